"""The plan executor on a real GPU (``runtime/executor.py``), its pair two green-context partitions
of the one GPU: the tiny Llama decode step captured once per device and slot, a plan that splits
its launches between the devices built and run once, and every slot's outputs bit for bit those
of its own capture's graph replay, as the correctness gate of ``kernelfleet bench disagg`` asks."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

PAIR = {"A": 64, "B": 32}  # SMs of each device's partition


def test_split_plan_reproduces_each_replica_bit_for_bit():
    import torch

    from kernelfleet.profile.devices import DeviceProfile, ProfileSpec
    from kernelfleet.runtime.executor import Slot, build, release, run
    from kernelfleet.runtime.replicas import capture_replicas, restore_all
    from kernelfleet.workloads.steps import reference

    # Two slots, each with a replica on A and on B (seeds 0 and 1: different weights per slot); slot 0
    # runs its first half on A and comes home to A, slot 1 the mirror image, home B.
    slots, restores = [], []
    for seed in range(2):
        replicas, restore = capture_replicas(lambda where, s: reference("llama-decode", device=where, seed=s),
                                             dict.fromkeys(PAIR, 0), seed)
        slots.append(replicas)
        restores += restore
    restore_all(restores)
    references = []
    for replicas in slots:  # each capture's own graph replay, whole GPU, from the captured state
        for replica in replicas.values():
            replica.captured.replay()
        torch.cuda.synchronize()
        references.append({d: [t.clone() for t in r.captured.output_tensors()] for d, r in replicas.items()})
    n = len(slots[0]["A"].program.launches)
    halves = ["A"] * (n // 2) + ["B"] * (n - n // 2)
    plan = [Slot(slots[0], halves, "A"), Slot(slots[1], [{"A": "B", "B": "A"}[d] for d in halves], "B")]

    profiles = {d: DeviceProfile(ProfileSpec(d, sms)) for d, sms in PAIR.items()}
    for d, profile in profiles.items():  # kept alive (and entered) while anything runs in them
        profile.__enter__()
        assert profile.sms == PAIR[d]
        for replicas in slots:
            replicas[d].context = profile.context
    stream = torch.cuda.Stream()  # the executor launches on a stream of its own
    built = build(plan, resident_state=True)
    try:
        restore_all(restores)
        for slot in plan:
            for t in slot.replicas[slot.home].captured.output_tensors():
                t.fill_(0)  # only a run that writes the outputs can match
        run(built, stream.cuda_stream)
        stream.synchronize()
        differ = {k: sum(int((a != b).sum()) for a, b in
                         zip(references[k][slot.home], slot.replicas[slot.home].captured.output_tensors()))
                  for k, slot in enumerate(plan)}
        print(f"{n} launches a slot, {built.slots} slots, {built.nodes} nodes, {len(built.copies)} copies "
              f"({built.copy_bytes / 1e6:.3f} MB, {built.method}); elements differing per slot: {differ}")
        assert len(built.copies) > 0
        assert differ == {0: 0, 1: 0}
    finally:
        release(built)
        for profile in profiles.values():
            profile.__exit__(None, None, None)
