"""Every ```python block of docs/python.md runs as written."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if DOC.exists() else []


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_doc_example_runs(code, tmp_path, monkeypatch):
    pytest.importorskip("jax")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__doc_example__"}
    try:
        exec(compile(code, str(DOC), "exec"), namespace)
    finally:
        # Functions defined by the example hold the namespace (a cycle): clear
        # it so the archives it opened are released before interpreter exit.
        namespace.clear()
