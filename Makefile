# The two commands of docs/development.md: `make demo` and `make test`. Both set up what they
# need on a fresh Debian machine (as root): system packages, a Docker engine, a venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers: each docker-slurm release's tests run on one worker (they share its
# cluster), the S3 tests on another (they share moto and Ceph), the rest wherever one is free.
# The clusters mostly wait on Slurm's timers, so they overlap well on 2 cores.
PYTEST_WORKERS ?= 4
export TESTCONTAINERS_RYUK_DISABLED := true

.PHONY: demo test host venv bench wheel clean vm-images

host:
	@tools/setup-host

# The hf, lightning and s3 extras' tests (tests/test_hf.py, test_lightning.py; tests/test_s3.py
# against moto's server) run in `make test`. torch is pinned and installed first: a bare
# `torch` requirement would resolve to the newest CUDA build (GBs). The frameworks' (tests/
# test_deepspeed.py, test_megatron.py, test_torchtitan.py) come after it, pinned to the releases
# tested, with torch pinned so none replaces it: DeepSpeed built from its source against that torch
# (no compiled ops: it compiles its CPU op when first started, ~30 s, cached in ~/.cache); torchtitan
# after the two its checkpointer imports, without its other dependencies: its own pin of datasets (< 4.8)
# wants huggingface-hub < 2, which transformers 5 refuses.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,cluster,plot,s3,submitit]'
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[hf,lightning]'
	echo torch==2.13.0 > $(VENV)/torch-pin.txt
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation -c $(VENV)/torch-pin.txt deepspeed==0.19.8
	$(PY) -m pip install -q -c $(VENV)/torch-pin.txt megatron-core==0.16.1 -e '.[deepspeed,megatron]'
	$(PY) -m pip install -q -c $(VENV)/torch-pin.txt tyro spmd_types==0.2.3
	$(PY) -m pip install -q -c $(VENV)/torch-pin.txt --no-deps torchtitan==0.3.0
	touch $@

venv: $(VENV)/.installed

# The main job: build and start docker-slurm, overlap a job and its replacement in each
# scenario, naive shared folder vs dispatch-slurm, and print what the overlap did.
# The trials are the test bed's (tests/testbed/), run from this checkout: not in the wheel.
demo: host venv
	@mkdir -p demo-output
	PYTHONPATH=tests $(PY) -m testbed trial --scenario cancel --scenario preempt --scenario partition \
	  --trials 1 --json demo-output/trials.json --plot demo-output/timeline.png
	@echo "timeline: demo-output/timeline.png   results: demo-output/trials.json"

# The VM test bed (cgroup v2 under QEMU, tests/testbed/vm.py): its images are built before
# the tests, cached by a hash of their inputs (an unchanged tree: a few ms). CI runs trixie;
# DISPATCH_VM_SUITES=bookworm,trixie,sid (tests/cluster/conftest.py reads the same variable)
# for more, empty for none; DISPATCH_VM_FULL=1 for the fuller in-VM test set.
comma := ,
VM_SUITES := $(subst $(comma), ,$(if $(filter undefined,$(origin DISPATCH_VM_SUITES)),trixie,$(DISPATCH_VM_SUITES)))
vm-images: host venv
	@if [ -n "$(strip $(VM_SUITES))" ]; then PYTHON=$(PY) docker-slurm/vm/build-vm-image $(VM_SUITES) >/dev/null; fi

# pytest exits 5 when it collected nothing: that is a failure here, never a pass. The wheel
# users install is built first (dist/): CI's artifact.
test: host venv wheel vm-images
	@rc=0; $(PY) -m pytest -ra --durations=40 -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# What users install: the package alone (no test bed), as CI builds it.
wheel: venv
	$(PY) -m build --wheel --no-isolation --outdir dist .
	@ls dist/*.whl

bench: venv
	$(PY) benchmarks/bench_publish.py
	$(PY) benchmarks/bench_latest.py
	$(PY) benchmarks/bench_watch.py
	$(PY) benchmarks/bench_startup.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info

# The admin's install (make install/uninstall, DESTDIR, PREFIX), the packages (make deb,
# make rpm, make orig) and the man pages: admin/install.mk.
include admin/install.mk
