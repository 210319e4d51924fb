"""Golden outputs: every sampler family gives the numbers recorded in tests/golden/golden.json.

Recorded before the package was re-laid out (torchtree/model, torchtree/steps,
torchtree/samplers, a common sampler driver), so that the move can be shown not to change
a single number. The cases, their settings and the recorder live in
``tests/golden/record_golden.py``; how to re-record (and what that means) is in
``tests/golden/README.md``.

Exactness, per family:

* TopDownSMC, MCMC (host and batched engines), SMCSampler, the estimators, checkpoint
  resume and 2 gloo ranks: bit for bit (floats compared by value and sign, as stored by
  Python's round-tripping repr; weight vectors also by a sha256 of their float64 bytes).
* NUTS and DCC (soft trees): bit for bit as well. They were checked to be reproducible
  run to run and process to process on the CPU with one torch thread (every draw comes
  from generators seeded by ``seed``), so no tolerance is needed. If a future change makes
  them depend on thread scheduling, state a tolerance here rather than re-recording.

Only the public API is used (see record_golden.py), so this file needs no edit when modules move.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN_DIR))
import record_golden as rg  # noqa: E402

RECORDED = json.loads(rg.GOLDEN.read_text())
NAMES = [c["name"] for c in rg.CASES_RAW]
RUNNER = {c["name"]: c["runner"] for c in rg.CASES_RAW}
# This CPU's records: the main ones where they were recorded on a CPU of this capability, else those recorded for
# it apart (by_capability), else the main ones compared with CROSS_CPU's tolerance.
CAPABILITY = rg.cpu_capability()
EXACT_HERE = RECORDED["recorded_with"].get("cpu_capability") == CAPABILITY
HERE = {c["name"]: c for c in RECORDED["cases"]}
if not EXACT_HERE:
    for name, outputs in RECORDED.get("by_capability", {}).get(CAPABILITY, {}).items():
        HERE[name] = dict(HERE[name], outputs=outputs, exact=True)
BY_NAME = HERE

# Tolerances per family: (rtol, atol). All exact (see the module docstring).
TOLERANCE = {"TopDownSMC": (0.0, 0.0), "MCMC": (0.0, 0.0), "SMCSampler": (0.0, 0.0), "estimators": (0.0, 0.0),
             "NUTS": (0.0, 0.0), "DCC": (0.0, 0.0)}
# Another CPU capability (torch.backends.cpu.get_cpu_capability(): AVX512, AVX2, ...) runs torch's vectorised
# exp / log / sums with other instructions, which differ in the last bits. Through the tree samplers' runs those
# differences stay below 1e-8 relative (on an AVX2 CPU against the AVX512 record: weights 7e-15, log evidence
# 1e-15), so where this capability has no record of its own they are compared within 1e-8 (hashes skipped);
# Hamiltonian trajectories (NUTS, DCC) amplify them to 1e-4 - 1e-1, so those cases are skipped there instead.
CROSS_CPU = {"TopDownSMC": (1e-8, 1e-300), "MCMC": (1e-8, 1e-300), "SMCSampler": (1e-8, 1e-300),
             "estimators": (1e-8, 1e-300), "NUTS": None, "DCC": None}


def _cases():
    return {c["name"]: c for c in rg.cases()}


def _assert_same(got, want, what: str, family: str, exact: bool = True):
    if not exact and CROSS_CPU[family] is None:
        pytest.skip(f"{what}: no record for {CAPABILITY} CPUs, and {family}'s trajectories amplify other CPUs' "
                    "last-bit differences (record one: tests/golden/README.md)")
    rtol, atol = TOLERANCE[family] if exact else CROSS_CPU[family]
    diffs = rg.compare(rg.canonical(got), want, what, rtol=rtol, atol=atol)
    assert not diffs, f"{what}: {len(diffs)} difference(s) from tests/golden/golden.json ({CAPABILITY} CPU):\n  " + \
        "\n  ".join(diffs[:12])


def _exact(name: str) -> bool:
    """Whether this CPU's record of ``name`` is its own (compared bit for bit), not another capability's."""
    return EXACT_HERE or BY_NAME[name].get("exact", False)


def _check_settings(case):
    rec = BY_NAME.get(case["name"])
    assert rec is not None, f"case {case['name']} is not in golden.json: record it (tests/golden/README.md)"
    diffs = rg.compare(rg.canonical(case["settings"]), rec["settings"], "settings")
    assert not diffs, (f"the settings of {case['name']} differ from the recorded ones (a changed case must be "
                       f"re-recorded, see tests/golden/README.md):\n  " + "\n  ".join(diffs[:12]))
    return rec


def test_every_case_is_recorded():
    assert NAMES == [c["name"] for c in RECORDED["cases"]]
    assert RECORDED["format"] == rg.FORMAT
    for cap, records in RECORDED.get("by_capability", {}).items():  # another CPU's records: of known cases
        assert cap != RECORDED["recorded_with"].get("cpu_capability") and set(records) <= set(NAMES), cap


@pytest.mark.parametrize("name", [n for n in NAMES if RUNNER[n] in ("sampler", "estimator")])
def test_golden_run(name):
    case = _cases()[name]
    rec = _check_settings(case)
    _assert_same(rg.run_case(case), rec["outputs"], name, case["family"], _exact(name))


@pytest.mark.parametrize("name", [n for n in NAMES if RUNNER[n] == "resume"])
def test_golden_checkpoint_resume(name, tmp_path):
    """A checkpointed run stopped by a monitor raising at step k, then run again with the same
    path and seed, gives the uninterrupted run's posterior exactly."""
    case = _cases()[name]
    rec = _check_settings(case)
    s = case["settings"]
    out = rg.run_resume(s, tmpdir=str(tmp_path))
    k = s["interrupt_at"]
    # the interrupted run left a checkpoint of a step before the final one, at most k
    assert 0 <= out["checkpoint_step"] <= k, out
    # the second run resumed after it rather than starting over
    assert out["first_step_after_resume"] is not None and out["first_step_after_resume"] > out["checkpoint_step"], out
    base = BY_NAME[s["base_case"]]["outputs"]
    _assert_same(out["posterior"], base, f"{name} (resumed) vs {s['base_case']} (uninterrupted)", case["family"],
                 _exact(s["base_case"]))
    _assert_same(out["posterior"], rec["outputs"]["posterior"], name, case["family"], _exact(name))


@pytest.fixture(scope="module")
def rank_results():
    """One job of 2 real gloo processes running every 2-rank case (about 4 s: two interpreters
    importing torch)."""
    _cases()
    names = [n for n in NAMES if RUNNER[n] == "ranks"]
    return rg.run_ranks(names, 2)


@pytest.mark.distributed
@pytest.mark.parametrize("name", [n for n in NAMES if RUNNER[n] == "ranks"])
def test_golden_two_ranks(name, rank_results):
    """Both ranks return the global posterior; the samplers promise it equals one rank's, bit for bit."""
    case = _cases()[name]
    rec = _check_settings(case)
    base = BY_NAME[case["settings"]["base_case"]]["outputs"]
    for r, res in enumerate(rank_results):
        _assert_same(res[name], base, f"{name} rank {r} vs {case['settings']['base_case']} (1 rank)", case["family"],
                     _exact(case["settings"]["base_case"]))
        _assert_same(res[name], rec["outputs"][f"rank{r}"], f"{name} rank {r}", case["family"], _exact(name))


def test_recorded_invariants():
    """What the recorded file itself must satisfy (guards a re-recording): resumed = uninterrupted,
    2 ranks = 1 rank, and the MCMC host loop = the batched loop on the same chains (same
    moves and uniforms; the posterior weights are summed in another order, hence 1e-12); in the main
    records and in each other CPU capability's."""
    main = {c["name"]: c for c in RECORDED["cases"]}
    for outputs in [{n: c["outputs"] for n, c in main.items()}] + list(RECORDED.get("by_capability", {}).values()):
        for name, out in outputs.items():
            c = main[name]
            base = outputs.get(c["settings"].get("base_case"))
            if c["runner"] == "resume" and base is not None:
                assert not rg.compare(out["posterior"], base), name
            if c["runner"] == "ranks" and base is not None:
                for r in range(c["settings"]["world_size"]):
                    assert not rg.compare(out[f"rank{r}"], base), name
    BY_NAME = main
    host, batched = BY_NAME["mcmc_host_1chain"]["outputs"], BY_NAME["mcmc_batched_1chain"]["outputs"]
    assert BY_NAME["mcmc_host_1chain"]["engine"] == "host" and BY_NAME["mcmc_batched_1chain"]["engine"] == "batched"
    for key in ("predict_proba", "predict", "log_predictive", "n_leaves_first5"):
        assert not rg.compare(host[key], batched[key], key, rtol=1e-12, atol=1e-12), key
    w_host, w_batched = torch.tensor(host["weights"]["first5"]), torch.tensor(batched["weights"]["first5"])
    assert torch.allclose(w_host, w_batched, rtol=1e-12, atol=0)
    # several chains: the host engine runs them one after another, the same chains as the batch
    host, batched = BY_NAME["mcmc_host_4chains"]["outputs"], BY_NAME["mcmc_batched_4chains"]["outputs"]
    for key in ("predict_proba", "predict", "log_predictive"):
        assert not rg.compare(host[key], batched[key], key, rtol=1e-12, atol=1e-12), key
