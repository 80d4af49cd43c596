# Two entry points (README): `make run` and `make test`. Everything lives in .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
KF     := $(VENV)/bin/kernelfleet

.PHONY: run test system-deps docs schemas k8s-manifests record record-see record-detector record-ofu record-capture \
	record-counters record-variants record-x2 record-disagg record-demo clean

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
	$(PY) -m pip install -q -e ".[place,serve,test,bench]"
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

# System packages the tests drive for real (Debian): the Prometheus server and promtool, Chromium
# for the dashboard, Node for the dashboard's own script, tmux, the terminal `watch` is tested in, and
# openssl, which makes the certificate of the HTTPS server the API-server client is tested against.
system-deps:
	@command -v promtool >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 && command -v node >/dev/null 2>&1 \
		&& command -v tmux >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
			--no-install-recommends prometheus chromium nodejs tmux openssl; }

test: $(VENV)/.all system-deps
	$(PY) -m pytest -q

# Regenerate the plots and tables in docs/ from the committed recordings (CPU only).
docs: $(VENV)/.all schemas
	$(PY) -m bench.plot_telemetry
	$(PY) -m bench.plot_ofu_validation
	$(PY) -m bench.plot_disagg

# Re-record what tests/data holds, on a GPU machine, each recorder into a folder of its own under
# $(RECORD_OUT); copy what you keep into tests/data (the folder the test that reads it names).
# `make record` runs the one-GPU recorders (about 20 minutes); record-x2 and record-disagg need two
# GPUs. Without the GPUs a target says so and fails. record-demo rebuilds the bundled demo trace
# from tests/data and runs anywhere. The recorders run with the GPU machine's python3.
RECORD_OUT ?= /tmp/kf-record
RECORD_ENV := PYTHONPATH=$(CURDIR) PYTHONUNBUFFERED=1
need_gpus = @found=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU '); if [ "$$found" -lt $(1) ]; then \
	echo "make $@: needs $(1) NVIDIA GPU(s); nvidia-smi -L finds $$found here. Run it on a GPU machine." >&2; exit 1; fi

record: record-see record-detector record-ofu record-capture record-counters record-variants

# tests/data/h200 (bench.record_traces, bench.clock_density), with the sampler's cost benchmarks
record-see:
	$(call need_gpus,1)
	OUT=$(RECORD_OUT)/see $(RECORD_ENV) bash bench/h200_run.sh

# tests/data/h200-detector
record-detector:
	$(call need_gpus,1)
	$(RECORD_ENV) python3 -m bench.record_detector_traces --out $(RECORD_OUT)/h200-detector

# tests/data/h200-hook, h200-clock, h200-clock-duty and h200-sweep's Nsight Compute re-run
record-ofu:
	$(call need_gpus,1)
	OUT=$(RECORD_OUT)/ofu $(RECORD_ENV) bash bench/ofu_h200_check.sh

# tests/data/h200-capture
record-capture:
	$(call need_gpus,1)
	OUT=$(RECORD_OUT)/capture $(RECORD_ENV) bash bench/place_run.sh

# tests/data/h200-counters
record-counters:
	$(call need_gpus,1)
	OUT=$(RECORD_OUT) $(RECORD_ENV) bash bench/profile_counters.sh

# tests/data/h200-variants: one transformers step captured with different kernels for the same ops
record-variants:
	$(call need_gpus,1)
	$(RECORD_ENV) python3 -m bench.record_kernel_variants --out $(RECORD_OUT)/h200-variants

# tests/data/h200x2-detector (two GPUs)
record-x2:
	$(call need_gpus,2)
	OUT=$(RECORD_OUT)/x2 $(RECORD_ENV) bash bench/h200x2_run.sh

# tests/data/h200x2-disagg (two GPUs; the plans are made on this machine's CPU first)
record-disagg:
	$(call need_gpus,2)
	$(RECORD_ENV) bash bench/disagg_run.sh plans $(RECORD_OUT)/plans
	OUT=$(RECORD_OUT)/disagg $(RECORD_ENV) bash bench/disagg_run.sh run $(RECORD_OUT)/plans

# kernelfleet/data/demo-h200.jsonl.gz, from the recordings in tests/data (CPU)
record-demo: $(VENV)/.see
	$(PY) -m bench.make_demo_trace

# The JSON Schema of every document kernelfleet reads and writes, from its typed model, into
# docs/schemas/ (tests/unit/test_documents.py fails when a committed one is stale).
schemas: $(VENV)/.see
	$(PY) -c "from kernelfleet.schemas import write_schemas; print(*write_schemas(), sep='\n')"

# deploy/kubernetes's PrometheusRule and Grafana ConfigMap, from deploy/prometheus/rules.yml and
# deploy/grafana/kernelfleet.json and kernelfleet-serve.json (tests/e2e/test_deploy.py fails when the committed ones are stale).
k8s-manifests:
	$(PYTHON) deploy/kubernetes/generate.py

clean:
	rm -rf $(VENV) .pytest_cache
