"""Run every ```python block of README.md and report its CPU and wall seconds.

The blocks run in a subprocess (``OMP_NUM_THREADS`` = ``--threads``, a fresh temporary
directory as working directory, so the files a snippet writes go there), in order and in one
namespace, as a reader runs them: the blocks build on each other (the soft-tree block uses the
quick start's ``X``, ``y``, ``tr``, ``te``). Each block is timed alone (CPU seconds of the
process, all threads, and wall seconds) under its own ``--timeout`` (an alarm inside the
subprocess); a block that fails or runs past it is reported as such and the next one still
runs. ``--isolated`` instead gives every block its own subprocess, which first re-runs the
blocks before it untimed (costly: the prefix runs again for every block).

Usage::

    python benchmarks/check_readme_snippets.py                       # all blocks, 1 thread
    python benchmarks/check_readme_snippets.py --only 3 --threads 2
    python benchmarks/check_readme_snippets.py --out benchmarks/results/readme_snippets.txt

Exit status 1 when a block failed, timed out, or took more than ``--limit`` seconds
(default 60: every README snippet must finish in under a minute) of CPU time, or of wall time
with ``--limit-on wall``. CPU is the default because on a shared machine the wall time
measures the other jobs too (on the 2-core box shared by several jobs it was 2.5x the CPU
time); on an idle machine at one thread they agree.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent

# smoke-expect: ^block 1 .*: ok; cpu [0-9.]+ s, wall [0-9.]+ s

SMOKE_README = "# demo\n\n```python\nx = 20\n```\n\ntext\n\n```python\nprint(x + 1)\n```\n"

RUNNER = r"""
import json, sys, time
blocks = json.loads(sys.argv[1]); k = int(sys.argv[2])
ns = {"__name__": "__main__"}
for i in range(k):
    exec(compile(blocks[i], f"README block {i}", "exec"), ns)
c0, w0 = time.process_time(), time.perf_counter()
exec(compile(blocks[k], f"README block {k}", "exec"), ns)
print("@@TIMES@@" + json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}))
"""

SHARED_RUNNER = r"""
import json, signal, sys, time, traceback
blocks = json.loads(sys.argv[1]); timeout = float(sys.argv[2]); only = json.loads(sys.argv[3])
ns = {"__name__": "__main__"}

class Overran(BaseException):
    pass

def alarm(signum, frame):
    raise Overran

signal.signal(signal.SIGALRM, alarm)
for k, code in enumerate(blocks):
    c0, w0 = time.process_time(), time.perf_counter()
    status, err = "ok", ""
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        exec(compile(code, f"README block {k}", "exec"), ns)
    except Overran:
        status = "timeout"
    except BaseException as exc:
        status, err = f"failed ({type(exc).__name__})", traceback.format_exc()[-2000:]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print("@@TIMES@@" + json.dumps({"k": k, "status": status, "cpu": time.process_time() - c0,
                                    "wall": time.perf_counter() - w0, "stderr": err}), flush=True)
"""


def run_shared(blocks: List[str], threads: int, timeout: float) -> List[dict]:
    """Run all blocks in order in one subprocess, each under its own ``timeout``.

    Returns
    -------
    list of dict per block: ``status``, ``cpu`` / ``wall`` seconds (None unless ok), ``stderr``
    """
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="readme_snippets_") as tmp:
        try:
            p = subprocess.run([sys.executable, "-c", SHARED_RUNNER, json.dumps(blocks), str(timeout), "null"],
                               cwd=tmp, env=env, capture_output=True, text=True,
                               timeout=timeout * len(blocks) + 120)
            out = p.stdout
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    got = {}
    for ln in out.splitlines():
        if ln.startswith("@@TIMES@@"):
            r = json.loads(ln[len("@@TIMES@@"):])
            ok = r["status"] == "ok"
            got[r["k"]] = {"status": r["status"], "cpu": r["cpu"] if ok else None, "wall": r["wall"] if ok else None,
                           "stderr": r["stderr"]}
    return [got.get(k, {"status": "not run (the subprocess died)", "cpu": None, "wall": None, "stderr": ""})
            for k in range(len(blocks))]


def python_blocks(text: str) -> List[Tuple[int, str]]:
    """The ```python blocks of a Markdown text.

    Parameters
    ----------
    text : str

    Returns
    -------
    list of (first line number, 1-based; the block's code)
    """
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        if re.match(r"^\s*```python\s*$", lines[i]):
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
                j += 1
            out.append((i + 2, "\n".join(lines[i + 1 : j])))
            i = j
        i += 1
    return out


def run_block(blocks: List[str], k: int, threads: int, timeout: float) -> dict:
    """Run block ``k`` (after blocks ``0..k-1``, untimed) in a subprocess.

    Returns
    -------
    dict with ``status`` ("ok", "failed", "timeout"), ``cpu`` / ``wall`` seconds of the block
    (None unless ok), ``total_wall`` of the subprocess, and the tail of its stderr.
    """
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="readme_snippet_") as tmp:
        try:
            p = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(blocks), str(k)], cwd=tmp, env=env,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "cpu": None, "wall": None, "total_wall": time.perf_counter() - t0,
                    "stderr": ""}
    total = time.perf_counter() - t0
    found = [ln for ln in p.stdout.splitlines() if ln.startswith("@@TIMES@@")]
    if p.returncode != 0 or not found:
        return {"status": f"failed (exit {p.returncode})", "cpu": None, "wall": None, "total_wall": total,
                "stderr": p.stderr[-2000:]}
    t = json.loads(found[-1][len("@@TIMES@@"):])
    return {"status": "ok", "cpu": t["cpu"], "wall": t["wall"], "total_wall": total, "stderr": ""}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0, help="wall seconds per block (--isolated: per subprocess, "
                    "setup blocks included)")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds a block may take")
    ap.add_argument("--limit-on", choices=("cpu", "wall"), default="cpu", help="which seconds --limit bounds")
    ap.add_argument("--only", type=int, nargs="*", help="block indices to run (default: all)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--smoke", action="store_true", help="check the machinery on a two-block Markdown text")
    ap.add_argument("--isolated", action="store_true", help="one subprocess per block (re-running the blocks before it)")
    args = ap.parse_args(argv)
    found = python_blocks(SMOKE_README if args.smoke else Path(args.readme).read_text())
    blocks = [code for _, code in found]
    rows, bad = [], False
    header = (f"README.md python blocks, OMP_NUM_THREADS={args.threads}, limit {args.limit:g} {args.limit_on} s "
              f"(cpu = the snippet process's CPU seconds over all threads; wall includes waiting for "
              f"other jobs on a shared machine)")
    print(header, flush=True)
    shared = None if args.isolated else run_shared(blocks, args.threads, args.timeout)
    for k, (line, code) in enumerate(found):
        if args.only is not None and k not in args.only:
            continue
        r = shared[k] if shared is not None else run_block(blocks, k, args.threads, args.timeout)
        first = next((ln.strip() for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
        over = r["status"] == "ok" and r[args.limit_on] > args.limit
        bad |= r["status"] != "ok" or over
        cpu = "-" if r["cpu"] is None else f"{r['cpu']:.1f}"
        wall = "-" if r["wall"] is None else f"{r['wall']:.1f}"
        row = (f"block {k} (README line {line}): {r['status']}{' OVER LIMIT' if over else ''}; "
               f"cpu {cpu} s, wall {wall} s; first line: {first[:70]}")
        rows.append(row)
        print(row, flush=True)
        if r["stderr"]:
            print("  " + r["stderr"].strip().replace("\n", "\n  "), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(header + "\n" + "\n".join(rows) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
