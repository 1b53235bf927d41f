"""The fenced examples of README.md and docs/*.md, as tests/python/test_docs.py runs them.

Which blocks run: every fence tagged ``python`` or ``py`` (run with exec, in this
interpreter), ``sh`` or ``bash`` (a bash script, ``set -euo pipefail``, must exit 0) and
``console`` (``$ `` commands, each followed by the output it prints). Other fences (``cpp``,
``json``, untagged synopses and output listings) are not run.

Markers: an HTML comment on the line(s) right before a fence (blank lines allowed between):

    <!-- docs-test: skip (why) -->     not run; the reason shows in the test's skip message
    <!-- docs-test: continue -->       runs after the previous runnable block of the same
                                       file, in the same directory (files it wrote are there)

Printed output is compared, whitespace runs collapsed and line ends stripped:

- python, sh: a ``# prints TEXT`` comment (at the end of a line or on a line of its own)
  says that the block prints the line TEXT there. The block's stdout, line by line, must
  equal these comments in order. A python block with none must print nothing; an sh block
  with none is not checked (commands report what they wrote).
- console: the lines after a ``$ command`` line (up to the next ``$ `` line) are what the
  command prints, stdout and stderr together, as a terminal shows them. A command ending in
  `` \\`` continues on the next line.
- ``...`` is the placeholder for what varies (times, absolute paths, versions): inside a
  line it matches any text, and a line that is only ``...`` matches any number of lines.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON, SHELL, CONSOLE = "python", "sh", "console"
LANGS = {"python": PYTHON, "py": PYTHON, "sh": SHELL, "bash": SHELL, "shell": SHELL,
         "console": CONSOLE}

_FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(skip|continue)\b\s*(.*?)\s*-->\s*$")
_PRINTS = re.compile(r"#\s*prints\s(.*)$")


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int            # 1-based line of the opening fence
    lang: str            # PYTHON, SHELL or CONSOLE
    code: str
    skip: str | None     # the reason given by a skip marker
    continues: bool      # a continue marker: runs after the previous block, same directory

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list:
    return [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if p.exists()]


def blocks(path: pathlib.Path) -> list:
    """The runnable fenced blocks of one markdown file, in order."""
    lines = path.read_text().splitlines()
    out, i, marker = [], 0, None
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            mm = _MARKER.match(lines[i].strip())
            if mm:
                marker = mm
            elif lines[i].strip():
                marker = None
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if lang in LANGS:
            skip = None
            if marker and marker.group(1) == "skip":
                skip = marker.group(2).strip().strip("()") or "no reason given"
            out.append(Block(path, start + 1, LANGS[lang], "\n".join(body) + "\n", skip,
                             bool(marker and marker.group(1) == "continue")))
        marker = None
    return out


def untagged_sessions(path: pathlib.Path) -> list:
    """Lines of untagged fences that start with a `$ ` prompt: shell sessions the test would
    not run (they should be tagged console)."""
    out, fence = [], None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence = (m.group(1), m.group(2))
        elif fence is not None and line.startswith(fence[0]):
            fence = None
        elif fence is not None and not fence[1] and line.startswith("$ "):
            out.append(f"{path.relative_to(ROOT)}:{n}")
    return out


def groups(all_blocks: list) -> list:
    """Blocks joined by continue markers: each group runs in one directory, in order."""
    out = []
    for b in all_blocks:
        if b.continues and out and out[-1][-1].path == b.path:
            out[-1].append(b)
        else:
            out.append([b])
    return out


def expected_prints(code: str) -> list:
    """The ``# prints TEXT`` comments of a python or sh block, in order."""
    return [m.group(1) for m in map(_PRINTS.search, code.splitlines()) if m]


def console_steps(code: str) -> list:
    """[(command, [expected output lines])] of a console block."""
    steps, cmd = [], None
    for line in code.splitlines():
        if cmd is not None and cmd.endswith("\\"):
            cmd = cmd[:-1] + "\n" + line
            steps[-1] = (cmd, [])
        elif line.startswith("$ "):
            cmd = line[2:]
            steps.append((cmd, []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block: output before the first `$ ` command: {line!r}")
    return steps


def _norm(line: str) -> str:
    return " ".join(line.split())


def _line_regex(expected: str):
    return re.compile(".*".join(re.escape(p) for p in _norm(expected).split("...")) + r"\Z", re.S)


def matches(expected: list, actual: list) -> bool:
    """Whether `actual` output lines are what `expected` shows, with the ``...`` placeholder."""
    exp = [e for e in expected]
    act = [_norm(a) for a in actual]
    while exp and not exp[-1].strip():
        exp.pop()
    while act and not act[-1]:
        act.pop()

    def go(i, j):
        if i == len(exp):
            return j == len(act)
        if _norm(exp[i]) == "...":
            return any(go(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and bool(_line_regex(exp[i]).match(act[j])) and go(i + 1, j + 1)
    return go(0, 0)


def mismatch(what: str, expected: list, actual: list) -> str:
    return (f"{what}: the output differs from the docs.\n--- the docs show ---\n"
            + "\n".join(expected) + "\n--- it printed ---\n" + "\n".join(actual))
