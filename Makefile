# Set-up and run commands for a fresh machine. Each target creates .venv and installs the project into it.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU machines: torch 2.13.0 lies on disk as a CPU wheel; triton's interpreter needs numpy < 2.4.
PINS := torch==2.13.0 "triton==3.6.0" "numpy<2.4"
# Wheels the package index lacks: distributed and zict (pure Python) for the `cluster` extra.
WHEELS := vendor/wheels

.PHONY: test test-fast lint demo clean

$(BIN)/kernelwright: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --find-links $(WHEELS) $(PINS) -e ".[cuda,test,lint,cluster]"
	touch $@

# Tests in tiers by cost: tests/unit (pure Python, small CPU tensors), tests/kernels (one template or
# kernel family per file, Triton interpreter and NVRTC), tests/e2e (optimize, bench, fuzz and CLI runs
# of whole problems). TRITON_INTERPRET=1 runs the Triton kernels in the interpreter on any machine
# (tests/conftest.py sets it by itself only where there is no GPU); the GPU tests skip without one.
# pytest-xdist runs the files on one worker per core, each file on one worker (--dist loadfile), so
# a module's shared fixtures (captures, emitted modules, compiled samples) are made once.
TIERS := tests/unit tests/kernels tests/e2e
XDIST := -n auto --dist loadfile

test: $(BIN)/kernelwright
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) $(TIERS)

# The quick tiers only: unit and kernel tests, without the end-to-end runs.
test-fast: $(BIN)/kernelwright
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) tests/unit tests/kernels

# Checks configured in pyproject.toml: ruff ([tool.ruff]) and mypy on the modules [tool.mypy] lists.
lint: $(BIN)/kernelwright
	$(BIN)/ruff check src tests scripts
	$(BIN)/mypy

demo: $(BIN)/kernelwright
	$(BIN)/kernelwright doctor
	$(BIN)/kernelwright inspect problems/level2/gemm_group_norm_swish.py
	$(BIN)/kernelwright optimize problems/level2/gemm_group_norm_swish.py --out demo_out --budget 12 --small
	$(BIN)/kernelwright report demo_out

clean:
	rm -rf $(VENV) demo_out .ruff_cache .mypy_cache
