// treecask._core: the nanobind binding of the public C++ API.
//
// This layer is deliberately thin and private: it moves plain Python values
// (tuples, lists, dicts, uint8 arrays) across the boundary and leaves every
// pytree decision to the pure-Python package (python/treecask/*.py). It never
// parses the file itself and holds no rule of its own: the core checks every
// leaf index and request and says which leaves are views (LeafInfo::zero_copy);
// the binding checks only that the Python values it converts have the form
// the conversion needs (one output per box, four fields per treedef node...)
// (docs/design.md "Layers").
//
// Files: this one is the module entry (constants, dtypes, the enum tables, the
// commit path, key paths); binding.{h,cc} the conversions and errors the
// others share; readers.cc Archive and ShardedArchive (one read API, bound
// once); save.cc save and save_async; source.cc a Python object as a core
// Source; interop.cc the safetensors routines; signing.cc sign and
// verify_signature.
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
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "binding.h"

namespace treecask_py {
namespace {

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

}  // namespace
}  // namespace treecask_py

NB_MODULE(_core, m) {
  using namespace treecask_py;
  using namespace nb::literals;
  m.doc() = "Private binding of the treecask C++ library; use the `treecask` package.";
  nb::register_exception_translator(&translate_error);

  m.attr("FORMAT_MAJOR") = treecask::kFormatMajor;
  m.attr("FORMAT_MINOR") = treecask::kFormatMinor;
  // What a remote open's first read asks for (source.h): the object's first and last bytes.
  m.attr("OPEN_HEAD_BYTES") = treecask::kOpenHeadBytes;
  m.attr("OPEN_TAIL_BYTES") = treecask::kOpenTailBytes;
  // The transport rules of both transports (remote.h): the URL schemes treecask knows,
  // ranges in flight per object, and the retry policy obstore's retry_config is built from.
  {
    nb::list schemes;
    for (std::string_view s : treecask::kUrlSchemes) schemes.append(nb::str(s.data(), s.size()));
    m.attr("URL_SCHEMES") = nb::steal(PyList_AsTuple(schemes.ptr()));
  }
  m.attr("OBJECT_CONCURRENCY") = treecask::kObjectConcurrency;
  // The environment-to-config table of both transports (remote.h kEnvOptions): one
  // (scheme, option, (variable, ...)) per row, variables in order of precedence.
  {
    nb::list rows;
    for (const treecask::EnvOption& row : treecask::kEnvOptions) {
      nb::list vars;
      for (std::string_view v : row.variables)
        if (!v.empty()) vars.append(nb::str(v.data(), v.size()));
      rows.append(nb::make_tuple(nb::str(row.scheme.data(), row.scheme.size()),
                                 nb::str(row.option.data(), row.option.size()),
                                 nb::steal(PyList_AsTuple(vars.ptr()))));
    }
    m.attr("ENV_OPTIONS") = nb::steal(PyList_AsTuple(rows.ptr()));
  }
  m.def(
      "options_from_env",
      [](const std::string& scheme) {
        nb::dict d;
        for (const auto& [k, v] : treecask::options_from_env(scheme)) d[nb::str(k.data(), k.size())] = v;
        return d;
      },
      "scheme"_a,
      "treecask::options_from_env: {option: value} that ENV_OPTIONS gives the URLs of `scheme` (\"s3\", "
      "\"gs\", \"http\", \"https\"; \"az\" has none) from this process's environment now (os.environ: "
      "Python's putenv), the first set and non-empty variable of each row winning. storage_options "
      "override it key by key. Holds secrets: never print it. Raises nothing.");
  // The classification of failed HTTP answers both transports share (remote.h).
  {
    nb::list statuses;
    for (long st = 100; st < 600; ++st)
      if (treecask::is_retryable_status(st)) statuses.append(st);
    m.attr("RETRYABLE_STATUSES") = nb::steal(PyList_AsTuple(statuses.ptr()));
  }
  m.def(
      "http_error_code",
      [](long status, std::string_view s3_code, bool create_only) {
        return std::string(treecask::error_code_name(treecask::http_error_code(status, s3_code, create_only)));
      },
      "status"_a, "s3_code"_a = "", nb::kw_only(), "create_only"_a = false,
      "treecask::http_error_code: the name (an ERROR_CODES key: \"not found\", \"already exists\", "
      "\"corruption\", \"I/O error\"...) of the error a final HTTP answer `status` (int) means, with the "
      "S3 error <Code> `s3_code`, to a read pinned to a version or, with create_only, to a put that "
      "must not replace an object: 404/410 not found; 412 already exists (create_only) or corruption "
      "(the object changed); 409 ConditionalRequestConflict already exists (create_only); 416 "
      "corruption; anything else an I/O error. RETRYABLE_STATUSES are retried first. Raises nothing.");
  // The name of a multi-process checkpoint's index (sharded.h kShardedIndexName),
  // created last: its presence commits the checkpoint.
  m.attr("INDEX_NAME") = std::string(treecask::kShardedIndexName);
  {
    const treecask::RetryPolicy& r = treecask::kRetryPolicy;
    nb::dict d;
    d["max_retries"] = r.max_retries;
    d["initial_backoff_s"] = r.initial_backoff_s;
    d["max_backoff_s"] = r.max_backoff_s;
    d["backoff_base"] = r.backoff_base;
    d["timeout_s"] = r.timeout_s;
    // Per attempt (RemoteOptions' defaults): seconds to connect, and without progress.
    const treecask::RemoteOptions o;
    d["connect_timeout_s"] = o.connect_timeout_s;
    d["stall_timeout_s"] = o.stall_timeout_s;
    m.attr("RETRY_POLICY") = d;
  }
  m.def("library_version", [] { return std::string(treecask::library_version()); });
  // Every dtype the core knows (its enum table's names, by value): its name, bits per
  // element (treecask::dtype_bits) and whether it is packed (treecask::dtype_packed:
  // sub-byte, several elements per byte). The Python package keeps only the NumPy /
  // ml_dtypes objects; these numbers are the core's.
  m.def("dtype_names", [] {
    std::vector<std::string> names;
    for (auto [name, value] : enum_table<treecask::DType>(treecask::dtype_name))
      names.push_back(nb::cast<std::string>(name));
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
  m.def("is_stale_temporary", &treecask::is_stale_temporary, "name"_a, "entry"_a,
        "treecask::is_stale_temporary: whether `entry` is a temporary of `name` (parse_temporary_name's "
        "grammar, target `name`) made on this host by a process that no longer runs.");
  // The temporary-name grammar (commit.h parse_temporary_name: SPEC.md "Atomic commit" step 4).
  m.def("is_temporary_name", &treecask::is_temporary_name, "name"_a,
        "treecask::is_temporary_name: whether `name` (one path component: a file or directory name, "
        "or one part of an object key split at '/') is a temporary a treecask writer makes or made: "
        "<target>.tmp.<host>.<pid>.<hex16> (temporary_path), <target>.tmp.<pid>.<x> or "
        "<target>.tmpdir.<host>.<pid>.<x> (earlier writers). Raises nothing.");
  m.def(
      "parse_temporary_name",
      [](std::string_view name) -> nb::object {
        std::optional<treecask::TemporaryName> t = treecask::parse_temporary_name(name);
        if (!t) return nb::none();
        nb::dict d;
        d["target"] = std::string(t->target);
        d["kind"] = std::string(t->kind);
        d["host"] = std::string(t->host);
        d["pid"] = t->pid;
        d["random"] = std::string(t->random);
        return d;
      },
      "name"_a,
      "treecask::parse_temporary_name: {'target', 'kind', 'host', 'pid', 'random'} of the temporary "
      "`name` (is_temporary_name), or None: target the final name it stands for, kind \".tmp.\" or "
      "\".tmpdir.\", host the writer's host name (\"\" in the oldest form), pid its process id (int). "
      "Whether that writer is gone is host == host_name() and no process pid (is_stale_temporary). "
      "Raises nothing.");
  m.def("host_name", &treecask::host_name,
        "treecask::host_name: this host's name as temporary names carry it (gethostname; \"localhost\" "
        "when it has none).");
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

  register_save(m);      // save.cc
  register_readers(m);   // readers.cc
  register_interop(m);   // interop.cc
  register_signing(m);   // signing.cc
#ifdef TREECASK_PY_TOOL
  register_tool(m);      // tool.cc
#endif
}
