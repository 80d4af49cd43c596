"""ScrapeSource on dcgm-exporter text: exact values, pacing, stale and broken exporters, MIG, pods.

The fixtures in tests/data/dcgm/ are modelled on dcgm-exporter's format, not recorded
(see their first line). Every test but the last feeds them through ``fetch=``.
"""

import http.server
import logging
import threading
import urllib.error
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.fleet.agent import Agent
from kernelfleet.ofu import ofu
from kernelfleet.telemetry.scrape import FetchFailed, PodRef, ScrapeSource, http_get, pod_labels

pytestmark = pytest.mark.unit

DCGM = Path(__file__).parents[1] / "data" / "dcgm"
URL = "http://gpu-h100-017:9400/metrics"
MIB = 1024 * 1024
H100_0 = "GPU-5f3c6a1e-8b2d-4c7a-9e11-2d4b6f8a0c31"
H100_1 = "GPU-a07d29c4-3e6f-4b15-8d02-7c9e1f5b3a64"
MIG_GPU = "GPU-3e8a1f07-c5b2-4d96-8a4e-0f7c2b9d6e15"
WHOLE_GPU = "GPU-d52b7e96-1a4c-4f38-b6e0-8c3d5a7f1e29"


def text(name: str) -> str:
    return (DCGM / name).read_text()


class Responses:
    """A fake ``fetch``: hands out bodies (or raises exceptions) in order, the last one forever."""

    def __init__(self, *responses, fake_time=None, takes_seconds=0.0):
        self.responses = list(responses)
        self.urls: list[str] = []
        self.fake_time = fake_time
        self.takes_seconds = takes_seconds

    def __call__(self, url: str) -> str:
        self.urls.append(url)
        if self.fake_time is not None:
            self.fake_time.sleep(self.takes_seconds)  # a slow exporter
        response = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(response, BaseException):
            raise response
        return response


def source(fake_time, *responses, **kw) -> ScrapeSource:
    return ScrapeSource(
        URL, fetch=Responses(*responses), clock=fake_time.now, wall=fake_time.wall, sleep=fake_time.sleep, **kw
    )


def by_key(batch):
    return {(s.uuid, s.mig_instance): s for s in batch}


def test_two_h100_node_gives_every_field_exactly(fake_time):
    src = source(fake_time, text("h100x2-k8s.prom"))
    batch = src.read()
    assert src.fetch.urls == [URL]
    assert [(s.gpu_index, s.uuid) for s in batch] == [(0, H100_0), (1, H100_1)]
    busy, idle = batch
    assert busy.name == "NVIDIA H100 80GB HBM3"
    assert busy.timestamp_seconds == fake_time.wall() and busy.window_seconds == 30.0  # first: one interval
    assert busy.tensor_active_ratio == 0.612345
    assert busy.sm_active_ratio == 0.874512 and busy.sm_occupancy_ratio == 0.402176
    assert busy.dram_bandwidth_ratio == 0.318904
    assert (busy.fp64_active_ratio, busy.fp32_active_ratio, busy.fp16_active_ratio) == (0.0, 0.051233, 0.000412)
    assert (busy.pcie_tx_bytes_per_second, busy.pcie_rx_bytes_per_second) == (215040123, 1843200456)
    assert (busy.nvlink_tx_bytes_per_second, busy.nvlink_rx_bytes_per_second) == (61234567890, 60987654321)
    # one instantaneous DCGM read stands for the whole window
    assert busy.sm_clock_mean_hertz == busy.sm_clock_instant_hertz == 1755e6 and busy.sm_clock_polls == 1
    assert busy.power_mean_watts == 612.418
    assert busy.memory_used_bytes == 71234 * MIB
    assert (busy.temperature_celsius, idle.temperature_celsius) == (61.0, 33.0)
    assert busy.memory_total_bytes is None and busy.xid_errors_total is None  # not read from an exporter
    assert busy.gpm_supported and not busy.stale and busy.error is None and busy.mig_instance is None
    # what dcgm-exporter does not serve stays None, never 0
    assert busy.hmma_active_ratio is None and busy.integer_active_ratio is None
    assert busy.sm_clock_max_hertz is None and busy.pci_device_id is None and busy.processes == ()
    assert idle.tensor_active_ratio == 0.0 and idle.sm_clock_mean_hertz == 345e6
    assert idle.power_mean_watts == 69.871 and idle.memory_used_bytes == 0
    assert ofu(busy, None).reason == "no reference clock: unknown GPU and NVML gave no max clock"


def test_pods_come_with_each_batch_and_from_the_helper(fake_time):
    body = text("h100x2-k8s.prom")
    src = source(fake_time, body)
    src.read()
    expected = {(H100_0, None): (PodRef("llm-train", "llama-8b-pretrain-worker-0", "trainer"),)}
    assert src.pods == expected  # GPU 1 carries no pod labels: no pod holds it
    assert pod_labels(body) == expected
    assert set(src.hosts.values()) == {"gpu-h100-017"} and len(src.hosts) == 2


def test_the_agent_files_scraped_gpus_under_their_node_and_pods(fake_time):
    src = source(fake_time, text("h100x2-k8s.prom"))
    agent = Agent(src, None, Catalog.load(), host="collector", pods=lambda s: src.pods.get((s.uuid, s.mig_instance), ()), hosts=lambda: src.hosts,
                  clock=fake_time.wall)
    readings = agent.step(src.read())
    assert {r.host for r in readings} == {"gpu-h100-017"}
    busy = next(r for r in readings if r.jobs)
    # The StatefulSet's pod is a job of its StatefulSet's name (kernelfleet.fleet.owners).
    assert [(j.job, j.kind, j.share, j.pod, j.container) for j in busy.jobs] == [
        ("k8s:llm-train/llama-8b-pretrain-worker", "kubernetes", 1.0, "llama-8b-pretrain-worker-0", "trainer")]
    assert busy.sku is not None and busy.sku.key == "h100-sxm" and busy.ofu.ofu_ratio is not None


def test_shared_gpu_lists_every_pod_and_old_empty_labels_mean_none():
    line = 'DCGM_FI_DEV_SM_CLOCK{{gpu="0",UUID="GPU-x",modelName="NVIDIA H100 80GB HBM3"{extra}}} 1980\n'
    body = (
        line.format(extra=',container="a",namespace="ns",pod="p1"')
        + line.format(extra=',container="b",namespace="ns",pod="p2"')
        + line.format(extra=',container="",namespace="",pod=""').replace('"GPU-x"', '"GPU-y"')
    )
    assert pod_labels(body) == {("GPU-x", None): (PodRef("ns", "p1", "a"), PodRef("ns", "p2", "b"))}


def test_scrapes_at_once_then_every_interval_keeping_the_schedule(fake_time):
    src = ScrapeSource(
        URL,
        interval_seconds=30.0,
        fetch=Responses(text("h100x2-k8s.prom"), fake_time=fake_time, takes_seconds=2.0),
        clock=fake_time.now,
        wall=fake_time.wall,
        sleep=fake_time.sleep,
    )
    start = fake_time.now()
    seen = [(fake_time.now() - start, batch[0].window_seconds) for batch in src.batches(count=3)]
    # each scrape starts on the 30-s grid although the exporter takes 2 s to answer
    assert seen == [(2.0, 30.0), (32.0, 30.0), (62.0, 30.0)]


def test_falling_behind_skips_missed_ticks_instead_of_bursting(fake_time):
    src = source(fake_time, text("h100x2-k8s.prom"), interval_seconds=10.0)
    starts = []
    for batch in src.batches(count=3):
        starts.append(fake_time.now() - 100.0)
        if len(starts) == 1:
            fake_time.sleep(25.0)  # the consumer stalls for two and a half intervals
    assert starts == [0.0, 30.0, 40.0]


def test_failed_fetch_after_a_good_scrape_gives_stale_samples(fake_time, caplog):
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    http_error = urllib.error.HTTPError(URL, 503, "Service Unavailable", {}, None)  # type: ignore[arg-type]
    timeout = urllib.error.URLError(TimeoutError("timed out"))
    good = text("h100x2-k8s.prom")
    src = source(fake_time, good, refused, http_error, timeout, good)
    src.read()
    errors = []
    for _ in range(3):
        fake_time.sleep(30.0)
        batch = src.read()
        assert [s.uuid for s in batch] == [H100_0, H100_1]
        assert all(s.stale and s.tensor_active_ratio is None and s.sm_clock_mean_hertz is None for s in batch)
        assert all(s.name == "NVIDIA H100 80GB HBM3" and s.window_seconds == 30.0 for s in batch)
        assert src.pods == {}  # who holds the GPU now is unknown
        errors.append(batch[0].error)
    assert errors == ["unreachable ([Errno 111] Connection refused)", "HTTP 503 Service Unavailable", "timed out"]
    assert "scrape failed" in caplog.text
    fake_time.sleep(30.0)
    recovered = src.read()
    assert not any(s.stale for s in recovered) and recovered[0].tensor_active_ratio == 0.612345
    assert src.pods  # known again


def test_first_scrape_failing_is_an_environment_problem(fake_time):
    src = source(fake_time, urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")))
    with pytest.raises(EnvironmentProblem) as caught:
        next(src.batches())
    message = str(caught.value)
    assert "\n" not in message and URL in message and "Connection refused" in message
    assert "dcgm-exporter" in message


def test_a_body_that_is_not_prometheus_text(fake_time):
    html = "<html><body><h1>502 Bad Gateway</h1></body></html>\n"
    src = source(fake_time, text("h100x2-k8s.prom"), html)
    src.read()
    stale = src.read()
    assert all(s.stale for s in stale) and "not Prometheus text" in stale[0].error
    with pytest.raises(EnvironmentProblem, match="not Prometheus text"):
        source(fake_time, html).read()


def test_prometheus_text_without_dcgm_gpus_is_not_an_exporter(fake_time):
    with pytest.raises(EnvironmentProblem, match="no GPU lines"):
        source(fake_time, "# TYPE node_load1 gauge\nnode_load1 0.42\n").read()


def test_exporter_without_profiling_fields(fake_time, caplog):
    src = source(fake_time, text("a100x2-no-prof.prom"))
    with caplog.at_level(logging.WARNING):
        first = src.read()
        src.read()
    assert [s.name for s in first] == ["NVIDIA A100-SXM4-80GB"] * 2
    a0 = first[0]
    assert not a0.gpm_supported and a0.tensor_active_ratio is None
    assert a0.sm_active_ratio is None and a0.dram_bandwidth_ratio is None and a0.pcie_tx_bytes_per_second is None
    assert a0.sm_clock_mean_hertz == 1410e6 and a0.power_mean_watts == 287.934
    assert a0.memory_used_bytes == 40960 * MIB and not a0.stale
    warnings = [r.getMessage() for r in caplog.records if "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in r.getMessage()]
    assert len(warnings) == 1 and "counters CSV" in warnings[0]  # once, not every scrape
    assert ofu(a0, None).ofu_ratio is None and "no GPM tensor counters" in ofu(a0, None).reason


def test_mig_instances_are_separate_samples_of_their_parent_gpu(fake_time):
    src = source(fake_time, text("h100-mig-k8s.prom"))
    samples = by_key(src.read())
    assert list(samples) == [(MIG_GPU, 2), (MIG_GPU, 3), (MIG_GPU, 9), (WHOLE_GPU, None)]
    gi2, gi3, gi9, whole = samples.values()
    assert (gi2.gpu_index, gi9.gpu_index, whole.gpu_index) == (0, 0, 1)
    assert (gi2.tensor_active_ratio, gi3.tensor_active_ratio, gi9.tensor_active_ratio) == (0.45512, 0.0, 0.120988)
    assert gi2.sm_clock_mean_hertz == gi9.sm_clock_mean_hertz == 1980e6  # the GPU's clock, on every slice
    # the board's power is not a slice's; the exporter serves no framebuffer lines for slices
    assert gi2.power_mean_watts is None and gi2.memory_used_bytes is None
    assert whole.power_mean_watts == 455.603 and whole.memory_used_bytes == 38210 * MIB
    assert gi2.temperature_celsius is None and whole.temperature_celsius == 57.0  # the die's, not a slice's
    assert whole.tensor_active_ratio == 0.387501 and whole.pcie_rx_bytes_per_second == 9437184456
    assert src.pods == {
        (MIG_GPU, 2): (PodRef("inference", "vllm-qwen2-7b-6d9f8c7b5-x2kqp", "vllm"),),
        (MIG_GPU, 9): (PodRef("search", "text-embedder-5c7d9b6f4-m8zlw", "embedder"),),
        (WHOLE_GPU, None): (PodRef("batch", "offline-scoring-28471-qv7tn", "scorer"),),
    }


def test_dcgm_blank_sentinels_read_as_none(fake_time):
    # DCGM_FP64_BLANK (2**47) + 2 is "not supported"; DCGM_INT64_BLANK + 1 "not found".
    body = text("h100x2-k8s.prom").replace(" 612.418000\n", " 140737488355330.000000\n")
    body = body.replace(" 0.612345\n", " 140737488355329.000000\n").replace(" 71234\n", " 9223372036854775793\n")
    busy = source(fake_time, body).read()[0]
    assert busy.power_mean_watts is None and busy.memory_used_bytes is None
    assert busy.tensor_active_ratio is None and busy.gpm_supported  # a missing window, not missing profiling
    assert busy.sm_clock_mean_hertz == 1755e6


def test_a_gpu_that_drops_out_stays_as_stale(fake_time):
    full = text("h100x2-k8s.prom")
    only_gpu0 = "".join(line for line in full.splitlines(keepends=True) if 'gpu="1"' not in line)
    src = source(fake_time, full, only_gpu0)
    src.read()
    fake_time.sleep(30.0)
    kept, gone = src.read()
    assert not kept.stale and kept.uuid == H100_0
    assert gone.uuid == H100_1 and gone.stale and gone.error == "no longer in the exporter's output"


def test_counter_typed_rates_and_missing_uuid_labels(fake_time):
    body = (
        "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES counter\n"
        'DCGM_FI_PROF_PCIE_TX_BYTES{gpu="3",modelName="NVIDIA H100 80GB HBM3",Hostname="node-9"} 1048576\n'
        'DCGM_FI_DEV_SM_CLOCK{gpu="3",modelName="NVIDIA H100 80GB HBM3",Hostname="node-9"} 1980\n'
        'DCGM_FI_DEV_SM_CLOCK{gpu="4",uuid="GPU-old-namespace"} 1500\n'
        'DCGM_FI_DEV_NVSWITCH_TEMPERATURE_CURRENT{nvswitch="0"} 45\n'
    )
    a, b = source(fake_time, body).read()
    assert (a.uuid, a.gpu_index, a.pcie_tx_bytes_per_second, a.sm_clock_mean_hertz) == ("node-9/gpu3", 3, 1048576, 1980e6)
    assert (b.uuid, b.name, b.sm_clock_mean_hertz) == ("GPU-old-namespace", "", 1500e6)


@pytest.mark.parametrize("url", ["gpu-node:9400/metrics", "file:///etc/passwd", ""])
def test_a_url_that_is_not_http_is_a_usage_error(url):
    with pytest.raises(UsageError, match="http"):
        ScrapeSource(url)


def test_interval_must_be_positive():
    with pytest.raises(UsageError, match="interval"):
        ScrapeSource(URL, interval_seconds=0)


@pytest.mark.e2e
def test_reads_a_real_http_endpoint_with_the_default_fetch():
    body = text("h100x2-k8s.prom").encode()

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with ScrapeSource(f"{base}/metrics", interval_seconds=0.01) as src:
            batches = list(src.batches(count=2))
        assert [s.tensor_active_ratio for s in batches[1]] == [0.612345, 0.0]
        assert 0 < batches[1][0].window_seconds < 5  # real monotonic time between the two scrapes
        assert src.pods[H100_0, None][0].pod == "llama-8b-pretrain-worker-0"
        with pytest.raises(EnvironmentProblem, match="HTTP 404"):
            ScrapeSource(f"{base}/wrong-path").read()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# --- a hostile or broken exporter: every limit of the module docstring ------------------------

def line(metric: str, value: str, gpu: int = 0, uuid: str | None = None) -> str:
    return f'{metric}{{gpu="{gpu}",UUID="{uuid or f"GPU-{gpu}"}",modelName="NVIDIA H100 80GB HBM3"}} {value}\n'


def test_a_body_cut_short_mid_number_is_a_failed_scrape_not_a_slow_clock(fake_time):
    good = line("DCGM_FI_DEV_SM_CLOCK", "1980") + line("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.5")
    cut = good + line("DCGM_FI_DEV_SM_CLOCK", "1980", gpu=1)[:-3]  # "... 19", no newline
    src = source(fake_time, good, cut)
    assert src.read()[0].sm_clock_mean_hertz == 1980e6
    fake_time.sleep(30.0)
    (stale,) = src.read()
    assert stale.stale and stale.sm_clock_mean_hertz is None
    assert stale.error == "not Prometheus text (the answer was cut short mid-line)"
    assert src.rejected["failed"] == 1


def test_out_of_range_values_are_rejected_counted_and_logged_once(fake_time, caplog):
    body = (line("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "1.7") + line("DCGM_FI_PROF_SM_ACTIVE", "-0.2")
            + line("DCGM_FI_PROF_DRAM_ACTIVE", "1.0000004") + line("DCGM_FI_DEV_POWER_USAGE", "-5")
            + line("DCGM_FI_DEV_SM_CLOCK", "2500") + line("DCGM_FI_DEV_MAX_SM_CLOCK", "1980")
            + line("DCGM_FI_DEV_SM_CLOCK", "1410", gpu=1) + line("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.25", gpu=1))
    src = source(fake_time, body)
    with caplog.at_level(logging.WARNING):
        bad, good = src.read()
        fake_time.sleep(30.0)
        src.read()
    assert (bad.tensor_active_ratio, bad.sm_active_ratio, bad.power_mean_watts) == (None, None, None)
    assert bad.dram_bandwidth_ratio == 1.0  # a float hair above 1 is 1
    assert bad.sm_clock_mean_hertz is None and bad.sm_clock_max_hertz == 1980e6  # above its own max
    assert (good.tensor_active_ratio, good.sm_clock_mean_hertz) == (0.25, 1410e6)
    assert src.rejected["out_of_range"] == 2 * 4
    assert caplog.text.count("out of range value(s) rejected") == 1
    assert ofu(bad, Catalog.load().lookup(bad.name)).ofu_ratio is None  # never a negative OFU


def test_a_series_twice_is_kept_where_both_agree_and_dropped_where_they_differ(fake_time):
    body = (line("DCGM_FI_DEV_SM_CLOCK", "1755") + line("DCGM_FI_DEV_SM_CLOCK", "1755")
            + line("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.5") + line("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.9"))
    src = source(fake_time, body)
    (gpu,) = src.read()
    assert gpu.sm_clock_mean_hertz == 1755e6 and gpu.tensor_active_ratio is None
    assert gpu.gpm_supported  # served, only ambiguous this window
    assert src.rejected["duplicate"] == 1


def test_more_gpus_than_a_node_holds_fail_the_scrape(fake_time):
    body = "".join(line("DCGM_FI_DEV_SM_CLOCK", "1500", gpu=k) for k in range(300))
    with pytest.raises(EnvironmentProblem, match="more than 256 GPUs in one answer"):
        source(fake_time, body).read()


def test_a_gpu_that_leaves_the_output_expires(fake_time):
    full = text("h100x2-k8s.prom")
    only_gpu0 = "".join(row for row in full.splitlines(keepends=True) if 'gpu="1"' not in row)
    src = source(fake_time, full, only_gpu0, expire_seconds=100.0)
    src.read()
    uuids = []
    for _ in range(4):
        fake_time.sleep(30.0)
        uuids.append([s.uuid for s in src.read()])
    assert uuids == [[H100_0, H100_1]] * 3 + [[H100_0]]  # stale at 30, 60 and 90 s, gone at 120 s
    assert (H100_1, None) not in src.hosts


def test_an_outage_longer_than_the_expiry_empties_the_batch_but_does_not_end_the_source(fake_time):
    # The fault campaign's slow-drip exporter (bench/fault_campaign.py) once ended the agent here:
    # every GPU expired during the stall, and the next failed scrape read as "never reachable".
    src = source(fake_time, text("h100x2-k8s.prom"), FetchFailed("timed out"), expire_seconds=10.0)
    assert len(src.read()) == 2
    fake_time.sleep(30.0)
    assert src.read() == [] and src.rejected["failed"] == 1


class _Server:
    """A real HTTP endpoint on loopback that answers with ``handler(wfile)`` after its headers."""

    def __init__(self, headers: dict[str, str], write) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                self.send_response(200)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    write(self.wfile)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.mark.e2e
def test_a_slow_drip_endpoint_cannot_hold_a_scrape_past_its_deadline():
    import time as real_time

    def drip(wfile):
        for _ in range(40):  # one byte every 0.1 s: each read succeeds, the whole takes 4 s
            wfile.write(b"#")
            wfile.flush()
            real_time.sleep(0.1)

    with _Server({"Content-Type": "text/plain"}, drip) as url:
        began = real_time.monotonic()
        with pytest.raises(FetchFailed, match=r"no whole answer within 0.5 s|timed out"):
            http_get(url, deadline_seconds=0.5)
        assert real_time.monotonic() - began < 1.5


@pytest.mark.e2e
@pytest.mark.parametrize("declared", [True, False])
def test_an_oversized_answer_is_refused_whether_or_not_it_declares_its_length(declared):
    body = b"# " + b"x" * (2 * MIB) + b"\n"
    headers = {"Content-Type": "text/plain", **({"Content-Length": str(len(body))} if declared else {})}
    with _Server(headers, lambda wfile: wfile.write(body)) as url:
        with pytest.raises(FetchFailed, match="over the 1 MiB cap"):
            http_get(url, max_bytes=MIB)
