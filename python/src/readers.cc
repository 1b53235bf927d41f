// treecask._core's readers: Archive (include/treecask/archive.h) and
// ShardedArchive (sharded.h). The read API they share (include/treecask/reader.h)
// is bound once, by bind_read_api over either class: it is the source that
// python/treecask/_reader.py's Reader reads. Each class then adds its own:
// an Archive its views of the map, row and byte-range reads; a ShardedArchive
// its index and shard files.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "binding.h"

namespace treecask_py {
namespace {

using namespace nb::literals;
using ByteView = nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>, nb::c_contig>;

// A (bundle_json, public_key_pem) pair, or None: OpenOptions::signature (signing.cc).
using Signature = std::optional<std::tuple<std::string, std::string>>;

// The OpenOptions of the binding's open calls.
treecask::OpenOptions open_options(bool verify_checksums, bool validate_structure = true,
                                   const Signature& signature = std::nullopt) {
  treecask::OpenOptions o;
  o.verify_checksums = verify_checksums;
  o.validate_structure = validate_structure;
  o.signature = signature_check(signature);
  return o;
}

// Archive::open / ShardedArchive::open with the OpenOptions, GIL released.
template <class T>
T open_with(const std::string& path, bool verify_checksums, bool validate_structure, const Signature& signature) {
  treecask::OpenOptions o = open_options(verify_checksums, validate_structure, signature);
  nb::gil_scoped_release release;
  return T::open(path, o);
}

treecask::Verify to_verify(std::optional<bool> v) {
  if (!v) return treecask::Verify::kDefault;
  return *v ? treecask::Verify::kYes : treecask::Verify::kNo;
}

// The archive whose facts (format and library versions, creation time, key
// lookups) a reader gives: an Archive's own, a sharded checkpoint's index's.
const treecask::Archive& facts_of(const treecask::Archive& a) { return a; }
const treecask::Archive& facts_of(const treecask::ShardedArchive& s) { return s.index(); }

// r.verify(), GIL released: one treecask.errors instance per damaged leaf.
nb::list verify_to_python(const treecask::Reader& r) {
  std::vector<treecask::Error> errors;
  {
    nb::gil_scoped_release release;
    errors = r.verify();
  }
  nb::list out;
  for (const treecask::Error& e : errors) out.append(error_to_python(e));
  return out;
}

nb::dict leaf_info_to_dict(const treecask::LeafInfo& li) {
  nb::dict d;
  d["key_path"] = nb::str(li.key_path.data(), li.key_path.size());
  d["index"] = li.index;
  d["value_kind"] = static_cast<int>(li.value_kind);
  d["dtype"] = std::string(treecask::dtype_name(li.dtype));
  d["shape"] = nb::tuple(nb::cast(li.shape));
  d["logical_axes"] = nb::tuple(nb::cast(li.logical_axes));
  d["sharding"] = sharding_to_python(li.sharding);
  d["metadata"] = key_values_to_python(li.metadata);
  d["byte_length"] = li.byte_length;
  d["stored_bytes"] = li.stored_bytes;
  d["codec"] = std::string(treecask::codec_name(li.codec));
  d["filter"] = std::string(treecask::filter_name(li.filter));
  d["chunk_size"] = li.chunk_size;
  d["num_chunks"] = li.num_chunks;
  d["num_parts"] = li.num_parts;
  d["zero_copy"] = li.zero_copy();  // the core's rule (LeafInfo::zero_copy)
  // Format 3.0 (sharded checkpoints): (file, key_path, start, stop) per saved box.
  nb::list shards;
  for (const auto& r : li.shards)
    shards.append(nb::make_tuple(r.file, r.key_path, nb::tuple(nb::cast(r.start)), nb::tuple(nb::cast(r.stop))));
  d["shards"] = shards;
  return d;
}

// Leaves [first, first + count) of `r` as columns: (dtype names, shapes as
// tuples, value kinds as bytes, 1/0 per leaf as bytes: whether it has leaf
// metadata, 1/0 per leaf as bytes: LeafInfo::zero_copy).
nb::tuple leaf_columns_to_python(const treecask::Reader& r, size_t first, size_t count) {
  if (first > r.size() || count > r.size() - first)
    throw treecask::Error(treecask::ErrorCode::kInvalidArgument, r.path(), "",
                          std::to_string(count) + " leaves from index " + std::to_string(first) +
                              " run past the archive's " + std::to_string(r.size()));
  std::vector<nb::object> names(256);  // one str per dtype, shared by its leaves
  nb::list dtypes, shapes;
  std::string kinds(count, '\0'), has_metadata(count, '\0'), views(count, '\0');
  for (size_t k = 0; k < count; ++k) {
    treecask::LeafInfo li = r.leaf(first + k);
    nb::object& name = names[static_cast<uint8_t>(li.dtype)];
    if (!name.is_valid()) {
      std::string_view dn = treecask::dtype_name(li.dtype);
      name = nb::str(dn.data(), dn.size());
    }
    dtypes.append(name);
    shapes.append(nb::tuple(nb::cast(li.shape)));
    kinds[k] = static_cast<char>(li.value_kind);
    has_metadata[k] = li.metadata.empty() ? 0 : 1;
    views[k] = li.zero_copy() ? 1 : 0;
  }
  nb::bytes kind_bytes(kinds.data(), kinds.size()), metadata_bytes(has_metadata.data(), has_metadata.size());
  return nb::make_tuple(dtypes, shapes, kind_bytes, metadata_bytes, nb::bytes(views.data(), views.size()));
}

// The subtree of `def` at `components` (treecask::find_subtree): (index of its
// first leaf, number of leaves, its nodes as treedef_to_python gives them), or None.
nb::object subtree_nodes_to_python(const treecask::TreeDef& def, const std::vector<std::string>& components) {
  std::optional<treecask::SubtreeAt> at = treecask::find_subtree(def, components);
  if (!at) return nb::none();
  return nb::make_tuple(at->leaf_begin, at->leaf_count, treedef_to_python(def, at->node_begin, at->node_end));
}

// One owner of views into the map of `a`: a heap copy of the Archive (the map).
nb::capsule map_owner(const treecask::Archive& a) {
  auto* keep = new treecask::Archive(a);
  return nb::capsule(keep, [](void* p) noexcept { delete static_cast<treecask::Archive*>(p); });
}

// A read-only uint8 view of `s` that keeps `owner` (and so the map) alive.
nb::object make_view(std::span<const std::byte> s, nb::handle owner) {
  static const std::byte kEmpty[64] = {};
  const void* data = s.empty() ? static_cast<const void*>(kEmpty) : s.data();
  return nb::cast(ByteView(data, {s.size()}, owner));
}

// A held writable buffer of any layout (PyBUF_STRIDES: NumPy views with
// strides, negative ones included) as a read_slice destination: the smallest
// byte span holding it, and its byte strides (empty when C-contiguous).
class SliceDest {
 public:
  explicit SliceDest(nb::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_WRITABLE | PyBUF_STRIDES) != 0)
      throw nb::python_error();
    held_ = true;
    std::byte* buf = static_cast<std::byte*>(view_.buf);
    if (PyBuffer_IsContiguous(&view_, 'C')) {
      out_ = {buf, static_cast<size_t>(view_.len)};
      return;
    }
    int64_t lo = 0, hi = 0;
    bool empty = false;
    for (int d = 0; d < view_.ndim; ++d) {
      int64_t n = view_.shape[d], st = view_.strides[d];
      shape_.push_back(n);
      strides_.push_back(st);
      if (n == 0) empty = true;
      else (st < 0 ? lo : hi) += (n - 1) * st;
    }
    out_ = empty ? std::span<std::byte>() : std::span<std::byte>(buf + lo, static_cast<size_t>(hi - lo + view_.itemsize));
  }
  SliceDest(const SliceDest&) = delete;
  SliceDest& operator=(const SliceDest&) = delete;
  SliceDest(SliceDest&& o) noexcept
      : view_(o.view_), held_(o.held_), out_(o.out_),
        shape_(std::move(o.shape_)),
        strides_(std::move(o.strides_)),
        full_strides_(std::move(o.full_strides_)) {
    o.held_ = false;
  }
  ~SliceDest() {
    if (held_) PyBuffer_Release(&view_);
  }
  // The request for box [start, stop) of leaf `i`. A strided destination must
  // have the box's shape, where dimensions of extent 1 may be left out (as an
  // int index drops them); else kShapeMismatch naming the leaf.
  treecask::SliceRequest request(const treecask::Reader& r, size_t i, const std::vector<int64_t>& start,
                                 const std::vector<int64_t>& stop) {
    if (strides_.empty() || start.size() != stop.size()) return {start, stop, out_, {}};
    std::vector<int64_t> full;
    size_t k = 0;
    bool ok = true;
    for (size_t d = 0; ok && d < start.size(); ++d) {
      int64_t n = stop[d] - start[d];
      if (k < shape_.size() && shape_[k] == n && (n != 1 || shape_.size() - k >= start.size() - d)) {
        full.push_back(strides_[k++]);
      } else if (n == 1) {
        full.push_back(0);  // a dropped dimension of extent 1: its stride is never used
      } else {
        ok = false;
      }
    }
    if (!ok || k != shape_.size())
      throw treecask::Error(treecask::ErrorCode::kShapeMismatch, r.path(), r.leaf(i).key_path,
                            "a non-contiguous destination must have the slice's shape");
    full_strides_ = std::move(full);
    return {start, stop, out_, full_strides_};
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
  std::span<std::byte> out_;
  std::vector<int64_t> shape_, strides_, full_strides_;
};

// The read API of include/treecask/reader.h on class R (Archive or
// ShardedArchive), with the facts of facts_of(R). Every leaf index is checked
// by the core (kInvalidArgument: treecask.errors.InvalidArgumentError, which
// is also an IndexError). Reads release the GIL.
template <class R>
void bind_read_api(nb::class_<R>& c) {
  c.def_prop_ro("path", &R::path)
      .def_prop_ro("format_version",
                   [](const R& r) {
                     const treecask::Archive& f = facts_of(r);
                     return std::make_pair(f.format_major(), f.format_minor());
                   })
      .def_prop_ro("library_version", [](const R& r) { return facts_of(r).library_version(); })
      .def_prop_ro("created_unix_ns", [](const R& r) { return facts_of(r).created_unix_ns(); })
      .def_prop_ro("metadata", [](const R& r) { return key_values_to_python(r.metadata()); })
      .def_prop_ro("treedef", [](const R& r) { return treedef_to_python(r.treedef()); })
      .def("__len__", &R::size)
      .def("leaf", [](const R& r, size_t i) { return leaf_info_to_dict(r.leaf(i)); })
      .def("find", [](const R& r, const std::string& k) { return r.find(k); })
      .def("index_of", [](const R& r, const std::string& k) { return facts_of(r).index_of(k); })
      .def(
          "subtree_nodes",
          [](const R& r, const std::vector<std::string>& components) {
            return subtree_nodes_to_python(r.treedef(), components);
          },
          "components"_a,
          "The subtree at `components` (unescaped key path components; the first child of that "
          "name at each level): (index of its first leaf, number of leaves, its treedef nodes in "
          "pre-order), or None. Costs the nodes before it in C++ and its own nodes in Python.")
      .def(
          "leaf_columns", [](const R& r, size_t first, size_t count) { return leaf_columns_to_python(r, first, count); },
          "first"_a, "count"_a,
          "Leaves [first, first + count) as columns: (dtype names, shapes as tuples, value kinds "
          "as bytes, 1/0 per leaf as bytes: whether it has leaf metadata, 1/0 per leaf as bytes: "
          "whether the package views it in the map (LeafInfo::zero_copy; never for a sharded "
          "checkpoint's leaves)). InvalidArgumentError when the range runs past the last leaf.")
      .def(
          "read",
          [](const R& r, size_t i, nb::handle out, std::optional<bool> verify) {
            Buffer buf(out, true);
            nb::gil_scoped_release release;
            r.read(i, {buf.data(), buf.size()}, to_verify(verify));
          },
          "index"_a, "out"_a, "verify"_a = nb::none())
      .def(
          "read_many",
          [](const R& r, const std::vector<size_t>& indices, nb::list outs, std::optional<bool> verify) {
            std::vector<Buffer> bufs;  // reserved: never moved once held
            std::vector<std::span<std::byte>> spans;
            bufs.reserve(outs.size());
            spans.reserve(outs.size());
            for (nb::handle out : outs) {
              bufs.emplace_back(out, true);
              spans.emplace_back(bufs.back().data(), bufs.back().size());
            }
            nb::gil_scoped_release release;
            r.read_many(indices, spans, to_verify(verify));
          },
          "indices"_a, "outs"_a, "verify"_a = nb::none(),
          "Copies many leaves at once (Reader::read_many; an Archive shares all chunks among all "
          "cores, pread() from the page cache, checksummed in the same pass). outs[k] must be a "
          "writable C-contiguous buffer (e.g. a NumPy array) of exactly leaf indices[k]'s byte "
          "length. Releases the GIL.")
      .def(
          "read_slice",
          [](const R& r, size_t i, const std::vector<int64_t>& start, const std::vector<int64_t>& stop,
             nb::handle out, std::optional<bool> verify, unsigned threads) {
            SliceDest dest(out);
            treecask::SliceRequest q = dest.request(r, i, start, stop);
            nb::gil_scoped_release release;
            r.read_slice(i, q.start, q.stop, q.out, q.out_byte_strides, to_verify(verify), threads);
          },
          "index"_a, "start"_a, "stop"_a, "out"_a, "verify"_a = nb::none(), "threads"_a = 0,
          "Reader::read_slice: elements start[d] <= i_d < stop[d] of leaf `index` (a sharded "
          "checkpoint's: of the global array) into `out`, any writable buffer: C-contiguous of "
          "exactly the box's bytes (sub-byte dtypes: one byte per element), or a strided view of "
          "the box's shape (NumPy strides; negative ones for an Archive). Releases the GIL; "
          "threads 0 = all cores for reads of >= 8 MiB of chunks.")
      .def(
          "read_slices",
          [](const R& r, size_t i, const std::vector<std::vector<int64_t>>& starts,
             const std::vector<std::vector<int64_t>>& stops, nb::list outs, std::optional<bool> verify,
             unsigned threads) {
            if (starts.size() != stops.size() || starts.size() != outs.size())
              throw nb::value_error("read_slices: one start, stop and output per box");
            std::vector<SliceDest> dests;  // reserved: never moved once held
            std::vector<treecask::SliceRequest> reqs;
            dests.reserve(outs.size());
            for (size_t k = 0; k < starts.size(); ++k) {
              dests.emplace_back(outs[k]);
              reqs.push_back(dests.back().request(r, i, starts[k], stops[k]));
            }
            nb::gil_scoped_release release;
            r.read_slices(i, reqs, to_verify(verify), threads);
          },
          "index"_a, "starts"_a, "stops"_a, "outs"_a, "verify"_a = nb::none(), "threads"_a = 0,
          "Reader::read_slices: several boxes of one leaf (outs[k] as read_slice's out); an "
          "Archive decodes and checksums each chunk once for all of them, a ShardedArchive reads "
          "one box after the other. Releases the GIL.")
      .def("verify", [](const R& r) { return verify_to_python(r); });
}

}  // namespace

void register_readers(nb::module_& m) {
  nb::class_<treecask::Archive> archive(m, "Archive");
  archive
      .def_static(
          "open",
          &open_with<treecask::Archive>,
          "path"_a, "verify_checksums"_a = true, "validate_structure"_a = true, "signature"_a = nb::none(),
          "Archive::open; `signature`: None, or (bundle JSON, PEM public key) for a verified open "
          "(OpenOptions::signature). GIL released.")
      .def_static(
          "open_source",
          [](nb::object source, bool verify_checksums, const Signature& signature) {
            std::shared_ptr<const treecask::Source> src = source_from_python(std::move(source));
            treecask::OpenOptions o = open_options(verify_checksums, true, signature);
            nb::gil_scoped_release release;
            return treecask::Archive::open(src, o);
          },
          "source"_a, "verify_checksums"_a = true, "signature"_a = nb::none());
  bind_read_api(archive);
  archive.def_prop_ro("file_size", &treecask::Archive::file_size)
      .def_prop_ro("manifest_fingerprint",
                   [](const treecask::Archive& a) {
                     treecask::ShardFile f = a.manifest_fingerprint();
                     return std::make_tuple(f.file, f.manifest_length, f.manifest_checksum);
                   })
      .def("leaves",
           [](const treecask::Archive& a) {
             nb::list out;
             for (size_t i = 0; i < a.size(); ++i) out.append(leaf_info_to_dict(a.leaf(i)));
             return out;
           })
      .def("subtree",
           [](const treecask::Archive& a, const std::string& k) { return a.subtree(k); })
      .def(
          "view",
          [](const treecask::Archive& a, size_t i, std::optional<bool> verify) {
            std::span<const std::byte> s;
            {
              nb::gil_scoped_release release;
              s = a.view(i, to_verify(verify));
            }
            return make_view(s, map_owner(a));
          },
          "index"_a, "verify"_a = nb::none())
      .def(
          "view_parts",
          [](const treecask::Archive& a, size_t i, std::optional<bool> verify) {
            std::vector<std::span<const std::byte>> parts;
            {
              nb::gil_scoped_release release;
              parts = a.view_parts(i, to_verify(verify));
            }
            nb::list out;
            for (auto s : parts) out.append(make_view(s, map_owner(a)));
            return out;
          },
          "index"_a, "verify"_a = nb::none())
      .def(
          "view_many",
          [](const treecask::Archive& a, const std::vector<size_t>& indices, std::optional<bool> verify) {
            std::vector<std::optional<std::span<const std::byte>>> spans;
            {
              nb::gil_scoped_release release;
              spans = a.view_many(indices, to_verify(verify));
            }
            nb::capsule owner = map_owner(a);  // one owner for all the views
            nb::list out;
            for (const auto& s : spans) out.append(s ? make_view(*s, owner) : nb::none());
            return out;
          },
          "indices"_a, "verify"_a = nb::none(),
          "Archive::view_many: read-only uint8 views of the mapped file, one per index (None for "
          "a leaf with no zero-copy view: LZ4 or several parts), every chunk checksummed once by "
          "all cores (GIL released). The views keep the map alive.")
      .def(
          "read_rows",
          [](const treecask::Archive& a, size_t i, int64_t begin, int64_t end, nb::handle out,
             std::optional<bool> verify) {
            Buffer buf(out, true);
            nb::gil_scoped_release release;
            a.read_rows(i, begin, end, {buf.data(), buf.size()}, to_verify(verify));
          },
          "index"_a, "row_begin"_a, "row_end"_a, "out"_a, "verify"_a = nb::none())
      .def(
          "read_bytes",
          [](const treecask::Archive& a, size_t i, uint64_t offset, nb::handle out,
             std::optional<bool> verify) {
            Buffer buf(out, true);
            nb::gil_scoped_release release;
            a.read_bytes(i, offset, {buf.data(), buf.size()}, to_verify(verify));
          },
          "index"_a, "offset"_a, "out"_a, "verify"_a = nb::none(),
          "Archive::read_bytes: raw leaf bytes [offset, offset + len(out)) into a writable "
          "C-contiguous buffer (sub-byte dtypes stay packed). Releases the GIL.");

  // ---- sharded checkpoints (format 3.0; include/treecask/sharded.h) ----------
  m.def("is_sharded", [](const std::string& path) { return treecask::ShardedArchive::is_sharded(path); });
  m.def("is_url", [](const std::string& s) { return treecask::is_url(s); });
  // The one redaction rule (include/treecask/remote.h): every Python message
  // that shows a URL shows it through these.
  m.def("redact_url", [](std::string_view url) { return treecask::redact_url(url); }, "url"_a,
        "The URL with its credentials (user:password@, signature / token / credential query "
        "parameters) shown as ***: treecask::redact_url.");
  m.def("redact_urls_in", [](std::string_view text) { return treecask::redact_urls_in(text); }, "text"_a,
        "Every URL inside `text` through redact_url: treecask::redact_urls_in.");
  // The one URL rule (include/treecask/remote.h parse_url): the package takes
  // every URL apart with it.
  m.def(
      "parse_url",
      [](std::string_view url, bool prefix) {
        treecask::ParsedUrl u =
            treecask::parse_url(url, prefix ? treecask::UrlTarget::kPrefix : treecask::UrlTarget::kObject);
        nb::dict d;
        d["scheme"] = u.scheme;
        d["bucket"] = u.bucket;
        d["key"] = u.key;
        d["directory"] = u.directory;
        return d;
      },
      "url"_a, nb::kw_only(), "prefix"_a = false,
      "treecask::parse_url: {'scheme', 'bucket', 'key', 'directory'} of `url`, which names one object "
      "(a key needed) or, with prefix=True, a \"directory\" (a bucket alone allowed). Raises "
      "UnsupportedError (another scheme), InvalidArgumentError (not a URL, malformed, credentials in "
      "an s3://, gs:// or az:// URL), naming the URL redacted.");
  nb::class_<treecask::ShardedArchive> sharded(m, "ShardedArchive");
  sharded
      .def_static(
          "open",
          &open_with<treecask::ShardedArchive>,
          "path"_a, "verify_checksums"_a = true, "validate_structure"_a = true, "signature"_a = nb::none())
      .def_static(
          "open_sources",
          [](nb::object opener, const std::string& shown, bool verify_checksums, const Signature& signature) {
            // Made and destroyed with the GIL held; each call of it takes the GIL.
            treecask::SourceOpener open_object = opener_from_python(std::move(opener));
            treecask::OpenOptions o = open_options(verify_checksums, true, signature);
            nb::gil_scoped_release release;
            return treecask::ShardedArchive::open(open_object, shown, o);
          },
          "opener"_a, "shown"_a, "verify_checksums"_a = true, "signature"_a = nb::none());
  // The read API above, over the global leaves: the checkpoint's facts, its treedef and key
  // lookups are the index archive's; leaves are assembled from the saved boxes, so none has a
  // view of a map.
  bind_read_api(sharded);
  sharded.def_prop_ro("index", [](const treecask::ShardedArchive& s) { return s.index(); })
      .def("files", &treecask::ShardedArchive::files)
      .def("file", [](const treecask::ShardedArchive& s, const std::string& name) { return s.file(name); })
      .def(
          "view_many",
          [](const treecask::ShardedArchive& s, const std::vector<size_t>& indices, std::optional<bool>) {
            for (size_t i : indices)
              if (i >= s.size())
                throw treecask::Error(treecask::ErrorCode::kInvalidArgument, s.path(), "",
                                      "leaf index " + std::to_string(i) + " out of range (archive has " +
                                          std::to_string(s.size()) + " leaves)");
            nb::list out;
            for (size_t k = 0; k < indices.size(); ++k) out.append(nb::none());
            return out;
          },
          "indices"_a, "verify"_a = nb::none(),
          "As Archive.view_many: None for every leaf (a sharded leaf has no view of a map).");
}

}  // namespace treecask_py
