"""Runs a batch of fuzz cases of ``tests/test_fuzz_inputs.py`` under a memory cap and reports what happened.

Usage::

    python _fuzz_worker.py CASES.pkl RESULTS.jsonl MEMORY_BYTES CASE_SECONDS

``CASES.pkl`` holds a list of case specs (dicts, see ``test_fuzz_inputs.py``). For each case
this process writes a line ``{"start": id}`` to ``RESULTS.jsonl`` before running it and a
line ``{"id": id, ...}`` with the observation after, flushed at once: if the process dies
(a segfault, the kernel's OOM killer, the parent's time limit) the parent knows which case
was running and starts a new worker on the cases after it.

The worker only observes (what was raised, with what message; what shape and values came
back); the test decides what is acceptable. ``RLIMIT_AS`` caps the address space, so an
input that makes torchtree allocate without bound shows up as an allocator error in this
process instead of swapping or OOM-killing the machine; ``signal.alarm`` turns a case that
hangs in Python code into an observation ("hang") instead of a stuck test run.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import pickle
import resource
import signal
import sys
import traceback
import warnings

import numpy as np


class _Hang(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` inside torchtree swallows it."""


def _on_alarm(signum, frame):
    raise _Hang()


def _exc(exc: BaseException, stage: str) -> dict:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"outcome": "raised", "stage": stage, "type": type(exc).__name__,
            "mro": [k.__name__ for k in type(exc).__mro__], "msg": str(exc), "tb": "".join(tb)[-3000:]}


def _array_report(out) -> dict:
    a = np.asarray(out)
    rep = {"shape": list(a.shape), "kind": a.dtype.kind}
    if a.dtype.kind in "biuf":
        rep["finite"] = bool(np.isfinite(a.astype(np.float64)).all())
    return rep


# ------------------------------------------------------------------------ API cases
_FITTED: dict = {}


def _estimator(spec):
    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

    Est = BayesianTreeClassifier if spec["est"] == "clf" else BayesianTreeRegressor
    return Est(method=spec["method"], random_state=0, device="cpu", **spec["kw"])


def _run_api(spec) -> dict:
    stage = "fit"
    try:
        if spec.get("ref") is not None:
            # a prediction case: fit the reference data once per worker and method
            key = (spec["method"], spec["est"], spec["ref"])
            if key not in _FITTED:
                _FITTED[key] = _estimator(spec).fit(spec["ref_X"], spec["ref_y"])
            model = _FITTED[key]
        else:
            model = _estimator(spec).fit(spec["X"], spec["y"])
        Xp = spec["X_predict"]
        reports = {}
        for call in spec["calls"]:
            stage = call
            out = getattr(model, call)(Xp)
            reports[call] = _array_report(out)
            if call == "predict" and spec["est"] == "clf":
                classes = set(np.asarray(model.classes_).tolist())
                reports[call]["in_classes"] = all(v in classes for v in np.asarray(out).tolist())
            if call == "predict_proba":
                p = np.asarray(out, dtype=np.float64)
                reports[call]["rows_sum_to_one"] = bool(p.ndim == 2 and np.allclose(p.sum(1), 1.0, atol=1e-5))
                reports[call]["n_classes"] = len(model.classes_)
            if call == "predict_interval":
                iv = np.asarray(out, dtype=np.float64)
                reports[call]["ordered"] = bool(iv.ndim == 2 and np.all(iv[:, 0] <= iv[:, 1]))
        return {"outcome": "ok", "calls": reports}
    except _Hang:
        raise
    except BaseException as exc:  # noqa: BLE001 - every exception is an observation here
        return _exc(exc, stage)


# ------------------------------------------------------------------------ CLI cases
_SETUP_DONE: dict = {}


def _cli(argv) -> dict:
    """``torchtree.cli.main(argv)`` in this process, with stdout and stderr captured."""
    from torchtree.cli import main

    out, err = io.StringIO(), io.StringIO()
    rep: dict = {}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("default")  # warnings print to the captured stderr, as in a real run
        try:
            rep["rc"] = main(list(argv))
        except SystemExit as exc:  # argparse
            rep["rc"] = exc.code
        except _Hang:
            raise
        except BaseException as exc:  # noqa: BLE001 - escaping main() = a traceback for the user
            rep["rc"] = None
            rep["uncaught"] = _exc(exc, "main")
    rep["stdout"] = out.getvalue()[-4000:]
    rep["stderr"] = err.getvalue()[-4000:]
    return rep


def _read_predictions(path: str) -> dict:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    numeric = []
    for r in body:
        for h, v in zip(header, r):
            if h != "prediction":
                numeric.append(float(v))
    pred_col = [r[0] for r in body] if header and header[0] == "prediction" else None
    return {"header": header, "n_rows": len(body), "finite": bool(np.isfinite(numeric).all()) if numeric else True,
            "predictions": sorted(set(pred_col)) if pred_col is not None else None}


def _run_cli(spec) -> dict:
    for setup in spec.get("setup", []):
        key = tuple(setup)
        if key not in _SETUP_DONE:
            _SETUP_DONE[key] = _cli(setup)
        if _SETUP_DONE[key].get("rc") != 0:
            return {"outcome": "setup-failed", "setup": _SETUP_DONE[key]}
    for op, src, dst in spec.get("prepare", []):
        if op == "truncate":  # the first half of a file: a damaged copy
            with open(src, "rb") as fh:
                blob = fh.read()
            with open(dst, "wb") as fh:
                fh.write(blob[: len(blob) // 2])
    rep = _cli(spec["argv"])
    rep["outcome"] = "cli"
    check = spec.get("then_predict")
    if rep.get("rc") == 0 and check:
        # a fit that succeeded must give a posterior that predicts the training file
        after = _cli(check["argv"])
        rep["then"] = after
        if after.get("rc") == 0 and os.path.exists(check["out"]):
            rep["then"]["predictions"] = _read_predictions(check["out"])
    if rep.get("rc") == 0 and spec.get("pred_out") and os.path.exists(spec["pred_out"]):
        rep["predictions"] = _read_predictions(spec["pred_out"])
    return rep


def _run_probe(spec) -> dict:
    """The harness's own check (``test_harness_catches_...``): misbehave as asked."""
    action = spec["action"]
    try:
        if action == "allocate":  # far beyond the cap: the allocator must fail in this process
            import torch

            torch.empty(spec["bytes"] // 4, dtype=torch.float32)
        elif action == "sleep":
            import time

            time.sleep(spec["seconds"])
        elif action == "exit":  # a process that dies without a word, as a segfault or the OOM killer leaves it
            os._exit(3)
        return {"outcome": "ok", "calls": {}}
    except _Hang:
        raise
    except BaseException as exc:  # noqa: BLE001
        return _exc(exc, action)


_RUNNERS = {"api": _run_api, "cli": _run_cli, "probe": _run_probe}


def _address_space() -> int:
    """Bytes of address space this process maps now (``VmSize``; 0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> int:
    cases_path, results_path, mem, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    signal.signal(signal.SIGALRM, _on_alarm)
    import torch
    import torchtree  # noqa: F401

    # the cap is on top of what the imports mapped: a CUDA build of torch maps several GB of
    # libraries, which a fixed cap set before the import refused ("failed to map segment")
    limit = _address_space() + mem
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    torch.set_num_threads(1)
    with open(cases_path, "rb") as fh:
        cases = pickle.load(fh)
    with open(results_path, "a") as res:
        for spec in cases:
            res.write(json.dumps({"start": spec["id"]}) + "\n")
            res.flush()
            signal.alarm(seconds)
            try:
                rep = _RUNNERS[spec["kind"]](spec)
            except _Hang:
                rep = {"outcome": "hang", "seconds": seconds}
            finally:
                signal.alarm(0)
            rep["id"] = spec["id"]
            res.write(json.dumps(rep, default=str) + "\n")
            res.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
