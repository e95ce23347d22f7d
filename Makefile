# make run  : set up .venv (when missing) and run the main tuning job on its embedded default.
# make test : set up .venv (when missing) and run the whole test suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
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

.PHONY: run test setup lint clean interop-venvs

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/tuner run $(AGENT) $(if $(TRIALS),--trials $(TRIALS),)

test: $(STAMP) interop-venvs
	$(PY) -m pytest -q -ra

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

lint: $(STAMP)
	$(VENV)/bin/ruff check tuner tests experiments
	$(VENV)/bin/mypy tuner
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .venv-guidellm .venv-hfserve .tuner
