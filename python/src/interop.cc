// treecask._core's interop: Hugging Face safetensors layouts (src/interop/convert.h).
//
// treecask.import_safetensors / export_safetensors call the routines
// `treecask import` / `treecask export --max-shard-size` call (the
// treecask_interop library), so the file format logic exists once.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>

#include "binding.h"
#include "convert.h"  // treecask_interop (src/interop)

namespace treecask_py {

using namespace nb::literals;

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

}  // namespace treecask_py
