# The README's commands: `make demo` and `make test` (plus wheel and clean). Everything lands in .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORE := $(VENV)/.qag-core
FULL := $(VENV)/.qag-full
TOOLS := $(VENV)/.qag-build-tools
# The fast end-to-end contract tests, run a second time with the pure-Python twins (QAG_SPEEDUPS=off, which
# also selects the worker's pure-Python HTTP parser) and a third time on gunicorn's gthread worker.
E2E_PURE := $(wildcard tests/integration/test_contract_*.py) tests/integration/test_bad_input.py
WHEEL_VENV := build/wheel-venv
# The unit tier's bare run (issue 25.5): a virtual environment with qag's base dependencies, pytest and hypothesis
# only (no optional driver, no Cython), made once and kept while pyproject.toml is unchanged, and a copy of the
# tree without any build in it (git's files: no .so, no digest), so the run is what a machine without a compiler
# and without services gets.
BARE_VENV := build/bare-venv
BARE_TREE := build/bare-tree
WHEEL_TESTS := build/wheel-tests
# Every qag/ module: the request path's are compiled too (build_backend/speedups.py REQUEST_PATH); a build older
# than its source is never run (the source is), so an edit means a rebuild to keep the speed.
SOURCES := pyproject.toml setup.py $(wildcard build_backend/*.py) $(wildcard qag/_speedups/*.pyx) \
	$(wildcard qag/*.py qag/*/*.py)

.PHONY: demo test unit-bare system-deps wheel clean

# The demo serves at once on the pure-Python twins while the compiled modules build beside their sources in
# the background (every core, a line each), then restarts on them (build_backend/demo.py). Without a C
# compiler a banner says so and the demo goes on in pure Python.
demo: $(CORE) $(TOOLS)
	$(BIN)/python -m build_backend demo -- $(BIN)/qag demo

test: system-deps $(FULL) unit-bare
	QAG_SPEEDUPS=require $(BIN)/python -m pytest -q -p no:cacheprovider tests
	QAG_SPEEDUPS=off $(BIN)/python -m pytest -q -p no:cacheprovider -m e2e $(E2E_PURE)
	QAG_WORKER_CLASS=gthread $(BIN)/python -m pytest -q -p no:cacheprovider -m e2e $(E2E_PURE)

# QAG_TEST_REQUIRE_SERVICES passes through: in CI a unit test that reached for a service would fail, not skip.
unit-bare: $(BARE_VENV)/.qag-bare
	rm -rf $(BARE_TREE) && mkdir -p $(BARE_TREE)
	git ls-files -z --cached --others --exclude-standard \
	  | tar -c --null -T - --ignore-failed-read -f - | tar -x -C $(BARE_TREE)
	cd $(BARE_TREE) && env -u PYTHONPATH QAG_SPEEDUPS=off $(abspath $(BARE_VENV))/bin/python -m pytest -q \
	  -p no:cacheprovider tests/unit tests/speedups

$(BARE_VENV)/.qag-bare: pyproject.toml
	rm -rf $(BARE_VENV)
	$(PYTHON) -m venv $(BARE_VENV)
	$(PYTHON) -c 'import tomllib as t; print("\n".join(t.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
	  > $(BARE_VENV)/requirements.txt
	$(BARE_VENV)/bin/python -m pip install -q -r $(BARE_VENV)/requirements.txt pytest hypothesis
	# qag itself is the tree's copy, as an editable install would have it (a child python finds it too), unbuilt.
	echo "$(abspath $(BARE_TREE))" > \
	  "$$($(BARE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/qag-tree.pth"
	touch $@

# System packages for the whole suite: a C compiler for the speedups, pkg-config and the MySQL client
# library that mysqlclient builds against, libpq and wrk for the benchmark harness's smoke test, venv
# support, headless Chromium for the /docs page test. Installed only when missing.
system-deps:
	@missing=""; \
	command -v cc >/dev/null 2>&1 || missing="$$missing gcc libc6-dev"; \
	command -v pkg-config >/dev/null 2>&1 || missing="$$missing pkg-config"; \
	pkg-config --exists mysqlclient 2>/dev/null || pkg-config --exists libmariadb 2>/dev/null \
	  || missing="$$missing default-libmysqlclient-dev"; \
	pkg-config --exists libpq 2>/dev/null || missing="$$missing libpq-dev"; \
	command -v wrk >/dev/null 2>&1 || missing="$$missing wrk"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	$(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# pyproject.toml's build requirements, for the in-place builds that run outside pip.
$(TOOLS): $(BIN)/python
	$(BIN)/python -m pip install -q 'setuptools>=64' wheel 'Cython>=3'
	touch $@

# pip installs qag (seconds); the compiled modules are built in place, where their progress shows.
$(CORE): $(BIN)/python $(SOURCES)
	QAG_BUILD_SPEEDUPS=off $(BIN)/python -m pip install -q -e .
	touch $@

$(FULL): $(BIN)/python $(TOOLS) $(SOURCES)
	QAG_BUILD_SPEEDUPS=off $(BIN)/python -m pip install -q -e '.[test,mysql,postgres,redis,formats,otel,jwt]'
	$(BIN)/python -m build_backend inplace --speedups require
	touch $@ $(CORE)

# This platform's wheel, compiled or failed: never a silently pure one. It is then installed into a clean
# virtual environment and the suite runs against it from a copy of tests/ whose root holds no qag/, so only
# the installed package can be imported (QAG_TEST_INSTALLED=1 makes tests/conftest.py fail the run otherwise).
wheel: system-deps $(FULL)
	rm -rf dist $(WHEEL_VENV) $(WHEEL_TESTS)
	$(BIN)/python -m pip wheel -q --no-deps -w dist -C speedups=require .
	$(BIN)/python -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q --upgrade pip
	$(WHEEL_VENV)/bin/python -m pip install -q "$$(ls dist/qag-*.whl)[test,mysql,postgres,redis,formats,otel,jwt]"
	mkdir -p $(WHEEL_TESTS)
	cp -r tests docs benchmarks $(WHEEL_TESTS)/
	find $(WHEEL_TESTS) -name __pycache__ -prune -exec rm -rf {} +
	printf '[pytest]\ntestpaths = tests\n' > $(WHEEL_TESTS)/pytest.ini
	cd $(WHEEL_TESTS) && env -u PYTHONPATH QAG_TEST_INSTALLED=1 QAG_SPEEDUPS=require \
	  $(abspath $(WHEEL_VENV))/bin/python -m pytest -q -p no:cacheprovider --rootdir . tests

clean:
	rm -rf $(VENV) build dist *.egg-info
	find qag \( -name '*.so' -o -name '*.source-sha256' -o -name '*.c' -o -name '*.partial' \) -delete
