"""Crafted checkpoints: a sampler state edited and sealed again (the checksum is recomputed, as anyone can) is
refused on resume with ``CheckpointError`` naming the checkpoint and the field, before any of it reaches a
kernel; an untouched checkpoint still resumes.

The compiled kernels index the data and their own arrays with the trees' fields unchecked: a BART point's leaf
of 30000 made the compiled sweep write outside its arrays (a segmentation fault, or a heap corrupted until the
interpreter's exit), a split on column 30000 of 3 or at cut 30000 gave a "successful" fit on corrupted trees, a
truncated residual a raw ``RuntimeError``, and the same edits to an MCMC, SMC-with-moves or top-down SMC
checkpoint a bare ``IndexError`` / ``ValueError`` or a crash. Every resume runs in a child process, so that a
crash fails its case rather than the test session; the child goes on with the next case after one.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor
from torchtree.io.integrity import CHECKSUM_KEY, seal
from torchtree.monitor import CallbackMonitor

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # unconverged chains of these short runs

# method -> (estimator, settings of the first run, settings of the resume, stop the first run after this step)
RUNS = {
    "bart": ("BayesianTreeRegressor", dict(method="bart", n_trees=10, n_chains=2, n_samples=5, n_warmup=5),
             dict(n_samples=10), None),
    "mcmc_host": ("BayesianTreeClassifier", dict(method="mcmc", engine="host", n_chains=2, n_samples=10, n_warmup=10),
                  dict(n_samples=20), None),
    "mcmc_batched": ("BayesianTreeClassifier", dict(method="mcmc", engine="batched", n_chains=4, n_samples=10,
                                                    n_warmup=10), dict(n_samples=20), None),
    "smc_moves": ("BayesianTreeClassifier", dict(method="smc-moves", n_particles=16, n_iterations=6), {}, 2),
    "smc": ("BayesianTreeClassifier", dict(method="smc", n_particles=32), {}, 2),
}


def _where_split(t: torch.Tensor, value) -> torch.Tensor:
    return torch.where(t >= 0, torch.tensor(value, dtype=t.dtype), t)


def _host_chains(st, edit):
    for rec in st["chains"]:
        edit(rec)


# case -> (method, edit of the sampler state (in place), the field the refusal names)
CASES = {
    "bart_leaf_of_high": ("bart", lambda st: st.update(leaf_of=torch.full_like(st["leaf_of"], 30000)), "leaf_of"),
    "bart_leaf_of_low": ("bart", lambda st: st.update(leaf_of=torch.full_like(st["leaf_of"], -30000)), "leaf_of"),
    "bart_leaf_of_absent_slot": ("bart", lambda st: st.update(leaf_of=torch.full_like(
        st["leaf_of"], st["feature"].shape[-1] - 1)), "leaf_of"),
    "bart_feature": ("bart", lambda st: st.update(feature=_where_split(st["feature"], 30000)), "feature"),
    "bart_cut": ("bart", lambda st: st.update(cut=torch.where(st["feature"] >= 0, torch.tensor(30000, dtype=torch.int16),
                                                              st["cut"])), "cut"),
    "bart_no_root": ("bart", lambda st: st["feature"][0, 0].fill_(-2), "feature"),
    "bart_resid_truncated": ("bart", lambda st: st.update(resid=st["resid"][:, :3]), "resid"),
    "bart_kept_feature": ("bart", lambda st: [c.update(feature=_where_split(c["feature"], 30000))
                                              for c in st["kept"]["chunks"]], "kept.feature"),
    "mcmc_host_assign": ("mcmc_host", lambda st: _host_chains(st, lambda r: r["chain"].update(
        assign=torch.full_like(r["chain"]["assign"], 10 ** 6))), "assign"),
    "mcmc_host_feat": ("mcmc_host", lambda st: _host_chains(st, lambda r: r["chain"].update(
        feat=_where_split(r["chain"]["feat"], 10 ** 6))), "feat"),
    "mcmc_host_left": ("mcmc_host", lambda st: _host_chains(st, lambda r: r["chain"].update(
        left=_where_split(r["chain"]["left"], 10 ** 6))), "left"),
    "mcmc_host_n": ("mcmc_host", lambda st: _host_chains(st, lambda r: r["chain"].update(n=10 ** 6)), "n"),
    "mcmc_host_kept_feat": ("mcmc_host", lambda st: _host_chains(st, lambda r: r["snaps"]["fields"][0].copy_(
        _where_split(r["snaps"]["fields"][0], 100))), "snaps.feature"),
    "mcmc_batched_feature": ("mcmc_batched", lambda st: st["trees"].update(
        feature=_where_split(st["trees"]["feature"], 10 ** 6)), "trees.feature"),
    "mcmc_batched_left": ("mcmc_batched", lambda st: st["trees"].update(
        left=_where_split(st["trees"]["left"], 10 ** 6)), "trees.left"),
    "mcmc_batched_thr_rank": ("mcmc_batched", lambda st: st["trees"]["extra.thr_rank"].add_(10 ** 6),
                              "trees.extra.thr_rank"),
    "mcmc_batched_kept_feature": ("mcmc_batched", lambda st: st["kept"].update(
        feature=torch.full_like(st["kept"]["feature"], 100)), "kept.feature"),
    "smc_moves_feature": ("smc_moves", lambda st: st["trees"].update(
        feature=_where_split(st["trees"]["feature"], 10 ** 6)), "trees.feature"),
    "smc_moves_left": ("smc_moves", lambda st: st["trees"].update(
        left=_where_split(st["trees"]["left"], 10 ** 6)), "trees.left"),
    "smc_buf": ("smc", lambda st: st["growth"]["table"]["buf"].fill_(10 ** 6), "growth.table.buf"),
    "smc_off": ("smc", lambda st: st["growth"]["table"]["off"].clamp_(min=10 ** 6), "growth.table.off"),
    "smc_rfeat": ("smc", lambda st: st["growth"]["table"]["rfeat"].fill_(10 ** 6), "growth.table.rfeat"),
    "smc_node_uid": ("smc", lambda st: st["growth"]["node_uid"].fill_(10 ** 6), "growth.node_uid"),
}
UNTOUCHED = {f"{m}_untouched": (m, lambda st: None, None) for m in RUNS}

# run in the child: each case's resume, one line of JSON per case ("start" first, so that a crash names it)
CHILD = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import torchtree
    from torchtree.io.checkpoint import CheckpointError
    warnings.simplefilter("ignore")
    spec = json.loads(sys.argv[1])
    data = np.load(spec["data"])
    for case in spec["cases"]:
        print(json.dumps({"case": case["name"], "start": True}), flush=True)
        est = getattr(torchtree, case["estimator"])(random_state=0, checkpoint=case["path"], **case["settings"])
        try:
            est.fit(data["X"], data[case["target"]])
            out = {"result": "ok", "finite": bool(np.isfinite(np.asarray(est.predict(data["X"][:5]),
                                                                          dtype=float)).all())}
        except CheckpointError as exc:
            out = {"result": "CheckpointError", "message": str(exc)}
        except Exception as exc:
            out = {"result": type(exc).__name__, "message": str(exc)[:300]}
        print(json.dumps({"case": case["name"], **out}), flush=True)
""")


def _stop_after(k):
    class Stop(RuntimeError):
        pass

    def at_checkpoint(step):
        if step >= k:
            raise Stop(f"stopped after step {step}")

    return Stop, CallbackMonitor(on_checkpoint=at_checkpoint)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case's outcome in a child process: {case: {"result": ..., "message": ...}}."""
    tmp = tmp_path_factory.mktemp("crafted")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    data = {"X": X, "x0": X[:, 0] + 0.1 * rng.normal(size=120), "label": (X[:, 0] + 0.3 * rng.normal(size=120) > 0).astype(np.int64)}
    np.savez(tmp / "data.npz", **data)
    genuine = {}
    for method, (estimator, first, _, stop) in RUNS.items():
        path = str(tmp / f"{method}.ckpt")
        cls = {"BayesianTreeRegressor": BayesianTreeRegressor, "BayesianTreeClassifier": BayesianTreeClassifier}[estimator]
        target = data["x0"] if method == "bart" else data["label"]
        if stop is None:
            cls(random_state=0, checkpoint=path, **first).fit(X, target)
        else:  # interrupted after its checkpoint of step `stop`: the resume runs the rest
            Stop, monitor = _stop_after(stop)
            with pytest.raises(Stop):
                cls(random_state=0, checkpoint=path, monitor=monitor, **first).fit(X, target)
        genuine[method] = torch.load(path, weights_only=True)
    cases = []
    for name, (method, edit, _) in {**CASES, **UNTOUCHED}.items():
        payload = {k: v for k, v in genuine[method].items() if k != CHECKSUM_KEY}
        payload = copy.deepcopy(payload)
        edit(payload["state"]["sampler_state"]["state"])
        path = str(tmp / f"{name}.ckpt")
        torch.save(seal(payload), path)
        estimator, first, resume, _ = RUNS[method]
        cases.append({"name": name, "path": path, "estimator": estimator, "settings": {**first, **resume},
                      "target": "x0" if method == "bart" else "label"})
    out, todo = {}, cases
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    while todo:  # a crash ends the child: the case it was on is recorded, the next child goes on after it
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"data": str(tmp / "data.npz"),
                                                                          "cases": todo})],
                              capture_output=True, text=True, timeout=600, env=env, cwd=str(ROOT))
        started = None
        for line in proc.stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("start"):
                started = rec["case"]
            else:
                out[rec.pop("case")] = rec
                started = None
        if started is not None:
            out[started] = {"result": f"crashed (exit status {proc.returncode})", "message": proc.stderr[-500:]}
        elif proc.returncode:
            pytest.fail(f"the child failed before a case (exit status {proc.returncode}):\n{proc.stderr[-2000:]}")
        todo = [c for c in todo if c["name"] not in out]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_crafted_checkpoint_is_refused_naming_the_field(results, case):
    got = results[case]
    field = CASES[case][2]
    assert got["result"] == "CheckpointError", f"{case}: {got}"
    msg = got["message"]
    assert f"{case}.ckpt: " in msg, msg  # the checkpoint's path
    assert f"'{field}'" in msg or f".{field}'" in msg, msg
    assert "damaged or edited" in msg, msg


@pytest.mark.parametrize("method", sorted(RUNS))
def test_an_untouched_checkpoint_still_resumes(results, method):
    got = results[f"{method}_untouched"]
    assert got == {"result": "ok", "finite": True}, got
