"""Launching rank processes from tests: a free local port, and ``torchrun`` with two ranks."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


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
