// Fuzz target: raw manifest bytes -> parse_manifest (src/format/manifest.h).
// Properties: any byte string is either rejected with treecask::Error or
// yields an index whose every record can be read without a crash; the
// two-thread check (used for large manifests) reaches the same verdict, error
// code and key path as the single-thread one; the one-pass check of plain
// leaves reaches the same verdict, message included, as the full check of
// every leaf (parse_manifest's full_leaf_check); and whatever the FlatBuffers
// verifier of the generated code rejects, parse_manifest rejects (it splits
// verification across threads, so this pins it to the generated verifier).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "format/manifest.h"

namespace {
// The verdict of one parse: empty when accepted, else code and key path.
std::string verdict(std::span<const std::byte> bytes, size_t parallel_from, std::unique_ptr<treecask::Manifest>* out,
                    bool full_leaf_check = false) {
  try {
    auto m = treecask::parse_manifest(bytes, "fuzz", false, std::nullopt, parallel_from, full_leaf_check);
    if (out) *out = std::move(m);
    return {};
  } catch (const treecask::Error& e) {
    return std::string(treecask::error_code_name(e.code())) + " at '" + e.key_path() + "': " + e.what();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace treecask;
  auto bytes = std::as_bytes(std::span(data, size));
  std::unique_ptr<Manifest> m;
  std::string alone = verdict(bytes, SIZE_MAX, &m);
  if (verdict(bytes, 0, nullptr) != alone) __builtin_trap();
  std::unique_ptr<Manifest> full;
  if (verdict(bytes, SIZE_MAX, &full, true) != alone) __builtin_trap();
  if (!alone.empty()) return 0;
  {
    flatbuffers::Verifier::Options opts;
    opts.max_depth = 16;
    opts.max_tables = 1u << 27;
    flatbuffers::Verifier v(m->data, m->size, opts);
    if (!fb::VerifyManifestBuffer(v)) __builtin_trap();
  }
  // A manifest that passed every check: walk what the reader serves from it.
  (void)m->treedef();  // the lazily built public treedef
  for (size_t i = 0; i < m->leaves.size(); ++i) {
    const LeafRecord& r = m->leaves[i];
    LeafMeta meta = leaf_meta_of(*r.fb);
    if (meta.key_path != r.key_path) __builtin_trap();
    auto found = m->find(r.key_path);
    if (!found || *found != i) __builtin_trap();
    uint64_t stored = 0;
    for (uint32_t c = 0; c < r.num_chunks(); ++c) {
      const fb::Chunk* ch = r.chunks->Get(c);
      if (ch->blob() >= m->blob_payload.size()) __builtin_trap();
      if (ch->offset() + ch->stored_size() > m->blob_payload[ch->blob()]) __builtin_trap();
      stored += ch->stored_size();
    }
    if (stored != r.stored_bytes) __builtin_trap();
    const LeafRecord& f = full->leaves[i];
    auto at = [](const void* p, const Manifest& in) {  // offset in that parse's own copy of the bytes
      return p ? static_cast<const uint8_t*>(p) - in.data : -1;
    };
    if (at(f.fb, *full) != at(r.fb, *m) || at(f.chunks, *full) != at(r.chunks, *m) || f.key_path != r.key_path || f.byte_length != r.byte_length || f.chunk_size != r.chunk_size ||
        f.stored_bytes != r.stored_bytes || f.num_parts != r.num_parts || f.num_shards != r.num_shards ||
        f.codec != r.codec || f.filter != r.filter || f.shuffle_bytes != r.shuffle_bytes || f.dtype != r.dtype)
      __builtin_trap();
  }
  return 0;
}
