// treecask._core's saves (python/treecask/_save.py, _distributed.py,
// _manager.py): a treecask._request.SaveRequest as the core's save inputs,
// save, save_async and the PendingSave it returns, and SnapshotPool.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"

namespace treecask_py {
namespace {

using namespace nb::literals;

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

}  // namespace

void register_save(nb::module_& m) {
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
  // leaf (treecask::save_async checks the count); the bytes of the other leaves are
  // copied into one fresh buffer before the call returns (treecask::save_async's
  // snapshot, on `threads` threads, GIL released), so the caller may then mutate or
  // free them. A borrowed leaf's buffer is held by the PendingSave until the save
  // ends: pass only memory nobody will write (e.g. a host copy of an accelerator
  // array). pool: an optional SnapshotPool the snapshot buffer comes from and returns
  // to (treecask::SnapshotPool; its memory outlives the object while a save uses it).
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
}

}  // namespace treecask_py
