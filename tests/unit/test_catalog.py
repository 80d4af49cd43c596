"""The GPU catalog: the built-in numbers, lookup, and user override files.

The data tests pin exact values and check the numbers against each other (per-SM tensor rates
must be powers of two at the reference clock, dense ratios between precisions must hold), so a
typo, a sparse figure left unhalved or a wrong clock fails here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

import kernelfleet.catalog as catalog_module
from kernelfleet.catalog import ENV_VAR, PRECISIONS, TENSOR_PRECISIONS, Catalog, Price, Sku
from kernelfleet.errors import UsageError

pytestmark = pytest.mark.unit

# Every exact NVML string (nvmlDeviceGetName) the catalog must recognise, and its SKU.
NVML_NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H200": "h200-sxm",
    "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA A100-SXM4-80GB": "a100-sxm-80gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA L40S": "l40s",
    "NVIDIA L4": "l4",
    "NVIDIA A10": "a10",
    "NVIDIA A10G": "a10g",
    "Tesla T4": "t4",
    "NVIDIA B200": "b200",
    "NVIDIA GB200": "gb200",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000-se",
}

# PCI device ids from pci.ids (vendor 0x10de).
PCI_IDS = {
    0x2330: "h100-sxm",
    0x2331: "h100-pcie",
    0x2335: "h200-sxm",
    0x233B: "h200-nvl",
    0x20B2: "a100-sxm-80gb",
    0x20B5: "a100-pcie-80gb",
    0x20B0: "a100-sxm-40gb",
    0x20F1: "a100-pcie-40gb",
    0x20B1: "a100-pcie-40gb",
    0x26B9: "l40s",
    0x27B8: "l4",
    0x2236: "a10",
    0x2237: "a10g",
    0x1EB8: "t4",
    0x2901: "b200",
    0x2941: "gb200",
    0x2BB5: "rtx-pro-6000-se",
}

# (reference clock Hz, dense BF16 FLOP/s, FP16 for T4) per SKU: pins the headline numbers.
HEADLINE = {
    "h100-sxm": (1.83e9, 989.4e12),
    "h100-pcie": (1.62e9, 756.5e12),
    "h200-sxm": (1.83e9, 989.4e12),
    "h200-nvl": (1.5453e9, 835.5e12),
    "a100-sxm-80gb": (1.41e9, 312e12),
    "a100-pcie-80gb": (1.41e9, 312e12),
    "a100-sxm-40gb": (1.41e9, 312e12),
    "a100-pcie-40gb": (1.41e9, 312e12),
    "l40s": (2.52e9, 366.5e12),
    "l4": (2.04e9, 121e12),
    "a10": (1.695e9, 125e12),
    "a10g": (1.71e9, 70.04e12),
    "t4": (1.59e9, 65e12),
    "b200": (1.8558e9, 2.25e15),
    "gb200": (2.062e9, 2.5e15),
    "rtx-pro-6000-se": (2.43e9, 468e12),
}

# Dense BF16 (T4: FP16) tensor FLOP per clock per SM. A sparse figure left unhalved doubles this
# and is still a power of two, so the power-of-two test alone would not catch it.
BF16_FLOP_PER_CLOCK_PER_SM = {
    "h100-sxm": 4096,
    "h100-pcie": 4096,
    "h200-sxm": 4096,
    "h200-nvl": 4096,
    "a100-sxm-80gb": 2048,
    "a100-pcie-80gb": 2048,
    "a100-sxm-40gb": 2048,
    "a100-pcie-40gb": 2048,
    "l40s": 1024,
    "l4": 1024,
    "a10": 1024,
    "a10g": 512,  # half-rate FP32-accumulate tensor ops (derived, see the SKU's note)
    "t4": 1024,
    "b200": 8192,
    "gb200": 8192,
    "rtx-pro-6000-se": 1024,
}

# Datasheets print 3-4 significant figures (L4's TF32 120* is 121.2 rounded, 0.96 % low): 1 %
# absorbs that and still fails a factor of two, a wrong SM count or a wrong clock.
DATASHEET_ROUNDING = 0.01

# Tensor peaks that are NOT defined at the SKU's reference clock, with the reason.
NOT_AT_REFERENCE_CLOCK = {
    ("h100-sxm", "fp64_tensor"): "FP64 figures are quoted at the 1.98 GHz boost: 66.9e12/(132x256)",
    ("h100-pcie", "fp64_tensor"): "FP64 figures are quoted at the 1.755 GHz boost: 51.2e12/(114x256)",
    ("h200-sxm", "fp64_tensor"): "FP64 figures are quoted at the 1.98 GHz boost: 66.9e12/(132x256)",
    ("h200-nvl", "fp64_tensor"): "FP64 figures are quoted near the 1.785 GHz boost: 60e12/(132x256)",
    ("b200", "fp64_tensor"): "FP64 37e12 is quoted near the 1.965 GHz boost: 37e12/(148x128) = 1.95 GHz",
    ("gb200", "fp64_tensor"): "FP64 40e12 implies 2.11 GHz (as FP32 80e12 does), above the 2062 MHz max",
}

TESSERA_PRICES = {"a100-sxm-80gb": 1.5, "l40s": 1.0, "h100-sxm": 2.9, "b200": 5.0, "rtx-pro-6000-se": 1.2}
# No public on-demand price could be sourced for these; they carry none rather than a guess.
NO_PRICE_FOUND = {"h200-nvl", "a100-pcie-40gb"}


@pytest.fixture(autouse=True)
def _no_user_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own KERNELFLEET_CATALOG must not leak into the tests.
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture(scope="module")
def builtin() -> Catalog:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(ENV_VAR, raising=False)
        return Catalog.load()


def _all_keys() -> list[str]:
    return sorted(HEADLINE)


# ------------------------------------------------------------------------------ built-in data


def test_every_required_sku_is_present(builtin: Catalog) -> None:
    assert {sku.key for sku in builtin} == set(HEADLINE)
    assert len(builtin) == 16


@pytest.mark.parametrize("key", _all_keys())
def test_headline_numbers(builtin: Catalog, key: str) -> None:
    sku = builtin.get(key)
    reference_clock, bf16 = HEADLINE[key]
    assert sku.reference_clock_hertz == reference_clock
    assert (sku.peak_flops("bf16") or sku.peak_flops("fp16")) == bf16
    assert sku.reference_clock_hertz <= sku.max_sm_clock_hertz


def test_exact_values_of_one_sku_per_generation(builtin: Catalog) -> None:
    h100 = builtin.get("h100-sxm")
    assert dict(h100.dense_peak_flops) == {
        "fp64": 33.5e12,
        "fp64_tensor": 66.9e12,
        "fp32": 66.9e12,
        "tf32": 494.7e12,
        "bf16": 989.4e12,
        "fp16": 989.4e12,
        "fp8": 1978.9e12,
        "int8": 1978.9e12,
    }
    assert (h100.sm_count, h100.max_sm_clock_hertz, h100.memory_bytes) == (132, 1.98e9, 80 * 2**30)
    assert h100.memory_bandwidth_bytes_per_second == 3.35e12
    assert (h100.interconnect_bytes_per_second, h100.tdp_watts) == (900e9, 700)
    a100 = builtin.get("a100-sxm-80gb")
    assert dict(a100.dense_peak_flops) == {
        "fp64": 9.7e12,
        "fp64_tensor": 19.5e12,
        "fp32": 19.5e12,
        "tf32": 156e12,
        "bf16": 312e12,
        "fp16": 312e12,
        "int8": 624e12,
    }
    assert a100.memory_bandwidth_bytes_per_second == 2.039e12
    t4 = builtin.get("t4")
    assert dict(t4.dense_peak_flops) == {"fp32": 8.1e12, "fp16": 65e12, "int8": 130e12}
    b200 = builtin.get("b200")
    assert (b200.peak_flops("fp4"), b200.peak_flops("fp8"), b200.peak_flops("tf32")) == (
        9e15,
        4.5e15,
        1.125e15,
    )
    assert (b200.sm_count, b200.max_sm_clock_hertz, b200.tdp_watts) == (148, 1.965e9, 1000)
    h200 = builtin.get("h200-sxm")
    assert (h200.memory_bytes, h200.memory_bandwidth_bytes_per_second) == (141 * 2**30, 4.8e12)


@pytest.mark.parametrize("key", _all_keys())
def test_tensor_peaks_are_a_power_of_two_flop_per_clock_per_sm(builtin: Catalog, key: str) -> None:
    sku = builtin.get(key)
    checked = 0
    for precision in TENSOR_PRECISIONS:
        peak = sku.peak_flops(precision)
        if peak is None:
            continue
        per_sm_clock = peak / (sku.sm_count * sku.reference_clock_hertz)
        off = abs(per_sm_clock / 2 ** round(math.log2(per_sm_clock)) - 1)
        if (key, precision) in NOT_AT_REFERENCE_CLOCK:
            # A stale exception would hide a future typo: it must still be needed.
            assert off > DATASHEET_ROUNDING, f"{key} {precision}: exception no longer needed"
            continue
        checked += 1
        assert off <= DATASHEET_ROUNDING, (
            f"{key} {precision}: {peak:g} / ({sku.sm_count} x {sku.reference_clock_hertz:g}) = "
            f"{per_sm_clock:.1f} FLOP/clk/SM, not a power of two"
        )
    assert checked >= 2


@pytest.mark.parametrize("key", _all_keys())
def test_dense_bf16_rate_per_sm_matches_the_architecture(builtin: Catalog, key: str) -> None:
    sku = builtin.get(key)
    peak = sku.peak_flops("bf16") or sku.peak_flops("fp16")
    assert peak is not None
    rate = peak / (sku.sm_count * sku.reference_clock_hertz)
    assert rate == pytest.approx(BF16_FLOP_PER_CLOCK_PER_SM[key], rel=DATASHEET_ROUNDING)


@pytest.mark.parametrize("key", _all_keys())
def test_dense_ratios_between_precisions(builtin: Catalog, key: str) -> None:
    sku = builtin.get(key)
    peak = dict(sku.dense_peak_flops)
    rel = DATASHEET_ROUNDING
    has_fp8 = sku.architecture in ("hopper", "ada", "blackwell")
    assert ("fp8" in peak) == has_fp8
    assert ("fp4" in peak) == (sku.architecture == "blackwell")
    assert ("bf16" in peak) == (sku.architecture != "turing")
    assert ("tf32" in peak) == (sku.architecture != "turing")
    if "bf16" in peak:
        assert peak["bf16"] == peak["fp16"]
        assert peak["tf32"] == pytest.approx(peak["bf16"] / 2, rel=rel)
    if has_fp8:
        assert peak["fp8"] == pytest.approx(2 * peak["bf16"], rel=rel)
        assert peak["int8"] == pytest.approx(peak["fp8"], rel=rel)
    else:  # Ampere and Turing: INT8 runs at twice the FP16 rate.
        assert peak["int8"] == pytest.approx(2 * peak["fp16"], rel=rel)
    if "fp4" in peak:
        assert peak["fp4"] == pytest.approx(2 * peak["fp8"], rel=rel)
    if "fp64_tensor" in peak:
        # Hopper and Ampere double FP64 on the tensor cores; Blackwell does not.
        factor = 1 if sku.architecture == "blackwell" else 2
        assert peak["fp64_tensor"] == pytest.approx(factor * peak["fp64"], rel=rel)


def test_every_sku_cites_its_source_and_explains_its_clock(builtin: Catalog) -> None:
    for sku in builtin:
        assert len(sku.source) > 40, sku.key
        assert "/" in sku.reference_clock_note and "=" in sku.reference_clock_note, sku.key
        assert 0.0 not in sku.dense_peak_flops.values()


def test_tessera_prices(builtin: Catalog) -> None:
    for key, usd in TESSERA_PRICES.items():
        tessera = [p for p in builtin.get(key).prices if p.source.startswith("Tessera, arXiv 2604.10180")]
        assert [(p.usd_per_hour, p.date) for p in tessera] == [(usd, "2026-04")], key


def test_every_sku_has_a_public_price_unless_none_was_found(builtin: Catalog) -> None:
    for sku in builtin:
        if sku.key in NO_PRICE_FOUND:
            assert sku.prices == ()
        else:
            assert sku.prices, f"{sku.key} has no price"
    assert builtin.get("t4").prices[0].usd_per_hour == 0.526
    assert builtin.get("a10g").prices[0].usd_per_hour == 1.006


# ------------------------------------------------------------------------------------ lookup


@pytest.mark.parametrize(("nvml_name", "key"), sorted(NVML_NAMES.items()))
def test_lookup_by_nvml_name(builtin: Catalog, nvml_name: str, key: str) -> None:
    sku = builtin.lookup(nvml_name)
    assert sku is not None and sku.key == key


def test_lookup_ignores_case_and_runs_of_whitespace(builtin: Catalog) -> None:
    assert builtin.lookup("  nvidia   H100 80gb\tHBM3 ") is builtin.get("h100-sxm")


def test_unknown_gpu_borrows_nothing(builtin: Catalog) -> None:
    assert builtin.lookup("NVIDIA GeForce RTX 4090") is None
    # A real datacenter GPU the catalog lacks must not match its nearest relative.
    assert builtin.lookup("NVIDIA H100 NVL") is None
    assert builtin.lookup("NVIDIA H100") is None
    assert builtin.lookup("") is None


@pytest.mark.parametrize(("pci_id", "key"), sorted(PCI_IDS.items()))
def test_lookup_by_pci_device_id(builtin: Catalog, pci_id: int, key: str) -> None:
    sku = builtin.lookup("unrecognised name", pci_id)
    assert sku is not None and sku.key == key
    # NVML's pciInfo.pciDeviceId packs device << 16 | vendor.
    assert builtin.lookup("unrecognised name", pci_id << 16 | 0x10DE) is sku


def test_name_wins_over_pci_id_and_unknown_pci_id_is_none(builtin: Catalog) -> None:
    assert builtin.lookup("NVIDIA L4", 0x2330) is builtin.get("l4")
    assert builtin.lookup("unrecognised name", 0x2684) is None  # GeForce RTX 4090
    assert builtin.lookup("unrecognised name", 0x2684 << 16 | 0x1002) is None


def test_pci_id_shared_by_two_skus_matches_neither(builtin: Catalog) -> None:
    a10 = builtin.get("a10")
    twin = dataclasses.replace(a10, key="a10-twin", nvml_names=("NVIDIA A10 twin",))
    catalog = Catalog([a10, twin])
    assert catalog.lookup("unrecognised name", 0x2236) is None
    assert catalog.lookup("NVIDIA A10 twin", 0x2236) is twin


def test_get_unknown_key_names_the_known_keys(builtin: Catalog) -> None:
    with pytest.raises(UsageError, match="unknown GPU key 'h300'.*h100-sxm.*rtx-pro-6000-se"):
        builtin.get("h300")


def test_catalog_rejects_duplicate_keys_and_shared_nvml_names(builtin: Catalog) -> None:
    l4 = builtin.get("l4")
    with pytest.raises(ValueError, match="twice"):
        Catalog([l4, l4])
    with pytest.raises(ValueError, match="claimed by both"):
        Catalog([l4, dataclasses.replace(l4, key="l4-copy", pci_device_ids=())])


def test_iteration_follows_file_order(builtin: Catalog) -> None:
    keys = [sku.key for sku in builtin]
    assert keys[0] == "h100-sxm" and keys[-1] == "rtx-pro-6000-se"
    assert "t4" in builtin and "t5" not in builtin


# ---------------------------------------------------------------------------------- the Sku


def test_peak_flops_unsupported_is_none_and_unknown_name_is_an_error(builtin: Catalog) -> None:
    assert builtin.get("t4").peak_flops("bf16") is None
    assert builtin.get("a100-sxm-80gb").peak_flops("fp8") is None
    assert builtin.get("h100-sxm").peak_flops("fp4") is None
    with pytest.raises(UsageError, match="unknown precision 'bfloat16'"):
        builtin.get("h100-sxm").peak_flops("bfloat16")
    assert set(TENSOR_PRECISIONS) == set(PRECISIONS) - {"fp64", "fp32"}


def test_sku_is_immutable(builtin: Catalog) -> None:
    sku = builtin.get("h100-sxm")
    with pytest.raises(TypeError):
        sku.dense_peak_flops["bf16"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        sku.sm_count = 1  # type: ignore[misc]
    assert {sku, builtin.get("h100-sxm")} == {sku}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"reference_clock_hertz": 2.0e9}, "exceeds max_sm_clock_hertz"),
        ({"dense_peak_flops": {"bf16": 0.0}}, "dense_peak_flops.bf16 must be a positive"),
        ({"dense_peak_flops": {"fp6": 1e12}}, "unknown precision 'fp6'"),
        ({"sm_count": 0}, "sm_count must be a positive"),
        ({"compute_capability": "sm_90"}, "compute_capability"),
        ({"pci_device_ids": (0x233010DE,)}, "16-bit"),
        ({"tdp_watts": -1.0}, "tdp_watts"),
        ({"tensor_clock_ratio": {"hmma": 0.9}}, "come together"),
        ({"tensor_clock_ratio": {"gmma": 0.9}, "tensor_clock_evidence": "x"}, "unknown pipe 'gmma'"),
        ({"tensor_clock_ratio": {"hmma": 903.0}, "tensor_clock_evidence": "x"}, "near or below 1"),
        ({"peak_clock_hertz": {"fp64": 2.5e9}}, "peak_clock_hertz.fp64 .* exceeds max_sm_clock_hertz"),
        ({"peak_clock_hertz": {"fp8": 1.98e9}}, "hmma precisions have peaks at different clocks"),
    ],
)
def test_sku_validates_itself(builtin: Catalog, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(builtin.get("h100-sxm"), **change)


def test_peaks_quoted_at_another_clock_are_a_power_of_two_there(builtin: Catalog) -> None:
    """peak_clock_hertz is the datasheet's own arithmetic for the exceptions above: at that clock the
    per-SM rate is a power of two again."""
    given = [(sku, p, hz) for sku in builtin for p, hz in sku.peak_clock_hertz.items()]
    assert {(sku.key, p) for sku, p, _ in given} >= {("h100-sxm", "fp64_tensor"), ("h200-sxm", "fp64_tensor")}
    for sku, precision, hertz in given:
        per_sm_clock = sku.peak_flops(precision) / (sku.sm_count * hertz)
        assert abs(per_sm_clock / 2 ** round(math.log2(per_sm_clock)) - 1) <= DATASHEET_ROUNDING, (sku.key, precision)
        assert sku.peak_clock(precision) == hertz
    assert builtin.get("h200-sxm").peak_clock("bf16") == 1.83e9


def test_ofu_reference_clock_is_the_peaks_clock_over_the_measured_ratio(builtin: Catalog) -> None:
    h200 = builtin.get("h200-sxm")
    assert h200.tensor_clock_ratio == {"hmma": 0.903, "dfma": 0.995} and "probe" in h200.tensor_clock_evidence
    assert h200.ofu_reference_clock() == (pytest.approx(1.83e9 / 0.903), "measured")
    assert h200.ofu_reference_clock("dfma") == (pytest.approx(1.98e9 / 0.995), "measured")
    assert h200.ofu_reference_clock("imma") == (1.83e9, "datasheet")  # int8 never measured
    assert h200.ofu_clock_hertz == pytest.approx(2026.6e6, abs=0.1e6)
    for precision in ("tf32", "bf16", "fp16", "fp8"):
        assert h200.ofu_reference_clock_of(precision) == h200.ofu_reference_clock("hmma")
    assert h200.ofu_reference_clock_of("fp64_tensor") == h200.ofu_reference_clock("dfma")
    assert h200.ofu_reference_clock_of("fp32") == (1.98e9, "datasheet")  # no pipe: its own peak clock
    # a SKU measured by nobody takes NVML's clock at its word: f_ref is the datasheet's peak clock
    h100 = builtin.get("h100-sxm")
    assert h100.ofu_reference_clock() == (1.83e9, "datasheet") and h100.ofu_reference_clock("dfma") == (1.98e9, "datasheet")
    assert all(not sku.tensor_clock_ratio for sku in builtin if sku.key != "h200-sxm")
    with pytest.raises(UsageError, match="unknown tensor pipe"):
        h200.ofu_reference_clock("gmma")


def test_reference_clock_may_equal_the_maximum(builtin: Catalog) -> None:
    sku = dataclasses.replace(builtin.get("h100-sxm"), reference_clock_hertz=1.98e9)
    assert sku.reference_clock_hertz == sku.max_sm_clock_hertz


def test_price_validates_its_date() -> None:
    assert Price(1.0, "AWS", "rate card", "2026-04").date == "2026-04"
    with pytest.raises(ValueError, match="ISO 8601"):
        Price(1.0, "AWS", "rate card", "April 2026")
    with pytest.raises(ValueError, match="usd_per_hour"):
        Price(0.0, "AWS", "rate card", "2026")


@pytest.mark.parametrize("key", _all_keys())
def test_to_dict_round_trips_json(builtin: Catalog, key: str) -> None:
    sku = builtin.get(key)
    as_dict = sku.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert set(as_dict) == {f.name for f in dataclasses.fields(Sku)}
    assert as_dict["dense_peak_flops"] == dict(sku.dense_peak_flops)
    assert [Price(**price) for price in as_dict["prices"]] == list(sku.prices)


# -------------------------------------------------------------------------------- overrides

NEW_SKU = """
[[gpu]]
key = "h100-nvl"
name = "NVIDIA H100 NVL"
nvml_names = ["NVIDIA H100 NVL"]
pci_device_ids = [0x2321]
architecture = "hopper"
compute_capability = "9.0"
sm_count = 132
max_sm_clock_hertz = 1.785e9
reference_clock_hertz = 1.5453e9
reference_clock_note = "835.5e12 / (132 x 4096) = 1.5453 GHz"
memory_bytes = 100_931_731_456
memory_bandwidth_bytes_per_second = 3.9e12
interconnect = "NVLink bridge 600 GB/s bidirectional"
interconnect_bidirectional_bytes_per_second = 600e9
tdp_watts = 400
source = "NVIDIA H100 datasheet, H100 NVL column"

[gpu.dense_peak_flops]
bf16 = 835.5e12
fp16 = 835.5e12
"""


def _write(tmp_path: Path, text: str, name: str = "site-gpus.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_override_updates_only_the_fields_it_gives(tmp_path: Path, builtin: Catalog) -> None:
    path = _write(tmp_path, '[[gpu]]\nkey = "h200-sxm"\nreference_clock_hertz = 1.98e9\n')
    catalog = Catalog.load(override=path)
    h200 = catalog.get("h200-sxm")
    assert h200.reference_clock_hertz == 1.98e9
    assert h200.peak_flops("bf16") == 989.4e12
    assert dataclasses.replace(h200, reference_clock_hertz=1.83e9) == builtin.get("h200-sxm")
    assert [sku.key for sku in catalog] == [sku.key for sku in builtin]
    assert catalog.get("h100-sxm") == builtin.get("h100-sxm")


def test_override_sets_a_measured_clock_ratio(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[gpu]]\nkey = "h100-sxm"\ntensor_clock_ratio = { hmma = 0.91 }\n'
                            'tensor_clock_evidence = "our probe run, 2026-12"\n')
    h100 = Catalog.load(override=path).get("h100-sxm")
    assert h100.ofu_reference_clock() == (pytest.approx(1.83e9 / 0.91), "measured")
    assert h100.ofu_reference_clock("dfma") == (1.98e9, "datasheet")


def test_override_replaces_a_price_list(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[[gpu]]\nkey = "t4"\n\n[[gpu.price]]\nusd_per_hour = 0.35\nprovider = "Example Co"\n'
        'source = "internal rate card"\ndate = "2026-11-01"\n',
    )
    assert Catalog.load(override=path).get("t4").prices == (
        Price(0.35, "Example Co", "internal rate card", "2026-11-01"),
    )


def test_override_adds_a_new_sku(tmp_path: Path, builtin: Catalog) -> None:
    catalog = Catalog.load(override=_write(tmp_path, NEW_SKU))
    assert len(catalog) == len(builtin) + 1
    sku = catalog.lookup("NVIDIA H100 NVL")
    assert sku is not None and sku.key == "h100-nvl" and list(catalog)[-1] is sku
    assert sku.peak_flops("bf16") == 835.5e12 and sku.peak_flops("fp8") is None
    assert sku.prices == () and sku.interconnect_bytes_per_second == 600e9
    assert Catalog.load().lookup("NVIDIA H100 NVL") is None  # the built-in is untouched


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[gpu]]\nkey = "t4\n')
    with pytest.raises(UsageError, match="not valid TOML") as caught:
        Catalog.load(override=path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_new_sku_missing_a_required_field(tmp_path: Path) -> None:
    path = _write(tmp_path, NEW_SKU.replace("sm_count = 132\n", ""))
    with pytest.raises(UsageError, match="'h100-nvl'.*missing required field 'sm_count'") as caught:
        Catalog.load(override=path)
    assert str(caught.value).startswith(f"GPU catalog override {path}: ")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('key = "t4"\nsm_count = "40"', "field 'sm_count' must be an integer, got str"),
        ('key = "t4"\nsm_count = true', "field 'sm_count' must be an integer, got bool"),
        ('key = "t4"\nreference_clock_hz = 1.5e9', "unknown field 'reference_clock_hz'"),
        ('key = "t4"\nreference_clock_hertz = 2.0e9', "exceeds max_sm_clock_hertz"),
        ('key = "t4"\nmax_sm_clock_hertz = -1', "max_sm_clock_hertz must be a positive"),
        ('key = "t4"\ndense_peak_flops = { fp6 = 1e12 }', "unknown precision 'fp6'"),
        ('key = "t4"\ndense_peak_flops = { fp16 = 0 }', "dense_peak_flops.fp16 must be a positive"),
        ('key = "t4"\nnvml_names = ["NVIDIA L4"]', "claimed by both"),
        ('key = "T4"', "lower-case"),
        ('name = "no key"', "missing required field 'key'"),
        (
            'key = "t4"\n[[gpu.price]]\nusd_per_hour = 1.0\nprovider = "x"\nsource = "y"',
            "missing required field 'date'",
        ),
        (
            'key = "t4"\n[[gpu.price]]\nusd_per_hour = 1.0\nprovider = "x"\nsource = "y"\ndate = "soon"',
            "ISO 8601",
        ),
        ('key = "t4"\n[[gpu]]\nkey = "t4"', "appears twice"),
        ('key = "h200-sxm"\nmeasured_ofu_clock_hertz = 1.98e9', "'measured_ofu_clock_hertz' is retired: .*tensor_clock_ratio"),
        ('key = "h200-sxm"\ntensor_clock_ratio = { xmma = 0.9 }', "tensor_clock_ratio has unknown pipe 'xmma'"),
        ('key = "h200-sxm"\ntensor_clock_ratio = { hmma = "0.9" }', "'tensor_clock_ratio' must be a table of pipe = number"),
        ('key = "t4"\ntensor_clock_ratio = { hmma = 0.9 }', "come together"),
        ('key = "t4"\npeak_clock_hertz = { fp6 = 1e9 }', "peak_clock_hertz has unknown precision 'fp6'"),
    ],
)
def test_bad_override_is_a_usage_error_naming_file_and_field(tmp_path: Path, body: str, message: str) -> None:
    path = _write(tmp_path, f"[[gpu]]\n{body}\n")
    with pytest.raises(UsageError, match=message) as caught:
        Catalog.load(override=path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_unknown_top_level_key_and_schema_version(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown top-level key 'gpus'"):
        Catalog.load(override=_write(tmp_path, '[[gpus]]\nkey = "t4"\n'))
    with pytest.raises(UsageError, match="schema_version 2"):
        Catalog.load(override=_write(tmp_path, "schema_version = 2\n"))
    assert len(Catalog.load(override=_write(tmp_path, "schema_version = 1\n"))) == 16


def test_missing_override_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="file not found"):
        Catalog.load(override=tmp_path / "absent.toml")


def test_environment_variable_names_the_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, '[[gpu]]\nkey = "l4"\nreference_clock_hertz = 2.0e9\n')
    monkeypatch.setenv(ENV_VAR, str(path))
    assert Catalog.load().get("l4").reference_clock_hertz == 2.0e9
    # An explicit override wins over the environment.
    explicit = _write(tmp_path, '[[gpu]]\nkey = "l4"\nreference_clock_hertz = 1.9e9\n', name="explicit.toml")
    assert Catalog.load(override=explicit).get("l4").reference_clock_hertz == 1.9e9


def test_environment_variable_pointing_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "gone.toml"))
    with pytest.raises(UsageError, match=f"gone.toml \\(from {ENV_VAR}\\): file not found"):
        Catalog.load()
    monkeypatch.setenv(ENV_VAR, "  ")
    assert len(Catalog.load()) == 16


def test_bad_builtin_file_is_a_bug_not_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    document = {"schema_version": 1, "gpu": [{"key": "x", "name": "incomplete"}]}
    monkeypatch.setattr(catalog_module, "_builtin_document", lambda: document)
    with pytest.raises(RuntimeError, match="built-in GPU catalog"):
        Catalog.load()


def test_the_override_example_in_the_docs_loads(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "catalog.md"
    example = docs.read_text(encoding="utf-8").split("```toml\n", 1)[1].split("```", 1)[0]
    catalog = Catalog.load(override=_write(tmp_path, example))
    assert catalog.get("h200-sxm").reference_clock_hertz == 1.98e9
    assert [p.usd_per_hour for p in catalog.get("l40s").prices] == [0.85]
    assert catalog.lookup("NVIDIA H100 NVL", None) is catalog.get("h100-nvl")
