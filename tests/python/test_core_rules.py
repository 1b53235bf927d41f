"""The rules the core holds once and the package reads from it (issue 34,
"Each rule once, in the core, bound to Python"): the index name, the
temporary-name grammar, the environment-to-config table, the redaction of
userinfo holding '/', ':' and '@'. Each is checked against what the core
itself does with it (a file it writes, a URL the libcurl tool resolves), not
against a copy of the rule."""

from __future__ import annotations

import os
import socket
import subprocess

import numpy as np
import pytest

import treecask
from treecask import _core
from treecask.errors import InvalidArgumentError

CLI = os.environ.get("TREECASK_CLI")


def test_the_index_name_is_the_one_a_multi_process_save_writes(tmp_path):
    assert _core.INDEX_NAME == "index.cask"
    # The core's ShardedArchive recognises a directory by it.
    d = tmp_path / "ckpt"
    d.mkdir()
    assert not _core.is_sharded(str(d))
    treecask.save(d / _core.INDEX_NAME, {"x": np.ones(3)}, durable=False)
    assert _core.is_sharded(str(d))


def test_the_temporary_name_grammar_is_the_cores(tmp_path):
    host, pid = _core.host_name(), os.getpid()
    assert host == (socket.gethostname() or "localhost")
    # What the core writes now: parsed back whole.
    name = os.path.basename(_core.temporary_path(str(tmp_path / "step_3.cask")))
    t = _core.parse_temporary_name(name)
    assert t is not None and _core.is_temporary_name(name)
    assert (t["target"], t["kind"], t["host"], t["pid"]) == ("step_3.cask", ".tmp.", host, pid)
    assert len(t["random"]) == 16 and int(t["random"], 16) >= 0
    # Every form earlier writers made, the .tmpdir. one of multi-process saves included.
    assert _core.parse_temporary_name("ckpt.tmpdir.node-1.example.org.42.0123456789abcdef") == {
        "target": "ckpt", "kind": ".tmpdir.", "host": "node-1.example.org", "pid": 42,
        "random": "0123456789abcdef"}
    assert _core.parse_temporary_name("s.cask.tmp.42.0badc0de")["host"] == ""
    assert _core.parse_temporary_name("step_1.cask.tmp.7.deleting")["target"] == "step_1.cask"
    # A store's upload marker and the local scratch directory are the same grammar.
    assert _core.is_temporary_name(os.path.basename(_core.temporary_path("treecask-upload")))
    for no in ("step_3.cask", "index.cask", "notes.tmp.2024.final", "s.cask.tmp.h.1.0123",
               "run/s.cask.tmp.h.1.0123456789abcdef", "s.cask.tmpdir.1.0badc0de", ""):
        assert not _core.is_temporary_name(no) and _core.parse_temporary_name(no) is None, no


def test_a_temporary_the_core_wrote_is_swept_by_the_same_rule(tmp_path):
    """The grammar and the stale rule agree with what remove_stale_temporaries
    removes: a dead writer's temporary of every form goes, a live one stays."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    target = tmp_path / "m.cask"
    names = {f"m.cask.tmp.{_core.host_name()}.{dead.pid}.0123456789abcdef": False,
             f"m.cask.tmpdir.{_core.host_name()}.{dead.pid}.0123456789abcdef": False,
             f"m.cask.tmp.{dead.pid}.0badc0de": False,
             os.path.basename(_core.temporary_path(str(target))): True,  # this live process
             f"m.cask.tmp.other-host.{dead.pid}.0123456789abcdef": True}  # another host's
    for n in names:
        (tmp_path / n).write_bytes(b"")
        assert _core.is_temporary_name(n)
        assert _core.parse_temporary_name(n)["target"] == "m.cask"
        assert _core.is_stale_temporary("m.cask", n) == (not names[n])
    _core.remove_stale_temporaries(str(target))
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, kept in names.items() if kept)


def test_the_environment_table_is_the_cores(monkeypatch):
    rows = {(scheme, option): vars_ for scheme, option, vars_ in _core.ENV_OPTIONS}
    assert rows[("s3", "endpoint")] == ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
    assert rows[("s3", "region")] == ("AWS_REGION", "AWS_DEFAULT_REGION")
    assert rows[("s3", "session_token")] == ("AWS_SESSION_TOKEN", "AWS_TOKEN")
    assert rows[("gs", "endpoint")] == ("STORAGE_EMULATOR_HOST",)
    assert {s for s, _ in rows} <= set(_core.URL_SCHEMES)
    for name in [v for vs in rows.values() for v in vs]:
        monkeypatch.delenv(name, raising=False)
    assert _core.options_from_env("s3") == {} and _core.options_from_env("az") == {}
    # Precedence: the first set, non-empty variable of the row.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://generic:1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_TOKEN", "tok")
    assert _core.options_from_env("s3") == {"endpoint": "http://generic:1", "region": "eu-west-3",
                                            "session_token": "tok"}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:2")
    assert _core.options_from_env("s3")["endpoint"] == "http://s3-only:2"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    assert _core.options_from_env("gs") == {"endpoint": "127.0.0.1:4443"}


@pytest.mark.skipif(not CLI, reason="TREECASK_CLI (the C++ tool built with libcurl) not set")
def test_the_libcurl_tool_reads_the_endpoint_by_the_table(tmp_path):
    """AWS_ENDPOINT_URL_S3 before AWS_ENDPOINT_URL, as the table says: the
    tool's request goes to the endpoint the table picks (an endpoint that is no
    http(s):// URL is refused naming the variable it came from)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL="http://127.0.0.1:9", AWS_ENDPOINT_URL_S3="ftp://nowhere",
               AWS_EC2_METADATA_DISABLED="true")
    r = subprocess.run([CLI, "info", "s3://bucket/k.cask"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "AWS_ENDPOINT_URL_S3" in r.stderr, r.stderr
    env.pop("AWS_ENDPOINT_URL_S3")
    env["AWS_ENDPOINT"] = "ftp://legacy"
    r = subprocess.run([CLI, "info", "s3://bucket/k.cask"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "ftp://" not in r.stderr, r.stderr  # AWS_ENDPOINT_URL won: nothing listens
    env.pop("AWS_ENDPOINT_URL")
    r = subprocess.run([CLI, "info", "s3://bucket/k.cask"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "AWS_ENDPOINT" in r.stderr and "ftp://legacy" in r.stderr, r.stderr


SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_userinfo_holding_slash_colon_and_at_is_redacted_whole():
    for url, shown in (
            (f"s3://AKIAIOSFODNN7EXAMPLE:{SECRET_KEY}@bucket/k.cask", "s3://***@bucket/k.cask"),
            (f"https://u:{SECRET_KEY}@h/x.cask?a=1", "https://***@h/x.cask?a=1"),
            ("gs://u:p@ss/w:rd@bucket/k", "gs://***@bucket/k"),
            ("https://h/a?b=c@d", "https://h/a?b=c@d")):  # an '@' in the query is no userinfo
        assert _core.redact_url(url) == shown
        assert _core.redact_urls_in(f"open '{url}': failed") == f"open '{shown}': failed"
    for url in (f"s3://AKIAIOSFODNN7EXAMPLE:{SECRET_KEY}@bucket/k.cask", f"https://u:{SECRET_KEY}@h/x.cask"):
        with pytest.raises(InvalidArgumentError) as e:
            _core.parse_url(url)
        assert "K7MD" not in str(e.value) and "bPxR" not in str(e.value) and "***@" in e.value.file


def test_the_http_error_classification_is_the_cores():
    assert _core.RETRYABLE_STATUSES == (429, 500, 502, 503, 504)
    names = set(_core.ERROR_CODES)
    cases = {(404, "NoSuchKey", False): "not found", (410, "", False): "not found",
             (412, "", False): "corruption", (412, "PreconditionFailed", True): "already exists",
             (409, "ConditionalRequestConflict", True): "already exists", (416, "", False): "corruption",
             (403, "AccessDenied", False): "I/O error", (503, "SlowDown", True): "I/O error"}
    for (status, code, create), want in cases.items():
        got = _core.http_error_code(status, code, create_only=create)
        assert got == want and got in names, (status, code, create, got)
    # Each name is a treecask.errors class's.
    assert {c.code_name for c in (treecask.NotFoundError, treecask.CorruptionError, treecask.AlreadyExistsError,
                                  treecask.IoError)} == set(cases.values())
