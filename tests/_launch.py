"""Launching rank processes from tests: a free local port, ``torchrun`` with two ranks, and gloo ranks set up
as ``torchrun`` sets them up, forked from a pre-imported interpreter (``_zygote.spawn``), with their :class:`Job`."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _zygote  # noqa: E402


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, cwd, timeout: float = 300, nproc: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node NPROC --master-port PORT ARGS...`` in ``cwd``, one torch thread per rank,
    its output captured; the test is skipped where torchrun is not installed next to the interpreter."""
    exe = Path(sys.executable).parent / "torchrun"
    if not exe.exists():
        pytest.skip("torchrun not found next to the interpreter")
    return subprocess.run([str(exe), "--nproc-per-node", str(nproc), "--master-port", str(free_port()), *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


class Job:
    """A launched group of rank processes (each a ``Popen`` or a ``_zygote.Child``, leading its own session) and
    the folder they write to. :meth:`wait` waits for every process, at most ``deadline`` seconds from the
    start in all, kills the group of any still running after that, and reads the tail of every ``*.log``."""

    def __init__(self, procs: list, out_dir: Path, deadline: float, tail: int = 4000) -> None:
        self.procs, self.out_dir, self.deadline, self.tail = procs, out_dir, deadline, tail
        self.started = time.monotonic()
        self.elapsed: Optional[float] = None
        self.codes: Optional[List[int]] = None
        self.logs = ""

    def wait(self) -> "Job":
        if self.codes is None:
            codes = []
            for p in self.procs:
                try:
                    codes.append(p.wait(timeout=max(1.0, self.started + self.deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)  # its own session and process group
                    codes.append(p.wait())
            self.elapsed = time.monotonic() - self.started
            self.codes = codes
            self.logs = "\n".join(f.read_text()[-self.tail:] for f in sorted(self.out_dir.glob("*.log")))
        return self


def gloo_ranks(script: str, args: List[str], n: int, cwd: Path, out_dir: Path, deadline: float,
               env: Optional[Callable[[int], Dict[str, str]]] = None, tail: int = 4000) -> Job:
    """``n`` processes of ``python SCRIPT ARGS`` in ``cwd`` with the variables ``torchrun`` sets (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) on top of
    ``env(rank)`` (default: this process's environment), each writing ``out_dir/gloo{rank}.log`` and leading its
    own session."""
    port = free_port()
    procs = []
    for r in range(n):
        e = dict(env(r) if env is not None else os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),
                 LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(_zygote.spawn([script, *map(str, args)], cwd, e, out_dir / f"gloo{r}.log", start_new_session=True))
    return Job(procs, out_dir, deadline, tail)
