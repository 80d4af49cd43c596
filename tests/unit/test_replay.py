"""Trace files: round trip, pacing, looping, and clear errors naming file and line."""

import json
import zlib

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.telemetry.replay import ReplaySource, TraceWriter
from kernelfleet.telemetry.sample import ProcessSample, Sample

pytestmark = pytest.mark.unit


def sample(t: float, **kw) -> Sample:
    return Sample(timestamp_seconds=t, window_seconds=1.0, gpu_index=0, uuid="GPU-x", name="NVIDIA H200", **kw)


def write(path, batches):
    with TraceWriter(path, note="test") as w:
        for b in batches:
            w.write(b)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_round_trip_is_exact(tmp_path, name):
    batch = [sample(10.0, tensor_active_ratio=0.5, sm_clock_mean_hertz=1.4e9,
                    processes=(ProcessSample(pid=7, name="python3", used_memory_bytes=5, sm_active_ratio=0.3),))]
    write(tmp_path / name, [batch, [sample(11.0, stale=True, error="lost")]])
    source = ReplaySource(tmp_path / name)
    assert source.header["note"] == "test"
    assert list(source.batches()) == [batch, [sample(11.0, stale=True, error="lost")]]


def test_speed_paces_by_recorded_time(tmp_path):
    write(tmp_path / "t.jsonl", [[sample(10.0)], [sample(12.0)], [sample(13.0)]])
    slept = []
    list(ReplaySource(tmp_path / "t.jsonl", speed=2.0, sleep=slept.append).batches())
    assert slept == [1.0, 0.5]


def test_loop_continues_the_timeline(tmp_path):
    write(tmp_path / "t.jsonl", [[sample(10.0)], [sample(11.0)]])
    stamps = [b[0].timestamp_seconds for b in ReplaySource(tmp_path / "t.jsonl", loop=True).batches(count=5)]
    assert stamps == [10.0, 11.0, 12.0, 13.0, 14.0]


def test_rebase_time_moves_the_trace_to_now(tmp_path):
    write(tmp_path / "t.jsonl", [[sample(10.0)], [sample(11.0)]])
    source = ReplaySource(tmp_path / "t.jsonl", rebase_time=True, wall=lambda: 5000.0)
    assert [b[0].timestamp_seconds for b in source.batches()] == [5000.0, 5001.0]


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match=r"nope.jsonl: no such trace file"):
        ReplaySource(tmp_path / "nope.jsonl")


def test_not_a_trace(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"hello": 1}\n')
    with pytest.raises(UsageError, match=r"t.jsonl:1: not a kernelfleet trace"):
        ReplaySource(tmp_path / "t.jsonl")


def test_empty_file(tmp_path):
    (tmp_path / "t.jsonl").write_text("")
    with pytest.raises(UsageError, match=r"t.jsonl:1: the trace is empty"):
        ReplaySource(tmp_path / "t.jsonl")


def test_truncated_line_names_the_line(tmp_path):
    write(tmp_path / "t.jsonl", [[sample(10.0)], [sample(11.0)]])
    text = (tmp_path / "t.jsonl").read_text()
    (tmp_path / "t.jsonl").write_text(text[: len(text) - 40])  # the last line cut short
    source = ReplaySource(tmp_path / "t.jsonl")
    batches = source.batches()
    assert next(batches)[0].timestamp_seconds == 10.0  # what came before is still read
    with pytest.raises(UsageError, match=r"t.jsonl:3: corrupt or truncated line"):
        next(batches)


def test_truncated_gzip_names_the_file(tmp_path):
    write(tmp_path / "t.jsonl.gz", [[sample(float(i))] for i in range(200)])
    data = (tmp_path / "t.jsonl.gz").read_bytes()
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match=r"t.jsonl.gz:\d+: corrupt or truncated"):
        list(ReplaySource(tmp_path / "t.jsonl.gz").batches())


@pytest.mark.parametrize(
    "record, message",
    [
        ({"samples": []}, "at least one sample"),
        ({"samples": [{"timestamp_seconds": 1.0}]}, "missing field"),
        ({"samples": [{**sample(1.0).to_dict(), "tensor_active_ratio": "high"}]}, "'tensor_active_ratio'"),
        ({"samples": [{**sample(1.0).to_dict(), "gpu_index": True}]}, "'gpu_index'"),
        ({"samples": [{**sample(1.0).to_dict(), "surprise": 1}]}, "unknown field"),
        # JSON's NaN and Infinity parse as floats: a sample carrying one would reach the store and /metrics
        ({"samples": [{**sample(1.0).to_dict(), "timestamp_seconds": float("inf")}]}, "'timestamp_seconds'.*finite"),
        ({"samples": [{**sample(1.0).to_dict(), "tensor_active_ratio": float("nan")}]}, "'tensor_active_ratio'"),
        ({"samples": [{**sample(1.0).to_dict(), "window_seconds": -1.0}]}, "'window_seconds'"),
    ],
)
def test_bad_sample_names_file_line_and_field(tmp_path, record, message):
    header = {"kernelfleet_trace": 1}
    (tmp_path / "t.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(UsageError, match=rf"t.jsonl:2: .*{message}"):
        list(ReplaySource(tmp_path / "t.jsonl").batches())


def test_writer_refuses_unwritable_path(tmp_path):
    with pytest.raises(UsageError, match="cannot write trace"):
        TraceWriter(tmp_path / "no-such-dir" / "t.jsonl")


def test_writer_flushes_each_batch(tmp_path):
    w = TraceWriter(tmp_path / "t.jsonl.gz")
    w.write([sample(1.0)])
    # decodable before close: a crash loses at most the batch being written
    text = zlib.decompressobj(wbits=31).decompress((tmp_path / "t.jsonl.gz").read_bytes())
    assert len(text.decode().splitlines()) == 2
    w.close()


def test_a_corrupt_timestamp_cannot_hold_a_paced_replay(tmp_path):
    write(tmp_path / "t.jsonl", [[sample(10.0)], [sample(1e300)], [sample(1e300 + 1.0)]])
    slept = []
    assert len(list(ReplaySource(tmp_path / "t.jsonl", speed=1.0, sleep=slept.append).batches())) == 3
    assert slept == [3600.0, 0.0]  # the gap is capped at MAX_GAP_SECONDS, not slept out or overflowed


def test_every_bit_flip_of_a_recording_reads_or_fails_in_one_line(tmp_path):
    """Seeded bit flips of a gzipped trace: zlib's own errors used to escape as tracebacks."""
    import random

    write(tmp_path / "t.jsonl.gz", [[sample(float(i), tensor_active_ratio=0.5)] for i in range(300)])
    data = (tmp_path / "t.jsonl.gz").read_bytes()
    rng = random.Random(0)
    outcomes = {"read": 0, "refused": 0}
    for k in range(60):
        flipped = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        path = tmp_path / f"m{k}.jsonl.gz"
        path.write_bytes(bytes(flipped))
        try:
            list(ReplaySource(path).batches())
            outcomes["read"] += 1
        except UsageError as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0 and sum(outcomes.values()) == 60
