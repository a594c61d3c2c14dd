# The README's commands: `make demo` and `make test` (plus wheel and clean). Everything lands in .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.qag-installed
SOURCES := pyproject.toml setup.py $(wildcard build_backend/*.py) $(wildcard qag/_speedups/*.pyx qag/_speedups/*.py)

.PHONY: demo test system-deps install wheel clean

demo: system-deps $(STAMP)
	$(BIN)/qag demo

test: system-deps $(STAMP)
	QAG_SPEEDUPS=require $(BIN)/python -m pytest -q -p no:cacheprovider tests

install: system-deps $(STAMP)

# System packages: a C compiler for the speedups and venv support for Python. Installed only when missing.
system-deps:
	@missing=""; \
	command -v cc >/dev/null 2>&1 || missing="$$missing gcc libc6-dev"; \
	$(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# This platform's wheel, compiled or failed: never a silently pure one.
wheel: system-deps $(STAMP)
	rm -rf dist
	$(BIN)/python -m pip wheel -q --no-deps -w dist -C speedups=require .

clean:
	rm -rf $(VENV) build dist *.egg-info qag/_speedups/*.so qag/_speedups/*.c
