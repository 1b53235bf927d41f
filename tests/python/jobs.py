"""Launching a multi-process jax.distributed job of child Python processes on
localhost, for the tests: a free loopback port for the coordinator, the
children's environment (CPU only, no inherited XLA_FLAGS, a bounded barrier
timeout), and collecting their output. Each child prints "CHILD OK <process
id>" last when it succeeds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Callable, List, Optional, Sequence


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script, source: str, nproc: int, argv: Callable[[int, int], Sequence[str]],
           env_extra: Optional[dict] = None) -> List[subprocess.Popen]:
    """Writes `source` to `script` and starts `nproc` children running it, child i with
    arguments argv(port, i); stdout and stderr go to a pipe each child's output is read from."""
    script.write_text(source)
    port = free_port()
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["TREECASK_BARRIER_TIMEOUT_S"] = "120"
    env.update(env_extra or {})
    return [subprocess.Popen([sys.executable, str(script), *map(str, argv(port, i))], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)
            for i in range(nproc)]


def collect(procs: List[subprocess.Popen], label: str, timeout: float = 180) -> List[str]:
    """Waits for every child (killing the rest on a timeout) and returns their outputs;
    fails the test unless each exited 0 after printing "CHILD OK <i>"."""
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"CHILD OK {i}" in out, f"{label} process {i} (rc {p.returncode}):\n{out}"
    return outs
