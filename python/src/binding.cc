// treecask._core's conversions: the core's errors as treecask.errors
// instances, and its values (treedefs, key-values, shardings, dtype names,
// save stats) as plain Python values and back.
#include "binding.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace treecask_py {

// ---- errors -------------------------------------------------------------------

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

treecask::DType dtype_of(nb::handle name, const std::string& key_path) {
  std::string dtype = nb::cast<std::string>(name);
  std::optional<treecask::DType> dt = treecask::dtype_from_name(dtype);
  if (!dt)
    throw treecask::Error(treecask::ErrorCode::kInvalidArgument, "", key_path,
                          "unsupported dtype '" + dtype + "'");
  return *dt;
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

}  // namespace treecask_py
