"""The ``treecask`` command that ``pip install`` puts on PATH.

Every subcommand of the C++ tool (docs/cli.md: info, ls, verify, get, import,
export) runs the tool built into the package (``treecask/_bin/treecask``,
scikit-build-core builds it with the extension): this process is replaced by
it (``os.execv``), so arguments, output and exit statuses are the tool's own.
``import-orbax``, ``import-flax`` and ``gc`` need Python libraries and run
``python -m treecask`` (treecask/__main__.py) in this process instead.

The tool built into the package has no HTTP source of its own (the wheel is
built without libcurl): ``info``, ``ls``, ``verify``, ``get`` and ``export``
of a URL (s3://, gs://, az://, http(s)://) run the same tool's commands in
this process (``_core.run_tool``), each object read through the package's
store layer (``treecask.stores``, obstore), as ``treecask.open`` reads it:
the same configuration (the environment), output and exit statuses.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import treecask._core as _core

# Subcommands of python -m treecask (treecask/__main__.py).
PYTHON_COMMANDS = ("import-orbax", "import-flax", "gc")
# The tool's subcommands that read an archive, which may be a URL.
READING_COMMANDS = ("info", "ls", "verify", "get", "export")


def tool_path() -> str:
    """Path of the C++ ``treecask`` tool inside this package (it may be absent
    from a build configured with ``TREECASK_BUILD_CLI=OFF``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "treecask")


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``treecask ARGS``: a Python subcommand here, anything else (``--help``,
    ``--version``, unknown words included) by exec-ing the C++ tool.

    Returns the Python subcommand's exit status; for the C++ tool it does not
    return (exec). Exits 10 ("unsupported", docs/cli.md "Exit codes") when this
    install has no tool.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in PYTHON_COMMANDS:
        from .__main__ import main as python_main

        return python_main(args, prog="treecask")
    if args and args[0] in READING_COMMANDS and any(_core.is_url(a) for a in args[1:]):  # a URL: <scheme>://
        return _run_in_process(args)
    tool = tool_path()
    if not os.access(tool, os.X_OK):
        print(f"treecask: {tool}: this install of the treecask package has no command-line tool "
              "(built with TREECASK_BUILD_CLI=OFF); build it with CMake (docs/cli.md)",
              file=sys.stderr)
        return 10
    if args in (["--help"], ["-h"]):
        return _help(tool)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(tool, ["treecask", *args])
    return 11  # unreachable: execv returns only by raising OSError


def _help(tool: str) -> int:
    """``treecask --help``: the tool's help with the commands of treecask/__main__.py among its subcommands."""
    import subprocess

    from .__main__ import command_help

    r = subprocess.run([tool, "--help"], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    if "Subcommands:" in lines:
        start = lines.index("Subcommands:") + 1  # the list ends at the first blank line
        end = next((k for k in range(start, len(lines)) if not lines[k].strip()), len(lines))
        lines[end:end] = [f"  {name:<28}{text}" for name, text in command_help()]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stderr.write(r.stderr)
    return r.returncode


def _run_in_process(args: List[str]) -> int:
    """The tool's command ``args`` run in this process (``_core.run_tool``), URLs read through their stores."""
    from . import stores

    if not hasattr(_core, "run_tool"):
        print("treecask: this install of the treecask package has no command-line tool "
              "(built with TREECASK_BUILD_CLI=OFF): read URLs with treecask.open", file=sys.stderr)
        return 10
    sys.stdout.flush()
    sys.stderr.flush()
    def source(url: str) -> object:  # the core's Source of an object a command names, through its store
        st, path = stores.resolve(url)
        return st.source(path)

    return _core.run_tool(["treecask", *args], source)


if __name__ == "__main__":
    sys.exit(main())
