"""The ``treecask`` command that ``pip install`` puts on PATH.

Every subcommand of the C++ tool (docs/cli.md: info, ls, verify, get, import,
export) runs the tool built into the package (``treecask/_bin/treecask``,
scikit-build-core builds it with the extension): this process is replaced by
it (``os.execv``), so arguments, output and exit statuses are the tool's own.
``import-orbax`` and ``import-flax`` need Python libraries and run
``python -m treecask`` (treecask/__main__.py) in this process instead.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

# Subcommands of python -m treecask (treecask/__main__.py).
PYTHON_COMMANDS = ("import-orbax", "import-flax")


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
    tool = tool_path()
    if not os.access(tool, os.X_OK):
        print(f"treecask: {tool}: this install of the treecask package has no command-line tool "
              "(built with TREECASK_BUILD_CLI=OFF); build it with CMake (docs/cli.md)",
              file=sys.stderr)
        return 10
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(tool, ["treecask", *args])
    return 11  # unreachable: execv returns only by raising OSError


if __name__ == "__main__":
    sys.exit(main())
