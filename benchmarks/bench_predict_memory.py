"""Peak memory and CPU time of prediction as the number of rows grows.

Fits ``BayesianTreeRegressor()`` (default settings, seed 0) on 105 abalone rows once,
saves the posterior, then runs each case -- ``predict`` (posterior mean) or
``predict_interval`` (level 0.9, 4000 draws) on N rows -- in its own subprocess and
reports that process's peak RSS, the CPU seconds (user + system) and wall seconds of
the call. The N query rows cycle through the 4177 abalone rows.

    python benchmarks/bench_predict_memory.py                      # this checkout
    python benchmarks/bench_predict_memory.py --root /tmp/main     # another checkout's code
    python benchmarks/bench_predict_memory.py --rows 2000,20000 --ops interval
    python benchmarks/bench_predict_memory.py --smoke --out rows.json   # seconds, for the test-suite (one child)

``--root`` runs the code of another source tree (e.g. ``git archive main | tar -x -C
/tmp/main``) on the same posterior file; ``--as-limit`` caps each subprocess's address
space (default 12 GiB) so that a case that cannot fit fails instead of exhausting the
machine. Data: ``data/abalone.csv.gz`` of this repository.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

# smoke-expect: ^\{"op": "predict", "rows": 200, "peak_rss_mib"
# smoke-expect: ^\{"op": "interval", "rows": 200, "peak_rss_mib"

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "abalone.csv.gz")


def _use_root(root: str) -> None:
    """Import ``torchtree`` (and its kernels / distributed packages) from ``root``."""
    import importlib.machinery

    mapping = {"torchtree": "torchtree", "torchtree.kernels": "kernels", "torchtree.distributed": "distributed"}

    class Finder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name in mapping:
                d = os.path.join(root, mapping[name])
                return importlib.machinery.PathFinder.find_spec(name, [os.path.dirname(d)]) if name == "torchtree" \
                    else importlib.util.spec_from_file_location(name, os.path.join(d, "__init__.py"),
                                                                submodule_search_locations=[d])
            return None

    import importlib.util

    sys.meta_path.insert(0, Finder)
    sys.path.insert(0, root)


def _abalone():
    import numpy as np

    arr = np.loadtxt(DATA, delimiter=",", skiprows=1, dtype=np.float64)
    return arr[:, :-1], arr[:, -1]


def fit(path: str, smoke: bool = False) -> None:
    import torchtree

    X, y = _abalone()
    reg = torchtree.BayesianTreeRegressor(**({"n_particles": 50, "hyper": "fixed"} if smoke else {})).fit(X[::40],
                                                                                                         y[::40])
    reg.posterior_.save(path)
    print(f"fitted: {reg.posterior_!r}", flush=True)


def child(path: str, op: str, n: int) -> None:
    import numpy as np
    import torch
    import torchtree

    post = torchtree.TreePosterior.load(path)
    X, _ = _abalone()
    Xq = X[np.arange(n) % X.shape[0]]
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = post.predict(Xq) if op == "predict" else post.predict_interval(Xq, level=0.9)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps({"op": op, "rows": n, "peak_rss_mib": r1.ru_maxrss / 1024, "cpu_s": cpu, "wall_s": wall,
                      "threads": torch.get_num_threads(),
                      "code": os.path.dirname(os.path.dirname(torchtree.__file__)), "checksum": float(np.asarray(out, np.float64).sum())}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", help="source tree whose torchtree to run (default: the installed one)")
    ap.add_argument("--rows", default="2000,20000,100000,1000000")
    ap.add_argument("--ops", default="predict,interval")
    ap.add_argument("--posterior", help="posterior file to use (fitted and written there if absent)")
    ap.add_argument("--as-limit", default="12", help="address-space cap of each case, GiB")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run for the test-suite: 200 rows, a 50-particle fit (no evidence search), one child")
    ap.add_argument("--out", help="also write the rows as a JSON list to this file")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.smoke:
        a.rows = "200"
    if a.root:
        _use_root(os.path.abspath(a.root))
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]))
        return
    tmp = tempfile.mkdtemp()
    path = a.posterior or os.path.join(tmp, "posterior.pt")
    if not os.path.exists(path):
        fit(path, smoke=a.smoke)
    cap = int(float(a.as_limit) * (1 << 30))
    rows = []
    for op in a.ops.split(","):
        for n in [int(v) for v in a.rows.split(",")]:
            if a.smoke and rows:
                # --smoke: the first case runs in a child as in the full run, the others here (their peak RSS is
                # then this process's, meaningless in a smoke run; a child each would only add torch's import)
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    child(path, op, n)
                line = buf.getvalue().strip().splitlines()[-1]
                print(line, flush=True)
                rows.append(json.loads(line))
                continue
            cmd = [sys.executable, os.path.abspath(__file__)] + (["--root", a.root] if a.root else []) + \
                  ["--child", path, op, str(n)]
            p = subprocess.run(cmd, capture_output=True, text=True,
                               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
            if p.returncode == 0:
                line = p.stdout.strip().splitlines()[-1]
            else:
                last = (p.stderr.strip().splitlines() or ["?"])[-1]
                line = json.dumps({"op": op, "rows": n, "failed": f"exit {p.returncode}: {last[:200]}"})
            print(line, flush=True)
            rows.append(json.loads(line))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
