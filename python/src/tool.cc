// treecask._core.run_tool: the `treecask` tool's commands (src/cli,
// commands.h run_tool) run in this process, so that the tool the Python
// package installs reads URLs through the package's own store layer
// (python/treecask/_cli.py; the wheel's tool binary has no HTTP source).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "binding.h"
#include "commands.h"

namespace treecask_py {

void register_tool(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "run_tool",
      [](const std::vector<std::string>& args, nb::object opener) {
        std::vector<std::string> owned = args;
        std::vector<char*> argv;
        for (std::string& a : owned) argv.push_back(a.data());
        argv.push_back(nullptr);
        // The opener holds a Python object: set and cleared with the GIL held.
        treecask::set_url_opener(opener_from_python(std::move(opener)));
        int status;
        {
          nb::gil_scoped_release release;
          status = treecask::cli::run_tool(static_cast<int>(owned.size()), argv.data());
        }
        treecask::set_url_opener({});
        return status;
      },
      "args"_a, "opener"_a,
      "Runs the treecask tool (args[0] is the program name) in this process, every URL's "
      "objects opened by opener(url) -> a Source (treecask._remote.ObjectSource); prints what "
      "the tool prints and returns its exit status (docs/cli.md).");
}

}  // namespace treecask_py
