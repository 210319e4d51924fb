#!/usr/bin/env bash
# The prepared GPU check (a lent GPU machine has 15 minutes in all: this runs in under 8).
#
#   bash benchmarks/gpu_check.sh            # from the repository root
#
# Python: $PY, else .venv/bin/python after `make venv`, else python3 (a GPU image with torch, numpy and
# pytest but without this package installed: see below).
# 1. the CUDA tests (pytest -m cuda), 2. BART at 10^4 and 10^5 rows: the CUDA kernel (compile="native": one
# launch per sweep), the torch code on the GPU, and one CPU thread of the same machine; the kernel's 1000 sweeps
# at 10^5 rows, 3. the cost of the estimators' CUDA chain count (gpu_chains) against 4 chains, and of the
# grow-from-root kernel, 4. BART's compiled sweeps recorded as CUDA graphs and not, 5. every hard-tree method at
# 10^4 and 10^6 rows on the GPU and on one CPU thread (bench_scale), 6. a profile of where the GPU's time goes.
# Each stage has its own time limit (560 s at most in all; run it with the device tool's timeout_s=600); results
# go to $OUT (or ./gpu_results) as text.
set -u
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
# Not installed (no `make venv`, no network): the package's layout as an install would make it, in
# this checkout (kernels/ and distributed/ are torchtree.kernels and torchtree.distributed), removed on exit.
if ! "$PY" -c "import torchtree.kernels.native" > /dev/null 2>&1; then
  ln -sfn ../kernels torchtree/kernels && ln -sfn ../distributed torchtree/distributed
  trap 'rm -f torchtree/kernels torchtree/distributed' EXIT
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{ nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1
  "$PY" -c "import sys, torch, torchtree; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available(), torchtree.__file__)" 2>&1
  # the compiled CPU kernels and the CUDA ones, built once before any timed stage (a fresh machine has no cache)
  t0=$SECONDS
  timeout 140 env MAX_JOBS=${MAX_JOBS:-16} "$PY" -c \
    "from torchtree.kernels import native; print('native kernels:', native.available(), 'CUDA kernels:', native.cuda_available())" 2>&1
  echo "kernel builds: $((SECONDS - t0)) s wall"
  # a failed CUDA build: its compiler's messages
  "$PY" -c "from torchtree.kernels import native; print(native.cuda_build_directory())" 2>/dev/null | while read -r dir; do
    [ -f "$dir/torchtree_cuda.so" ] || { echo "no CUDA library in $dir:"; (cd "$dir" && timeout 60 ninja 2>&1 | tail -n 60); }
  done
} > "$OUT/gpu.txt"
# 1. the CUDA tests
timeout 95 "$PY" -m pytest -m cuda -q -p no:cacheprovider tests/test_bart_block.py tests/test_cuda.py \
  tests/test_missing_categorical.py \
  > "$OUT/pytest_cuda.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_cuda.txt"
# 2. BART's MCMC sweeps (n_gfr=0: stage 3 times the grow-from-root kernel): the CUDA kernel, the torch code on
# the GPU, the CPU kernel on one thread; then the target run, 10^5 rows x 200 trees x 1000 sweeps by the kernel
timeout 90 "$PY" - > "$OUT/bart.txt" 2>&1 <<'PYEOF'
import os, time, numpy as np, torch
torch.set_num_threads(1)
from torchtree import BART, Data
rng = np.random.default_rng(0)
def run(d, sweeps, **kw):
    t0, c0 = time.time(), time.process_time()
    post = BART(n_trees=200, n_chains=4, n_warmup=sweeps // 2, n_samples=sweeps // 2, n_gfr=0, **kw).run(d, seed=0)
    torch.cuda.synchronize()
    return post, time.time() - t0, time.process_time() - c0
for n in (10_000, 100_000):
    X = rng.uniform(size=(n, 10)); y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + rng.normal(size=n)
    pred, times = {}, {}
    for dev, mode, sweeps, adds in (("cuda", "native", 50, "atomic"), ("cuda", "native", 50, "warp"),
                                    ("cpu", "native", 50, "-"), ("cuda", "off", 10, "-")):
        os.environ["TORCHTREE_CUDA_CELL_ADDS"] = adds  # the kernel's cell adds: one atomic per point, or per warp first
        post, wall, cpu = run(Data(X, y, task="regression", device=dev), sweeps, compile=mode)
        if mode == "native" and adds != "warp":
            pred[dev], times[dev] = np.asarray(post.predict(X[:1000])), wall
        print(f"BART n={n} {dev} compile={mode} cell adds={adds}: {sweeps} sweeps, wall {wall:.2f} s ({1000 * wall / sweeps:.1f} ms per sweep), cpu {cpu:.1f} s", flush=True)
    os.environ["TORCHTREE_CUDA_CELL_ADDS"] = "atomic"
    print("  largest |prediction on CUDA - on the CPU| over 1000 rows, both kernels:", float(np.abs(pred["cuda"] - pred["cpu"]).max()), flush=True)
per_sweep = times["cuda"] / 50  # the kernel's 50 sweeps at 10^5 rows, setup included
if per_sweep * 1000 < 60:
    post, wall, _ = run(Data(X, y, task="regression", device="cuda"), 1000, compile="native")
    print(f"TARGET BART n=100000 cuda compile=native: 200 trees, 4 chains, 1000 sweeps, wall {wall:.1f} s (target < 30 s)", flush=True)
else:
    print(f"TARGET BART n=100000 cuda compile=native: not run, 1000 sweeps would take about {1000 * per_sweep:.0f} s", flush=True)
PYEOF
echo "bart rc=$?" >> "$OUT/bart.txt"
# 3. what more chains cost on the GPU (the evidence for the estimators' device-aware chain count, gpu_chains: 64
# chains at 10^4 rows, 32 at 10^5): the kernel (one block per chain) and the torch code (the route compile="auto"
# takes on CUDA), 200 trees, the preset's chains against 4 (and 256 on the kernel at 10^5 rows); then what the
# grow-from-root kernel's sweeps cost
timeout 55 "$PY" - > "$OUT/bart_chains.txt" 2>&1 <<'PYEOF'
import time, warnings, numpy as np, torch
warnings.simplefilter("ignore")  # short runs: convergence warnings
from torchtree import BART, Data
from torchtree.samplers.bart.config import gpu_chains
rng = np.random.default_rng(0)
X = rng.uniform(size=(100_000, 10)); y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + rng.normal(size=len(X))
for n in (10_000, 100_000):
    d = Data(X[:n], y[:n], task="regression", device="cuda")
    for mode, sweeps in (("native", 10), ("off", 2)):
        for chains in (4, gpu_chains(n)) + ((256,) if mode == "native" and n == 100_000 else ()):
            t0 = time.time()
            BART(n_trees=200, n_chains=chains, n_warmup=sweeps // 2, n_samples=sweeps // 2, n_gfr=0, compile=mode).run(d, seed=0)
            torch.cuda.synchronize()
            wall = time.time() - t0
            print(f"BART n={n} cuda compile={mode} chains={chains}: wall {wall:.2f} s for {sweeps} sweeps ({1000 * wall / sweeps:.0f} ms per sweep)", flush=True)
    # the grow-from-root kernel: 5 of its sweeps and the 10 MCMC sweeps, against those 10 alone (the preset's chains)
    for gfr in (0, 5):
        t0 = time.time()
        BART(n_trees=200, n_chains=gpu_chains(n), n_warmup=5 + gfr, n_samples=5, n_gfr=gfr, compile="native").run(d, seed=0)
        torch.cuda.synchronize()
        print(f"BART n={n} cuda compile=native chains={gpu_chains(n)} n_gfr={gfr}: wall {time.time() - t0:.2f} s for {10 + gfr} sweeps", flush=True)
PYEOF
echo "bart chains rc=$?" >> "$OUT/bart_chains.txt"
# 4. the compiled and recorded routes, in one process (torch.compile's build paid once): the eager sweeps;
# compile="graph" (torch.compile's kernels recorded as a CUDA graph: its first run builds and records them,
# 10 and 40 sweeps separate that from a replay); compile="on" (the compiled kernels launched one by one)
timeout 40 "$PY" - > "$OUT/bart_graph.txt" 2>&1 <<'PYEOF'
import time, numpy as np, torch
from torchtree import BART, Data
rng = np.random.default_rng(0)
for n in (100_000,):
    X = rng.uniform(size=(n, 10)); y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + rng.normal(size=n)
    d = Data(X, y, task="regression", device="cuda")
    pred = {}
    for mode, sweeps in (("off", 10), ("graph", 10), ("graph", 40), ("on", 10)):
        t0 = time.time()
        post = BART(n_trees=200, n_chains=4, n_warmup=sweeps // 2, n_samples=sweeps // 2, n_gfr=0, compile=mode).run(d, seed=0)
        torch.cuda.synchronize()
        print(f"BART n={n} cuda compile={mode}: wall {time.time() - t0:.2f} s for {sweeps} sweeps", flush=True)
        if sweeps == 10:
            pred[mode] = np.asarray(post.predict(X[:1000]))
    print("largest |prediction - eager's| over 1000 rows:", {m: float(np.abs(p - pred["off"]).max()) for m, p in pred.items()})
PYEOF
echo "bart graph rc=$?" >> "$OUT/bart_graph.txt"
# 5. hard-tree methods: 10^4 rows on both devices, 10^6 on the GPU, and the CPU's 10^6 top-down fit as the
# reference (this machine's CPU; mcmc and smc-moves take 50-380 s there, more than this check can spend)
S="$PY benchmarks/bench_scale.py --threads 1 --baselines-max-n 0 --methods"
{ timeout 35 $S smc mcmc smc-moves --sizes 10000 --devices cpu cuda --timeout 14; echo "rc=$?"
  timeout 55 $S smc mcmc smc-moves --sizes 1000000 --devices cuda --timeout 23; echo "rc=$?"
  timeout 25 $S smc --sizes 1000000 --devices cpu --timeout 23; echo "rc=$?"
} > "$OUT/bench_scale.txt" 2>&1
# 6. where the GPU's time goes (the direction for the next GPU work): torch.profiler over short runs of MCMC's
# batched engine, the top-down filter and BART's eager sweeps; the kernels taking most GPU time, the host calls
# taking most CPU time, and the counts of kernel launches and of host synchronisations
timeout 25 "$PY" - > "$OUT/profile.txt" 2>&1 <<'PYEOF'
import warnings, torch
from torch.profiler import ProfilerActivity, profile
from torchtree import BART, MCMC, Data, TopDownSMC
from torchtree.datasets.scale import interactions
warnings.simplefilter("ignore")
runs = [("MCMC batched, 4 chains x 10 iterations, 10^5 rows", 100_000, "classification",
         lambda: MCMC(n_chains=4, n_warmup=5, n_samples=5, engine="batched")),
        ("top-down SMC, 100 particles, 2 x 10^4 rows", 20_000, "classification", lambda: TopDownSMC(n_particles=100)),
        ("BART eager, 50 trees x 4 chains x 4 sweeps, 10^5 rows", 100_000, "regression",
         lambda: BART(n_trees=50, n_chains=4, n_warmup=2, n_samples=2, n_gfr=0, compile="off"))]
for name, n, task, make in runs:
    X, y = interactions(n, 10, seed=0)
    d = Data(X, y if task == "classification" else y.double() + 0.1 * X[:, 0], task=task, device="cuda")
    make().run(d, seed=0)  # lazy initialisations outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        make().run(d, seed=0)
        torch.cuda.synchronize()
    ka = prof.key_averages()
    count = lambda names: sum(e.count for e in ka if e.key in names)  # noqa: E731
    print(f"== {name}: kernel launches {count({'cudaLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernel', 'cuLaunchKernelEx'})}, "
          f"synchronisations {count({'cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize'})}, "
          f"copies {count({'cudaMemcpyAsync', 'cudaMemcpy'})}", flush=True)
    print(ka.table(sort_by="self_device_time_total", row_limit=10, max_name_column_width=60), flush=True)
    print(ka.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60), flush=True)
PYEOF
echo "profile rc=$?" >> "$OUT/profile.txt"
tail -n 5 "$OUT"/*.txt
