"""The roofline cost model on synthetic measured tables made from known capabilities and known
per-launch efficiencies: it recovers them, says how wrong it is, and falls back to a launch's
class when the launch's FLOPs and bytes are unknown."""

import math
import random

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.costs.model import Capability, fit, leave_one_out, predict_table
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError

pytestmark = pytest.mark.unit

CATALOG = Catalog.load()
CAPS = {
    key: Capability.from_sku(CATALOG.get(key))
    for key in ("a100-sxm-80gb", "l40s", "h100-sxm", "rtx-pro-6000-se", "h200-sxm", "b200")
}
MEASURED = ["a100-sxm-80gb", "l40s", "h100-sxm", "rtx-pro-6000-se"]
OVERHEAD = 4e-6


def synthetic_launches(n, seed):
    """(kind, FLOPs, bytes, precision, e_compute, e_memory): GEMMs of several sizes, decode
    attention, elementwise kernels and 'other' kernels with FP32 work, efficiencies drawn per launch."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            m, k, nn = rng.choice([64, 256, 1024, 4096]), 4096, rng.choice([4096, 14336])
            out.append(
                (
                    "tensor-core",
                    2 * m * k * nn,
                    2 * (m * k + k * nn + m * nn),
                    "bf16",
                    rng.uniform(0.5, 0.85),
                    rng.uniform(0.6, 0.9),
                )
            )
        elif r < 0.5:
            ctx = rng.choice([512, 2048, 8192])
            out.append(
                (
                    "tensor-core",
                    128 * ctx * 4096,
                    64 * ctx * 1024 + 2**20,
                    "bf16",
                    rng.uniform(0.3, 0.6),
                    rng.uniform(0.6, 0.9),
                )
            )
        elif r < 0.9:
            nbytes = rng.choice([2**18, 2**21, 2**24, 2**26])
            out.append(
                ("memory-bound", nbytes // 2, nbytes, None, rng.uniform(0.3, 0.6), rng.uniform(0.5, 0.92))
            )
        else:
            nbytes = rng.choice([2**20, 2**23])
            out.append(("other", 8 * nbytes, nbytes, None, rng.uniform(0.2, 0.5), rng.uniform(0.4, 0.8)))
    return out


def true_seconds(launches, cap):
    return [
        max(f / (cap.peak(p) * ec), b / (cap.memory_bytes_per_second * em)) + OVERHEAD
        for _, f, b, p, ec, em in launches
    ]


def measured_table(launches, devices, noise, seed, known=lambda k: True):
    rng = random.Random(seed)
    truth = {d: true_seconds(launches, CAPS[d]) for d in devices}
    rows = [{d: truth[d][k] * math.exp(rng.gauss(0.0, noise)) for d in devices} for k in range(len(launches))]
    return CostTable(
        rows,
        "synthetic",
        [f if known(k) else None for k, (_, f, *_) in enumerate(launches)],
        [b if known(k) else None for k, (_, _, b, *_) in enumerate(launches)],
        [p for _, _, _, p, _, _ in launches],
    )


def relative_errors(predicted, truth):
    return sorted(abs(p - t) / t for p, t in zip(predicted, truth))


LAUNCHES = synthetic_launches(120, seed=1)
KINDS = [launch[0] for launch in LAUNCHES]


def test_noise_free_table_is_recovered_exactly():
    table = measured_table(LAUNCHES, MEASURED, noise=0.0, seed=0)
    model = fit(table, KINDS, CAPS, overhead_seconds=OVERHEAD)
    assert model.paths() == {"launch": 120}
    for target in ("h200-sxm", "l40s"):
        assert max(relative_errors(model.predict(CAPS[target]), true_seconds(LAUNCHES, CAPS[target]))) < 1e-9
    # the efficiencies are the ones the table was made from (GEMMs are compute-bound on every SKU here)
    for k, (kind, f, b, _, ec, em) in enumerate(LAUNCHES):
        if "compute" in model.launches[k].identified:
            assert 1 / model.launches[k].a == pytest.approx(ec, rel=1e-9)
        if "memory" in model.launches[k].identified:
            assert 1 / model.launches[k].b == pytest.approx(em, rel=1e-9)


def test_noisy_table_predicts_unmeasured_skus_and_fits_the_overhead():
    table = measured_table(LAUNCHES, MEASURED, noise=0.03, seed=2)
    model = fit(table, KINDS, CAPS)
    assert model.overhead_seconds == pytest.approx(OVERHEAD, rel=0.1)
    for target in ("h200-sxm", "b200"):
        rel = relative_errors(model.predict(CAPS[target]), true_seconds(LAUNCHES, CAPS[target]))
        assert rel[len(rel) // 2] < 0.06 and rel[int(0.9 * len(rel))] < 0.10, target
    # class efficiencies near the middle of the ranges the launches were drawn from
    assert 0.55 < model.efficiency["tensor-core"]["compute"] < 0.8
    assert 0.6 < model.efficiency["memory-bound"]["memory"] < 0.8


def test_leave_one_device_out_error_is_reported():
    table = measured_table(LAUNCHES, MEASURED, noise=0.03, seed=2)
    error = leave_one_out(table, KINDS, CAPS)
    assert set(error.per_device) == set(MEASURED) and error.pairs == 4 * 120
    assert error.median_ratio < 0.06 and error.p90_ratio < 0.2 and error.mispredicted_share < 0.06
    assert "leave-one-device-out median" in error.summary()
    one = CostTable(
        [{"l40s": row["l40s"]} for row in table.seconds], "x", table.flops, table.bytes, table.precision
    )
    assert leave_one_out(one, KINDS, CAPS) is None


def test_held_out_device_does_not_leak_into_its_own_prediction():
    # the L40S column runs 1.5x slower than its datasheet says on every launch: the other three
    # devices cannot know that, so an honest held-out prediction is off by exactly 1/3
    table = measured_table(LAUNCHES, MEASURED, noise=0.0, seed=0)
    for row in table.seconds:
        row["l40s"] *= 1.5
    error = leave_one_out(table, KINDS, CAPS, overhead_seconds=OVERHEAD)
    # (a few launches whose binding side the other devices never saw are off a little more or less)
    assert error.per_device["l40s"]["median_ratio"] == pytest.approx(1 / 3, rel=0.01)
    assert error.per_device["l40s"]["mispredicted_share"] == pytest.approx(1 / 3, rel=0.02)


def test_unknown_flops_and_bytes_fall_back_to_the_class():
    unknown = set(range(0, 120, 3))
    table = measured_table(LAUNCHES, MEASURED, noise=0.0, seed=0, known=lambda k: k not in unknown)
    model = fit(table, KINDS, CAPS, overhead_seconds=OVERHEAD)
    assert model.paths() == {"launch": 80, "class": 40}
    assert all(model.launches[k].path == "class" for k in unknown)
    rel = relative_errors(
        [model.predict(CAPS["b200"])[k] for k in sorted(unknown)],
        [true_seconds(LAUNCHES, CAPS["b200"])[k] for k in sorted(unknown)],
    )
    assert rel[len(rel) // 2] < 0.02 and rel[-1] < 0.2


def test_one_measured_device_takes_the_binding_resource_from_the_class():
    # measured on the A100 only: an elementwise kernel of unknown size must scale with bandwidth to
    # the L40S (2.36x slower), a large GEMM with the bf16 peak (1.17x faster); swapping the two
    # resources would be off by 4x or more
    table = measured_table(LAUNCHES, ["a100-sxm-80gb"], noise=0.0, seed=0)
    elementwise = next(
        k for k, launch in enumerate(LAUNCHES) if launch[0] == "memory-bound" and launch[2] == 2**26
    )
    gemm = next(k for k, launch in enumerate(LAUNCHES) if launch[0] == "tensor-core" and launch[1] > 1e11)
    for k in (elementwise, gemm):
        table.flops[k] = table.bytes[k] = None
    model = fit(table, KINDS, CAPS, overhead_seconds=OVERHEAD)
    assert model.launches[elementwise].path == model.launches[gemm].path == "class"
    predicted, truth = model.predict(CAPS["l40s"]), true_seconds(LAUNCHES, CAPS["l40s"])
    for k in (elementwise, gemm):
        assert predicted[k] == pytest.approx(truth[k], rel=0.15)


def test_no_flops_anywhere_uses_the_kind_and_two_devices_decide():
    table = measured_table(LAUNCHES, ["a100-sxm-80gb", "l40s"], noise=0.0, seed=0, known=lambda k: False)
    model = fit(table, KINDS, CAPS, overhead_seconds=OVERHEAD)
    assert model.paths() == {"kind": 120}
    rel = relative_errors(model.predict(CAPS["h100-sxm"]), true_seconds(LAUNCHES, CAPS["h100-sxm"]))
    assert rel[len(rel) // 2] < 0.02


def test_a_precision_the_target_lacks_is_none_not_a_guess():
    launches = [("tensor-core", 2 * 4096**3, 3 * 2 * 4096**2, "fp8", 0.7, 0.8)] + LAUNCHES[:5]
    table = measured_table(launches, ["h100-sxm", "h200-sxm"], noise=0.0, seed=0)
    model = fit(table, [launch[0] for launch in launches], CAPS)
    assert model.predict(CAPS["a100-sxm-80gb"])[0] is None  # the A100 has no FP8
    assert model.predict(CAPS["b200"])[0] is not None


def test_predicted_table_is_labelled_and_keeps_measurements():
    table = measured_table(LAUNCHES[:30], ["a100-sxm-80gb", "l40s", "h100-sxm"], noise=0.02, seed=3)
    out, _, error = predict_table(table, KINDS[:30], CAPS, {"b200": CAPS["b200"], "l40s": CAPS["l40s"]})
    assert out.source.startswith(
        "roofline model fitted on a100-sxm-80gb, h100-sxm, l40s (measured: synthetic)"
    )
    assert "predicted b200;" in out.source and error is not None and error.summary() in out.source
    assert [row["l40s"] for row in out.seconds] == [row["l40s"] for row in table.seconds]
    assert all(row["b200"] > 0 for row in out.seconds) and out.flops == table.flops
    again = CostTable.from_json(out.to_json())
    assert again == out


def test_inputs_are_checked():
    table = measured_table(LAUNCHES[:4], ["l40s"], noise=0.0, seed=0)
    with pytest.raises(UsageError, match="no capability for measured device"):
        fit(table, KINDS[:4], {})
    with pytest.raises(UsageError, match="kernel kinds"):
        fit(table, KINDS[:3], CAPS)
    with pytest.raises(UsageError, match="memory_bytes_per_second"):
        Capability({"bf16": 1e15}, 0.0)
    with pytest.raises(UsageError, match="precisions"):
        Capability({"bf17": 1e15}, 1e12)
    with pytest.raises(UsageError, match="calib.json"):
        Capability.from_dict({"flops_per_second": {"bf16": 1e15}}, "calib.json")
    assert (
        Capability.from_dict({"flops_per_second": {"bf16": 1e15}, "memory_bytes_per_second": 2e12}).peak(
            "bf16"
        )
        == 1e15
    )


def test_cost_table_json_stays_backward_compatible():
    old = '{"kernelfleet_costs": 1, "source": "old", "seconds": [{"a": 1.0}, {"a": null}]}'
    table = CostTable.from_json(old)
    assert table.flops is None and table.bytes is None and table.precision is None
    assert "flops" not in table.to_json()
    full = CostTable([{"a": 1.0}, {"a": None}], "new", [10, None], [20, 30], ["bf16", None])
    assert CostTable.from_json(full.to_json()) == full
    with pytest.raises(UsageError, match="f.json: cost table: flops has 1 entries"):
        CostTable.from_json('{"kernelfleet_costs": 1, "seconds": [{}, {}], "flops": [1]}', "f.json")
    with pytest.raises(UsageError, match="precision"):
        CostTable([{"a": 1.0}], precision=["bf17"])
    with pytest.raises(UsageError, match="bytes must be a number"):
        CostTable([{"a": 1.0}], bytes=[-1])
