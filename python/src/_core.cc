// treecask._core: the nanobind binding of the public C++ API.
//
// This layer is deliberately thin and private: it moves plain Python values
// (tuples, lists, dicts, uint8 arrays) across the boundary and leaves every
// pytree decision to the pure-Python package (python/treecask/*.py). It never
// parses the file itself (docs/design.md "Layers").
//
// Conventions:
//   * a treedef is a list of (kind, arity, type_name, keys) tuples in pre-order;
//   * leaf metadata is a dict (see leaf_info_to_dict / meta_from_dict);
//   * leaf bytes cross as 1-d uint8 arrays; the Python side views them with
//     the real dtype. Zero-copy views are read-only and own a heap copy of the
//     Archive, so the mapping outlives the Python Archive object;
//   * every treecask::Error becomes the treecask.errors class of its code
//     (built by treecask.errors._from_core), keeping .file / .key_path.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "treecask/treecask.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using ByteArrayIn = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using ByteArrayOut = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using ByteView = nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>, nb::c_contig>;

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

// ---- conversions --------------------------------------------------------------

nb::list treedef_to_python(const treecask::TreeDef& def) {
  nb::list out;
  for (const treecask::TreeNode& n : def) {
    nb::list keys;
    for (const std::string& k : n.keys) keys.append(nb::str(k.data(), k.size()));
    out.append(nb::make_tuple(static_cast<int>(n.kind), n.arity,
                              nb::str(n.type_name.data(), n.type_name.size()), keys));
  }
  return out;
}

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
  d["chunk_size"] = li.chunk_size;
  d["num_chunks"] = li.num_chunks;
  d["num_parts"] = li.num_parts;
  return d;
}

// meta: dict with key_path, value_kind, dtype, shape, logical_axes, sharding, metadata.
treecask::LeafMeta meta_from_dict(nb::dict d) {
  treecask::LeafMeta m;
  m.key_path = nb::cast<std::string>(d["key_path"]);
  m.value_kind = static_cast<treecask::ValueKind>(nb::cast<int>(d["value_kind"]));
  std::string dtype = nb::cast<std::string>(d["dtype"]);
  std::optional<treecask::DType> dt = treecask::dtype_from_name(dtype);
  if (!dt)
    throw treecask::Error(treecask::ErrorCode::kInvalidArgument, "", m.key_path,
                          "unsupported dtype '" + dtype + "'");
  m.dtype = *dt;
  m.shape = nb::cast<std::vector<int64_t>>(d["shape"]);
  if (d.contains("logical_axes"))
    m.logical_axes = nb::cast<std::vector<std::string>>(d["logical_axes"]);
  if (d.contains("sharding")) m.sharding = sharding_from_python(d["sharding"]);
  if (d.contains("metadata")) m.metadata = key_values_from_python(d["metadata"]);
  return m;
}

treecask::Verify to_verify(std::optional<bool> v) {
  if (!v) return treecask::Verify::kDefault;
  return *v ? treecask::Verify::kYes : treecask::Verify::kNo;
}

std::span<std::byte> out_span(ByteArrayOut& out) {
  return {reinterpret_cast<std::byte*>(out.data()), out.shape(0)};
}

// A read-only uint8 view of `s` that keeps a copy of `a` (and so the map) alive.
nb::object make_view(const treecask::Archive& a, std::span<const std::byte> s) {
  auto* keep = new treecask::Archive(a);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<treecask::Archive*>(p); });
  static const std::byte kEmpty[64] = {};
  const void* data = s.empty() ? static_cast<const void*>(kEmpty) : s.data();
  return nb::cast(ByteView(data, {s.size()}, owner));
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "Private binding of the treecask C++ library; use the `treecask` package.";
  nb::register_exception_translator(&translate_error);

  m.attr("FORMAT_MAJOR") = treecask::kFormatMajor;
  m.attr("FORMAT_MINOR") = treecask::kFormatMinor;
  m.def("library_version", [] { return std::string(treecask::library_version()); });
  m.def("dtype_names", [] {
    std::vector<std::string> names;
    for (int v = 0; v < 256; ++v)
      if (treecask::dtype_valid(static_cast<uint8_t>(v)))
        names.emplace_back(treecask::dtype_name(static_cast<treecask::DType>(v)));
    return names;
  });
  m.def("byte_length_for", [](const std::string& dtype, std::vector<int64_t> shape) {
    std::optional<treecask::DType> dt = treecask::dtype_from_name(dtype);
    if (!dt)
      throw treecask::Error(treecask::ErrorCode::kInvalidArgument, "", "",
                            "unsupported dtype '" + dtype + "'");
    return treecask::byte_length_for(*dt, shape);
  });
  m.def("escape_key", &treecask::escape_key);
  m.def("join_key_path", &treecask::join_key_path);
  m.def("split_key_path", [](const std::string& p) { return treecask::split_key_path(p); });

  // save(path, treedef, leaves, compression, chunk_size, threads, overwrite, durable, metadata)
  // leaves: list of (meta dict, uint8 array, compression int or None).
  m.def(
      "save",
      [](const std::string& path, nb::list nodes, nb::list leaves, int compression,
         std::optional<uint64_t> chunk_size, unsigned threads, bool overwrite, bool durable,
         nb::handle metadata, std::optional<uint64_t> max_part_bytes) {
        treecask::TreeDef def = treedef_from_python(nodes);
        std::vector<ByteArrayIn> keep;  // holds every buffer for the whole call
        std::vector<treecask::LeafInput> inputs;
        keep.reserve(leaves.size());
        inputs.reserve(leaves.size());
        for (nb::handle item : leaves) {
          nb::tuple t = nb::cast<nb::tuple>(item);
          treecask::LeafInput in;
          in.meta = meta_from_dict(nb::cast<nb::dict>(t[0]));
          keep.push_back(nb::cast<ByteArrayIn>(t[1]));
          const ByteArrayIn& arr = keep.back();
          in.data = {reinterpret_cast<const std::byte*>(arr.data()), arr.shape(0)};
          if (!t[2].is_none())
            in.compression = static_cast<treecask::Compression>(nb::cast<int>(t[2]));
          inputs.push_back(std::move(in));
        }
        treecask::SaveOptions opt;
        opt.compression = static_cast<treecask::Compression>(compression);
        if (chunk_size) {
          opt.chunk_size = *chunk_size;
          // Keep the default part size a whole number of chunks.
          if (*chunk_size > 0 && !max_part_bytes)
            opt.max_part_bytes = std::max<uint64_t>(opt.max_part_bytes / *chunk_size, 1) * *chunk_size;
        }
        if (max_part_bytes) opt.max_part_bytes = *max_part_bytes;
        opt.threads = threads;
        opt.overwrite = overwrite;
        opt.durable = durable;
        opt.metadata = key_values_from_python(metadata);
        treecask::SaveStats st;
        {
          nb::gil_scoped_release release;
          st = treecask::save(path, def, inputs, opt);
        }
        nb::dict d;
        d["file_bytes"] = st.file_bytes;
        d["raw_bytes"] = st.raw_bytes;
        d["stored_bytes"] = st.stored_bytes;
        d["num_leaves"] = st.num_leaves;
        d["num_blobs"] = st.num_blobs;
        return d;
      },
      "path"_a, "treedef"_a, "leaves"_a, "compression"_a = 0, "chunk_size"_a = nb::none(),
      "threads"_a = 0, "overwrite"_a = false, "durable"_a = true, "metadata"_a = nb::none(),
      "max_part_bytes"_a = nb::none());

  nb::class_<treecask::Archive>(m, "Archive")
      .def_static(
          "open",
          [](const std::string& path, bool verify_checksums, bool validate_structure) {
            treecask::OpenOptions o;
            o.verify_checksums = verify_checksums;
            o.validate_structure = validate_structure;
            nb::gil_scoped_release release;
            return treecask::Archive::open(path, o);
          },
          "path"_a, "verify_checksums"_a = true, "validate_structure"_a = true)
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
      .def("__len__", &treecask::Archive::size)
      .def("leaf",
           [](const treecask::Archive& a, size_t i) {
             if (i >= a.size()) throw nb::index_error("leaf index out of range");
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
            if (i >= a.size()) throw nb::index_error("leaf index out of range");
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
            if (i >= a.size()) throw nb::index_error("leaf index out of range");
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
          "read",
          [](const treecask::Archive& a, size_t i, ByteArrayOut out, std::optional<bool> verify) {
            if (i >= a.size()) throw nb::index_error("leaf index out of range");
            nb::gil_scoped_release release;
            a.read(i, out_span(out), to_verify(verify));
          },
          "index"_a, "out"_a, "verify"_a = nb::none())
      .def(
          "read_many",
          [](const treecask::Archive& a, const std::vector<size_t>& indices, std::vector<ByteArrayOut> outs,
             std::optional<bool> verify) {
            if (indices.size() != outs.size()) throw nb::value_error("one output per index");
            std::vector<std::span<std::byte>> spans;
            spans.reserve(outs.size());
            for (size_t k = 0; k < outs.size(); ++k) {
              if (indices[k] >= a.size()) throw nb::index_error("leaf index out of range");
              spans.push_back(out_span(outs[k]));
            }
            nb::gil_scoped_release release;
            a.read_many(indices, spans, to_verify(verify));
          },
          "indices"_a, "outs"_a, "verify"_a = nb::none(),
          "Copies many leaves at once (Archive::read_many): all chunks shared among all cores, "
          "pread() from the page cache, checksummed in the same pass. outs[k] must be a 1-D uint8 "
          "array of exactly leaf indices[k]'s byte length.")
      .def(
          "read_rows",
          [](const treecask::Archive& a, size_t i, int64_t begin, int64_t end, ByteArrayOut out,
             std::optional<bool> verify) {
            if (i >= a.size()) throw nb::index_error("leaf index out of range");
            nb::gil_scoped_release release;
            a.read_rows(i, begin, end, out_span(out), to_verify(verify));
          },
          "index"_a, "row_begin"_a, "row_end"_a, "out"_a, "verify"_a = nb::none())
      .def("verify", [](const treecask::Archive& a) {
        std::vector<treecask::Error> errors;
        {
          nb::gil_scoped_release release;
          errors = a.verify();
        }
        nb::list out;
        for (const treecask::Error& e : errors) out.append(error_to_python(e));
        return out;
      });
}
