"""The executor's control flow on the CPU: runtime/executor.py builds its graph through the null
driver (kernels/cuda/null.py), which records it, over the two captures two H200s made of the 8B decode step
(tests/data/h200x2-disagg). Checked: every launch becomes a copy of its own replica's node, every
copy moves bytes between the right captures' buffers, and the graph's dependencies are exactly
plan/slots.py's, across slots too."""

from pathlib import Path

import pytest
from recorded import twin_replicas

from kernelfleet.errors import UsageError
from kernelfleet.kernels.cuda.doorway import DriverError
from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.plan.schedule import schedule
from kernelfleet.plan.slots import pipeline
from kernelfleet.runtime.distributed import RankSlot, build_rank, release_rank
from kernelfleet.runtime.executor import Replica, Slot, build, release, run
from kernelfleet.runtime.link import Throttle

pytestmark = pytest.mark.replay

RUNS = Path(__file__).parents[1] / "data" / "h200x2-disagg"
DEVICES = ("compute", "bandwidth")


def replicas(slot: int = 0) -> dict[str, Replica]:
    return twin_replicas(RUNS, "llama8b-decode", DEVICES, slot)


def inside(program, address: int, length: int) -> bool:
    return any(b.address <= address and address + length <= b.address + b.size_bytes for b in program.buffers)


def test_a_plan_becomes_its_replicas_nodes_and_copies_between_their_buffers():
    null = NullDriver()
    mine = replicas()
    n = len(mine["bandwidth"].program.launches)
    assignment = ["bandwidth"] * (n // 2) + ["compute"] * (n - n // 2)
    built = build([Slot(mine, assignment, "bandwidth")], resident_state=True, driver=null)
    launches = [x for x in null.added if x.kind == "launch"]
    assert len(launches) == n and built.nodes == n + len(built.copies) and built.method == "memcpy"
    for k, x in enumerate(launches):
        assert x.ctx == f"{assignment[k]}-0" and x.what[0] == assignment[k]  # its own device's captured node
    copies = [x for x in null.added if x.kind == "copy"]
    assert len(copies) == len(built.copies) > 0
    for x, t in zip(copies, built.copies):
        dst, src, length = x.what
        assert inside(mine[t.dst].program, dst, length) and inside(mine[t.src].program, src, length)


@pytest.mark.parametrize("mode", ["sequential", "free"])
def test_the_graph_has_exactly_the_dependencies_slots_lays_out(mode):
    null = NullDriver()
    slots = [replicas(k) for k in range(2)]
    n = len(slots[0]["bandwidth"].program.launches)
    assignment = ["bandwidth" if i % 7 else "compute" for i in range(n)]
    build([Slot(r, assignment, "bandwidth") for r in slots], resident_state=True, slot_mode=mode, driver=null)
    orders = [schedule(r["bandwidth"].program, assignment, "bandwidth", resident_state=True) for r in slots]
    combined = pipeline(orders, mode)
    assert len(null.added) == len(combined)
    assert [x.after for x in null.added] == [x.deps for x in combined]


def paced_tail(null: NullDriver):
    """The plan with the last three launches on the compute device, over a 25 Gbit/s link."""
    mine = replicas()
    n = len(mine["bandwidth"].program.launches)
    return build([Slot(mine, ["bandwidth"] * (n - 3) + ["compute"] * 3, "bandwidth")],
                 throttle=Throttle(25e9 / 8), resident_state=True, driver=null)


def test_a_paced_link_adds_a_wait_beside_each_copy():
    null = NullDriver()
    built = paced_tail(null)
    waits = [x for x in null.added if x.kind == "kernel"]
    copies = [x for x in null.added if x.kind == "copy"]
    assert [w.what[0] for w in waits] == ["kf_wait"] * len(built.copies)
    assert [w.after for w in waits] == [c.after for c in copies]  # each wait starts with its copy


def test_a_racy_plan_graph_is_refused_before_the_driver_sees_it(monkeypatch):
    from dataclasses import replace

    from kernelfleet.runtime import executor

    null = NullDriver()
    real = executor.schedule

    def broken(*args, **kwargs):  # the first copy forgets what it waits for
        order = real(*args, **kwargs)
        k = next(i for i, n in enumerate(order) if n.copy is not None and n.deps)
        return order[:k] + [replace(order[k], deps=())] + order[k + 1:]

    monkeypatch.setattr(executor, "schedule", broken)  # plants the bug; the driver is the null one
    mine = replicas()
    n = len(mine["bandwidth"].program.launches)
    with pytest.raises(UsageError, match="races in the plan graph"):
        build([Slot(mine, ["bandwidth"] * (n // 2) + ["compute"] * (n - n // 2), "bandwidth")], resident_state=True,
              driver=null)
    assert null.added == [] and null.live == set()


def test_a_built_plan_runs_on_its_driver_and_releases_every_handle():
    null = NullDriver()
    built = paced_tail(null)
    assert null.live == {built.graph, built.executable, *(k.module for k in built.kernels)}
    run(built, 7)
    release(built)
    assert null.launched == [(built.executable, 7)] and null.live == set()


def test_a_refused_memcpy_node_falls_back_to_the_captured_copy():
    # the H200 once refused memcpy nodes inside the executor (runtime/link.py): the next method is taken
    null = NullDriver(refuse=("add_copy",))
    mine = replicas()
    n = len(mine["bandwidth"].program.launches)
    built = build([Slot(mine, ["bandwidth"] * (n // 2) + ["compute"] * (n - n // 2), "bandwidth")],
                  resident_state=True, driver=null)
    assert built.method == "captured"
    assert len([x for x in null.added if x.kind == "captured_copy"]) == len(built.copies) > 0


def test_earlier_slots_launch_at_a_higher_priority():
    null = NullDriver(priorities=(0, -5))
    slots = [replicas(k) for k in range(2)]
    n = len(slots[0]["bandwidth"].program.launches)
    assignment = ["bandwidth" if i % 7 else "compute" for i in range(n)]
    built = build([Slot(r, assignment, "bandwidth") for r in slots], resident_state=True, priorities=True, driver=null)
    by_slot = {x.slot: set() for x in built.combined}
    for node, x in enumerate(built.combined):
        if x.node.launch is not None:
            by_slot[x.slot].add(null.priorities[node])
    assert by_slot == {0: {-1}, 1: {0}}  # a larger number is a lower priority


def test_each_rank_builds_a_graph_per_segment_of_its_own_replicas_nodes():
    mine = replicas()
    programs = {d: r.program for d, r in mine.items()}
    n = len(programs["bandwidth"].launches)
    assignment = ["bandwidth"] * (n // 2) + ["compute"] * (n - n // 2)
    for device in DEVICES:
        null = NullDriver()
        built = build_rank([RankSlot(programs, mine[device], assignment, "bandwidth")], device,
                           lambda address, length: (address, length), Throttle(25e9 / 8), driver=null)
        segments = [i for i, op in enumerate(built.ops) if op.kind == "segment"]
        assert sorted(built.graphs) == segments and len(built.buffers) == len(built.ops) - len(segments) > 0
        launches = [x for x in null.added if x.kind == "launch"]
        assert len(launches) == assignment.count(device)
        assert all(x.what[0] == device and x.ctx == f"{device}-0" for x in launches)  # its own replica only
        for address, length in built.buffers.values():
            assert inside(programs[device], address, length)
        release_rank(built)
        assert null.live == set()  # graphs and the receiver's kf_wait module


def test_the_executor_refuses_the_legacy_default_stream():
    # handle 0 is the stream of whichever context is current: a graph launched there was once timed
    # by events on another device (bench disagg read 0.02 ms for an 8B decode step)
    with pytest.raises(UsageError, match="stream of its own"):
        run(None, 0)


def test_a_ranks_graph_is_predicted_as_the_one_process_executors_is():
    """bench disagg-nccl predicts each row from the rank's plan graph with bench disagg's model
    (``bench.disagg.prediction``): the same figure the one-process executor's graph gets, for every
    slot mode, contention and measured link included."""
    from kernelfleet.bench.disagg import Strategy, prediction
    from kernelfleet.costs.links import LinkFit, MeasuredLink
    from kernelfleet.costs.table import CostTable
    from kernelfleet.plan.contention import Contention
    from kernelfleet.plan.slots import estimate, uniform_link

    mine = replicas()
    programs = {d: r.program for d, r in mine.items()}
    n = len(programs["bandwidth"].launches)
    assignment = ["bandwidth"] * (n // 2) + ["compute"] * (n - n // 2)
    fit = LinkFit(3e-6, 50e9, [0, 1], [3e-6, 3e-6])
    costs = CostTable([{d: 1e-5 for d in DEVICES}] * n, "twin", graph_seconds={d: 1e-5 * n for d in DEVICES},
                      graph_seconds_shared={d: 1.2e-5 * n for d in DEVICES},
                      graph_seconds_free={d: 0.6e-5 * n for d in DEVICES},
                      links=[MeasuredLink("compute", "bandwidth", fit, fit, 1e-6, 0.5e-6)])
    seconds, contention = estimate(costs, uniform_link(4.0, 25.0)), Contention.of(costs)
    for mode in ("sequential", "free"):
        strategy = Strategy("half", [assignment] * 2, ["bandwidth"] * 2, {"slot_mode": mode})
        rank = build_rank([RankSlot(programs, mine["compute"], assignment, "bandwidth")] * 2, "compute",
                          lambda address, length: (address, length), slot_mode=mode, driver=NullDriver())
        one = build([Slot(replicas(k), assignment, "bandwidth") for k in range(2)], resident_state=True,
                    slot_mode=mode, driver=NullDriver())
        ranked = prediction(rank.combined, strategy, seconds, contention)
        assert ranked == prediction(one.combined, strategy, seconds, contention) and ranked > 0
        assert prediction(rank.combined, strategy, None, contention) is None  # no cost table: no prediction


def test_a_kernel_the_driver_will_not_copy_is_named_with_its_device_and_launch():
    """On the H200 (2026-12-06) the driver refused to copy one cuDNN kernel into a plan graph; the
    error now says which launch, op and kernel, and on which device, in its one line."""
    mine = replicas()
    n = len(mine["bandwidth"].program.launches)
    with pytest.raises(DriverError) as refused:
        build([Slot(mine, ["compute"] * n, "bandwidth")], resident_state=True,
              driver=NullDriver(refuse=("add_copy_of",)))
    first = mine["compute"].program.launches[0]
    line = str(refused.value)
    assert line.startswith(f"device compute: launch 0 ({first.op or 'no ATen op'}, kernel {first.name[:120]}): "
                           "add_copy_of failed: CUDA_ERROR_INVALID_VALUE")
    assert "\n" not in line and refused.value.name == "CUDA_ERROR_INVALID_VALUE"
