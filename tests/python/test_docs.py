"""Every python and shell example of README.md and docs/*.md runs as written, and prints
what the docs show (the conventions and markers: tests/python/docblocks.py).

Each group of blocks (a block and those that continue it) runs in a fresh directory, in
order. Shell blocks find `treecask` on PATH: $TREECASK_CLI when set (the CMake-built tool,
which reads URLs), else the package's entry point beside this Python; `python` and
`python3` are this interpreter. A block naming ``s3://BUCKET/...`` runs against the local
SeaweedFS (conftest.py's s3_server): the buckets it names are created there, and the
variables docs/remote.md tells a user to set (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)
point at it.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import docblocks

GROUPS = [g for p in docblocks.doc_files() for g in docblocks.groups(docblocks.blocks(p))]
TIMEOUT = 300  # seconds a shell block may take


@pytest.fixture(scope="session")
def shell_bin(tmp_path_factory):
    """A directory to put first on PATH: `treecask`, `python`, `python3`."""
    d = tmp_path_factory.mktemp("docs-bin")
    cli = os.environ.get("TREECASK_CLI") or shutil.which("treecask", path=os.path.dirname(sys.executable))
    for name, target in (("treecask", cli), ("python", sys.executable), ("python3", sys.executable)):
        if target:
            # A wrapper, not a symlink: a symlinked venv python would not find its pyvenv.cfg.
            (d / name).write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
            (d / name).chmod(0o755)
    return d


def _s3_env(request, code):
    buckets = sorted(set(re.findall(r"s3://([a-z0-9][a-z0-9.-]*)/", code)))
    if not buckets:
        return {}
    server = request.getfixturevalue("s3_server")
    for b in buckets:
        server.create_bucket(b)
    return server.env()


def _run_python(block, env, capsys, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    namespace = {"__name__": "__doc_example__"}
    capsys.readouterr()
    try:
        exec(compile(block.code, str(block.path), "exec"), namespace)
    finally:
        # Functions defined by the example hold the namespace (a cycle): clear it so
        # the archives it opened are released now, not at interpreter exit.
        namespace.clear()
    out = capsys.readouterr().out.splitlines()
    want = docblocks.expected_prints(block.code)
    if want or out:
        assert docblocks.matches(want, out), docblocks.mismatch(block.where, want, out)


def _bash(cmd, env, cwd, merge):
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merge else subprocess.PIPE)


def _run_shell(block, env, cwd):
    r = _bash("set -euo pipefail\n" + block.code, env, cwd, merge=False)
    assert r.returncode == 0, (f"{block.where}: exit status {r.returncode}\n--- stdout ---\n"
                               f"{r.stdout}\n--- stderr ---\n{r.stderr}")
    want = docblocks.expected_prints(block.code)
    if want:
        out = r.stdout.splitlines()
        assert docblocks.matches(want, out), docblocks.mismatch(block.where, want, out)


def _run_console(block, env, cwd):
    for cmd, want in docblocks.console_steps(block.code):
        r = _bash(cmd, env, cwd, merge=True)
        out = r.stdout.splitlines()
        assert docblocks.matches(want, out), docblocks.mismatch(f"{block.where}: $ {cmd}", want, out)


@pytest.mark.parametrize("group", GROUPS, ids=[g[0].where for g in GROUPS])
def test_doc_example_runs(group, tmp_path, monkeypatch, capsys, request, shell_bin):
    skipped = [b for b in group if b.skip]
    if skipped:
        pytest.skip(f"{skipped[0].where}: {skipped[0].skip}")
    code = "".join(b.code for b in group)
    if any(b.lang == docblocks.PYTHON for b in group):
        pytest.importorskip("jax")
    if re.search(r"(s3|gs|https?)://", code) and any(b.lang != docblocks.PYTHON for b in group) \
            and not os.environ.get("TREECASK_CLI"):
        pytest.skip("a shell example reading a URL needs TREECASK_CLI (the pip-installed tool reads no URLs)")
    env = _s3_env(request, code)
    shell_env = dict(os.environ, **env, PATH=f"{shell_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.chdir(tmp_path)
    for block in group:
        if block.lang == docblocks.PYTHON:
            _run_python(block, env, capsys, monkeypatch)
        elif block.lang == docblocks.SHELL:
            _run_shell(block, shell_env, tmp_path)
        else:
            _run_console(block, shell_env, tmp_path)


def test_shell_sessions_are_tagged_so_they_run():
    untagged = [w for p in docblocks.doc_files() for w in docblocks.untagged_sessions(p)]
    assert not untagged, f"`$ ` sessions in untagged fences (tag them console): {untagged}"


def test_the_matcher():
    """The output convention itself: whitespace runs, `...` in a line and as a line."""
    m = docblocks.matches
    assert m(["w  float64 [2,3]"], ["w float64  [2,3]   "])
    assert m(["wrote ... from .../ckpts/100 step 100"], ["wrote a.cask from /tmp/x/ckpts/100 step 100"])
    assert m(["a", "...", "z"], ["a", "b", "c", "z"]) and m(["a", "...", "z"], ["a", "z"])
    assert not m(["a", "z"], ["a", "b", "z"]) and not m(["a"], ["ab"]) and not m(["a"], [])
    steps = docblocks.console_steps("$ echo a \\\n  b\na b\n$ true\n")
    assert steps == [("echo a \n  b", ["a b"]), ("true", [])]
