# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv if missing and installs what it needs; torch is pinned
# before the package so that pip does not pull a CUDA build on a CPU box.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: help venv demo test test-fast typecheck bench docs clean

help:
	@echo "make venv       create .venv ($(TORCH_PIN) when no torch is installed) and install the package, editable, with its test extras"
	@echo "make demo       venv, then fit the embedded demo and print a table"
	@echo "make test       venv, then the whole test suite (PYTEST_ARGS=... adds pytest arguments, TEST_WORKERS=0: one process)"
	@echo "make test-fast  the same without the tests marked slow (-m 'not slow')"
	@echo "make typecheck  mypy --strict on tests/typing_user_script.py (installs the typecheck extra when missing)"
	@echo "make bench      the headline timings against their record (BENCH_ARGS=--record writes a new one)"
	@echo "make docs       the documentation site into site/, strictly (TORCHTREE_DOCS_GALLERY=off: without running the examples)"
	@echo "make clean      remove .venv, build, site, *.egg-info and .mypy_cache"

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=77" wheel  # the packaging test builds the wheel without build isolation
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e ".[test,mpi]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/python -m torchtree demo

# Tests run torch single-threaded by default: they are dominated by small ops whose thread overhead
# outweighs any parallel gain (set OMP_NUM_THREADS to override). The cores go to pytest-xdist workers
# instead, one per core up to 4 (each worker holds its own torch, a few hundred MB), which steal queued tests
# from each other (a minute-long test near the end leaves no worker idle): TEST_WORKERS=0 runs in one process.
# The 15 slowest tests are listed at the end, to keep the suite's time in view.
TEST_WORKERS ?= $(shell $(PY) -c "import os; print(min(4, len(os.sched_getaffinity(0))))" 2>/dev/null || echo 2)
PYTEST := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15

test: venv
	$(PYTEST) $(PYTEST_ARGS)

test-fast: venv
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# What a type checker reads of the API: mypy --strict on tests/typing_user_script.py (the README's snippets, the
# scikit-learn workflow, posterior files, the lazily exported classes, sampler options; tests/test_typing.py) and
# on a misspelt sampler option (an error naming it), installing the `typecheck` extra when mypy is missing.
# About half a minute the first time; the cache (.mypy_cache) makes the next runs take seconds. The test
# suite checks the same annotations at run time (typing.get_type_hints).
typecheck: venv
	$(BIN)/python -c "import mypy" 2>/dev/null || $(BIN)/python -m pip install -q -e ".[typecheck]"
	TORCHTREE_TYPECHECK=1 TORCHTREE_MYPY_CACHE=.mypy_cache $(BIN)/python -m pytest -q tests/test_typing.py -k mypy

# The headline figures (fit and predict CPU seconds at 1 and 2 threads) against the recorded ones in
# benchmarks/results/headline.json; fails when a 1-thread figure is over 1.3x its record.
# BENCH_ARGS="--record" writes a new record, BENCH_ARGS="--only paper001" runs some figures.
BENCH_ARGS ?=
bench: venv
	$(BIN)/python benchmarks/headline.py $(BENCH_ARGS)

# The documentation site (mkdocs.yml; docs/contributing.md): installs the `docs` extra into the venv
# when MkDocs is missing, then builds site/ strictly (a warning fails: broken links or anchors, a page
# left out of the nav, a docstring the reference cannot render, a gallery script that fails).
# TORCHTREE_DOCS_GALLERY=smoke (default) runs the gallery's scripts with --smoke, =full as written,
# =off not at all (docs/hooks.py).
docs: venv
	$(BIN)/python -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || $(BIN)/python -m pip install -q -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) build site *.egg-info .mypy_cache
