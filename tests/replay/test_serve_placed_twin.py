"""The placed backend's control flow on the CPU (serve/placed.py): the generation loop decoding
through one plan graph per batch bucket and policy, built by the executor through the null driver
(kernels/cuda/null.py) from the captures an H200 made of a transformers Llama decode step
(tests/data/h200-kernel-pair/hf-llama-decode, both devices' replicas the same capture); the logits
come from the CPU twin (the home device's eager bucket forward of a real tiny Llama), so greedy
tokens must equal transformers' own ``generate``, prompts prefilled one at a time or several in one
forward. Checked: a graph per (bucket, policy); one launch per decode step, of the graph of the
policy the monitor chose before it; the monitor's switch between steps, counted in /metrics;
prefill (one prompt, or several at once) copying the rows of each cache the plans keep away from
home, and only those."""

import re
from pathlib import Path

import pytest
import torch
from recorded import PROMPTS, reference, tiny_causal_lm

from kernelfleet.errors import UsageError
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.cuda.capture import Captured
from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan.model import Device, Plan
from kernelfleet.runtime import plans as runtime_plans
from kernelfleet.runtime.executor import Replica, Slot, build, run
from kernelfleet.runtime.monitor import LATENCY, THROUGHPUT, Monitor
from kernelfleet.serve.backend import EagerBackend
from kernelfleet.serve.engine import Engine
from kernelfleet.serve.graphs import bucket_for, buckets
from kernelfleet.serve.metrics import ServeMetrics
from kernelfleet.serve.placed import PlacedBackend, PlanGraph
from kernelfleet.serve.parts import build_reading, joined
from kernelfleet.serve.placed_build import carried_plan, holds_all
from kernelfleet.serve.placed_plans import POLICIES, Placement, kv_placement, read, weights_read
from kernelfleet.serve.placed_step import WEIGHTS_PREFIX, decode_step
from kernelfleet.serve.sampling import Sampling

pytestmark = pytest.mark.replay

CAPTURE = Path(__file__).parents[1] / "data" / "h200-kernel-pair" / "hf-llama-decode" / "disagg.a.capture.json.gz"
SLOTS, CONTEXT = 4, 64
LAYER_1 = "model.model.layers.1."  # the recorded step's names of layer 1's weights


class Clock:
    """The backend's clock: a millisecond a read, plus what a test adds between steps."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        self.seconds += 0.001
        return self.seconds


def replicas(bucket: int) -> dict[str, Replica]:
    raw = RawCapture.load(CAPTURE)
    program = assemble(raw)
    return {d: Replica(Captured(raw, None, None, [(d, bucket, i) for i in range(len(raw.nodes))], (), None,
                                context=f"{d}-{bucket}"), program) for d in ("a", "b")}


def plans(tmp_path: Path, program, prefix: str = "cache_1") -> Path:
    """Both policies' plans of every bucket: layer 1's cache and attention on b (its rows must be
    copied there after prefill), layer 0's on home a; the throughput plan moves some of layer 0's MLP
    too. ``prefix``: b's span runs from the first to the last launch touching a buffer so named (by
    default layer 1's cache; ``model.model.layers.1.``: every launch reading a layer-1 weight too)."""
    touching = {b.id: b.name for b in program.buffers if b.name and b.name.startswith(prefix)}
    layer1 = [launch.index for launch in program.launches if any(a.buffer in touching for a in launch.accesses)]
    latency = ["b" if layer1[0] <= k <= layer1[-1] else "a" for k in range(len(program.launches))]
    throughput = ["b" if 60 <= k < 80 else d for k, d in enumerate(latency)]
    for bucket in buckets(SLOTS):
        folder = tmp_path / f"batch-{bucket}"
        folder.mkdir(parents=True)
        for policy, assignment in ((LATENCY, latency), (THROUGHPUT, throughput)):
            (folder / f"{POLICIES[policy]}.json").write_text(
                Plan(POLICIES[policy], assignment, 0.0, details={"home": "a"}).to_json())
    return tmp_path


@pytest.fixture
def placed(tmp_path):
    """The backend as placed_build.placed_backend assembles it, the null driver building the graphs."""
    model = tiny_causal_lm()
    return assembled(tmp_path, {d: EagerBackend(model, SLOTS, CONTEXT, d) for d in ("a", "b")}) + (model,)


@pytest.fixture
def shares(tmp_path):
    """As ``placed``, each device holding only the weights its launches read in some plan (the plans'
    program says which: ``placed_plans.weights_read``; ``parts.build_reading`` from the model's
    safetensors), home's prefill and twin logits on the shares joined (``parts.joined``)."""
    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "model")
    program = assemble(RawCapture.load(CAPTURE))
    found = read(plans(tmp_path / "read", program, LAYER_1), buckets(SLOTS))  # as assembled() writes them again
    names = {d: weights_read(found, dict.fromkeys(found, program), d, WEIGHTS_PREFIX) for d in ("a", "b")}
    held = {d: build_reading(f"hf:{tmp_path / 'model'}", names[d], "cpu", 0, torch.float32)[0] for d in names}
    devices = {d: EagerBackend(held[d], SLOTS, CONTEXT, d) for d in names}
    whole = EagerBackend(joined([(held[d], names[d]) for d in names]), SLOTS, CONTEXT, "a", cache=devices["a"].cache)
    return assembled(tmp_path / "plans", devices, whole, LAYER_1) + (model, names)


def assembled(tmp_path: Path, devices: dict[str, EagerBackend], whole: EagerBackend | None = None,
              prefix: str = "cache_1", contexts: tuple[int, ...] = (CONTEXT,)) -> tuple:
    """The placed backend over ``devices`` (``whole``: where prefill runs, as PlacedBackend takes it;
    ``prefix``: b's span, as :func:`plans` takes it), its null driver, metrics and clock; a graph per
    context bucket of ``contexts`` (the recorded capture stands for each)."""
    captured = {size: replicas(size) for size in buckets(SLOTS)}
    problems = {size: runtime_plans.problem(r["a"].program, [Device("a"), Device("b")]) for size, r in captured.items()}
    found = read(plans(tmp_path, problems[1].program, prefix), buckets(SLOTS))
    placement = kv_placement(found, problems)
    null = NullDriver()
    # every device makes each bucket's step, as each captures it on a GPU (which allocates its cache)
    steps = {size: {d: decode_step(backend, size) for d, backend in devices.items()} for size in captured}
    inputs = {size: steps[size]["a"].args[0] for size in captured}  # the home capture's input tensor
    graphs = {(size, length): {policy: PlanGraph(build([Slot(captured[size], plan.assignment, "a")],
                                                       resident_state=True, driver=null),
                                                 inputs[size], None, twin=True, length=length)
                               for policy, (_, plan) in found[size].items()}
              for size in captured for length in contexts}
    metrics = ServeMetrics(len(PROMPTS))
    clock = Clock()
    monitor = Monitor(window_seconds=5.0, beta=3.0, patience=1)
    backend = PlacedBackend(devices, placement, graphs, monitor, lambda built: run(built, 1), metrics.registry, clock,
                            whole=whole)
    return backend, null, metrics, clock


def greedy(engine: Engine, max_tokens: int) -> list[list[int]]:
    """Every prompt's greedy tokens, the engine run until all are answered."""
    got: list[list[int]] = [[] for _ in PROMPTS]
    for prompt, tokens in zip(PROMPTS, got):
        engine.submit(prompt, max_tokens, frozenset(), Sampling(temperature=0.0),
                      lambda t, f, tokens=tokens: tokens.append(t))
    while engine.step():
        pass
    return got


def test_a_graph_per_bucket_and_policy_each_placing_every_launch(placed):
    backend, null, *_ = placed
    assert backend.sizes == [1, 2, 4] and backend.placement.home == "a"
    assert backend.away == {"b": [(1, "keys"), (1, "values")]}
    executables = {graph.built.executable for policies in backend.graphs.values() for graph in policies.values()}
    assert len(executables) == 6 and executables <= null.live
    launches = [x for x in null.added if x.kind == "launch"]
    n = 124  # the recorded step's launches
    assert len(launches) == 6 * n
    assert {x.ctx for x in launches} == {f"{d}-{size}" for d in ("a", "b") for size in (1, 2, 4)}


def test_each_step_runs_the_graph_of_the_shortest_context_bucket_holding_its_positions(tmp_path):
    """With context buckets (the server's --shortest-context), each decode launches the graph of its
    batch bucket and of the shortest context bucket that holds the batch's furthest position, and
    the tokens (the twin attending that bucket's positions) still equal transformers' own."""
    model = tiny_causal_lm()
    backend, null, metrics, _ = assembled(tmp_path, {d: EagerBackend(model, SLOTS, CONTEXT, d) for d in ("a", "b")},
                                          contexts=(8, 16, 32, CONTEXT))
    assert backend.lengths == {size: [8, 16, 32, CONTEXT] for size in (1, 2, 4)}
    assert "bucket 4 context 8 latency" in backend.gates()["not gated"]
    decode, chosen = backend.decode, []

    def watched(slots, token_ids, positions):
        launched = len(null.launched)
        logits = decode(slots, token_ids, positions)
        length = bucket_for(max(positions) + 1, [8, 16, 32, CONTEXT])
        graph = backend.graphs[bucket_for(len(slots), backend.sizes), length][backend.monitor.policy]
        assert null.launched[launched:] == [(graph.built.executable, 1)] and graph.length == length
        chosen.append(length)
        return logits

    backend.decode = watched
    assert greedy(Engine(backend, len(PROMPTS), metrics), 30) == [reference(model, p, 30, eos=False) for p in PROMPTS]
    assert set(chosen) == {16, 32, CONTEXT}  # every batch holds a prompt of 11 tokens or more


def test_a_plan_carried_to_a_shorter_contexts_capture_passes_the_servers_checks_or_says_which_fails(tmp_path):
    """placed_build.carried_plan, as the server carries each plan to a context bucket's capture (the
    recorded capture stands for both contexts): the plan comes back as itself, named for the bucket;
    one whose device would read a weight it does not hold, one that keeps a cache elsewhere than the
    plans as made, and one over its devices' memory are each one line naming the carried plan."""
    whole, short = replicas(1), replicas(1)
    program = whole["a"].program
    found = read(plans(tmp_path, program), buckets(SLOTS))
    problem = runtime_plans.problem(program, [Device("a"), Device("b")])
    placement = kv_placement(found, dict.fromkeys(found, problem))
    path, plan = found[1][THROUGHPUT]  # b runs layer 1's attention and some of layer 0's MLP
    every = dict.fromkeys(("a", "b"))
    where, moved = carried_plan(path, plan, whole, short, 16, problem, placement, every)
    assert where == f"{path}, carried to context 16" and moved.assignment == plan.assignment
    held = weights_read({1: {THROUGHPUT: found[1][THROUGHPUT]}}, {1: program}, "b", WEIGHTS_PREFIX)  # b's in it
    missing = min(held)
    with pytest.raises(UsageError, match=rf"carried to context 16: b would read {re.escape(missing)}, which it does "
                                         "not hold"):
        carried_plan(path, plan, whole, short, 16, problem, placement, {"a": None, "b": held - {missing}})
    with pytest.raises(UsageError, match="carried to context 16: it keeps the KV cache elsewhere"):
        carried_plan(path, plan, whole, short, 16, problem, Placement("a", dict.fromkeys(placement.kv, "a")), every)
    small = runtime_plans.problem(program, [Device("a", 1 << 20), Device("b", 1 << 20)])
    with pytest.raises(UsageError, match=r"carried to context 16: invalid throughput-milp plan: device a needs \d+ "
                                         "bytes, limit 1048576"):
        carried_plan(path, plan, whole, short, 16, small, placement, every)


def test_prefill_copies_only_the_caches_kept_away_from_home(placed):
    backend, *_ = placed
    backend.prefill(2, [5, 9, 100, 3, 8])
    row = backend.rows.row_of[2]
    home, away = backend.devices["a"].cache, backend.devices["b"].cache
    assert torch.equal(away.keys[1][row, :, :5], home.keys[1][row, :, :5])
    assert torch.equal(away.values[1][row, :, :5], home.values[1][row, :, :5])
    assert home.keys[1][row, :, :5].abs().sum() > 0
    # layer 0's cache stays at home: nothing copied (position 0 holds what allocating the cache wrote)
    assert away.keys[0][row, :, 1:5].abs().sum() == 0 < home.keys[0][row, :, 1:5].abs().sum()


def test_a_batched_prefill_copies_each_prompts_rows_of_the_caches_kept_away(placed):
    backend, *_ = placed
    prompts = [[5, 9, 100, 3, 8], [7, 1], [44, 45, 46]]
    logits = backend.prefill_many([0, 2, 3], prompts)
    home, away = backend.devices["a"].cache, backend.devices["b"].cache
    assert logits.shape[0] == 3
    for slot, prompt in zip([0, 2, 3], prompts):
        row, n = backend.rows.row_of[slot], len(prompt)
        assert torch.equal(away.keys[1][row, :, :n], home.keys[1][row, :, :n])
        assert torch.equal(away.values[1][row, :, :n], home.values[1][row, :, :n])
        assert home.keys[1][row, :, :n].abs().sum() > 0


@pytest.mark.parametrize("prefill_batch", [1, 4])
def test_greedy_tokens_equal_generate_and_the_monitor_switches_only_between_steps(placed, prefill_batch):
    backend, null, metrics, clock, model = placed
    engine = Engine(backend, len(PROMPTS), metrics, prefill_batch=prefill_batch)
    lengths = [6, 9, 4, 7, 5, 8]
    got: list[list[int]] = [[] for _ in PROMPTS]
    for prompt, n, tokens in zip(PROMPTS, lengths, got):
        engine.submit(prompt, n, frozenset(), Sampling(temperature=0.0), lambda t, f, tokens=tokens: tokens.append(t))
    used, steps = [], 0
    while True:
        running = len(engine.scheduler.running) + min(len(engine.scheduler.waiting),
                                                      SLOTS - len(engine.scheduler.running))
        launched = len(null.launched)
        if not engine.step():
            break
        steps += 1
        if len(null.launched) > launched:  # a decode ran: one launch, of the policy chosen before it
            assert len(null.launched) == launched + 1
            executable = null.launched[-1][0]
            policy = backend.monitor.policy
            assert executable == backend.graphs[bucket_for(running, backend.sizes), CONTEXT][policy].built.executable
            used.append(policy)
        if steps >= 3:
            clock.seconds += 3.0  # the loop away from the running requests' steps: load, by Tessera's ratio
    assert got == [reference(model, p, n, eos=False) for p, n in zip(PROMPTS, lengths)]
    assert used[0] == LATENCY and THROUGHPUT in used
    assert used == sorted(used, key=[LATENCY, THROUGHPUT].index)  # one switch, between two steps
    exposition = metrics.exposition().decode()
    assert "kernelfleet_serve_plan_switches_total 1.0" in exposition
    assert f'kernelfleet_serve_plan_steps_total{{policy="latency"}} {float(used.count(LATENCY))}' in exposition
    assert f'kernelfleet_serve_plan_steps_total{{policy="throughput"}} {float(used.count(THROUGHPUT))}' in exposition


@pytest.mark.parametrize("waited", [0.0, 30.0])
def test_a_requests_wait_in_the_queue_counts_in_its_latency_and_switches_the_plan(placed, waited):
    """Tessera's latency runs from arrival: requests that waited for a slot are load even when
    nothing runs between the steps (the backend's clock advances a millisecond a read, so without a
    wait each token's latency is two or three steps' reads and the ratio stays below beta)."""
    backend, null, metrics, clock, model = placed
    backend.monitor = Monitor(window_seconds=0.01, beta=10.0, patience=1)  # a decision every few steps
    arrivals = Clock()
    engine = Engine(backend, len(PROMPTS), metrics, clock=arrivals)
    got: list[list[int]] = [[] for _ in PROMPTS[:SLOTS]]
    for prompt, tokens in zip(PROMPTS, got):
        engine.submit(prompt, 8, frozenset(), Sampling(temperature=0.0), lambda t, f, tokens=tokens: tokens.append(t))
    arrivals.seconds += waited  # the requests wait this long before the loop admits them
    while engine.step():
        pass
    assert got == [reference(model, p, 8, eos=False) for p in PROMPTS[:SLOTS]]
    assert backend.monitor.switches == (1 if waited else 0)
    assert backend.monitor.policy == (THROUGHPUT if waited else LATENCY)


def test_devices_holding_only_what_they_read_serve_generates_tokens_through_the_shares_joined(shares):
    """Neither device holds the whole model (home a reads none of layer 1's weights, b only those and
    some of layer 0's MLP and its norm); prefill and the twin's logits run on the two shares joined, no
    weight copied, and greedy tokens still equal transformers' own ``generate``."""
    backend, _, metrics, _, model, names = shares
    every = {name for name, _ in model.named_parameters()}
    assert names["a"] < every and names["b"] < every and names["a"] | names["b"] == every
    assert not holds_all(backend.home.model, names["a"]) and backend.whole is not backend.home
    assert not any(name.startswith("model.layers.1.") for name in names["a"])
    assert {name for name in names["b"] if not name.startswith("model.layers.1.")} <= {
        "model.layers.0.post_attention_layernorm.weight",
        *(f"model.layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj"))}
    own = {d: dict(backend.devices[d].model.named_parameters()) for d in names}
    for name, tensor in backend.whole.model.named_parameters():  # each the holder's own tensor, home's first
        assert tensor is own["a" if name in names["a"] else "b"][name]
    assert greedy(Engine(backend, len(PROMPTS), metrics), 6) == [reference(model, p, 6, eos=False) for p in PROMPTS]
    # the home model alone (its unread weights zero) does not give them: the join is what makes them right
    alone = backend.home.forward(torch.tensor([[5]]), torch.tensor([0]), torch.tensor([[0]]), 1)
    assert not torch.allclose(alone, backend.whole.forward(torch.tensor([[5]]), torch.tensor([0]), torch.tensor([[0]]), 1))
