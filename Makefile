# Two entry points (README): `make run` and `make test`. Everything lives in .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
KF     := $(VENV)/bin/kernelfleet

.PHONY: run test system-deps docs schemas clean

$(VENV)/.see: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# The place half's extras and the test tools. torch 2.13.0 goes first (a CPU build
# lies on disk on this project's machines), so the extra's `torch>=2.4` is already
# met and pip does not fetch a multi-GB CUDA build.
$(VENV)/.all: $(VENV)/.see
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[place,test,bench]"
	touch $@

# The main job: the agent on this machine's GPUs (without GPUs, on a trace recorded on an
# H200), its store in kernelfleet.db, its dashboard and /metrics on http://127.0.0.1:9400/.
run: $(VENV)/.see
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(KF) agent; \
	else \
		echo "No NVIDIA GPU here: the agent runs on a trace recorded on an H200 (Ctrl-C to stop)."; \
		$(KF) agent --demo; \
	fi

# System packages the end-to-end tests drive for real (Debian): the Prometheus server and
# promtool, and Chromium for the dashboard.
system-deps:
	@command -v promtool >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
			--no-install-recommends prometheus chromium; }

test: $(VENV)/.all system-deps
	$(PY) -m pytest -q

# Regenerate the plots and tables in docs/ from the committed recordings (CPU only).
docs: $(VENV)/.all schemas
	$(PY) bench/plot_telemetry.py

# The JSON Schema of every document kernelfleet reads and writes, from its typed model, into
# docs/schemas/ (tests/unit/test_documents.py fails when a committed one is stale).
schemas: $(VENV)/.see
	$(PY) -c "from kernelfleet.schemas import write_schemas; print(*write_schemas(), sep='\n')"

clean:
	rm -rf $(VENV) .pytest_cache
