"""/metrics device families and label names, on the NVML twin and on a replayed H200 recording,
parsed back through prometheus_client's own exposition parser."""

import subprocess
import sys

import pytest
from nvml_twin import Twin, TwinGpu
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError
from kernelfleet.fleet.exporter import OfuCollector
from kernelfleet.fleet.reading import Reading
from kernelfleet.ofu import classify, ofu
from kernelfleet.telemetry.nvml import NvmlSource
from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.replay import ReplaySource

pytestmark = pytest.mark.unit
CATALOG = Catalog.load()


def readings(batch):
    out = []
    for s in batch:
        sku = CATALOG.lookup(s.name, s.pci_device_id)
        out.append(Reading("node-1", s, sku, ofu(s, sku), classify(s).value))
    return out


def scrape(batch, **options) -> dict[str, list[tuple[dict, float]]]:
    """name -> [(labels, value)] of every sample /metrics would serve for ``batch``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OfuCollector(lambda: readings(batch), **options))
    text = generate_latest(registry).decode()
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def twin_batch(fake_time, gpus, windows=1):
    source = NvmlSource(nvml=Nvml(Twin(gpus, fake_time.now)), clock=fake_time.now, wall=fake_time.wall,
                        sleep=fake_time.sleep)
    with source:
        return list(source.batches(count=windows))[-1]


def test_device_families_carry_the_twins_values(fake_time):
    gpu = TwinGpu(processes=[(4242, 3 << 30), (4243, 1 << 30)], clock_event_reasons=0x4 | 0x40,
                  ecc_errors=(3, 1), pending_xids=[79])
    metrics = scrape(twin_batch(fake_time, [gpu], windows=2))
    gpu_labels = {"gpu": "0", "uuid": "GPU-twin-0", "model": "h200-sxm", "hostname": "node-1", "mig": "",
                  "namespace": "", "pod": "", "container": ""}  # outside Kubernetes, the pod labels are empty

    def value(name, **extra):
        (v,) = [v for labels, v in metrics[name] if labels == {**gpu_labels, **extra}]
        return v

    assert value("kernelfleet_memory_used_bytes") == 1 << 30
    assert value("kernelfleet_memory_total_bytes") == 141 << 30
    assert value("kernelfleet_temperature_celsius") == 52.0
    assert value("kernelfleet_pcie_transmit_bytes_per_second") == pytest.approx(14.6 * 1024 * 1024)
    assert value("kernelfleet_nvlink_receive_bytes_per_second") == 0.0  # GPM said 0: a reading, not a gap
    assert value("kernelfleet_processes") == 2
    assert value("kernelfleet_xid_errors_total") == 1 and value("kernelfleet_xid_last_code") == 79
    assert value("kernelfleet_ecc_errors_total", type="corrected") == 3
    assert value("kernelfleet_ecc_errors_total", type="uncorrected") == 1
    active = {labels["reason"]: v for labels, v in metrics["kernelfleet_clock_event_reason_active"]}
    assert len(active) == 9 and {r for r, v in active.items() if v} == {"sw_power_cap", "hw_thermal"}
    assert "kernelfleet_process_memory_used_bytes" not in metrics  # per-process series only when asked


def test_process_series_are_opt_in_and_bounded(fake_time):
    gpu = TwinGpu(processes=[(10, 1 << 30), (11, 5 << 30), (12, 2 << 30)])
    metrics = scrape(twin_batch(fake_time, [gpu]), process_series_per_gpu=2)
    rows = sorted((labels["pid"], v) for labels, v in metrics["kernelfleet_process_memory_used_bytes"])
    assert rows == [("11", 5 << 30), ("12", 2 << 30)]  # the two largest of three
    with pytest.raises(UsageError, match="--process-series must be 0..64"):
        OfuCollector(list, process_series_per_gpu=65)


def test_dcgm_label_names_join_dcgm_exporter_series(fake_time):
    metrics = scrape(twin_batch(fake_time, [TwinGpu()]), label_names="dcgm")
    ((labels, value),) = metrics["kernelfleet_temperature_celsius"]
    assert labels == {"gpu": "0", "UUID": "GPU-twin-0", "modelName": "NVIDIA H200", "Hostname": "node-1",
                      "GPU_I_ID": "", "namespace": "", "pod": "", "container": ""}  # dcgm-exporter's pod labels too
    assert value == 52.0
    ((ref_labels, _),) = metrics["kernelfleet_reference_clock_hertz"]
    assert set(ref_labels) == {"UUID", "source"}  # every family, not only the new ones
    with pytest.raises(UsageError, match="--label-names must be one of kernelfleet, dcgm, got 'DCGM'"):
        OfuCollector(list, label_names="DCGM")


def test_a_recording_older_than_the_health_fields_exports_them_absent_not_zero(h200_trace):
    batch = next(ReplaySource(h200_trace / "h200-bf16-gemm.jsonl.gz").batches(count=1))
    (s,) = batch
    assert (s.memory_total_bytes, s.temperature_celsius, s.xid_errors_total, s.ecc_corrected_errors_total) == (None,) * 4
    metrics = scrape(batch)
    for absent in ("kernelfleet_memory_total_bytes", "kernelfleet_temperature_celsius", "kernelfleet_xid_errors_total",
                   "kernelfleet_ecc_errors_total", "kernelfleet_clock_event_reason_active", "kernelfleet_xid_last_code"):
        assert absent not in metrics, absent
    ((_, used),) = metrics["kernelfleet_memory_used_bytes"]
    assert used == s.memory_used_bytes and used > 0
    ((_, tx),) = metrics["kernelfleet_pcie_transmit_bytes_per_second"]
    assert tx == s.pcie_tx_bytes_per_second


def test_a_stale_window_exports_no_device_values(fake_time):
    (s,) = twin_batch(fake_time, [TwinGpu()])
    metrics = scrape([s.gone_stale("GPU lost")])
    assert metrics["kernelfleet_sample_stale"][0][1] == 1.0
    assert "kernelfleet_memory_used_bytes" not in metrics and "kernelfleet_processes" not in metrics


@pytest.mark.parametrize("flag, needle", [(["--label-names", "prom"], "--label-names must be one of"),
                                          (["--process-series", "1000"], "--process-series must be 0..64")])
def test_a_bad_exporter_flag_is_one_line_before_anything_starts(flag, needle, tmp_path):
    done = subprocess.run([sys.executable, "-m", "kernelfleet", "agent", "--demo", "--store", str(tmp_path / "kf.db"), *flag],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("kernelfleet: error: ") and needle in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "kf.db").exists()


def test_the_bottleneck_class_of_the_last_window_is_one_series_and_a_stale_gpu_has_none(fake_time):
    (s,) = twin_batch(fake_time, [TwinGpu()])
    metrics = scrape([s])
    ((labels, value),) = metrics["kernelfleet_bottleneck_class"]
    assert labels == {"uuid": s.uuid, "mig": "", "class": classify(s).value} and value == 1.0
    assert "kernelfleet_bottleneck_class" not in scrape([s.gone_stale("GPU lost")])
