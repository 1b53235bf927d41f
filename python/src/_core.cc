// treecask._core: the nanobind binding of the public C++ API.
//
// This layer is deliberately thin and private: it moves plain Python values
// (tuples, lists, dicts, uint8 arrays) across the boundary and leaves every
// pytree decision to the pure-Python package (python/treecask/*.py). It never
// parses the file itself (docs/design.md "Layers").
//
// Conventions:
//   * a treedef is a list of (kind, arity, type_name, keys) tuples in pre-order
//     (keys: a tuple of str; the save side takes any sequence);
//   * one leaf's description is a dict (leaf_info_to_dict); the bulk paths
//     (save, Archive.leaf_columns) move columns instead: one list per field,
//     one entry per leaf, so that 10,000 small leaves cost no dict apiece;
//   * leaf bytes cross by the buffer protocol: save takes any C-contiguous
//     buffer (a NumPy array of the leaf's own dtype, or its uint8 bytes) and
//     read / read_many write into any writable C-contiguous buffer of exactly
//     the leaf's byte length. Zero-copy views are 1-d uint8 arrays the Python
//     side views with the real dtype; they are read-only and own a heap copy
//     of the Archive, so the mapping outlives the Python Archive object;
//   * every treecask::Error becomes the treecask.errors class of its code
//     (built by treecask.errors._from_core), keeping .file / .key_path.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "treecask/treecask.h"
#include "convert.h"  // treecask_interop (src/interop)

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using ByteView = nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>, nb::c_contig>;

// Archive::open / ShardedArchive::open with the two OpenOptions flags, GIL released.
// The OpenOptions of the binding's open calls.
treecask::OpenOptions open_options(bool verify_checksums, bool validate_structure = true) {
  treecask::OpenOptions o;
  o.verify_checksums = verify_checksums;
  o.validate_structure = validate_structure;
  return o;
}

template <class T>
T open_with(const std::string& path, bool verify_checksums, bool validate_structure) {
  nb::gil_scoped_release release;
  return T::open(path, open_options(verify_checksums, validate_structure));
}

// ---- remote sources (include/treecask/source.h) -------------------------------

// The treecask::Error for a Python exception raised by a source or a source
// opener of object `file`: a treecask error (an instance with an int `code`
// and a `message`) keeps its code, message and file (`file` when it names
// none), any other is kIo with its type and text.
treecask::Error error_from_python(nb::python_error& e, const std::string& file) {
  nb::object v = nb::borrow(e.value());
  if (nb::hasattr(v, "code") && nb::isinstance<nb::int_>(v.attr("code")) && nb::hasattr(v, "message")) {
    std::string named = nb::hasattr(v, "file") ? nb::cast<std::string>(nb::str(v.attr("file"))) : "";
    return treecask::Error(static_cast<treecask::ErrorCode>(nb::cast<int>(v.attr("code"))),
                           named.empty() ? file : named, "", nb::cast<std::string>(nb::str(v.attr("message"))));
  }
  return treecask::Error(treecask::ErrorCode::kIo, file, "",
                         nb::cast<std::string>(nb::str(v.type().attr("__name__"))) + ": " +
                             nb::cast<std::string>(nb::str(v)));
}

// A Source implemented in Python (treecask._remote.ObjectSource, or any object
// with `name` (str), `size` (int, bytes), `concurrency` (int) and
// read(offsets, lengths) -> a sequence of bytes-like objects of exactly those
// lengths). read() runs with the GIL held; the Python side releases it while
// it waits on the network. A Python exception becomes a treecask::Error
// naming the object: a treecask error keeps its code, any other is kIo.
class PySource final : public treecask::Source {
 public:
  explicit PySource(nb::object obj) : obj_(std::move(obj)) {
    name_ = nb::cast<std::string>(obj_.attr("name"));
    size_ = nb::cast<uint64_t>(obj_.attr("size"));
    concurrency_ = std::max(nb::cast<unsigned>(obj_.attr("concurrency")), 1u);
  }
  ~PySource() override {
    if (!Py_IsInitialized()) {  // after interpreter shutdown: nothing left to release
      obj_.release();
      return;
    }
    nb::gil_scoped_acquire gil;  // the last owner may run without it
    obj_.reset();
  }
  const std::string& name() const noexcept override { return name_; }
  uint64_t size() const noexcept override { return size_; }
  unsigned concurrency() const noexcept override { return concurrency_; }
  void read(std::span<const treecask::ReadRange> ranges) const override {
    nb::gil_scoped_acquire gil;
    try {
      nb::list offsets, lengths;
      for (const auto& r : ranges) {
        offsets.append(r.offset);
        lengths.append(r.out.size());
      }
      nb::object got = obj_.attr("read")(offsets, lengths);
      size_t k = 0;
      for (nb::handle item : got) {
        if (k >= ranges.size()) break;
        Py_buffer view;
        if (PyObject_GetBuffer(item.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
        const bool fits = static_cast<size_t>(view.len) == ranges[k].out.size();
        if (fits) {  // the buffer stays held; other threads run Python meanwhile
          nb::gil_scoped_release copying;
          std::memcpy(ranges[k].out.data(), view.buf, ranges[k].out.size());
        }
        const size_t got_len = static_cast<size_t>(view.len);
        PyBuffer_Release(&view);
        if (!fits)
          throw treecask::Error(treecask::ErrorCode::kCorruption, name_, "",
                                "the source returned " + std::to_string(got_len) + " bytes for a range of " +
                                    std::to_string(ranges[k].out.size()));
        ++k;
      }
      if (k != ranges.size())
        throw treecask::Error(treecask::ErrorCode::kIo, name_, "", "the source returned too few ranges");
    } catch (nb::python_error& e) {
      throw error_from_python(e, name_);
    }
  }

 private:
  nb::object obj_;
  std::string name_;
  uint64_t size_ = 0;
  unsigned concurrency_ = 16;
};


// ---- errors -------------------------------------------------------------------

// A Python exception instance for `e`, built by treecask.errors._from_core.
nb::object error_to_python(const treecask::Error& e) {
  nb::object make = nb::module_::import_("treecask.errors").attr("_from_core");
  return make(static_cast<int>(e.code()), std::string(treecask::error_code_name(e.code())),
              e.file(), e.key_path(), e.message(), std::string(e.what()));
}

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const treecask::Error& e) {
    nb::object exc;
    try {
      exc = error_to_python(e);
    } catch (nb::python_error& pe) {
      // treecask.errors could not be imported: fall back to RuntimeError.
      pe.restore();
      PyErr_Clear();
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return;
    }
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  }
}

// a.verify() (Archive or ShardedArchive), GIL released: one treecask.errors instance per
// damaged leaf.
template <class A>
nb::list verify_to_python(const A& a) {
  std::vector<treecask::Error> errors;
  {
    nb::gil_scoped_release release;
    errors = a.verify();
  }
  nb::list out;
  for (const treecask::Error& e : errors) out.append(error_to_python(e));
  return out;
}

// A leaf index at or past the end: kInvalidArgument, as every C++ Archive
// method that takes an index throws (treecask.errors.InvalidArgumentError,
// which is also an IndexError). Checked before the GIL is released.
template <class A>
void check_index(const A& a, size_t i) {
  if (i >= a.size())
    throw treecask::Error(treecask::ErrorCode::kInvalidArgument, a.path(), "",
                          "leaf index " + std::to_string(i) + " out of range (archive has " +
                              std::to_string(a.size()) + " leaves)");
}

// ---- conversions --------------------------------------------------------------

// Nodes [begin, end) of `def` as a list of (kind, arity, type_name, keys)
// tuples. Leaf and None nodes without a type name share one tuple each.
nb::list treedef_to_python(const treecask::TreeDef& def, size_t begin, size_t end) {
  nb::list out;
  nb::object leaf, none;
  for (size_t i = begin; i < end; ++i) {
    const treecask::TreeNode& n = def[i];
    bool plain = n.arity == 0 && n.keys.empty() && n.type_name.empty();
    if (plain && n.kind == treecask::NodeKind::kLeaf) {
      if (!leaf.is_valid()) leaf = nb::make_tuple(0, 0, nb::str(""), nb::tuple());
      out.append(leaf);
      continue;
    }
    if (plain && n.kind == treecask::NodeKind::kNone) {
      if (!none.is_valid()) none = nb::make_tuple(1, 0, nb::str(""), nb::tuple());
      out.append(none);
      continue;
    }
    nb::list keys;
    for (const std::string& k : n.keys) keys.append(nb::str(k.data(), k.size()));
    out.append(nb::make_tuple(static_cast<int>(n.kind), n.arity,
                              nb::str(n.type_name.data(), n.type_name.size()), nb::tuple(keys)));
  }
  return out;
}

nb::list treedef_to_python(const treecask::TreeDef& def) { return treedef_to_python(def, 0, def.size()); }

// A held Py_buffer, released (with the GIL held) when it goes out of scope.
class Buffer {
 public:
  Buffer(nb::handle obj, bool writable) {
    // Without PyBUF_ND the exporter must hand out one C-contiguous block
    // (NumPy raises for any other layout), whatever the element type.
    if (PyObject_GetBuffer(obj.ptr(), &view_, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0)
      throw nb::python_error();
    held_ = true;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : view_(o.view_), held_(o.held_) { o.held_ = false; }
  ~Buffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  std::byte* data() const { return static_cast<std::byte*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// ---- slice reads (read_slice / read_slices / read_bytes) ------------------------

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
  treecask::Archive::SliceRequest request(const treecask::Archive& a, size_t i,
                                          const std::vector<int64_t>& start,
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
      throw treecask::Error(treecask::ErrorCode::kShapeMismatch, a.path(), a.leaf(i).key_path,
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

treecask::TreeDef treedef_from_python(nb::handle nodes) {
  treecask::TreeDef def;
  for (nb::handle item : nodes) {
    nb::tuple t = nb::cast<nb::tuple>(item);
    if (t.size() != 4) throw nb::value_error("treedef node must be (kind, arity, type_name, keys)");
    treecask::TreeNode n;
    n.kind = static_cast<treecask::NodeKind>(nb::cast<int>(t[0]));
    n.arity = nb::cast<uint32_t>(t[1]);
    n.type_name = nb::cast<std::string>(t[2]);
    n.keys = nb::cast<std::vector<std::string>>(t[3]);
    def.push_back(std::move(n));
  }
  return def;
}

nb::dict key_values_to_python(const treecask::KeyValues& kv) {
  nb::dict d;
  for (const auto& [k, v] : kv) d[nb::str(k.data(), k.size())] = nb::str(v.data(), v.size());
  return d;
}

treecask::KeyValues key_values_from_python(nb::handle obj) {
  treecask::KeyValues kv;
  if (obj.is_none()) return kv;
  for (nb::handle item : obj) {
    nb::tuple t = nb::cast<nb::tuple>(item);
    kv.emplace_back(nb::cast<std::string>(t[0]), nb::cast<std::string>(t[1]));
  }
  return kv;
}

nb::object sharding_to_python(const std::optional<treecask::Sharding>& s) {
  if (!s) return nb::none();
  return nb::make_tuple(nb::cast(s->mesh_axis_names), nb::cast(s->mesh_axis_sizes),
                        nb::cast(s->spec));
}

std::optional<treecask::Sharding> sharding_from_python(nb::handle obj) {
  if (obj.is_none()) return std::nullopt;
  nb::tuple t = nb::cast<nb::tuple>(obj);
  treecask::Sharding s;
  s.mesh_axis_names = nb::cast<std::vector<std::string>>(t[0]);
  s.mesh_axis_sizes = nb::cast<std::vector<int64_t>>(t[1]);
  s.spec = nb::cast<std::vector<std::vector<std::string>>>(t[2]);
  return s;
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

// Leaves [first, first + count) of `a` (Archive or ShardedArchive) as columns:
// (dtype names, shapes as tuples, value kinds as bytes, 1/0 per leaf as bytes:
// whether it has leaf metadata, 1/0 per leaf as bytes: LeafInfo::zero_copy).
template <class A>
nb::tuple leaf_columns_to_python(const A& a, size_t first, size_t count) {
  if (first > a.size() || count > a.size() - first)
    throw treecask::Error(treecask::ErrorCode::kInvalidArgument, a.path(), "",
                          std::to_string(count) + " leaves from index " + std::to_string(first) +
                              " run past the archive's " + std::to_string(a.size()));
  std::vector<nb::object> names(256);  // one str per dtype, shared by its leaves
  nb::list dtypes, shapes;
  std::string kinds(count, '\0'), has_metadata(count, '\0'), views(count, '\0');
  for (size_t k = 0; k < count; ++k) {
    treecask::LeafInfo li = a.leaf(first + k);
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

treecask::DType dtype_of(nb::handle name, const std::string& key_path) {
  std::string dtype = nb::cast<std::string>(name);
  std::optional<treecask::DType> dt = treecask::dtype_from_name(dtype);
  if (!dt)
    throw treecask::Error(treecask::ErrorCode::kInvalidArgument, "", key_path,
                          "unsupported dtype '" + dtype + "'");
  return *dt;
}

// {name: value} of every value of the enum E that the core's `name_of` names
// (values 0-255; a value whose name is that of 255, which no enum uses, is
// not one): every enum table of the package comes from the core this way.
template <class E, class NameOf>
nb::dict enum_table(NameOf name_of) {
  nb::dict d;
  const std::string_view unknown = name_of(static_cast<E>(255));
  for (int v = 0; v < 255; ++v)
    if (std::string_view name = name_of(static_cast<E>(v)); name != unknown)
      d[nb::str(name.data(), name.size())] = v;
  return d;
}

treecask::Verify to_verify(std::optional<bool> v) {
  if (!v) return treecask::Verify::kDefault;
  return *v ? treecask::Verify::kYes : treecask::Verify::kNo;
}

// A read-only uint8 view of `s` that keeps a copy of `a` (and so the map) alive.
nb::object make_view(const treecask::Archive& a, std::span<const std::byte> s) {
  auto* keep = new treecask::Archive(a);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<treecask::Archive*>(p); });
  static const std::byte kEmpty[64] = {};
  const void* data = s.empty() ? static_cast<const void*>(kEmpty) : s.data();
  return nb::cast(ByteView(data, {s.size()}, owner));
}

// ---- save arguments (save and save_async) ----------------------------------------

// The columns of one save call, parsed: the treedef, one LeafInput per leaf
// whose data points into the Python buffer held in `buffers` (same index), and
// the options. Destroy it with the GIL held (Buffer releases Py_buffers).
struct SaveCall {
  treecask::TreeDef def;
  std::vector<Buffer> buffers;
  std::vector<treecask::LeafInput> inputs;
  treecask::SaveOptions opt;
};

// The core's save inputs from a treecask._request.SaveRequest (its attributes:
// the treedef, one entry per leaf in each column, the options).
SaveCall parse_save_request(nb::handle request) {
  auto field = [&](const char* name) { return nb::getattr(request, name); };
  nb::list nodes = nb::cast<nb::list>(field("nodes")), key_paths = nb::cast<nb::list>(field("key_paths")),
           value_kinds = nb::cast<nb::list>(field("value_kinds")), dtypes = nb::cast<nb::list>(field("dtypes")),
           shapes = nb::cast<nb::list>(field("shapes")), datas = nb::cast<nb::list>(field("datas"));
  nb::dict extras = nb::cast<nb::dict>(field("extras"));
  SaveCall call;
  call.def = treedef_from_python(nodes);
  size_t n = key_paths.size();
  if (value_kinds.size() != n || dtypes.size() != n || shapes.size() != n || datas.size() != n)
    throw nb::value_error("save: one entry per leaf in every column");
  call.buffers.reserve(n);
  call.inputs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    treecask::LeafMeta& m = call.inputs[i].meta;
    m.key_path = nb::cast<std::string>(key_paths[i]);
    m.value_kind = static_cast<treecask::ValueKind>(nb::cast<int>(value_kinds[i]));
    m.dtype = dtype_of(dtypes[i], m.key_path);
    m.shape = nb::cast<std::vector<int64_t>>(shapes[i]);
    call.buffers.emplace_back(datas[i], false);
    call.inputs[i].data = {call.buffers.back().data(), call.buffers.back().size()};
  }
  for (auto [k, v] : extras) {
    size_t i = nb::cast<size_t>(k);
    if (i >= n) throw nb::index_error("save: extras names no leaf");
    nb::tuple t = nb::cast<nb::tuple>(v);
    treecask::LeafMeta& m = call.inputs[i].meta;
    m.logical_axes = nb::cast<std::vector<std::string>>(t[0]);
    m.sharding = sharding_from_python(t[1]);
    m.metadata = key_values_from_python(t[2]);
    if (t.size() > 3 && !t[3].is_none())  // format 3.0: shard references (file, key, start, stop)
      for (nb::handle r : t[3]) {
        nb::tuple rt = nb::cast<nb::tuple>(r);
        m.shards.push_back(treecask::ShardRef{nb::cast<std::string>(rt[0]), nb::cast<std::string>(rt[1]),
                                              nb::cast<std::vector<int64_t>>(rt[2]),
                                              nb::cast<std::vector<int64_t>>(rt[3])});
      }
  }
  treecask::SaveOptions& opt = call.opt;
  opt.compression = static_cast<treecask::Compression>(nb::cast<int>(field("compression")));
  if (auto v = field("chunk_size"); !v.is_none()) opt.chunk_size = nb::cast<uint64_t>(v);
  // The writer rounds max_part_bytes to whole chunks.
  if (auto v = field("max_part_bytes"); !v.is_none()) opt.max_part_bytes = nb::cast<uint64_t>(v);
  opt.threads = nb::cast<unsigned>(field("threads"));
  opt.overwrite = nb::cast<bool>(field("overwrite"));
  opt.durable = nb::cast<bool>(field("durable"));
  opt.shuffle = nb::cast<bool>(field("shuffle"));
  opt.metadata = key_values_from_python(field("metadata"));
  for (nb::handle f : field("shard_files")) {
    nb::tuple t = nb::cast<nb::tuple>(f);
    opt.shard_files.push_back({nb::cast<std::string>(t[0]), nb::cast<uint64_t>(t[1]), nb::cast<uint64_t>(t[2])});
  }
  return call;
}

nb::dict save_stats_to_python(const treecask::SaveStats& st) {
  nb::dict d;
  d["file_bytes"] = st.file_bytes;
  d["raw_bytes"] = st.raw_bytes;
  d["stored_bytes"] = st.stored_bytes;
  d["num_leaves"] = st.num_leaves;
  d["num_blobs"] = st.num_blobs;
  return d;
}

// A save running on treecask::save_async's thread, as seen from Python.
// Members are destroyed in reverse order: the future first (its destructor
// waits for the save), then the borrowed buffers the save was reading.
struct PendingSave {
  std::vector<Buffer> borrowed;
  std::future<treecask::SaveStats> future;
  std::optional<treecask::SaveStats> stats;
  std::exception_ptr error;

  bool done() const {
    return !future.valid() || future.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  nb::dict wait() {
    if (future.valid()) {
      nb::gil_scoped_release release;
      try {
        stats = future.get();
      } catch (...) {
        error = std::current_exception();
      }
    }
    borrowed.clear();  // the save no longer reads them (GIL held again)
    if (error) std::rethrow_exception(error);
    return save_stats_to_python(*stats);
  }
};

// ---- interop: Hugging Face safetensors layouts (src/interop/convert.h) ---------
//
// treecask.import_safetensors / export_safetensors call the routines
// `treecask import` / `treecask export --max-shard-size` call (the
// treecask_interop library), so the file format logic exists once.
void register_interop(nb::module_& m) {
  // import_safetensors(src, dst, compression, chunk_size, threads, shuffle, overwrite, durable)
  // -> {"kind", "index", "files", "stats": {...}}
  m.def(
      "import_safetensors",
      [](const std::string& src, const std::string& dst, int compression,
         std::optional<uint64_t> chunk_size, unsigned threads, bool shuffle, bool overwrite,
         bool durable) {
        treecask::SaveOptions opt;
        opt.compression = static_cast<treecask::Compression>(compression);
        if (chunk_size) opt.chunk_size = *chunk_size;
        opt.threads = threads;
        opt.shuffle = shuffle;
        opt.overwrite = overwrite;
        opt.durable = durable;
        treecask::interop::SafetensorsImport r;
        {
          nb::gil_scoped_release release;
          r = treecask::interop::import_safetensors(src, dst, opt);
        }
        nb::dict d;
        d["kind"] = r.kind;
        d["index"] = r.index;
        d["files"] = r.files;
        d["stats"] = save_stats_to_python(r.stats);
        return d;
      },
      "src"_a, "dst"_a, "compression"_a = 0, "chunk_size"_a = nb::none(), "threads"_a = 0,
      "shuffle"_a = false, "overwrite"_a = false, "durable"_a = true);
  // export_safetensors(src, dst_dir, max_shard_size, overwrite): `src` an
  // archive file or a sharded checkpoint directory (treecask::open_reader)
  // -> {"index", "shards", "num_tensors", "total_size"}
  m.def(
      "export_safetensors",
      [](const std::string& src, const std::string& dst, uint64_t max_shard_size, bool overwrite) {
        treecask::interop::SafetensorsExport r;
        {
          nb::gil_scoped_release release;
          treecask::interop::SafetensorsExportOptions opt;
          opt.max_shard_size = max_shard_size;
          opt.overwrite = overwrite;
          r = treecask::interop::export_safetensors(*treecask::open_reader(src), dst, opt);
        }
        nb::dict d;
        d["index"] = r.index;
        d["shards"] = r.files;
        d["num_tensors"] = r.num_tensors;
        d["total_size"] = r.total_size;
        return d;
      },
      "src"_a, "dst"_a, "max_shard_size"_a, "overwrite"_a = false);
  m.def("parse_size", [](const std::string& text) { return treecask::interop::parse_size(text); });
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "Private binding of the treecask C++ library; use the `treecask` package.";
  nb::register_exception_translator(&translate_error);

  m.attr("FORMAT_MAJOR") = treecask::kFormatMajor;
  m.attr("FORMAT_MINOR") = treecask::kFormatMinor;
  m.def("library_version", [] { return std::string(treecask::library_version()); });
  // Every dtype the core knows: its name, bits per element (treecask::dtype_bits) and
  // whether it is packed (treecask::dtype_packed: sub-byte, several elements per byte).
  // The Python package keeps only the NumPy / ml_dtypes objects; these numbers are the core's.
  m.def("dtype_names", [] {
    std::vector<std::string> names;
    for (int v = 0; v < 256; ++v)
      if (treecask::dtype_valid(static_cast<uint8_t>(v)))
        names.emplace_back(treecask::dtype_name(static_cast<treecask::DType>(v)));
    return names;
  });
  m.def("dtype_bits", [](nb::handle dtype) { return treecask::dtype_bits(dtype_of(dtype, "")); }, "dtype"_a,
        "Bits per element of a dtype name (treecask::dtype_bits); InvalidArgumentError if unknown.");
  m.def("dtype_packed", [](nb::handle dtype) { return treecask::dtype_packed(dtype_of(dtype, "")); },
        "dtype"_a, "True for the packed sub-byte dtypes (treecask::dtype_packed).");
  m.def(
      "byte_length_for",
      [](nb::handle dtype, std::vector<int64_t> shape) { return treecask::byte_length_for(dtype_of(dtype, ""), shape); },
      "dtype"_a, "shape"_a,
      "Bytes that `shape` elements of a dtype occupy in the file (treecask::byte_length_for: "
      "packed for sub-byte dtypes); InvalidArgumentError for an unknown dtype or a bad shape.");
  m.def(
      "pack_elements",
      [](nb::handle dtype, nb::handle elems, nb::handle out) {
        const treecask::DType dt = dtype_of(dtype, "");
        Buffer in(elems, false), dst(out, true);
        nb::gil_scoped_release release;
        treecask::pack_elements(dt, {in.data(), in.size()}, {dst.data(), dst.size()});
      },
      "dtype"_a, "elems"_a, "out"_a,
      "treecask::pack_elements: the elements of a packed sub-byte dtype name (`elems`, any "
      "C-contiguous buffer of one byte per element, as ml_dtypes holds them) packed into `out` "
      "(a writable C-contiguous buffer of byte_length_for(dtype, shape) bytes) as SPEC.md "
      "\"Dtypes\" stores them. InvalidArgumentError for a dtype that is not packed or a wrong "
      "output size. Releases the GIL.");
  // The numeric values of the enums the package passes across, by the core's names
  // (include/treecask/types.h, writer.h, error.h): treecask.errors' classes take their
  // names from ERROR_CODES by number.
  m.attr("NODE_KINDS") = enum_table<treecask::NodeKind>(treecask::node_kind_name);
  m.attr("VALUE_KINDS") = enum_table<treecask::ValueKind>(treecask::value_kind_name);
  m.attr("ERROR_CODES") = enum_table<treecask::ErrorCode>(treecask::error_code_name);
  m.attr("COMPRESSIONS") = enum_table<treecask::Compression>(treecask::compression_name);
  // The one commit path (include/treecask/commit.h), for the multi-process directory commit.
  m.def(
      "publish",
      [](const std::string& tmp, const std::string& path, bool overwrite, bool durable, const std::string& file) {
        nb::gil_scoped_release release;
        treecask::publish(tmp, path, overwrite, durable, file);
      },
      "tmp"_a, "path"_a, "overwrite"_a, "durable"_a, "file"_a);
  m.def(
      "remove_stale_temporaries",
      [](const std::string& path) {
        nb::gil_scoped_release release;
        treecask::remove_stale_temporaries(path);
      },
      "path"_a);
  m.def(
      "temporary_path", [](const std::string& path) { return treecask::temporary_path(path).string(); }, "path"_a);
  m.def("is_stale_temporary", &treecask::is_stale_temporary, "name"_a, "entry"_a);
  m.def(
      "sync_path",
      [](const std::string& p, const std::string& file) {
        nb::gil_scoped_release release;
        treecask::sync_path(p, file);
      },
      "path"_a, "file"_a);
  m.def("escape_key", &treecask::escape_key);
  m.def("join_key_path", &treecask::join_key_path);
  m.def("split_key_path", [](const std::string& p) { return treecask::split_key_path(p); });

  // ---- save (python/treecask/_save.py, _distributed.py) ----
  // save(path, request) -> SaveStats dict: one treecask::save of a
  // treecask._request.SaveRequest (its columns and options: see that class), the GIL
  // released while it runs.
  m.def(
      "save",
      [](const std::string& path, nb::handle request) {
        SaveCall call = parse_save_request(request);
        treecask::SaveStats st;
        {
          nb::gil_scoped_release release;
          st = treecask::save(path, call.def, call.inputs, call.opt);
        }
        return save_stats_to_python(st);
      },
      "path"_a, "request"_a);

  // ---- save_async (CheckpointManager, python/treecask/_manager.py) ----
  // save_async(path, request, borrowed, pool) -> PendingSave. borrowed: one bool per
  // leaf; the bytes of the other leaves are copied into one fresh buffer before the call
  // returns (treecask::save_async's snapshot, on `threads` threads, GIL released), so the
  // caller may then mutate or free them. A borrowed leaf's buffer is held by the
  // PendingSave until the save ends: pass only memory nobody will write (e.g. a host copy
  // of an accelerator array). pool: an optional SnapshotPool the snapshot buffer comes
  // from and returns to (treecask::SnapshotPool; its memory outlives the object while a save uses it).
  nb::class_<PendingSave>(m, "PendingSave")
      .def("done", &PendingSave::done,
           "True once the save has ended (successfully or not); never blocks.")
      .def("wait", &PendingSave::wait,
           "Blocks (GIL released) until the save ends; returns save()'s stats dict or raises "
           "its treecask error. May be called again: the same result.");
  nb::class_<treecask::SnapshotPool>(m, "SnapshotPool")
      .def(nb::init<>())
      .def_prop_ro("held_bytes", &treecask::SnapshotPool::held_bytes,
                   "Bytes of the idle snapshot buffer the pool holds now (0: none).")
      .def("clear", &treecask::SnapshotPool::clear, "Frees the idle buffer now.");
  m.def(
      "save_async",
      [](const std::string& path, nb::handle request, std::vector<bool> borrowed, treecask::SnapshotPool* pool) {
        SaveCall call = parse_save_request(request);
        if (borrowed.size() != call.inputs.size()) throw nb::value_error("save_async: one borrowed flag per leaf");
        std::unique_ptr<bool[]> flags(new bool[borrowed.size() + 1]);
        std::copy(borrowed.begin(), borrowed.end(), flags.get());
        auto pending = std::make_unique<PendingSave>();
        {
          nb::gil_scoped_release release;
          pending->future = treecask::save_async(path, call.def, call.inputs, call.opt,
                                                 std::span<const bool>(flags.get(), borrowed.size()), pool);
        }
        for (size_t i = 0; i < borrowed.size(); ++i)  // the copied ones are released on return
          if (borrowed[i]) pending->borrowed.push_back(std::move(call.buffers[i]));
        return pending.release();
      },
      nb::rv_policy::take_ownership,
      "path"_a, "request"_a, "borrowed"_a, "pool"_a.none() = nb::none());

  nb::class_<treecask::Archive>(m, "Archive")
      .def_static(
          "open",
          &open_with<treecask::Archive>,
          "path"_a, "verify_checksums"_a = true, "validate_structure"_a = true)
      .def_static(
          "open_source",
          [](nb::object source, bool verify_checksums) {
            auto src = std::make_shared<PySource>(std::move(source));
            nb::gil_scoped_release release;
            return treecask::Archive::open(src, open_options(verify_checksums));
          },
          "source"_a, "verify_checksums"_a = true)
      .def_prop_ro("path", &treecask::Archive::path)
      .def_prop_ro("file_size", &treecask::Archive::file_size)
      .def_prop_ro("format_version",
                   [](const treecask::Archive& a) {
                     return std::make_pair(a.format_major(), a.format_minor());
                   })
      .def_prop_ro("library_version", &treecask::Archive::library_version)
      .def_prop_ro("created_unix_ns", &treecask::Archive::created_unix_ns)
      .def_prop_ro("metadata",
                   [](const treecask::Archive& a) { return key_values_to_python(a.metadata()); })
      .def_prop_ro("treedef",
                   [](const treecask::Archive& a) { return treedef_to_python(a.treedef()); })
      .def_prop_ro("manifest_fingerprint",
                   [](const treecask::Archive& a) {
                     treecask::ShardFile f = a.manifest_fingerprint();
                     return std::make_tuple(f.file, f.manifest_length, f.manifest_checksum);
                   })
      .def("__len__", &treecask::Archive::size)
      .def("leaf",
           [](const treecask::Archive& a, size_t i) {
             check_index(a, i);
             return leaf_info_to_dict(a.leaf(i));
           })
      .def("leaves",
           [](const treecask::Archive& a) {
             nb::list out;
             for (size_t i = 0; i < a.size(); ++i) out.append(leaf_info_to_dict(a.leaf(i)));
             return out;
           })
      .def("find",
           [](const treecask::Archive& a, const std::string& k) { return a.find(k); })
      .def("index_of",
           [](const treecask::Archive& a, const std::string& k) { return a.index_of(k); })
      .def("subtree",
           [](const treecask::Archive& a, const std::string& k) { return a.subtree(k); })
      .def(
          "view",
          [](const treecask::Archive& a, size_t i, std::optional<bool> verify) {
            check_index(a, i);
            std::span<const std::byte> s;
            {
              nb::gil_scoped_release release;
              s = a.view(i, to_verify(verify));
            }
            return make_view(a, s);
          },
          "index"_a, "verify"_a = nb::none())
      .def(
          "view_parts",
          [](const treecask::Archive& a, size_t i, std::optional<bool> verify) {
            check_index(a, i);
            std::vector<std::span<const std::byte>> parts;
            {
              nb::gil_scoped_release release;
              parts = a.view_parts(i, to_verify(verify));
            }
            nb::list out;
            for (auto s : parts) out.append(make_view(a, s));
            return out;
          },
          "index"_a, "verify"_a = nb::none())
      .def(
          "view_many",
          [](const treecask::Archive& a, const std::vector<size_t>& indices, std::optional<bool> verify) {
            for (size_t i : indices) check_index(a, i);
            std::vector<std::optional<std::span<const std::byte>>> spans;
            {
              nb::gil_scoped_release release;
              spans = a.view_many(indices, to_verify(verify));
            }
            // One owner for all the views: a heap copy of the Archive (the map).
            auto* keep = new treecask::Archive(a);
            nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<treecask::Archive*>(p); });
            static const std::byte kEmpty[64] = {};
            nb::list out;
            for (const auto& s : spans) {
              if (!s) {
                out.append(nb::none());
                continue;
              }
              const void* data = s->empty() ? static_cast<const void*>(kEmpty) : s->data();
              out.append(nb::cast(ByteView(data, {s->size()}, owner)));
            }
            return out;
          },
          "indices"_a, "verify"_a = nb::none(),
          "Archive::view_many: read-only uint8 views of the mapped file, one per index (None for "
          "a leaf with no zero-copy view: LZ4 or several parts), every chunk checksummed once by "
          "all cores (GIL released). The views keep the map alive.")
      .def("leaf_columns", &leaf_columns_to_python<treecask::Archive>, "first"_a, "count"_a,
          "Leaves [first, first + count) as columns: (dtype names, shapes as tuples, value kinds "
          "as bytes, 1/0 per leaf as bytes: whether it has leaf metadata, 1/0 per leaf as bytes: "
          "whether the package views it in the map (LeafInfo::zero_copy)). InvalidArgumentError when the "
          "range runs past the archive.")
      .def(
          "subtree_nodes",
          [](const treecask::Archive& a, const std::vector<std::string>& components) {
            return subtree_nodes_to_python(a.treedef(), components);
          },
          "components"_a,
          "The subtree at `components` (unescaped key path components; the first child of that "
          "name at each level): (index of its first leaf, number of leaves, its treedef nodes in "
          "pre-order), or None. Costs the nodes before it in C++ and its own nodes in Python.")
      .def(
          "read",
          [](const treecask::Archive& a, size_t i, nb::handle out, std::optional<bool> verify) {
            check_index(a, i);
            Buffer buf(out, true);
            nb::gil_scoped_release release;
            a.read(i, {buf.data(), buf.size()}, to_verify(verify));
          },
          "index"_a, "out"_a, "verify"_a = nb::none())
      .def(
          "read_many",
          [](const treecask::Archive& a, const std::vector<size_t>& indices, nb::list outs,
             std::optional<bool> verify) {
            if (indices.size() != outs.size()) throw nb::value_error("one output per index");
            std::vector<Buffer> bufs;  // reserved: never moved once held
            std::vector<std::span<std::byte>> spans;
            bufs.reserve(outs.size());
            spans.reserve(outs.size());
            for (size_t k = 0; k < indices.size(); ++k) {
              check_index(a, indices[k]);
              bufs.emplace_back(outs[k], true);
              spans.emplace_back(bufs.back().data(), bufs.back().size());
            }
            nb::gil_scoped_release release;
            a.read_many(indices, spans, to_verify(verify));
          },
          "indices"_a, "outs"_a, "verify"_a = nb::none(),
          "Copies many leaves at once (Archive::read_many): all chunks shared among all cores, "
          "pread() from the page cache, checksummed in the same pass. outs[k] must be a writable "
          "C-contiguous buffer (e.g. a NumPy array) of exactly leaf indices[k]'s byte length.")
      .def(
          "read_rows",
          [](const treecask::Archive& a, size_t i, int64_t begin, int64_t end, nb::handle out,
             std::optional<bool> verify) {
            check_index(a, i);
            Buffer buf(out, true);
            nb::gil_scoped_release release;
            a.read_rows(i, begin, end, {buf.data(), buf.size()}, to_verify(verify));
          },
          "index"_a, "row_begin"_a, "row_end"_a, "out"_a, "verify"_a = nb::none())
      // ---- slice reads: N-d boxes of a leaf (Archive::read_slice / read_slices) ----
      .def(
          "read_slice",
          [](const treecask::Archive& a, size_t i, const std::vector<int64_t>& start,
             const std::vector<int64_t>& stop, nb::handle out, std::optional<bool> verify,
             unsigned threads) {
            check_index(a, i);
            SliceDest dest(out);
            treecask::Archive::SliceRequest q = dest.request(a, i, start, stop);
            nb::gil_scoped_release release;
            a.read_slices(i, std::span(&q, 1), to_verify(verify), threads);
          },
          "index"_a, "start"_a, "stop"_a, "out"_a, "verify"_a = nb::none(), "threads"_a = 0,
          "Archive::read_slice: elements start[d] <= i_d < stop[d] of leaf `index` into `out`, any "
          "writable buffer: C-contiguous of exactly the box's bytes (sub-byte dtypes: one byte per "
          "element), or a strided view of the box's shape (NumPy strides, negative allowed). "
          "Releases the GIL; threads 0 = all cores for reads of >= 8 MiB of chunks.")
      .def(
          "read_slices",
          [](const treecask::Archive& a, size_t i, const std::vector<std::vector<int64_t>>& starts,
             const std::vector<std::vector<int64_t>>& stops, nb::list outs, std::optional<bool> verify,
             unsigned threads) {
            check_index(a, i);
            if (starts.size() != stops.size() || starts.size() != outs.size())
              throw nb::value_error("read_slices: one start, stop and output per box");
            std::vector<SliceDest> dests;  // reserved: never moved once held
            std::vector<treecask::Archive::SliceRequest> reqs;
            dests.reserve(outs.size());
            for (size_t k = 0; k < starts.size(); ++k) {
              dests.emplace_back(outs[k]);
              reqs.push_back(dests.back().request(a, i, starts[k], stops[k]));
            }
            nb::gil_scoped_release release;
            a.read_slices(i, reqs, to_verify(verify), threads);
          },
          "index"_a, "starts"_a, "stops"_a, "outs"_a, "verify"_a = nb::none(), "threads"_a = 0,
          "Archive::read_slices: several boxes of one leaf (outs[k] as read_slice's out), each "
          "chunk decoded and checksummed once for all of them. Releases the GIL.")
      .def(
          "read_bytes",
          [](const treecask::Archive& a, size_t i, uint64_t offset, nb::handle out,
             std::optional<bool> verify) {
            check_index(a, i);
            Buffer buf(out, true);
            nb::gil_scoped_release release;
            a.read_bytes(i, offset, {buf.data(), buf.size()}, to_verify(verify));
          },
          "index"_a, "offset"_a, "out"_a, "verify"_a = nb::none(),
          "Archive::read_bytes: raw leaf bytes [offset, offset + len(out)) into a writable "
          "C-contiguous buffer (sub-byte dtypes stay packed). Releases the GIL.")
      .def("verify", &verify_to_python<treecask::Archive>);

  register_interop(m);  // interop block above

  // ---- sharded checkpoints (format 3.0; include/treecask/sharded.h) ----------
  m.def("is_sharded", [](const std::string& path) { return treecask::ShardedArchive::is_sharded(path); });
  m.def("is_url", [](const std::string& s) { return treecask::is_url(s); });
  nb::class_<treecask::ShardedArchive>(m, "ShardedArchive")
      .def_static(
          "open",
          &open_with<treecask::ShardedArchive>,
          "path"_a, "verify_checksums"_a = true, "validate_structure"_a = true)
      .def_static(
          "open_sources",
          [](nb::object opener, const std::string& shown, bool verify_checksums) {
            // The opener is called from the open's threads: each call takes the GIL.
            auto open_object = [opener](const std::string& name) -> std::shared_ptr<const treecask::Source> {
              nb::gil_scoped_acquire gil;
              try {
                return std::make_shared<PySource>(opener(name));
              } catch (nb::python_error& e) {
                throw error_from_python(e, name);
              }
            };
            nb::gil_scoped_release release;
            return treecask::ShardedArchive::open(open_object, shown, open_options(verify_checksums));
          },
          "opener"_a, "shown"_a, "verify_checksums"_a = true)
      .def_prop_ro("path", &treecask::ShardedArchive::path)
      .def_prop_ro("index", [](const treecask::ShardedArchive& s) { return s.index(); })
      // The read methods of Archive above, over the global leaves: the checkpoint's facts, its
      // treedef and key lookups are the index archive's; leaves are assembled from the saved
      // boxes, so none has a view of a map.
      .def_prop_ro("format_version",
                   [](const treecask::ShardedArchive& s) {
                     return std::make_pair(s.index().format_major(), s.index().format_minor());
                   })
      .def_prop_ro("library_version", [](const treecask::ShardedArchive& s) { return s.index().library_version(); })
      .def_prop_ro("created_unix_ns", [](const treecask::ShardedArchive& s) { return s.index().created_unix_ns(); })
      .def_prop_ro("metadata",
                   [](const treecask::ShardedArchive& s) { return key_values_to_python(s.metadata()); })
      .def_prop_ro("treedef",
                   [](const treecask::ShardedArchive& s) { return treedef_to_python(s.treedef()); })
      .def("__len__", &treecask::ShardedArchive::size)
      .def("files", &treecask::ShardedArchive::files)
      .def("file", [](const treecask::ShardedArchive& s, const std::string& name) { return s.file(name); })
      .def("leaf", [](const treecask::ShardedArchive& s, size_t i) { return leaf_info_to_dict(s.leaf(i)); })
      .def("find", [](const treecask::ShardedArchive& s, const std::string& k) { return s.find(k); })
      .def("index_of",
           [](const treecask::ShardedArchive& s, const std::string& k) { return s.index().index_of(k); })
      .def(
          "subtree_nodes",
          [](const treecask::ShardedArchive& s, const std::vector<std::string>& components) {
            return subtree_nodes_to_python(s.treedef(), components);
          },
          "components"_a, "As Archive.subtree_nodes, over the index's treedef.")
      .def("leaf_columns", &leaf_columns_to_python<treecask::ShardedArchive>, "first"_a, "count"_a,
           "As Archive.leaf_columns, of the global leaves (never viewed in a map).")
      .def(
          "view_many",
          [](const treecask::ShardedArchive& s, const std::vector<size_t>& indices, std::optional<bool>) {
            for (size_t i : indices) check_index(s, i);
            nb::list out;
            for (size_t k = 0; k < indices.size(); ++k) out.append(nb::none());
            return out;
          },
          "indices"_a, "verify"_a = nb::none(),
          "As Archive.view_many: None for every leaf (a sharded leaf has no view of a map).")
      .def(
          "read",
          [](const treecask::ShardedArchive& s, size_t i, nb::handle out, std::optional<bool> verify) {
            Buffer buf(out, true);
            nb::gil_scoped_release release;
            s.read(i, {buf.data(), buf.size()}, to_verify(verify));
          },
          "index"_a, "out"_a, "verify"_a = nb::none())
      .def(
          "read_many",
          [](const treecask::ShardedArchive& s, const std::vector<size_t>& indices, nb::list outs,
             std::optional<bool> verify) {
            if (indices.size() != outs.size()) throw nb::value_error("one output per index");
            std::vector<Buffer> bufs;  // reserved: never moved once held
            std::vector<std::span<std::byte>> spans;
            bufs.reserve(outs.size());
            spans.reserve(outs.size());
            for (size_t k = 0; k < indices.size(); ++k) {
              check_index(s, indices[k]);
              bufs.emplace_back(outs[k], true);
              spans.emplace_back(bufs.back().data(), bufs.back().size());
            }
            nb::gil_scoped_release release;
            s.read_many(indices, spans, to_verify(verify));
          },
          "indices"_a, "outs"_a, "verify"_a = nb::none(),
          "As Archive.read_many (outs[k]: a writable C-contiguous buffer of exactly leaf "
          "indices[k]'s byte length), one ShardedArchive::read per leaf. Releases the GIL.")
      .def(
          "read_slice",
          [](const treecask::ShardedArchive& s, size_t i, std::vector<int64_t> start, std::vector<int64_t> stop,
             nb::handle out, std::optional<std::vector<int64_t>> strides, std::optional<bool> verify) {
            Buffer buf(out, true);
            std::vector<int64_t> st = strides.value_or(std::vector<int64_t>{});
            nb::gil_scoped_release release;
            s.read_slice(i, start, stop, {buf.data(), buf.size()}, st, to_verify(verify));
          },
          "index"_a, "start"_a, "stop"_a, "out"_a, "out_byte_strides"_a = nb::none(), "verify"_a = nb::none(),
          "Copies the hyperslab [start, stop) of the global array of leaf `index` into `out` (a writable "
          "C-contiguous buffer; C order unless out_byte_strides is given).")
      .def(
          "read_slices",
          [](const treecask::ShardedArchive& s, size_t i, const std::vector<std::vector<int64_t>>& starts,
             const std::vector<std::vector<int64_t>>& stops, nb::list outs, std::optional<bool> verify) {
            check_index(s, i);
            if (starts.size() != stops.size() || starts.size() != outs.size())
              throw nb::value_error("read_slices: one start, stop and output per box");
            std::vector<Buffer> bufs;  // reserved: never moved once held
            std::vector<treecask::SliceRequest> reqs;
            bufs.reserve(outs.size());
            for (size_t k = 0; k < outs.size(); ++k) {
              bufs.emplace_back(outs[k], true);
              reqs.push_back({starts[k], stops[k], {bufs.back().data(), bufs.back().size()}, {}});
            }
            nb::gil_scoped_release release;
            s.read_slices(i, reqs, to_verify(verify));
          },
          "index"_a, "starts"_a, "stops"_a, "outs"_a, "verify"_a = nb::none(),
          "As Archive.read_slices (outs[k]: a writable C-contiguous buffer of box k), one "
          "ShardedArchive::read_slice per box. Releases the GIL.")
      .def("verify", &verify_to_python<treecask::ShardedArchive>);
}
