"""Run Python scripts as ``python SCRIPT ARGS`` would, forked from a process that has imported torch already.

Each script of the example smoke tests (tests/test_examples.py) starting its own interpreter paid torch's
import, about 3 CPU seconds on the 2-core test machine, 40 times over. Here one server process per test
worker (``python tests/_zygote.py``) imports torch, numpy and torchtree once, single-threaded, and forks a
child per script: the child takes the request's working folder, environment, standard streams (files) and
``sys.argv``, runs the script's code as the module ``__main__`` (so ``if __name__ == "__main__"``, pickling
of its classes and ``sys.executable`` re-runs of ``__file__`` behave as in a fresh interpreter), and exits
the way an interpreter exits (threads joined, ``atexit`` run; an uncaught exception prints its traceback and
exits 1; ``SystemExit``'s code is the exit status) but for the teardown of its modules, which ``os._exit``
skips (:func:`_run`). The server imports scikit-learn too, which a third of the scripts use.

What a child shares with the server is only what the import did: a request whose environment differs from
the server's in anything read at import (thread counts, ``PYTHONPATH``, ``TORCH*`` / ``TORCHTREE*``
/ ``SKLEARN_*`` variables, ``CUDA_VISIBLE_DEVICES``) runs as a plain subprocess instead, and so does every request when
``TORCHTREE_TEST_ZYGOTE=0``.

:func:`run` runs one script to its end, as :func:`subprocess.run` would; :func:`spawn` starts one and returns
at once a handle with ``pid``, ``poll()``, ``wait(timeout)`` and ``returncode``, as :class:`subprocess.Popen`
does (the rank processes of the multi-process tests: several at once). One server per import-time
environment serves both.

Protocol: one JSON request per line on the server's stdin, ``{"id", "argv", "cwd", "env", "out", "err",
"session"}`` (``err`` equal to ``out``: one file for both; ``session``: the child leads a new session, as
``start_new_session=True``); the server answers ``{"id", "pid"}`` when the child is forked and ``{"id",
"rc"}`` when it has exited (a negative code: killed by that signal). Children run side by side.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

#: environment variables read when torch or torchtree is imported: a request must agree with the server on them
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "PYTHON", "TORCH", "CUDA_", "LD_", "SKLEARN_")


def _import_time_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


# ------------------------------------------------------------------------------------------------ server
def _child(req: dict) -> None:
    """In the forked child: become ``python argv[0] argv[1:]`` in ``cwd`` with ``env``, and exit with its code."""
    import types

    if req.get("session"):
        os.setsid()
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           (2, req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        if fd == 2 and path == req["out"]:
            os.dup2(1, 2)  # one file, one offset: the lines of both streams in their order
            continue
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
    exec(code, main.__dict__)


def _exit_status(exc: SystemExit) -> int:
    """The status an interpreter exits with on ``exc``: None is 0, an int itself, anything else is printed and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run(req: dict) -> int:
    """In the forked child: :func:`_child`, then what an interpreter does at exit but the teardown of its modules
    (an uncaught exception printed, non-daemon threads joined, ``atexit`` callbacks run, the standard streams
    flushed); the caller then ends the process with ``os._exit``. Tearing the modules down cost each forked child
    1.5-2 CPU seconds (every object it touches copies a page it shares with the server). Only an object still
    alive at exit would notice (a file left open and unflushed stays so)."""
    try:
        _child(req)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # what the interpreter calls to join the threads that are not daemons
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return status


def serve() -> None:
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import torchtree  # noqa: F401

    try:  # a third of the scripts use scikit-learn: its import (scipy and pandas with it) is ~1.7 CPU s each
        import sklearn  # noqa: F401
    except ImportError:
        pass
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nothing the server or a child prints reaches the protocol's stream
    running: Dict[int, object] = {}  # pid -> request id
    pending, open_ = b"", True
    while open_ or running:
        if open_ and select.select([0], [], [], 0.02)[0]:
            chunk = os.read(0, 65536)
            open_ = bool(chunk)
            pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                answers.close()
                os._exit(_run(req))
            running[pid] = req["id"]
            answers.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")
        if not open_ and not running:
            break
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in running:
                answers.write(json.dumps({"id": running.pop(pid), "rc": os.waitstatus_to_exitcode(status)}) + "\n")
        if not open_ and running:
            time.sleep(0.02)


# ------------------------------------------------------------------------------------------------ client
class Result:
    """What :func:`subprocess.run` with ``capture_output=True, text=True`` returns, in short."""

    def __init__(self, args: List[str], returncode: int, stdout: str, stderr: str) -> None:
        self.args, self.returncode, self.stdout, self.stderr = args, returncode, stdout, stderr


class _Server:
    """One server process, its import-time environment, and the answers read from it but not yet claimed."""

    def __init__(self, env: Dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True, bufsize=1)
        atexit.register(self.close)
        self.buffer = bytearray()  # what the server answered past the last line read
        self.answers: Dict[int, Dict[str, int]] = {}  # request id -> {"pid": ..., "rc": ...}
        self.next_id = 0

    def close(self) -> None:
        """End the server: it exits once its children have (a child still running after 10 s is killed with it).
        Waiting for it adds its and its children's CPU time to this process's children's."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()

    def request(self, argv: List[str], cwd: Path, env: Dict[str, str], out: Path, err: Path, session: bool) -> int:
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"id": self.next_id, "argv": [str(a) for a in argv], "cwd": str(cwd),
                                          "env": env, "out": str(out), "err": str(err), "session": session}) + "\n")
        self.proc.stdin.flush()
        return self.next_id

    def answer(self, rid: int, key: str, deadline: float) -> Optional[int]:
        """Request ``rid``'s ``key`` (``"pid"`` or ``"rc"``), or None at ``deadline``. Answers to other requests
        are kept for them (read from the pipe unbuffered: a buffered reader could hold several answers while
        ``select`` waits for more)."""
        fd = self.proc.stdout.fileno()
        while key not in self.answers.get(rid, {}):
            while b"\n" in self.buffer:
                line, _, rest = bytes(self.buffer).partition(b"\n")
                self.buffer[:] = rest
                a = json.loads(line)
                self.answers.setdefault(a.pop("id"), {}).update(a)
            if key in self.answers.get(rid, {}):
                break
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None  # a deadline now or past still reads what has come (poll)
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the zygote server died")
            self.buffer.extend(chunk)
        return self.answers[rid][key]


_SERVERS: Dict[tuple, _Server] = {}


def _server(env: Dict[str, str]) -> Optional[_Server]:
    """The server of ``env``'s import-time variables (started on first use), or None where forking is off."""
    if os.environ.get("TORCHTREE_TEST_ZYGOTE", "1") == "0" or not hasattr(os, "fork"):
        return None
    key = tuple(sorted(_import_time_env(env).items()))
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        server = _SERVERS[key] = _Server(env)
    return server


class Child:
    """A script started by :func:`spawn`: ``pid``, ``returncode``, ``poll()``, ``wait(timeout)`` and ``kill()``,
    as :class:`subprocess.Popen` has them."""

    def __init__(self, server: _Server, rid: int, args: List[str]) -> None:
        self.server, self.rid, self.args = server, rid, args
        self.pid = server.answer(rid, "pid", time.monotonic() + 60)
        if self.pid is None:
            raise RuntimeError("the zygote server did not start the script")
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self.server.answer(self.rid, "rc", time.monotonic())
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            deadline = time.monotonic() + (1e9 if timeout is None else timeout)
            self.returncode = self.server.answer(self.rid, "rc", deadline)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def spawn(argv: List[str], cwd: Path, env: Dict[str, str], log: Path, start_new_session: bool = False):
    """Start ``python argv[0] argv[1:]`` in ``cwd`` with ``env``, both output streams to the file ``log``, and
    return at once: a :class:`Child` forked from the server, or a :class:`subprocess.Popen` where forking is
    off or the import-time environment differs."""
    server = _server(env)
    if server is None:
        with open(log, "w") as fh:
            return subprocess.Popen([sys.executable] + [str(a) for a in argv], cwd=cwd, env=env, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=start_new_session)
    rid = server.request(argv, cwd, env, log, log, start_new_session)
    return Child(server, rid, [sys.executable] + [str(a) for a in argv])


def run(argv: List[str], cwd: Path, env: Dict[str, str], timeout: float) -> Result:
    """Run ``python argv[0] argv[1:]`` in ``cwd`` with ``env``, its output captured as text; raise
    :class:`subprocess.TimeoutExpired` after ``timeout`` seconds (the script is killed)."""
    server = _server(env)
    if server is None:
        r = subprocess.run([sys.executable] + argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env=env)
        return Result(r.args, r.returncode, r.stdout, r.stderr)
    out, err = Path(cwd) / ".zygote.out", Path(cwd) / ".zygote.err"
    child = Child(server, server.request(argv, cwd, env, out, err, False), [sys.executable] + argv)
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(60)
        raise subprocess.TimeoutExpired([sys.executable] + argv, timeout, out.read_text(), err.read_text())
    stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    out.unlink()
    err.unlink()
    return Result([sys.executable] + argv, child.returncode, stdout, stderr)


if __name__ == "__main__":
    serve()
