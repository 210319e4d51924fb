"""Run Python scripts as ``python SCRIPT ARGS`` would, forked from a process that has imported torch already.

Each script of the example smoke tests (tests/test_examples.py) starting its own interpreter paid torch's
import, about 3 CPU seconds on the 2-core test machine, 40 times over. Here one server process per test
worker (``python tests/_zygote.py``) imports torch, numpy and torchtree once, single-threaded, and forks a
child per script: the child takes the request's working folder, environment, standard streams (files) and
``sys.argv``, runs the script's code as the module ``__main__`` (so ``if __name__ == "__main__"``, pickling
of its classes and ``sys.executable`` re-runs of ``__file__`` behave as in a fresh interpreter), and exits
the way an interpreter exits (threads joined, ``atexit`` run; an uncaught exception prints its traceback and
exits 1; ``SystemExit``'s code is the exit status).

What a child shares with the server is only what the import did: a request whose environment differs from
the server's in anything read at import (thread counts, ``PYTHONPATH``, ``TORCH*`` / ``TORCHTREE*``
variables, ``CUDA_VISIBLE_DEVICES``) runs as a plain subprocess instead, and so does every request when
``TORCHTREE_TEST_ZYGOTE=0``.

Protocol: one JSON request per line on the server's stdin, ``{"argv", "cwd", "env", "out", "err"}``; the
server answers ``{"pid": ...}`` when the child is forked and ``{"rc": ...}`` when it has exited (a negative
code: killed by that signal).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

#: environment variables read when torch or torchtree is imported: a request must agree with the server on them
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "PYTHON", "TORCH", "CUDA_", "LD_")


def _import_time_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


# ------------------------------------------------------------------------------------------------ server
def _child(req: dict) -> None:
    """In the forked child: become ``python argv[0] argv[1:]`` in ``cwd`` with ``env``, and exit with its code."""
    import types

    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           (2, req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        f = os.open(path, mode, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(os.devnull)  # the server's request stream stays the server's
    script = os.path.abspath(req["argv"][0])
    sys.argv = [req["argv"][0]] + list(req["argv"][1:])
    sys.path[0] = os.path.dirname(script)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __builtins__=__builtins__, __spec__=None, __loader__=None,
                         __package__=None, __cached__=None)
    sys.modules["__main__"] = main
    with open(script, "rb") as fh:
        code = compile(fh.read(), script, "exec")
    exec(code, main.__dict__)  # an exception escapes to the interpreter, which prints it and exits 1


def serve() -> None:
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import torchtree  # noqa: F401

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nothing the server or a child prints reaches the protocol's stream
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            answers.close()
            _child(req)
            sys.exit(0)
        answers.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        answers.write(json.dumps({"rc": code}) + "\n")


# ------------------------------------------------------------------------------------------------ client
class Result:
    """What :func:`subprocess.run` with ``capture_output=True, text=True`` returns, in short."""

    def __init__(self, args: List[str], returncode: int, stdout: str, stderr: str) -> None:
        self.args, self.returncode, self.stdout, self.stderr = args, returncode, stdout, stderr


_SERVER: Optional[subprocess.Popen] = None
_SERVER_ENV: Dict[str, str] = {}
_PENDING = bytearray()  # what the server answered past the last line read


def _server(env: Dict[str, str]) -> Optional[subprocess.Popen]:
    global _SERVER, _SERVER_ENV
    if os.environ.get("TORCHTREE_TEST_ZYGOTE", "1") == "0" or not hasattr(os, "fork"):
        return None
    if _SERVER is not None and _SERVER.poll() is None:
        return _SERVER if _import_time_env(env) == _SERVER_ENV else None
    _PENDING.clear()
    _SERVER = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                               text=True, bufsize=1)
    _SERVER_ENV = _import_time_env(env)
    atexit.register(_SERVER.kill)
    return _SERVER


def _answer(server: subprocess.Popen, deadline: float) -> Optional[dict]:
    """The server's next answer, or None at ``deadline`` (read from the pipe unbuffered: a buffered reader
    could hold both answers while ``select`` waits for more)."""
    fd = server.stdout.fileno()
    while b"\n" not in _PENDING:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            raise RuntimeError("the zygote server died")
        _PENDING.extend(chunk)
    line, _, rest = bytes(_PENDING).partition(b"\n")
    _PENDING[:] = rest
    return json.loads(line)


def run(argv: List[str], cwd: Path, env: Dict[str, str], timeout: float) -> Result:
    """Run ``python argv[0] argv[1:]`` in ``cwd`` with ``env``, its output captured as text; raise
    :class:`subprocess.TimeoutExpired` after ``timeout`` seconds (the script is killed)."""
    server = _server(env)
    if server is None:
        r = subprocess.run([sys.executable] + argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env=env)
        return Result(r.args, r.returncode, r.stdout, r.stderr)
    out, err = Path(cwd) / ".zygote.out", Path(cwd) / ".zygote.err"
    server.stdin.write(json.dumps({"argv": [str(a) for a in argv], "cwd": str(cwd), "env": env, "out": str(out),
                                   "err": str(err)}) + "\n")
    server.stdin.flush()
    deadline = time.monotonic() + timeout
    pid = _answer(server, deadline + 30)["pid"]
    done = _answer(server, deadline)
    if done is None:
        os.kill(pid, signal.SIGKILL)
        _answer(server, time.monotonic() + 60)
        raise subprocess.TimeoutExpired([sys.executable] + argv, timeout, out.read_text(), err.read_text())
    stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    out.unlink()
    err.unlink()
    return Result([sys.executable] + argv, done["rc"], stdout, stderr)


if __name__ == "__main__":
    serve()
