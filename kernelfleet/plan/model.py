"""The placement problem and its answer, as plain data.

A :class:`Problem` bundles what the planners read: the kernel program, its RAW edges, the
devices (with optional memory limits), the links between them and a :class:`CostTable`
(seconds of each launch on each device). A :class:`Plan` is what they write: one device
name per launch, the objective it reaches and a lower bound; it round-trips through JSON
so the runtime (or a person) can read it without importing a solver.

Cost model (shared by the MILP and the validator, implemented separately in each):

* **Throughput** (steady state, many requests in flight, transfers overlapped with other
  requests' compute): the time per request is the busiest device's time, where a device's
  time is the compute of its launches plus the transfer seconds of every cut edge it sends
  or receives (``bytes / link bytes_per_second``; both ends are charged, as in Tessera's
  MILP, because a copy occupies both ends' copy engines and link ports).
* **Latency** (one request alone): list scheduling in capture order, see ``validate.py``.
* **Memory**: a device holds every buffer any of its launches touches, each buffer once per
  device (so a weight read by five launches on one device costs its size once; an activation
  written on one device and read on another is counted on both, the reader holding the
  received copy). Whole buffers count, not the accessed range, since the allocation is what
  must be resident. Tessera has no memory constraint (it replicates all weights).
* **Pins**: a pinned launch reaches memory through pointers the analysis cannot see, so it
  runs on the *home* device, the one the program was captured on (``Problem.home``, the
  first device unless named). A plan that runs the whole program on one device (a single-
  device baseline, each replica of request distribution) re-captures it there, so its home
  is that device; such plans carry ``details.home``.
* **Together**: the kernels of an op call that pass data through the call's own workspace
  (``Problem.groups``, ``graph.deps.together``) run on one device; every planner keeps them so,
  and the validator refuses a plan that splits them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property

from kernelfleet.costs.table import CostTable
from kernelfleet.documents import Document, document, model, one_of
from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import Edge, dependencies, together
from kernelfleet.kernels.ir import Launch, Program
from kernelfleet.plan.edges import EdgeFit

PLAN_FORMAT = 1
# How the executor lays several slots (requests in flight) of a plan over the devices' streams
# (``plan/slots.py``); a plan says which its policy predicted fastest. Plans written before the
# field run as they did: sequential.
SLOT_MODES = ("sequential", "free", "scheduled")
# beside a folder of plans (``kernelfleet plan --policy all --out``): the program they place (``kernelfleet serve
# --plans`` reads which weights each device's launches read from it before any weight loads)
PLANNED_PROGRAM = "program.json"


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU (or a GPU profile, e.g. a green-context partition). ``memory_bytes=None``: no limit."""

    name: str
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Link:
    """A bidirectional link; a transfer of n bytes over it takes ``seconds_per_copy +
    n / bytes_per_second`` (the fixed part: what one copy costs the executor's graph beyond its
    bytes, its node and the waits around it)."""

    a: str
    b: str
    bytes_per_second: float
    seconds_per_copy: float = 0.0


@model("solved repeats")
class SolvedRepeats:
    """The repeated layers the MILP solved once: ``count`` periods of ``period`` launches from
    ``start``, in ``groups`` classes."""

    start: int
    period: int
    count: int
    groups: int


@model("group placement")
class GroupPlacement:
    """One group of a group-replicas plan: its placement and its home device."""

    assignment: list[str]
    home: str


@model("in-flight candidate")
class Candidate:
    """One plan the in-flight policy considered, and its figures (None: not solved or not placed)."""

    plan: str
    per_request_seconds: float | None = None
    throughput_seconds: float | None = None
    switches: int | None = None
    max_switches: int | None = None
    solve_seconds: float | None = None
    status: str | None = None


@model("in-flight choice")
class InFlight:
    """Why the throughput plan made for ``requests`` in flight is the one it is."""

    requests: int
    chosen: str  # the candidate's name, e.g. "at most 1 switch"
    per_request_seconds: float
    candidates: list[Candidate]
    max_switches: int | None = None
    switches: int | None = None
    objective: str | None = None
    replicas_faster: bool = False
    note: str | None = None  # set when request distribution is predicted faster


@model("plan details")
class PlanDetails:
    """What a plan says beside its assignment; every field is optional (None: not said).

    The runtime reads ``home`` (the device the program is captured on, for plans that re-capture
    it), ``replicas`` and ``share`` (request distribution), ``groups`` (group replicas); the rest
    is what the policy and the solver report."""

    home: str | None = None
    replicas: list[str] | None = None  # request distribution: its devices
    share: dict[str, float] | None = None  # request distribution: each device's share of requests
    groups: list[GroupPlacement] | None = None  # group replicas: each group's placement
    in_flight: InFlight | None = None  # the throughput policy made for K requests in flight
    throughput_seconds: float | None = None  # the validator's objectives of the plan
    latency_seconds: float | None = None
    costs_source: str | None = None  # the cost table's source (a plan made from predicted costs says so)
    status: str | None = None  # the solver's status, or what happened instead
    started_from: str | None = None  # the plan that started the MILP
    solve_seconds: float | None = None
    mip_gap: float | None = None
    mip_dual_bound_seconds: float | None = None
    lp_relaxation_seconds: float | None = None
    zero_comm_lp_seconds: float | None = None
    zero_comm_simple_seconds: float | None = None
    classes: int | None = None  # launch classes the MILP placed (identical launches share one)
    columns: int | None = None
    rows: int | None = None
    repeats: SolvedRepeats | None = None
    max_switches: int | None = None
    switches: int | None = None


@document("kernelfleet_plan", PLAN_FORMAT, "plan")
class Plan(Document):
    """A placement (``kernelfleet_plan``): ``assignment[i]`` is the device name that runs launch ``i``.

    ``objective_seconds`` is the policy's own objective (time per request in steady state for
    throughput policies and baselines, or with K requests in flight for the throughput policy made
    for K (``details.in_flight``); one request's latency for the latency policy);
    ``lower_bound_seconds`` bounds the best throughput time any plan could reach.
    Request distribution ("replicas") has an empty assignment and lists its devices in
    ``details.replicas``. ``slot_mode``: how ``kernelfleet run`` lays several requests in flight
    over the devices (:data:`SLOT_MODES`): the mode the policy predicted fastest where it was made
    for requests in flight (``plan --in-flight``), else sequential.
    """

    policy: str
    assignment: list[str]
    objective_seconds: float
    lower_bound_seconds: float | None = None
    details: PlanDetails = field(default_factory=PlanDetails)
    slot_mode: one_of("slot_mode", SLOT_MODES) = "sequential"  # type: ignore[valid-type]
    DUMP = {"indent": 1, "exclude_none": True}  # fields that are None are left out



STATE_HOME = ("state the step carries to its next run (a KV cache, a recurrent state): --state-home keeps it "
              "on the home device in every plan")


def state_home(program: Program) -> Program:
    """``program`` with every launch that touches its state pinned (:data:`STATE_HOME`): the named
    buffers, neither weights, inputs nor outputs, that some launch writes. Plans made from it keep
    that state at home, whichever plan runs a step: what a server that switches plans between steps
    needs (``kernelfleet plan --state-home``, ``kernelfleet serve --plans``)."""
    named = {b.id for b in program.buffers if b.name and b.role not in ("weight", "input", "output")}
    state = {a.buffer for launch in program.launches for a in launch.accesses if a.writes and a.buffer in named}

    def pinned(launch: Launch) -> Launch:
        if launch.pinned or not any(a.buffer in state for a in launch.accesses):
            return launch
        return replace(launch, pinned=STATE_HOME)

    return Program(buffers=list(program.buffers), launches=[pinned(launch) for launch in program.launches],
                   units=program.units)


def weights_read(program: Program, assignment: list[str], device: str) -> set[str]:
    """The names of ``program``'s weight buffers that the launches ``assignment`` puts on ``device``
    read: the weights that device must hold under the plan."""
    named = {b.id: b.name for b in program.buffers if b.role == "weight" and b.name}
    return {named[a.buffer] for launch in program.launches if assignment[launch.index] == device
            for a in launch.accesses if a.reads and a.buffer in named}


def weights_kept(costs: CostTable, program: Program, reference: Program, plan: Plan, where: str) -> CostTable:
    """``costs`` with every launch of ``program`` that reads weights ``plan`` placed (a plan of
    ``reference``; weights matched by name) runnable only on the devices that hold all of them
    under ``plan``: each device's launches, in every plan made from the table, read only the
    weights ``plan`` put there (``kernelfleet plan --weights-like``: a server switching plans holds
    each device's weights once). UsageError naming ``where`` and the launch where no device holds
    all the weights it reads."""
    held = {d: weights_read(reference, plan.assignment, d) for d in dict.fromkeys(plan.assignment)}
    placed = set().union(*held.values())
    named = {b.id: b.name for b in program.buffers if b.role == "weight" and b.name in placed}
    rows = []
    for launch, row in zip(program.launches, costs.seconds):
        reads = {named[a.buffer] for a in launch.accesses if a.reads and a.buffer in named}
        devices = {d for d, names in held.items() if reads <= names}
        if not devices:
            raise UsageError(f"{where}: launch {launch.index} ({launch.name}) reads {', '.join(sorted(reads))}, "
                             "which the plan keeps on different devices: no device may run it")
        rows.append(row if not reads else {d: (v if d in devices else None) for d, v in row.items()})
    return replace(costs, seconds=rows)


class Problem:
    """Everything a planner reads, checked once so planners can trust it.

    Raises UsageError for a malformed problem: a cost table of the wrong length, a cost for
    an unknown device, a missing link between two devices, a launch that can run nowhere
    (no cost, or too big for every device's memory), a pinned launch its home cannot run.
    """

    def __init__(self, program: Program, devices: list[Device], links: list[Link], costs: CostTable | None,
                 edges: list[Edge] | None = None, home: str | None = None, keep_home: bool = False,
                 edge_fit: EdgeFit | None = None) -> None:
        self.program = program
        # per-edge costs fitted in a real step (plan/edges.py), charged by the slot-mode predictions
        # (slots.per_request) where given; None: predictions as without
        self.edge_fit = edge_fit
        # every plan keeps the home device (no single-device plan elsewhere, no replicas): for a
        # step whose state lives at home whatever the plan, as the server's KV cache does
        self.keep_home = keep_home
        self.devices = list(devices)
        self.names = [d.name for d in self.devices]
        self.costs = costs
        self.edges = dependencies(program) if edges is None else list(edges)
        self.home = self.names[0] if home is None and self.names else home
        _need(len(self.names) > 0, "a placement problem needs at least one device")
        _need(len(set(self.names)) == len(self.names), f"device names must be unique, got {self.names}")
        _need(self.home in self.names, f"home device {self.home!r} is not one of the devices {self.names}")
        self.bandwidth: dict[tuple[str, str], float] = {}
        self.copy_seconds: dict[tuple[str, str], float] = {}
        for link in links:
            _need(link.a in self.names and link.b in self.names and link.a != link.b,
                  f"link {link.a}-{link.b}: both ends must be distinct known devices {self.names}")
            _need(link.bytes_per_second > 0, f"link {link.a}-{link.b}: bytes_per_second must be positive")
            _need(link.seconds_per_copy >= 0, f"link {link.a}-{link.b}: seconds_per_copy must be >= 0")
            self.bandwidth[link.a, link.b] = self.bandwidth[link.b, link.a] = float(link.bytes_per_second)
            self.copy_seconds[link.a, link.b] = self.copy_seconds[link.b, link.a] = float(link.seconds_per_copy)
        for i, a in enumerate(self.names):
            for b in self.names[i + 1:]:
                _need((a, b) in self.bandwidth, f"no link between devices {a} and {b}: give a Link for every pair")
        n = len(program.launches)
        # costs=None: a problem to check plans against (launches, devices, pins, memory) when no table
        # was measured, e.g. at run time; every device can run every launch, and nothing is evaluated
        rows = [] if costs is None else costs.seconds
        _need(costs is None or len(rows) == n, f"cost table has {len(rows)} rows, program has {n} launches")
        for k, row in enumerate(rows):
            unknown = set(row) - set(self.names)
            _need(not unknown, f"launch {k}: cost for unknown device(s) {sorted(unknown)}")
            for name, value in row.items():
                _need(value is None or value >= 0, f"launch {k}: cost on {name} must be >= 0 or None, got {value}")
        sizes = {b.id: b.size_bytes for b in program.buffers}
        # buffers each launch touches (whole allocations: that is what must be resident)
        self.touches: list[tuple[int, ...]] = [tuple(sorted({a.buffer for a in launch.accesses}))
                                               for launch in program.launches]
        self.buffer_bytes = sizes
        for launch in program.launches:
            self._check_runnable(launch.index)

    def restricted(self, names: list[str]) -> Problem:
        """The same program on a subset of the devices (home: the first of them)."""
        keep = [d for d in self.devices if d.name in names]
        links = [Link(a, b, self.bandwidth[a, b], self.copy_seconds[a, b]) for i, a in enumerate(names)
                 for b in names[i + 1:]]
        costs = None
        if self.costs is not None:
            rows = [{d: row[d] for d in names if d in row} for row in self.costs.seconds]
            costs = CostTable(rows, self.costs.source, self.costs.flops, self.costs.bytes, self.costs.precision)
        return Problem(self.program, keep, links, costs, self.edges, home=names[0])

    @cached_property
    def groups(self) -> list[tuple[int, ...]]:
        """Launches that must share a device: op calls passing data through their own workspace
        (``graph.deps.together``), each in capture order."""
        return together(self.program)

    def kept_together(self, assignment: list[str]) -> list[str]:
        """``assignment`` with each of :attr:`groups` on one device, for the baselines that place
        launches by a rule blind to them (pipeline cuts, attention/FFN): home where a member is
        pinned, else where its first member is, or failing that the first device (home first) that
        can run every member."""
        out = list(assignment)
        for group in self.groups:
            pinned = any(self.program.launches[k].pinned for k in group)
            order = [self.home] if pinned else [out[group[0]], self.home] + self.names
            device = next((d for d in order if all(self.runs(k, d) for k in group)), out[group[0]])
            for k in group:
                out[k] = device
        return out

    # -- queries the planners and the validator share (pure look-ups, no cost model) --

    def cost(self, launch: int, device: str) -> float | None:
        if self.costs is None:
            raise UsageError("this problem has no cost table: its plans can be checked, not timed")
        return self.costs.seconds[launch].get(device)

    def runs(self, launch: int, device: str) -> bool:
        """Whether ``device`` can run ``launch`` at all: it has a cost for it (any, without a table)."""
        return self.costs is None or self.costs.seconds[launch].get(device) is not None

    def allowed(self, launch: int, home: str | None = None) -> list[str]:
        """Devices that can run the launch by cost, pin and its own memory footprint."""
        home = self.home if home is None else home
        if self.program.launches[launch].pinned:
            return [home] if self.fits_alone(launch, home) else []
        return [d for d in self.names if self.fits_alone(launch, d)]

    def transfer_seconds(self, nbytes: int, a: str, b: str) -> float:
        return self.cut_seconds(nbytes, 1, a, b)

    def cut_seconds(self, nbytes: int, copies: int, a: str, b: str) -> float:
        """Seconds of ``copies`` copies of ``nbytes`` in all from ``a`` to ``b`` (0 on one device)."""
        return 0.0 if a == b else copies * self.copy_seconds[a, b] + nbytes / self.bandwidth[a, b]

    def footprint_bytes(self, launch: int) -> int:
        return sum(self.buffer_bytes[b] for b in self.touches[launch])

    def memory_limit(self, device: str) -> int | None:
        return self.devices[self.names.index(device)].memory_bytes

    def edge_bytes(self) -> dict[tuple[int, int], int]:
        """Edges aggregated by (src, dst): the cost model is linear in bytes, so one term per pair."""
        out: dict[tuple[int, int], int] = defaultdict(int)
        for e in self.edges:
            out[e.src, e.dst] += e.bytes
        return dict(out)

    def edge_counts(self) -> dict[tuple[int, int], int]:
        """Edges (one copy each when cut: one per buffer) by (src, dst)."""
        out: dict[tuple[int, int], int] = defaultdict(int)
        for e in self.edges:
            out[e.src, e.dst] += 1
        return dict(out)

    def fits_alone(self, launch: int, device: str) -> bool:
        """The device has a cost for the launch and room for the buffers it touches."""
        limit = self.memory_limit(device)
        return self.runs(launch, device) and (limit is None or self.footprint_bytes(launch) <= limit)

    def _check_runnable(self, k: int) -> None:
        launch = self.program.launches[k]
        if self.allowed(k):
            return
        if launch.pinned:
            raise UsageError(f"launch {k} ({launch.name}) is pinned ({launch.pinned}) but its home device "
                             f"{self.home} has no cost for it or too little memory "
                             f"({self.footprint_bytes(k)} bytes needed)")
        raise UsageError(f"launch {k} ({launch.name}) fits no device: it touches {self.footprint_bytes(k)} bytes; "
                         f"memory limits {[(d.name, d.memory_bytes) for d in self.devices]}, costs "
                         f"{self.costs.seconds[k] if self.costs is not None else 'none given'}")


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
