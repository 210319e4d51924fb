"""Reading tables: the CSV reader of the command line and the coding of a mixed data frame.

Three figures, each at 1 and 2 threads (``torch.set_num_threads``), CPU seconds
(``time.process_time``, every thread of the process) and wall seconds, minimum of ``--repeats``:

* ``csv_plain``: ``torchtree.io.csv.read_csv`` of a generated file of ``--rows`` rows, 10 numeric
  features and a 0/1 target (numpy's C parser takes it), and ``csv_general``, the same file through the
  general reader (``_plain_numbers`` switched off), and ``csv_pandas``: ``pandas.read_csv`` of it, for
  reference (when pandas is installed);
* ``data_mixed``: ``torchtree.model.data.Data`` of a frame of ``--rows`` rows: 8 normal columns (three
  with 10% missing cells), a 10-level pandas ``category`` column and a 3-level text column.

Usage::

    python benchmarks/bench_input.py --out benchmarks/results/bench_input.txt
    python benchmarks/bench_input.py --smoke
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# smoke-expect: ^csv_plain +1 thread
# smoke-expect: ^data_mixed +2 threads
# smoke-expect: ^bench_input: done


def _write_csv(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 10)).round(5)
    with open(path, "w") as fh:
        fh.write(",".join([f"x{j}" for j in range(10)] + ["y"]) + "\n")
        np.savetxt(fh, np.c_[X, X[:, 0] > 0], delimiter=",", fmt="%.5g")


def _frame(n: int):
    import pandas as pd

    rng = np.random.default_rng(0)
    df = pd.DataFrame({f"x{j}": rng.normal(size=n) for j in range(8)})
    for j in (0, 3, 6):
        df.loc[rng.random(n) < 0.1, f"x{j}"] = np.nan
    df["c1"] = pd.Categorical(rng.choice(list("abcdefghij"), n))
    df["c2"] = rng.choice(["u", "v", "w"], n).astype(object)
    return df, (df.x1.fillna(0) > 0).astype(int).to_numpy()


def _time(fn, repeats: int):
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        fn()
        best = min(best[0], time.process_time() - c), min(best[1], time.perf_counter() - w)
    return best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", default=None, help="also write the table to this file")
    p.add_argument("--smoke", action="store_true", help="2000 rows, one repeat")
    a = p.parse_args(argv)
    if a.smoke:
        a.rows, a.repeats = 2000, 1
    import torch

    import torchtree.io.csv as csvmod
    from torchtree.model.data import Data

    try:
        import pandas as pd
    except ImportError:
        pd = None
    plain = getattr(csvmod, "_plain_numbers", None)  # None: a version before the plain-file path
    lines = [f"bench_input: {a.rows} rows, min of {a.repeats}, CPU s / wall s"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "table.csv"
        _write_csv(path, a.rows)
        frame = _frame(a.rows) if pd is not None else None
        for threads in a.threads:
            torch.set_num_threads(threads)
            figures = {"csv_plain": lambda: csvmod.read_csv(str(path))}

            def general():
                csvmod._plain_numbers = lambda *args: None
                try:
                    csvmod.read_csv(str(path))
                finally:
                    csvmod._plain_numbers = plain
            if plain is not None:
                figures["csv_general"] = general
            if pd is not None:
                figures["csv_pandas"] = lambda: pd.read_csv(path)
                figures["data_mixed"] = lambda: Data(*frame)
            for name, fn in figures.items():
                cpu, wall = _time(fn, a.repeats)
                lines.append(f"{name:<12} {threads} thread{'s' if threads > 1 else ' '}  cpu {cpu:8.2f}  wall {wall:8.2f}")
                print(lines[-1], flush=True)
    print(lines[0])
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    print("bench_input: done")


if __name__ == "__main__":
    main()
