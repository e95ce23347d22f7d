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

.PHONY: run test setup lint clean

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

test: $(STAMP)
	$(PY) -m pytest -q -ra

lint: $(STAMP)
	$(VENV)/bin/ruff check tuner tests experiments
	$(VENV)/bin/mypy tuner

clean:
	rm -rf $(VENV) .tuner
