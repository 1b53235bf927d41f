"""The C++ core's folders are layers (docs/design.md "Layers"): a file of src/<layer>/
includes only its own layer's and lower layers' private headers, never a higher one's.
The interop library and the tool include no private header of the core at all, and no
source file of src/ has more than 800 lines."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = ["util", "remote", "lmdb", "format", "read", "write"]  # lowest first
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _private_includes(path: pathlib.Path):
    for name in INCLUDE.findall(path.read_text()):
        top = name.split("/", 1)[0]
        if "/" in name and top in LAYERS:
            yield name, top


def test_every_core_layer_includes_only_itself_and_lower_layers():
    sources = [p for layer in LAYERS for p in (ROOT / "src" / layer).glob("*") if p.suffix in (".h", ".cc")]
    assert len(sources) >= 15
    upward = []
    for p in sources:
        mine = LAYERS.index(p.parent.name)
        for name, top in _private_includes(p):
            if LAYERS.index(top) > mine:
                upward.append(f"{p.relative_to(ROOT)} includes {name}")
    assert not upward, upward
    # Nothing is left at the top of src/: every core file is in its layer's folder.
    assert not [p.name for p in (ROOT / "src").glob("*.*")]


def test_interop_and_cli_use_only_the_public_api():
    for folder in ("interop", "cli"):
        for p in (ROOT / "src" / folder).glob("*"):
            if p.suffix in (".h", ".cc"):
                assert not list(_private_includes(p)), p


def test_no_source_file_over_800_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "src").rglob("*") if p.suffix in (".h", ".cc")
            for n in [len(p.read_text().splitlines())] if n > 800}
    assert not long, long
