#!/usr/bin/env bash
# The prepared GPU check (a lent GPU machine has 15 minutes in all: this runs in under 8).
#
#   bash benchmarks/gpu_check.sh            # from the repository root, after `make venv`
#
# 1. the CUDA tests (pytest -m cuda), 2. every hard-tree method at 10^4 and 10^6 rows on the GPU and on
# one CPU thread of the same machine (bench_scale), 3. BART at 10^4 and 10^5 rows, GPU against one CPU
# thread, 4. BART's cost on the GPU at 4, 16 and 64 chains. Each stage has its own time limit; results go to $OUT (or ./gpu_results) as text.
set -u
PY=${PY:-.venv/bin/python}
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1 || true
timeout 150 "$PY" -m pytest -m cuda -q -x -p no:cacheprovider tests/test_cuda.py tests/test_missing_categorical.py \
  > "$OUT/pytest_cuda.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_cuda.txt"
timeout 200 "$PY" benchmarks/bench_scale.py --methods smc mcmc smc-moves --sizes 10000 1000000 --threads 1 \
  --devices cpu cuda --timeout 60 > "$OUT/bench_scale.txt" 2>&1; echo "rc=$?" >> "$OUT/bench_scale.txt"
timeout 120 "$PY" - > "$OUT/bart.txt" 2>&1 <<'PYEOF'
import time, numpy as np, torch
torch.set_num_threads(1)
from torchtree import BART, Data
rng = np.random.default_rng(0)
for n in (10_000, 100_000):
    X = rng.uniform(size=(n, 10)); y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + rng.normal(size=n)
    for dev in ("cpu", "cuda"):
        d = Data(X, y, task="regression", device=dev)
        t0, c0 = time.time(), time.process_time()
        BART(n_trees=200, n_chains=4, n_warmup=50, n_samples=50, n_gfr=0).run(d, seed=0)  # MCMC sweeps on both
        if dev == "cuda":
            torch.cuda.synchronize()
        print(f"BART n={n} {dev}: wall {time.time() - t0:.1f} s, cpu {time.process_time() - c0:.1f} s", flush=True)
PYEOF
echo "bart rc=$?" >> "$OUT/bart.txt"
# 4. what more chains cost on the GPU (the evidence for a device-aware default chain count): 10^5 rows,
# 200 trees, 20 sweeps, 4 / 16 / 64 chains
timeout 90 "$PY" - > "$OUT/bart_chains.txt" 2>&1 <<'PYEOF'
import time, numpy as np, torch
from torchtree import BART, Data
rng = np.random.default_rng(0)
n = 100_000
X = rng.uniform(size=(n, 10)); y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + rng.normal(size=n)
d = Data(X, y, task="regression", device="cuda")
for chains in (4, 16, 64):
    t0 = time.time()
    BART(n_trees=200, n_chains=chains, n_warmup=10, n_samples=10, n_gfr=0).run(d, seed=0)
    torch.cuda.synchronize()
    print(f"BART n={n} cuda chains={chains}: wall {time.time() - t0:.1f} s for 20 sweeps", flush=True)
PYEOF
echo "bart chains rc=$?" >> "$OUT/bart_chains.txt"
tail -n 5 "$OUT"/*.txt
