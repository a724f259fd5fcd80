# The two set-up commands (see README): `make demo` and `make test`.
# Both create .venv on first use. On a CUDA machine pick a CUDA build of torch:
#   make demo TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126'
PYTHON ?= python3
TORCH ?= torch==2.13.0
# TensorFlow for `framework: tensorflow` (the CPU wheel; on a CUDA machine: TENSORFLOW=tensorflow==2.21.0)
TENSORFLOW ?= tensorflow-cpu==2.21.0
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEMO_DATA := data/quickstart
PYTEST_ARGS ?=

.PHONY: demo test test-openmpi venv horovod clean-demo

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH) $(TENSORFLOW)
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

# Horovod for `runtime.collective: horovod` (and `auto`), built from PyPI's sdist into the venv
# against its torch (and TensorFlow when installed) and the MPI whose mpicxx is first on PATH
# (the mpich wheel's here; a site MPI on a cluster, see docs/cluster.md). A few minutes on 2 cores.
HOROVOD := $(VENV)/.horovod
horovod: $(HOROVOD)

$(HOROVOD): $(INSTALLED) tools/build-horovod.sh tools/horovod-nospin.h tools/horovod-wake.h
	tools/build-horovod.sh $(BIN)/python
	touch $@

# The tests marked `openmpi` again under the system's Open MPI (Debian: openmpi-bin): the same
# venv, with mpi4py's wheel loading Open MPI's library (MPI4PY_LIBMPI) and FLEET_MPIEXEC for the
# launcher. Checks first that both really are Open MPI.
OPENMPI_EXEC ?= mpiexec.openmpi
OPENMPI_LIB ?= libmpi.so.40
test-openmpi: $(INSTALLED)
	export FLEET_MPIEXEC=$(OPENMPI_EXEC) MPI4PY_LIBMPI=$(OPENMPI_LIB) \
		OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 && \
	$(OPENMPI_EXEC) --version | grep -q -e 'Open MPI' -e OpenRTE && \
	$(BIN)/python -c 'from mpi4py import MPI; v = MPI.get_vendor(); assert v[0] == "Open MPI", v; print("fleet: tests under", *v)' && \
	$(BIN)/python -m pytest -q -m openmpi $(PYTEST_ARGS)

clean-demo:
	rm -rf $(DEMO_DATA) runs/quickstart
