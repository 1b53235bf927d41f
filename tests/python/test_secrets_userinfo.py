"""The secrets sweep, extended to userinfo holding '/', ':' and '@' (issue 34:
AWS secret access keys hold '/'; a password may hold ':' and '@'): every
public entry point of the package (open, load, save, CheckpointManager,
ShardedArchive, import_* / export_safetensors, treecask.orbax) and both
tools (the C++ ``treecask`` built with libcurl, and the pip-installed one,
``gc`` included), handed such a URL, fail with a treecask error that shows
the URL only as the core's redact_url shows it: userinfo up to the last '@'
before the query replaced by ``***`` (include/treecask/remote.h). Nothing of
the secret in str, repr, args, file, message, a chained exception, a warning,
stdout or stderr; no traceback from a tool.

The servers are on loopback (nginx, tests/python/stores.py); every URL here is
refused before any request is sent (parse_url), so none needs a bucket."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import treecask
import treecask.orbax as tco
from treecask import _core
from treecask.errors import Error, InvalidArgumentError, UnsupportedError

CLI = os.environ.get("TREECASK_CLI")  # the C++ tool, built with libcurl
TREE = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "step": 3}

# An AWS-shaped key pair (the secret holds '/'), and a password holding '@', ':' and '/'.
KEY_ID = "AKIAUSERINFOEXAMPLE7"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENGSECRET/bPxRfiCYEXAMPLEKEY"
PASSWORD = "pa@ss:wo/rd-SECRET-9f8e"
# What must never appear: every piece of them that a wrong split would print.
SECRETS = [KEY_ID, "wJalrXUtnFEMI", "K7MDENGSECRET", "bPxRfiCYEXAMPLEKEY", "pa@ss", "ss:wo", "wo/rd",
           "rd-SECRET-9f8e"]

PORT = 9  # discard: nothing listens, and nothing must be sent anyway


def _urls():
    """(url, what the core shows of it): every scheme, secrets in userinfo."""
    return [
        (f"s3://{KEY_ID}:{SECRET_KEY}@bucket/run/model.cask", "s3://***@bucket/run/model.cask"),
        (f"gs://user:{PASSWORD}@bucket/run/model.cask", "gs://***@bucket/run/model.cask"),
        (f"az://acct:{SECRET_KEY}@container/run/model.cask", "az://***@container/run/model.cask"),
        (f"http://{KEY_ID}:{SECRET_KEY}@127.0.0.1:{PORT}/run/model.cask", f"http://***@127.0.0.1:{PORT}/run/model.cask"),
        (f"https://user:{PASSWORD}@127.0.0.1:{PORT}/run/model.cask", f"https://***@127.0.0.1:{PORT}/run/model.cask"),
    ]


URLS = _urls()


def assert_clean(text: str):
    for s in SECRETS:
        assert s not in text, f"secret piece {s!r} in: {text}"


def exception_texts(e: BaseException):
    seen = set()
    stack = [e]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield from (str(e), repr(e), repr(e.args))
        for attr in ("file", "message", "filename", "filename2"):
            if getattr(e, attr, None) is not None:
                yield str(getattr(e, attr))
        stack += [e.__cause__, e.__context__]


def raises_clean(call, shown: str, kind=InvalidArgumentError):
    """`call` must raise `kind` (a treecask error) naming the URL as `shown`,
    with no secret anywhere in it, its chain or a warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Exception) as info:
            call()
    e = info.value
    texts = list(exception_texts(e))
    for t in texts + [str(w.message) for w in caught]:
        assert_clean(t)
    assert isinstance(e, kind), f"{type(e).__module__}.{type(e).__name__}: {e}"
    assert shown in str(e), str(e)
    return e


def test_the_core_shows_each_url_redacted_to_its_last_at():
    for url, shown in URLS:
        assert _core.redact_url(url) == shown
        e = raises_clean(lambda u=url: _core.parse_url(u), shown)
        assert e.file == shown


def _manager_save(url):
    with treecask.CheckpointManager(url) as m:
        m.save(1, TREE)
        m.wait_until_finished()


def _orbax_manager_save(url):
    with tco.CheckpointManager(url) as m:
        m.save(1, args=tco.args.StandardSave(TREE))
        m.wait_until_finished()


def _entry_points(tmp_path):
    """(name, call(url), how the error names the URL: "url" or "prefix"):
    each call given valid inputs but for the URL, so that the URL is what it
    refuses."""
    arrays = tmp_path / "arrays.cask"
    treecask.save(arrays, {"w": TREE["w"]})
    treecask.export_safetensors(arrays, tmp_path / "hf")
    st = next((tmp_path / "hf").glob("*.safetensors"))
    orbax_dir = tmp_path / "orbax"
    with contextlib.suppress(ImportError):
        import orbax.checkpoint as ocp

        with ocp.StandardCheckpointer() as c:
            c.save(orbax_dir, {"w": TREE["w"]})
    flax_file = tmp_path / "flax.msgpack"
    with contextlib.suppress(ImportError):
        import flax.serialization

        flax_file.write_bytes(flax.serialization.to_bytes({"w": TREE["w"]}))
    return [
        ("open", lambda u: treecask.open(u), "url"),
        ("load", lambda u: treecask.load(u), "url"),
        ("save", lambda u: treecask.save(u, TREE), "url"),
        ("ShardedArchive", lambda u: treecask.ShardedArchive(u), "url"),
        ("CheckpointManager", _manager_save, "prefix"),
        ("import_safetensors", lambda u: treecask.import_safetensors(st, u), "url"),
        ("export_safetensors", lambda u: treecask.export_safetensors(u, tmp_path / "out"), "url"),
        ("import_orbax", lambda u: treecask.import_orbax(orbax_dir, u), "url"),
        ("import_flax", lambda u: treecask.import_flax(flax_file, u), "url"),
        ("orbax.StandardCheckpointer.save", lambda u: tco.StandardCheckpointer().save(u, TREE), "url"),
        ("orbax.StandardCheckpointer.restore", lambda u: tco.StandardCheckpointer().restore(u), "url"),
        ("orbax.CheckpointManager", _orbax_manager_save, "prefix"),
    ]


ENTRY_NAMES = ["open", "load", "save", "ShardedArchive", "CheckpointManager", "import_safetensors",
               "export_safetensors", "import_orbax", "import_flax", "orbax.StandardCheckpointer.save",
               "orbax.StandardCheckpointer.restore", "orbax.CheckpointManager"]


@pytest.mark.parametrize("entry", ENTRY_NAMES)
def test_every_entry_point_refuses_userinfo_secrets_without_showing_them(entry, tmp_path, capfd):
    points = _entry_points(tmp_path)
    assert [n for n, _, _ in points] == ENTRY_NAMES
    name, call, target = next(e for e in points if e[0] == entry)
    if entry == "import_orbax" and not (tmp_path / "orbax").exists():
        pytest.skip("orbax-checkpoint not installed")
    if entry == "import_flax" and not (tmp_path / "flax.msgpack").exists():
        pytest.skip("flax not installed")
    for url, shown in URLS:
        if target == "prefix":
            url, shown = url.rsplit("/", 1)[0], shown.rsplit("/", 1)[0]
        # (the imports write local files only: any URL may be UnsupportedError, named redacted)
        raises_clean(lambda: call(url), shown,
                     (InvalidArgumentError, UnsupportedError) if entry in ("import_safetensors", "import_flax", "import_orbax")
                     else InvalidArgumentError)
    out, err = capfd.readouterr()
    assert_clean(out + err)


def _tools():
    tools = []
    if CLI:
        tools.append(("libcurl", [CLI]))
    # The pip-installed command of this package (treecask/_cli.py): URLs read
    # through obstore in this process; gc run by python -m treecask.
    tools.append(("pip", [sys.executable, "-c", "import sys; from treecask._cli import main; sys.exit(main())"]))
    return tools


# The pip command's commands run one after another in one process (what
# `treecask CMD URL` runs: treecask._cli.main), each followed by a marker line
# with its exit status on stderr: one interpreter start instead of one per command.
_PIP_DRIVER = """
import json, os, sys
from treecask._cli import main
for cmd in json.loads(sys.argv[1]):
    try:
        rc = main(cmd)
    except SystemExit as e:
        rc = e.code
    sys.stdout.flush(); sys.stderr.flush()
    os.write(2, f"\\n@@exit {rc}@@\\n".encode())
"""


def _run_commands(tool: str, commands: list, env: dict):
    """[(exit status, stdout + stderr text of that command)] of `commands` run by `tool`."""
    if tool == "libcurl":
        out = []
        for cmd in commands:
            r = subprocess.run([CLI, *cmd], capture_output=True, text=True, env=env, timeout=120)
            out.append((r.returncode, r.stdout, r.stderr))
        return out
    r = subprocess.run([sys.executable, "-c", _PIP_DRIVER, json.dumps(commands)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert_clean(r.stdout + r.stderr)
    parts = r.stderr.split("@@exit ")
    assert len(parts) == len(commands) + 1, r.stderr
    out, err = [], parts[0]
    for part in parts[1:]:
        code, rest = part.split("@@", 1)
        out.append((int(code), "", err.strip("\n") + "\n"))
        err = rest
    return out


@pytest.mark.parametrize("tool", [name for name, _ in _tools()])
def test_both_tools_refuse_userinfo_secrets_without_showing_them(tool, tmp_path):
    dict(_tools())[tool]  # skips nothing: the libcurl tool is listed only when built
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    commands = []
    for url, shown in URLS:
        commands += [["info", url], ["ls", url], ["verify", url], ["get", url, "w", "-o", os.devnull],
                     ["export", url, str(tmp_path / "out")]]
    results = _run_commands(tool, commands, env)
    for cmd, (rc, out, err) in zip(commands, results):
        shown = dict(URLS)[cmd[1]]
        assert_clean(out + err)
        assert rc == 7, (tool, cmd[0], rc, err)  # invalid argument
        assert err.startswith("treecask: ") and "Traceback" not in err, err
        assert shown in err, err


GC_URLS = [(u.rsplit("/", 1)[0], s.rsplit("/", 1)[0]) for u, s in URLS if u.startswith(("s3", "gs", "az"))]


@pytest.mark.parametrize("url,shown", GC_URLS, ids=[u.split(":", 1)[0] for u, _ in GC_URLS])
def test_gc_refuses_userinfo_secrets_and_malformed_urls_without_a_traceback(url, shown):
    """``treecask gc`` (the pip-installed command, python -m treecask) on a URL
    with secrets in its userinfo, and on malformed URLs: one line on stderr,
    exit 7 (invalid argument), never a traceback, never the secret."""
    argv = [sys.executable, "-c", "import sys; from treecask._cli import main; sys.exit(main())", "gc"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for u, want in ((url, shown), ("s3://", "s3://"), ("s3:///prefix", "s3:///prefix"),
                    ("s3://host:9000/bucket/run", "s3://host:9000/bucket/run")):
        r = subprocess.run([*argv, u, "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
        assert_clean(r.stdout + r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.startswith("treecask: "), r.stderr
        assert r.returncode == 7 and want in r.stderr, (u, r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) <= 2, r.stderr


def test_an_unconfigured_store_is_a_treecask_error_in_gc_too(monkeypatch):
    """``az://`` with no account configured: a treecask error from the API,
    and one line, no traceback, from ``treecask gc``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    argv = [sys.executable, "-c", "import sys; from treecask._cli import main; sys.exit(main())", "gc"]
    r = subprocess.run([*argv, "az://container/run", "--dry-run"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert "Traceback" not in r.stderr and r.stderr.startswith("treecask: "), r.stderr
    assert r.returncode in (7, 8) and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    for k in [k for k in os.environ if k.startswith("AZURE_")]:
        monkeypatch.delenv(k)
    with pytest.raises(Error) as e:
        treecask.load("az://container/run/model.cask")
    assert len(str(e.value).splitlines()) <= 2, str(e.value)
