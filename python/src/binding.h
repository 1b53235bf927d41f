// What the files of treecask._core share (conventions: _core.cc): the core's
// values as plain Python values and back, the core's errors as
// treecask.errors instances, a held Python buffer, a Python object as a core
// Source, and the register_* functions the module entry calls.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "treecask/treecask.h"

namespace treecask_py {

namespace nb = nanobind;

// ---- errors (binding.cc) ---------------------------------------------------------

// A Python exception instance for `e`, built by treecask.errors._from_core.
nb::object error_to_python(const treecask::Error& e);
// nanobind's exception translator: a treecask::Error raises its treecask.errors
// class (RuntimeError when treecask.errors cannot be imported).
void translate_error(const std::exception_ptr& p, void*);

// ---- values (binding.cc) ---------------------------------------------------------

// Nodes [begin, end) of `def` as a list of (kind, arity, type_name, keys)
// tuples. Leaf and None nodes without a type name share one tuple each.
nb::list treedef_to_python(const treecask::TreeDef& def, size_t begin, size_t end);
nb::list treedef_to_python(const treecask::TreeDef& def);
// A sequence of (kind, arity, type_name, keys) tuples (keys: any sequence of str).
treecask::TreeDef treedef_from_python(nb::handle nodes);

// KeyValues as a {str: str} dict, and back from a sequence of (str, str) pairs (None: empty).
nb::dict key_values_to_python(const treecask::KeyValues& kv);
treecask::KeyValues key_values_from_python(nb::handle obj);

// A Sharding as (mesh_axis_names, mesh_axis_sizes, spec), None for none; and back.
nb::object sharding_to_python(const std::optional<treecask::Sharding>& s);
std::optional<treecask::Sharding> sharding_from_python(nb::handle obj);

// The DType of a dtype name (a str); kInvalidArgument naming `key_path` for an unknown one.
treecask::DType dtype_of(nb::handle name, const std::string& key_path);

// SaveStats as a dict of its fields.
nb::dict save_stats_to_python(const treecask::SaveStats& st);

// ---- buffers ---------------------------------------------------------------------

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

// ---- remote sources (source.cc) --------------------------------------------------

// A Source implemented in Python (treecask._remote.ObjectSource, or any object
// with `size` (int, bytes) and read(offsets, lengths) -> a sequence of
// bytes-like objects of exactly those lengths; optionally `name` (str, for
// errors; default "<TypeName>") and `concurrency` (int, default 16)). The
// source's first read is the open's head and tail in one call (source.h).
// `size` may be None until then (an object that learns it from its first
// response): that read then asks for the tail with a negative offset, -n
// for the last n bytes, and either range may run past the object's end,
// each answer holding only the bytes the object has; `size` must be an int
// when it returns. read() runs with the GIL held; the Python side releases
// it while it waits on the network. A Python exception becomes a
// treecask::Error naming the object: a treecask error keeps its code, any
// other is kIo.
std::shared_ptr<const treecask::Source> source_from_python(nb::object obj);
// A SourceOpener over a Python callable `opener(name)` -> such an object; each
// call (from the open's threads) takes the GIL.
treecask::SourceOpener opener_from_python(nb::object opener);

// ---- signing (signing.cc) ---------------------------------------------------------

// The SignatureCheck of a (bundle_json, public_key_pem) pair, none for None: what
// the readers' open calls take as `signature`.
std::optional<treecask::SignatureCheck> signature_check(
    const std::optional<std::tuple<std::string, std::string>>& sig);

// ---- the module's parts, called by NB_MODULE (_core.cc) ----------------------------

void register_readers(nb::module_& m);  // readers.cc: Archive, ShardedArchive
void register_save(nb::module_& m);     // save.cc: save, save_async, PendingSave, SnapshotPool
void register_interop(nb::module_& m);  // interop.cc: import_safetensors, export_safetensors
void register_signing(nb::module_& m);  // signing.cc: sign, verify_signature
void register_tool(nb::module_& m);     // tool.cc: run_tool (when built with the tool)

}  // namespace treecask_py
