"""Sizing a served model against a device's cap: the footprint read from the config matches what
the model and its cache really allocate; slots are sized from what is left; a plan past the cap
is one line saying what it needs and what the cap allows; so is a device's share under ``serve
--plans`` past its GPU's free memory."""

import pytest
import torch
from recorded import PROMPTS, tiny_causal_lm

from kernelfleet.errors import UsageError
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.memory import (
    FIXED_WORKSPACE_BYTES,
    GIB,
    MAX_SIZED_SLOTS,
    DeviceCap,
    Footprint,
    checked_share,
    parse_device,
    planned_slots,
)
from kernelfleet.serve.model import footprint

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kind", ["llama", "qwen2-moe"])
def test_the_footprint_from_the_config_is_what_the_model_and_its_cache_allocate(tmp_path, kind):
    model = tiny_causal_lm(kind)
    model.save_pretrained(tmp_path)
    sized = footprint(f"hf:{tmp_path}", torch.float32, 40)
    assert sized.weights_bytes == sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    backend = EagerBackend(model, slots=3, context_tokens=40)
    backend.prefill(0, PROMPTS[0])
    cache = backend.cache
    allocated = sum(t.numel() * t.element_size() for t in [*cache.keys.values(), *cache.values.values()])
    assert sized.kv_bytes_per_slot * 3 == allocated


def test_device_specs_parse_and_bad_ones_say_what_is_expected():
    assert parse_device("h200:40") == DeviceCap("h200", 40_000_000_000, 0)
    assert parse_device("big.one:80.5@1") == DeviceCap("big.one", 80_500_000_000, 1)
    for bad in ("h200", "h200:", "h200:0", "h200:40@x", ":40", "h 200:40"):
        with pytest.raises(UsageError, match="--device takes NAME:MEMORY_GB"):
            parse_device(bad)


def test_slots_are_sized_from_what_the_weights_leave_under_the_cap():
    model = Footprint(weights_bytes=10 * GIB, kv_bytes_per_slot=GIB // 2, workspace_bytes_per_slot=GIB // 4)
    cap = 10 * GIB + FIXED_WORKSPACE_BYTES + 4 * (3 * GIB // 4)  # 4 slots, and not 5
    assert model.slots_under(cap) == 4 and model.needs_bytes(4) == cap
    assert planned_slots(model, cap, None, "here") == 4
    assert planned_slots(model, cap, 2, "here") == 2
    assert planned_slots(model, 10**15, None, "here") == MAX_SIZED_SLOTS
    with pytest.raises(UsageError) as refused:
        planned_slots(model, cap, 5, "under the cap of a (cuda:0, 14.00 GiB)")
    line = str(refused.value)
    assert "\n" not in line
    assert ("does not fit under the cap of a (cuda:0, 14.00 GiB): 5 slots need 14.75 GiB (weights 10.00 GiB, KV cache "
            "2.50 GiB, workspace 2.25 GiB) and the cap allows 14.00 GiB") in line


def test_weights_past_the_cap_leave_not_even_one_slot():
    model = Footprint(weights_bytes=20 * GIB, kv_bytes_per_slot=GIB, workspace_bytes_per_slot=0)
    assert model.slots_under(16 * GIB) == 0
    with pytest.raises(UsageError, match=r"1 slot need 22.00 GiB \(weights 20.00 GiB"):
        planned_slots(model, 16 * GIB, None, "here")


def test_a_plans_share_past_the_free_memory_is_one_line_saying_what_it_needs():
    checked_share("b", 3 * GIB, GIB, GIB, 5 * GIB, "under the free memory of GPU 0")  # exactly fits
    with pytest.raises(UsageError) as refused:
        checked_share("b", 3 * GIB, GIB, GIB, 5 * GIB - 1, "under the free memory of GPU 0")
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("device b does not fit under the free memory of GPU 0: its share of the plans needs "
                           "5.00 GiB (weights 3.00 GiB, KV cache 1.00 GiB, workspace 1.00 GiB) and 5.00 GiB are free")


def test_a_devices_share_under_plans_counts_the_caches_it_keeps_and_says_how_to_shrink_it():
    """``placed_build.share``: a device holding the whole model (names None) with every cache, or
    only what its plans read with the caches they keep there (one scratch for the rest), checked
    against its limit before it loads; each refusal one line with what would make it fit."""
    from kernelfleet.serve.placed_build import share

    footprint = Footprint(weights_bytes=8 * GIB, kv_bytes_per_slot=GIB, workspace_bytes_per_slot=0)
    sizes = footprint, lambda names: len(names) * GIB  # a GiB a weight read
    share("a", sizes, None, None, 0, 2, 8 * GIB + 2 * GIB + GIB, "under its cap")  # the model, 2 slots, workspace
    with pytest.raises(UsageError, match=r"KV cache 2.00 GiB.*served by --strategy pipeline"):
        share("a", sizes, None, None, 0, 2, 11 * GIB - 1, "under its cap")
    # 3 weights, 1 of 4 caches kept (and one scratch for the other 3): 2 slots' caches are 2 GiB, so 1 GiB here
    share("b", sizes, {"x", "y", "z"}, {(0, "keys")}, 4, 2, 3 * GIB + GIB + GIB, "under its cap")
    with pytest.raises(UsageError, match=r"weights 3.00 GiB, KV cache 1.00 GiB.*make them agree with kernelfleet plan --weights-like"):
        share("b", sizes, {"x", "y", "z"}, {(0, "keys")}, 4, 2, 5 * GIB - 1, "under its cap")
