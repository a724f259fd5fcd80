# The two set-up commands (see README): `make demo` and `make test`.
# Both create .venv on first use. On a CUDA machine pick a CUDA build of torch:
#   make demo TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126'
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEMO_DATA := data/quickstart
PYTEST_ARGS ?=

.PHONY: demo test venv clean-demo

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[mpich,dev]'
	touch $@

$(DEMO_DATA)/.made: $(INSTALLED)
	$(BIN)/fleet data make synthetic --format jpeg --out $(DEMO_DATA) --force \
		--classes 10 --samples 2400 --image-size 20 --channels 3 --seed 0
	touch $@

demo: $(DEMO_DATA)/.made
	$(BIN)/fleet run examples/quickstart.yaml

test: $(INSTALLED)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean-demo:
	rm -rf $(DEMO_DATA) runs/quickstart
