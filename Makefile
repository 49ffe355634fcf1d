# Two commands on a fresh machine (Python 3.11+, Java 17+): `make demo` and `make test`.
# Each sets up what it needs (uv, the locked environment) and can be run again safely.

PYTHON ?= python3
UV_VERSION := 0.13.8
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
VENV := .venv
STAMP := $(VENV)/.synced

.PHONY: setup test demo lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml uv.lock | $(UV)
	@scripts/check-java
	$(UV) sync --frozen --all-extras --python $(PYTHON)
	@touch $@

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet "uv==$(UV_VERSION)"

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest

demo: setup
	$(VENV)/bin/raybricks demo

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(VENV)/bin/python bench/bench_training.py
	$(VENV)/bin/python bench/bench_conversion.py
	$(VENV)/bin/python bench/bench_scoring.py

clean:
	rm -rf $(VENV) .tools spark-warehouse .pytest_cache
