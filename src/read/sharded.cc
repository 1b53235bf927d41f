// ShardedArchive: the global view of a sharded checkpoint directory
// (SPEC.md "Sharded checkpoints").
#include "treecask/sharded.h"
#include "format/format.h"
#include "remote/url.h"
#include "treecask/remote.h"
#include "util/parallel.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

namespace treecask {

namespace {

// One saved box of a leaf, resolved to its shard file and leaf there.
struct Box {
  size_t file = 0;  // index into Impl::archives
  size_t leaf = 0;  // leaf index in that file
  std::vector<int64_t> start, stop;
};

std::string box_str(std::span<const int64_t> b, std::span<const int64_t> e) {
  std::string s = "[";
  for (size_t d = 0; d < b.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(b[d]) + ":" + std::to_string(e[d]);
  }
  return s + "]";
}

bool overlap(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.start.size(); ++d)
    if (std::max(a.start[d], b.start[d]) >= std::min(a.stop[d], b.stop[d])) return false;
  return true;
}

}  // namespace

struct ShardedArchive::Impl {
  std::string dir;
  Archive index;
  std::vector<std::string> names;  // sorted shard file names
  std::vector<Archive> archives;   // same order
  std::vector<std::vector<Box>> boxes;  // per leaf
  std::vector<uint64_t> stored;         // per leaf: stored bytes over its boxes
  std::vector<uint64_t> bytes;          // per leaf: byte_length of the global array

  Error err(ErrorCode code, size_t leaf, const std::string& what) const {
    return Error(code, index.path(), leaf < boxes.size() ? index.leaf(leaf).key_path : "", what);
  }

  // Reads the part [lb, le) of box `b` (coordinates local to the box) into
  // `dst` with byte strides `dstr`: one Archive::read_slice of the shard
  // file, which touches and decodes only the chunks the part lies in.
  void read_part(const Box& b, std::span<const int64_t> lb, std::span<const int64_t> le,
                 std::span<std::byte> dst, std::span<const int64_t> dstr, Verify verify,
                 unsigned threads) const {
    archives[b.file].read_slice(b.leaf, lb, le, dst, dstr, verify, threads);
  }

  // kInvalidArgument unless `leaf` is below the number of leaves.
  void check_index(size_t leaf) const {
    if (leaf >= boxes.size())
      throw Error(ErrorCode::kInvalidArgument, dir, "",
                  "leaf index " + std::to_string(leaf) + " out of range (archive has " +
                      std::to_string(boxes.size()) + " leaves)");
  }

  // One box of a read_slices() request, its arguments checked: the byte
  // strides of its `out` (C-contiguous when the request gives none), the
  // bytes per element there and whether the box holds no element.
  struct CheckedBox {
    std::vector<int64_t> strides;
    uint64_t item = 0;   // bytes per element in `out`
    bool empty = false;  // no element: nothing to read
  };

  // Checks box `q` of leaf `leaf` (described by `info`) against
  // ShardedArchive::read_slice's REQUIRES, reading nothing: kInvalidArgument
  // (rank, range, strides), kShapeMismatch (out's size).
  CheckedBox check_box(size_t leaf, const LeafInfo& info, const SliceRequest& q) const {
    const size_t rank = info.shape.size();
    auto bad = [&](ErrorCode c, const std::string& what) { return err(c, leaf, what); };
    if (q.start.size() != rank || q.stop.size() != rank)
      throw bad(ErrorCode::kInvalidArgument, "start/stop need " + std::to_string(rank) + " entries");
    CheckedBox c;
    std::vector<int64_t> ext(rank);
    uint64_t count = 1;
    for (size_t d = 0; d < rank; ++d) {
      if (q.start[d] < 0 || q.start[d] > q.stop[d] || q.stop[d] > info.shape[d])
        throw bad(ErrorCode::kInvalidArgument, "slice " + box_str(q.start, q.stop) + " is not inside the shape " +
                                                   box_str(std::vector<int64_t>(rank), info.shape));
      ext[d] = q.stop[d] - q.start[d];
      count *= static_cast<uint64_t>(ext[d]);  // <= the leaf's element count, checked at open
    }
    // Bytes per element in `out`: sub-byte dtypes (int4, uint4, ...) are
    // unpacked to one byte per element, as Archive::read_slice writes them.
    const uint64_t item = dtype_packed(info.dtype) ? 1 : uint64_t(dtype_bits(info.dtype) / 8);
    const uint64_t want = count * item;
    c.item = item;
    c.strides.assign(q.out_byte_strides.begin(), q.out_byte_strides.end());
    if (c.strides.empty()) {
      if (q.out.size() != want)
        throw bad(ErrorCode::kShapeMismatch, "out has " + std::to_string(q.out.size()) + " bytes, the slice " +
                                                 box_str(q.start, q.stop) + " " + std::to_string(want));
      c.strides.resize(rank);
      int64_t s = int64_t(item);
      for (size_t d = rank; d-- > 0;) {
        c.strides[d] = s;
        s *= ext[d];
      }
    } else {
      if (c.strides.size() != rank)
        throw bad(ErrorCode::kInvalidArgument, "out_byte_strides needs " + std::to_string(rank) + " entries");
      for (size_t d = 0; d < rank; ++d)
        if (c.strides[d] == 0 && ext[d] > 1)  // as Archive::read_slice: elements would overwrite each other
          throw bad(ErrorCode::kInvalidArgument, "dimension " + std::to_string(d) +
                                                     ": a destination stride of 0 would write " +
                                                     std::to_string(ext[d]) + " elements to one place");
    }
    c.empty = want == 0;
    if (c.empty) return c;
    uint64_t last = item;
    for (size_t d = 0; d < rank; ++d) {
      if (c.strides[d] < 0) throw bad(ErrorCode::kInvalidArgument, "negative out_byte_strides");
      last += uint64_t(ext[d] - 1) * uint64_t(c.strides[d]);
    }
    if (last > q.out.size())
      throw bad(ErrorCode::kShapeMismatch, "out has " + std::to_string(q.out.size()) +
                                               " bytes; the strided slice needs " + std::to_string(last));
    return c;
  }

  // Reads box `q` of leaf `leaf`, checked by check_box as `c`: the part of
  // each saved box that intersects it, from its shard file.
  void read_box(size_t leaf, const SliceRequest& q, const CheckedBox& c, Verify verify, unsigned threads) const {
    if (c.empty) return;
    const size_t rank = c.strides.size();
    std::vector<int64_t> lb(rank), le(rank);
    for (const Box& b : boxes[leaf]) {
      bool none = false;
      uint64_t off = 0, extent = c.item;
      for (size_t d = 0; d < rank && !none; ++d) {
        int64_t is = std::max(q.start[d], b.start[d]), ie = std::min(q.stop[d], b.stop[d]);
        if (is >= ie) none = true;
        lb[d] = is - b.start[d];
        le[d] = ie - b.start[d];
        off += uint64_t(is - q.start[d]) * uint64_t(c.strides[d]);
        extent += uint64_t(ie - is - 1) * uint64_t(c.strides[d]);
      }
      if (none) continue;
      read_part(b, lb, le, q.out.subspan(off, extent), c.strides, verify, threads);
    }
  }
};

bool ShardedArchive::is_sharded(const std::filesystem::path& path) noexcept {
  if (is_url(path.string())) {
    try {
      return parse_url(path.string(), UrlTarget::kPrefix).directory;
    } catch (const Error&) {
      return false;  // opening it as one object names what is wrong
    }
  }
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) &&
         std::filesystem::is_regular_file(path / kShardedIndexName, ec);
}

namespace {

std::string hex64(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string save_id_of(const Archive& a) {
  for (const auto& [k, v] : a.metadata())
    if (k == kSaveIdKey) return v;
  return "";
}

// R9 (SPEC.md "Sharded checkpoints"): a bound index names the exact shard
// file, by the length and XXH3 of its manifest.
void check_binding(const Archive& index, const ShardFile& want, const Archive& shard) {
  ShardFile got = shard.manifest_fingerprint();
  if (got.manifest_length == want.manifest_length && got.manifest_checksum == want.manifest_checksum) return;
  std::string what = want.file + " is not the shard file this checkpoint was committed with: its manifest is " +
                     std::to_string(got.manifest_length) + " bytes with XXH3 " + hex64(got.manifest_checksum) +
                     ", the index recorded " + std::to_string(want.manifest_length) + " bytes with XXH3 " +
                     hex64(want.manifest_checksum);
  std::string mine = save_id_of(shard), theirs = save_id_of(index);
  if (mine != theirs)
    what += "; it was written by save '" + (mine.empty() ? std::string("(no save id)") : mine) +
            "', the index by save '" + (theirs.empty() ? std::string("(no save id)") : theirs) + "'";
  what += " (a file of another step, save or job)";
  throw Error(ErrorCode::kCorruption, shard.path(), "", what);
}

struct DirFd {
  int fd = -1;
  ~DirFd() {
    if (fd >= 0) ::close(fd);
  }
};

// True when `dir` no longer names the directory open as `fd` (replaced by a
// concurrent commit with overwrite, SPEC.md "Atomic commit of a directory").
bool replaced(const std::filesystem::path& dir, int fd) {
  struct stat now, held;
  if (::fstat(fd, &held) != 0) return false;
  if (::stat(dir.c_str(), &now) != 0) return true;
  return now.st_ino != held.st_ino || now.st_dev != held.st_dev;
}

}  // namespace

std::shared_ptr<const ShardedArchive::Impl> ShardedArchive::open_once(
    const std::string& shown, const std::function<Archive(const std::string&)>& at, unsigned threads) {
  auto im = std::make_shared<Impl>(Impl{shown, at(std::string(kShardedIndexName)), {}, {}, {}, {}, {}});
  const Archive& idx = im->index;
  const size_t n = idx.size();
  std::map<std::string, size_t, std::less<>> file_of;
  std::vector<LeafInfo> infos;
  infos.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    infos.push_back(idx.leaf(i));
    for (const auto& r : infos.back().shards) file_of.emplace(r.file, 0);
  }
  std::map<std::string_view, const ShardFile*> bound;
  for (const ShardFile& f : idx.shard_files()) bound.emplace(f.file, &f);
  for (auto& [name, k] : file_of) {
    k = im->names.size();
    im->names.push_back(name);
  }
  // The shard files, opened `threads` at a time (a remote open is a round
  // trip each), then checked against the index in name order.
  std::vector<std::optional<Archive>> opened(im->names.size());
  parallel_for(opened.size(), threads, [&](size_t f) { opened[f].emplace(at(im->names[f])); });
  for (size_t f = 0; f < opened.size(); ++f) {
    im->archives.push_back(std::move(*opened[f]));
    if (auto b = bound.find(im->names[f]); b != bound.end()) check_binding(idx, *b->second, im->archives.back());
  }
  im->boxes.resize(n);
  im->stored.resize(n);
  im->bytes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const LeafInfo& li = infos[i];
    if (li.shards.empty())
      throw Error(ErrorCode::kCorruption, idx.path(), li.key_path,
                  "a leaf of a sharded checkpoint's index has no shard references");
    im->bytes[i] = li.byte_length;
    auto& bx = im->boxes[i];
    for (const auto& r : li.shards) {
      size_t f = file_of.find(r.file)->second;
      const Archive& a = im->archives[f];
      std::string where = "shard " + box_str(r.start, r.stop) + " in " + r.file + " at '" + r.key_path + "'";
      auto k = a.find(r.key_path);
      if (!k) throw Error(ErrorCode::kCorruption, a.path(), li.key_path, where + ": the shard file has no such leaf");
      LeafInfo s = a.leaf(*k);
      std::vector<int64_t> want(r.start.size());
      for (size_t d = 0; d < want.size(); ++d) want[d] = r.stop[d] - r.start[d];
      if (!s.shards.empty())  // R6: a box is a leaf with bytes, never a reference to further files
        throw Error(ErrorCode::kCorruption, a.path(), li.key_path,
                    where + ": the shard file's leaf has shard references of its own (a shard file is never "
                            "the index of another sharded checkpoint)");
      if (s.dtype != li.dtype || s.shape != want)
        throw Error(ErrorCode::kCorruption, a.path(), li.key_path,
                    where + ": the shard file's leaf is " + std::string(dtype_name(s.dtype)) + " of shape " +
                        box_str(std::vector<int64_t>(s.shape.size()), s.shape) + ", expected " +
                        std::string(dtype_name(li.dtype)) + " of shape " +
                        box_str(std::vector<int64_t>(want.size()), want));
      im->stored[i] += s.stored_bytes;
      bx.push_back(Box{f, *k, r.start, r.stop});
    }
    for (size_t p = 0; p < bx.size(); ++p)
      for (size_t q = p + 1; q < bx.size(); ++q)
        if (overlap(bx[p], bx[q]))
          throw Error(ErrorCode::kCorruption, idx.path(), li.key_path,
                      "shard boxes " + box_str(bx[p].start, bx[p].stop) + " and " +
                          box_str(bx[q].start, bx[q].stop) + " overlap (they must tile the array exactly)");
  }
  return im;
}

ShardedArchive ShardedArchive::open(const SourceOpener& open_object, const std::string& shown,
                                   const OpenOptions& options, unsigned threads) {
  return ShardedArchive(open_once(
      shown, [&](const std::string& name) { return Archive::open(open_object(name), options); }, threads));
}

ShardedArchive ShardedArchive::open(const std::filesystem::path& dir, const OpenOptions& options) {
  if (is_url(dir.string())) {
    std::string base = dir.string();
    while (!base.empty() && base.back() == '/') base.pop_back();
    return open([&](const std::string& name) { return remote::open_object(base + "/" + name); }, redact_url(base),
                options, 16);
  }
  for (int attempt = 1;; ++attempt) {
    DirFd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    if (d.fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR)
        throw Error(ErrorCode::kNotFound, dir.string(), "", "no such checkpoint directory");
      throw Error(ErrorCode::kIo, dir.string(), "", std::string("cannot open the directory: ") + std::strerror(errno));
    }
    try {
      return ShardedArchive(open_once(
          dir.string(),
          [&](const std::string& name) { return Archive::open_at(d.fd, name, (dir / name).string(), options); },
          1));
    } catch (const Error& e) {
      // A commit with overwrite swapped a new checkpoint in and is removing
      // this one's files: open the new one instead (never a mix of the two).
      if (e.code() != ErrorCode::kNotFound || attempt >= kOpenAttempts || !replaced(dir, d.fd)) throw;
    }
  }
}

ShardedArchive ShardedArchive::open_index(const Archive& index, const OpenOptions& options) {
  if (index.source())
    throw Error(ErrorCode::kUnsupported, index.path(), "",
                "the index of a sharded checkpoint read from a store: open the checkpoint's directory URL "
                "(ending in '/') with ShardedArchive::open to read or verify its shard files");
  std::filesystem::path dir = std::filesystem::path(index.path()).parent_path();
  if (dir.empty()) dir = ".";
  DirFd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) {
    const int e = errno;
    throw Error(e == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, dir.string(), "",
                "cannot open the directory of the index " + index.path() + ": " + std::strerror(e));
  }
  // open_once asks for the index first, then for each shard file by name.
  bool first = true;
  return ShardedArchive(open_once(
      dir.string(),
      [&](const std::string& name) {
        if (std::exchange(first, false)) return index;
        return Archive::open_at(d.fd, name, (dir / name).string(), options);
      },
      1));
}

bool ShardedArchive::is_index(const Archive& archive) {
  if (archive.format_major() < format::kShardMajor) return false;
  for (size_t i = 0; i < archive.size(); ++i)
    if (!archive.leaf(i).shards.empty()) return true;
  return false;
}

const std::string& ShardedArchive::path() const noexcept { return impl_->dir; }
const Archive& ShardedArchive::index() const noexcept { return impl_->index; }
size_t ShardedArchive::size() const noexcept { return impl_->index.size(); }

LeafInfo ShardedArchive::leaf(size_t index) const {
  LeafInfo info = impl_->index.leaf(index);
  info.stored_bytes = impl_->stored[index];
  return info;
}

const TreeDef& ShardedArchive::treedef() const noexcept { return impl_->index.treedef(); }
const KeyValues& ShardedArchive::metadata() const noexcept { return impl_->index.metadata(); }
std::optional<size_t> ShardedArchive::find(std::string_view key_path) const noexcept {
  return impl_->index.find(key_path);
}
std::vector<size_t> ShardedArchive::subtree(std::string_view prefix) const { return impl_->index.subtree(prefix); }

std::vector<std::string> ShardedArchive::files() const { return impl_->names; }

const Archive& ShardedArchive::file(std::string_view name) const {
  auto it = std::lower_bound(impl_->names.begin(), impl_->names.end(), name);
  if (it == impl_->names.end() || *it != name)
    throw Error(ErrorCode::kNotFound, impl_->dir, "", "no shard file '" + std::string(name) + "' in the index");
  return impl_->archives[size_t(it - impl_->names.begin())];
}

void ShardedArchive::read(size_t index, std::span<std::byte> out, Verify verify, unsigned threads) const {
  const Impl& im = *impl_;
  im.check_index(index);
  LeafInfo info = im.index.leaf(index);
  std::vector<int64_t> start(info.shape.size(), 0);
  if (!dtype_packed(info.dtype)) return read_slice(index, start, info.shape, out, {}, verify, threads);
  // Sub-byte dtypes: a whole-leaf read gives the stored (packed) bytes, as
  // Archive::read does. One box holding the whole leaf is copied as stored;
  // otherwise the boxes are read unpacked (one byte per element) into a
  // temporary and packed (SPEC.md "Dtypes").
  if (out.size() != info.byte_length)
    throw im.err(ErrorCode::kShapeMismatch, index,
                 "out has " + std::to_string(out.size()) + " bytes, the leaf " + std::to_string(info.byte_length));
  const auto& bx = im.boxes[index];
  if (bx.size() == 1) return im.archives[bx[0].file].read(bx[0].leaf, out, verify);
  uint64_t count = 1;
  for (int64_t d : info.shape) count *= static_cast<uint64_t>(d);
  std::vector<std::byte> unpacked(count);
  read_slice(index, start, info.shape, unpacked, {}, verify, threads);
  pack_elements(info.dtype, unpacked, out);
}

void ShardedArchive::read(size_t index, std::span<std::byte> out, Verify verify) const {
  read(index, out, verify, 0);
}

void ShardedArchive::read_many(std::span<const size_t> indices, std::span<const std::span<std::byte>> outs,
                               Verify verify, unsigned threads) const {
  const Impl& im = *impl_;
  if (indices.size() != outs.size())
    throw Error(ErrorCode::kInvalidArgument, im.dir, "", "read_many needs one output per index");
  // Every argument first (reader.h): a bad index or size reads nothing.
  for (size_t k = 0; k < indices.size(); ++k) {
    im.check_index(indices[k]);
    if (outs[k].size() != im.bytes[indices[k]])
      throw im.err(ErrorCode::kShapeMismatch, indices[k],
                   "out has " + std::to_string(outs[k].size()) + " bytes, the leaf " +
                       std::to_string(im.bytes[indices[k]]));
  }
  for (size_t k = 0; k < indices.size(); ++k) read(indices[k], outs[k], verify, threads);
}

void ShardedArchive::read_slices(size_t index, std::span<const SliceRequest> boxes, Verify verify,
                                 unsigned threads) const {
  const Impl& im = *impl_;
  im.check_index(index);
  LeafInfo info = im.index.leaf(index);
  // Every box's arguments first (reader.h): a bad box reads nothing.
  std::vector<Impl::CheckedBox> checked;
  checked.reserve(boxes.size());
  for (const SliceRequest& q : boxes) checked.push_back(im.check_box(index, info, q));
  for (size_t k = 0; k < boxes.size(); ++k) im.read_box(index, boxes[k], checked[k], verify, threads);
}

void ShardedArchive::read_slice(size_t index, std::span<const int64_t> start, std::span<const int64_t> stop,
                                std::span<std::byte> out, std::span<const int64_t> out_byte_strides,
                                Verify verify, unsigned threads) const {
  SliceRequest q{start, stop, out, out_byte_strides};
  read_slices(index, std::span<const SliceRequest>(&q, 1), verify, threads);
}

std::vector<Error> ShardedArchive::verify(const std::function<void(uint64_t, uint64_t)>& progress) const {
  const Impl& im = *impl_;
  uint64_t all = 0, before = 0;
  for (const Archive& a : im.archives)
    for (size_t i = 0; i < a.size(); ++i) all += a.leaf(i).byte_length;
  std::vector<Error> errors;
  for (const Archive& a : im.archives) {
    uint64_t mine = 0;
    auto cb = [&](uint64_t done, uint64_t total) {
      mine = total;
      if (progress) progress(before + done, all);
    };
    for (Error& e : a.verify(cb)) errors.push_back(std::move(e));
    before += mine;
  }
  return errors;
}

std::unique_ptr<Reader> open_reader(const std::filesystem::path& path, const OpenOptions& options) {
  if (ShardedArchive::is_sharded(path)) return std::make_unique<ShardedArchive>(ShardedArchive::open(path, options));
  return std::make_unique<Archive>(Archive::open(path, options));
}

}  // namespace treecask
