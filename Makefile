# Two commands on a fresh machine (Python 3.11+, Java 17+): `make demo` and `make test`.
# Each sets up what it needs (uv, the locked environment) and can be run again safely.

PYTHON ?= python3
UV_VERSION := 0.13.8
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
VENV := .venv
STAMP := $(VENV)/.synced

RUNTIMES := dbr-15.4 dbr-16.4 dbr-17.3

.PHONY: setup test demo ui-check lint bench clean test-runtimes $(addprefix test-,$(RUNTIMES)) \
	$(addprefix setup-,$(RUNTIMES)) runtimes-table print-runtimes setup-foundation \
	test-foundation

setup: $(STAMP)

# --compile-bytecode: the .pyc files are written here, once (as pip does); else each process
# (each Ray worker) compiles what it imports, every time where PYTHONDONTWRITEBYTECODE is set.
# --no-extra foundation: its packages pull torch (from PyPI, the multi-GB CUDA build); they
# have their own environment, .venv-foundation (`make test-foundation`).
$(STAMP): pyproject.toml uv.lock | $(UV)
	@scripts/check-java
	$(UV) sync --frozen --all-extras --no-extra foundation --compile-bytecode --python $(PYTHON)
	@touch $@

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet "uv==$(UV_VERSION)"

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	ci/runtimes/test latest

demo: setup
	$(VENV)/bin/raybricks demo

# After `make demo`: the MLflow UI on the demo's store, its run page opened in headless
# Chromium (Debian: apt-get install chromium), checked and screenshotted to docs/images.
ui-check: setup
	$(VENV)/bin/python scripts/ui_check.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

bench: setup
	$(VENV)/bin/python bench/bench_training.py
	$(VENV)/bin/python bench/bench_conversion.py
	$(VENV)/bin/python bench/bench_scoring.py
	$(VENV)/bin/python bench/bench_quality.py
	$(VENV)/bin/python bench/bench_forecast.py

# Databricks Runtime ML profiles (ci/runtimes/): the runtime's package versions, the
# raybricks wheel installed on top (checked to move none of them), then the suite.
$(addprefix setup-,$(RUNTIMES)): setup-%: | $(UV)
	UV=$(abspath $(UV)) ci/runtimes/setup $*

$(addprefix test-,$(RUNTIMES)): test-%: setup-%
	ci/runtimes/test $*

# Every profile, then the check that docs/databricks.md's table is what just ran (with
# `make test`'s record of the newest versions).
test-runtimes: $(addprefix test-,$(RUNTIMES))
	$(PYTHON) ci/runtimes/table.py --check

runtimes-table:
	$(PYTHON) ci/runtimes/table.py --write

print-runtimes:
	@echo $(RUNTIMES)

# The `foundation` extra's tests (pretrained Chronos and TimesFM on tiny random-weight
# models) in their own environment: CPU torch from a local wheel, then the locked packages
# (see ci/foundation/setup); rebuilt when pyproject.toml or uv.lock change. Its tests
# marked `topology` then run again on a multi-executor Spark, as in `make test`.
FOUNDATION_VENV := .venv-foundation
FOUNDATION_STAMP := $(FOUNDATION_VENV)/.ready

setup-foundation: $(FOUNDATION_STAMP)

$(FOUNDATION_STAMP): pyproject.toml uv.lock ci/foundation/setup | $(UV)
	@scripts/check-java
	UV=$(abspath $(UV)) ci/foundation/setup

test-foundation: setup-foundation
	$(FOUNDATION_VENV)/bin/python -m pytest -p no:cacheprovider -m foundation tests
	RAYBRICKS_TEST_MASTER='local-cluster[2,2,1024]' \
		$(FOUNDATION_VENV)/bin/python -m pytest -p no:cacheprovider -m foundation tests

clean:
	rm -rf $(VENV) $(addprefix .venv-,$(RUNTIMES)) $(FOUNDATION_VENV) .tools build spark-warehouse \
		.pytest_cache
