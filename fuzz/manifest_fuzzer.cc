// Fuzz target: raw manifest bytes -> parse_manifest (src/manifest.h).
// Property: any byte string is either rejected with treecask::Error or
// yields an index whose every record can be read without a crash.
#include <cstddef>
#include <cstdint>
#include <span>

#include "manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace treecask;
  std::unique_ptr<Manifest> m;
  try {
    m = parse_manifest(std::as_bytes(std::span(data, size)), "fuzz");
  } catch (const Error&) {
    return 0;
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
  }
  return 0;
}
