"""Throughput policy: a MILP (HiGHS) over launch-to-device binaries.

minimise T  subject to, for every device d,
    T >= sum_k c[k,d] x[k,d] + sum over cut edges touching d of bytes / bandwidth
    sum_d x[k,d] = 1,  x binary,  pinned launches on the home device,
    sum_b size_b y[b,d] <= memory_d,  y[b,d] >= x[k,d] for every buffer b launch k touches.

Cut terms (why two forms): when every link has the same bandwidth, z[e,d] >= |x[i,d] - x[j,d]|
is 1 exactly when one end of edge e is on d, which is all device d's row needs
(E x D variables; one shared z per edge with two devices). With links of different speeds
the charge depends on the pair of devices, so w[e,a,b] >= x[i,a] + x[j,b] - 1 per ordered pair
(E x D x (D-1) variables). Edges are aggregated per unordered pair of launches (or classes,
under compression: see ``compress.py``), since the cost is linear in bytes and symmetric;
edges whose two ends are fixed are constants.

Switch budget (optional, ``max_switches=S``): along the launch order, leaving out launches that
can run on one device only (pins), a *switch* is a launch on another device than the one before
it; sum of switches <= S. With two devices one s >= |x[i,d] - x[i-1,d]| per consecutive pair; with
more, u[i,d] >= x[i,d] - x[i-1,d] per device, whose sum is half the L1 distance between the two
launches' placements (1 on a switch, like max_d, but tighter in the relaxation). s and u need
not be integer: for binary x each can sit at its lower bound, 0 or 1. Under compression
consecutive launches are counted by class pair (with how often the pair follows each other), so
the budget counts the switches of the replicated plan exactly. S = 1 on two devices is a
two-stage pipeline cut anywhere, chosen by compute and transfer cost. Why: the executor runs few
requests in flight, and a plan that switches every few kernels makes each request one serial
chain through both devices (``plan/slots.py``); the policy tries several S (``policy.py``).

Bounds: the LP relaxation of this model, and the zero-communication LP (same model without
cut terms and memory). HiGHS's own dual bound at the end is also valid when the model was
not compressed. Tessera's MILP (Gurobi) has no memory rows.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernelfleet.errors import EnvironmentProblem, UsageError
from kernelfleet.plan.compress import classes as launch_classes
from kernelfleet.plan.compress import find_repeats
from kernelfleet.plan.model import Plan, Problem

INF = math.inf  # HiGHS reads an infinite bound as none (its kHighsInf is inf)


def _highspy() -> Any:
    """HiGHS, imported where a solve happens: the baselines and the validator never need it."""
    try:
        import highspy
    except ImportError as exc:  # pragma: no cover - part of the [place] extra
        raise EnvironmentProblem(f"the MILP needs HiGHS ({exc}): pip install 'kernelfleet[place]'") from exc
    return highspy


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what C code writes to stdout to stderr meanwhile, so a table on stdout stays clean."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@dataclass
class _Model:
    """Columns and rows under construction (rows as sparse dicts; HiGHS gets CSR arrays)."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)
    rows: list[tuple[float, float, dict[int, float]]] = field(default_factory=list)

    def col(self, lower: float, upper: float, cost: float = 0.0, integer: bool = False) -> int:
        self.lower.append(lower), self.upper.append(upper), self.cost.append(cost)
        if integer:
            self.integer.append(len(self.cost) - 1)
        return len(self.cost) - 1

    def row(self, lower: float, upper: float, terms: dict[int, float]) -> None:
        self.rows.append((lower, upper, terms))

    def to_highs(self, relax: bool, time_limit_seconds: float, mip_rel_gap: float) -> Any:
        with _stdout_to_stderr():  # HiGHS prints its banner on the first construction, before any option
            h = _highspy().Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit_seconds))
        h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
        n = len(self.cost)
        h.addCols(n, np.array(self.cost), np.array(self.lower), np.array(self.upper), 0,
                  np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        starts, index, value = [], [], []
        for _, _, terms in self.rows:
            starts.append(len(index))
            index += terms.keys()
            value += terms.values()
        h.addRows(len(self.rows), np.array([r[0] for r in self.rows]), np.array([r[1] for r in self.rows]),
                  len(index), np.array(starts, np.int32), np.array(index, np.int32), np.array(value))
        if not relax and self.integer:
            cols = np.array(self.integer, np.int32)
            h.changeColsIntegrality(len(cols), cols, np.full(len(cols), 1, np.uint8))  # kInteger
        return h


@dataclass
class _Built:
    model: _Model
    x: dict[tuple[int, str], int]  # (class, device) -> column; absent = fixed or not allowed
    fixed: dict[int, str]  # class -> its only device
    members: list[list[int]]


def switches(problem: Problem, assignment: list[str], home: str | None = None) -> int:
    """Device changes along the launch order of ``assignment``, launches that can run on one device
    only left out (as the MILP's switch budget counts them)."""
    previous, count = None, 0
    for k, d in enumerate(assignment):
        if len(problem.allowed(k, home)) < 2:
            continue
        if previous is not None and d != previous:
            count += 1
        previous = d
    return count


def _consecutive(cls: list[int], fixed: dict[int, str]) -> dict[tuple[int, int], int]:
    """(class, next class) -> how often a launch of the first is followed by one of the second,
    among the launches of free classes in launch order."""
    out: dict[tuple[int, int], int] = defaultdict(int)
    previous = None
    for c in cls:
        if c in fixed:
            continue
        if previous is not None and previous != c:
            out[previous, c] += 1
        previous = c
    return out


def _build(problem: Problem, cls: list[int], home: str | None, transfers: bool, memory: bool,
           max_switches: int | None = None) -> _Built:
    names = problem.names
    n_cls = max(cls, default=-1) + 1
    members: list[list[int]] = [[] for _ in range(n_cls)]
    for k, c in enumerate(cls):
        members[c].append(k)
    m = _Model()
    t = m.col(0.0, INF, 1.0)
    x: dict[tuple[int, str], int] = {}
    fixed: dict[int, str] = {}
    load: dict[str, dict[int, float]] = {d: {t: 1.0} for d in names}  # row: T - load >= const
    const: dict[str, float] = {d: 0.0 for d in names}
    for c, ks in enumerate(members):
        # home=None ignores pins (a bound for plans that re-home the whole program)
        allowed = [d for d in names if all(problem.fits_alone(k, d) and (
            home is None or not problem.program.launches[k].pinned or d == home) for k in ks)]
        if not allowed:
            k = ks[0]
            raise UsageError(f"launch {k} ({problem.program.launches[k].name}) has no device it can run on "
                             f"together with the launches it is grouped with")
        seconds = {d: sum(problem.cost(k, d) or 0.0 for k in ks) for d in allowed}
        if len(allowed) == 1:
            fixed[c] = allowed[0]
            const[allowed[0]] += seconds[allowed[0]]
            continue
        for d in allowed:
            x[c, d] = m.col(0.0, 1.0, 0.0, integer=True)
            load[d][x[c, d]] = -seconds[d]
        m.row(1.0, 1.0, {x[c, d]: 1.0 for d in allowed})

    def on(c: int, d: str) -> tuple[int | None, float]:
        """x[c,d] as (column, constant): a column, or a fixed 0/1."""
        if (c, d) in x:
            return x[c, d], 0.0
        return None, 1.0 if fixed.get(c) == d else 0.0

    if transfers and len(names) > 1:
        pairs: dict[tuple[int, int], int] = defaultdict(int)
        copies: dict[tuple[int, int], int] = defaultdict(int)
        counts = problem.edge_counts()
        for (i, j), nbytes in problem.edge_bytes().items():
            a, b = cls[i], cls[j]
            if a != b and nbytes > 0:
                pairs[min(a, b), max(a, b)] += nbytes
                copies[min(a, b), max(a, b)] += counts[i, j]
        uniform = len(set(problem.bandwidth.values())) == 1 and len(set(problem.copy_seconds.values())) == 1
        for (a, b), nbytes in pairs.items():
            if a in fixed and b in fixed:
                if fixed[a] != fixed[b]:
                    s = problem.cut_seconds(nbytes, copies[a, b], fixed[a], fixed[b])
                    const[fixed[a]] += s
                    const[fixed[b]] += s
                continue
            if uniform:
                seconds = copies[a, b] * next(iter(problem.copy_seconds.values())) + \
                    nbytes / next(iter(problem.bandwidth.values()))
                shared = None
                for d in names:
                    (ca, ka), (cb, kb) = on(a, d), on(b, d)
                    if ca is None and cb is None:
                        const[d] += seconds * abs(ka - kb)  # both ends decided on d
                        continue
                    if len(names) == 2 and shared is not None:
                        z = shared  # with two devices the cut indicator is the same on both
                    else:
                        z = m.col(0.0, 1.0)
                        for sign in (1.0, -1.0):  # z >= sign * (x_a - x_b)
                            terms = {z: 1.0}
                            if ca is not None:
                                terms[ca] = -sign
                            if cb is not None:
                                terms[cb] = terms.get(cb, 0.0) + sign
                            m.row(sign * (ka - kb), INF, terms)
                        shared = z
                    load[d][z] = load[d].get(z, 0.0) - seconds
                continue
            for da in names:
                for db in names:
                    if da == db:
                        continue
                    (ca, ka), (cb, kb) = on(a, da), on(b, db)
                    if (ca is None and ka == 0.0) or (cb is None and kb == 0.0):
                        continue  # this pair of placements is impossible
                    w = m.col(0.0, 1.0)
                    terms = {w: 1.0}  # w >= x_a,da + x_b,db - 1
                    if ca is not None:
                        terms[ca] = -1.0
                    if cb is not None:
                        terms[cb] = -1.0
                    m.row(ka + kb - 1.0, INF, terms)
                    s = problem.cut_seconds(nbytes, copies[a, b], da, db)
                    for d in (da, db):
                        load[d][w] = load[d].get(w, 0.0) - s
    for d in names:
        m.row(const[d], INF, load[d])

    if max_switches is not None and len(names) > 1:
        budget: dict[int, float] = {}
        for (a, b), count in _consecutive(cls, fixed).items():
            shared = m.col(0.0, 1.0) if len(names) == 2 else None
            for d in names:
                (ca, ka), (cb, kb) = on(a, d), on(b, d)
                u = shared if shared is not None else m.col(0.0, 1.0)
                terms = {u: 1.0}  # u >= x_b,d - x_a,d
                if cb is not None:
                    terms[cb] = -1.0
                if ca is not None:
                    terms[ca] = terms.get(ca, 0.0) + 1.0
                m.row(kb - ka, INF, terms)
                budget[u] = float(count)  # once per column: the shared one stands for every device
        if budget:
            m.row(-INF, float(max_switches), budget)

    if memory:
        touching: dict[int, list[int]] = defaultdict(list)
        for c, ks in enumerate(members):
            for buf in sorted({b for k in ks for b in problem.touches[k]}):
                touching[buf].append(c)
        for d in names:
            limit = problem.memory_limit(d)
            if limit is None:
                continue
            used, terms = 0.0, {}
            for buf, cs in touching.items():
                cols = [x[c, d] for c in cs if (c, d) in x]
                if any(fixed.get(c) == d for c in cs):
                    used += problem.buffer_bytes[buf]
                elif cols:
                    y = m.col(0.0, 1.0)
                    for col in cols:
                        m.row(0.0, INF, {y: 1.0, col: -1.0})
                    terms[y] = float(problem.buffer_bytes[buf])
            if used > limit:
                raise UsageError(f"device {d} must hold {int(used)} bytes for its fixed launches, limit {limit}")
            if terms:
                m.row(-INF, limit - used, terms)
    return _Built(m, x, fixed, members)


def zero_comm_bound(problem: Problem, home: str | None = "problem") -> dict[str, float]:
    """Two lower bounds on any plan's throughput time, both ignoring transfers and memory:
    ``lp`` (fractional placement, pins kept; ``home=None`` drops pins, for plans that
    re-home the program) and ``simple`` (sum_k min_d c[k,d] / devices, a weaker check)."""
    home = problem.home if home == "problem" else home
    built = _build(problem, list(range(len(problem.program.launches))), home, transfers=False, memory=False)
    h = built.model.to_highs(relax=True, time_limit_seconds=60.0, mip_rel_gap=0.0)
    h.run()
    best = [min(v for v in row.values() if v is not None) for row in problem.costs.seconds]
    return {"lp": float(h.getInfo().objective_function_value),
            "simple": max(sum(best) / len(problem.names), max(best, default=0.0))}


def solve_throughput(problem: Problem, *, time_limit_seconds: float = 30.0, mip_rel_gap: float = 1e-4,
                     compress: bool = False, groups: int = 1, start: list[str] | None = None,
                     max_switches: int | None = None) -> Plan:
    """The throughput plan: the MILP's best placement within the time limit.

    ``compress`` solves one repeated block (``groups`` runs of it, see ``compress.py``) and
    replicates it. ``start`` is an assignment to start from (e.g. the best baseline), so the
    result is never worse than it even when the time limit cuts the search short.
    ``max_switches`` bounds the device changes along the launch order (module docstring); the
    MILP's own bounds then hold for the budget only, so the plan's lower bound is the
    zero-communication one. Raises UsageError when no placement satisfies pins, memory limits
    and the budget.
    """
    if max_switches is not None and max_switches < 0:
        raise UsageError(f"max_switches must be >= 0 or None, got {max_switches}")
    began = time.perf_counter()
    repeats = find_repeats(problem) if compress else None
    cls = launch_classes(problem, repeats, groups)
    built = _build(problem, cls, problem.home, transfers=True, memory=True, max_switches=max_switches)
    limits = "the pins and memory limits" + ("" if max_switches is None else f" within {max_switches} switches")
    fix = "raise a memory limit or add a device" + ("" if max_switches is None else " or allow more switches")
    status_of = _highspy().HighsModelStatus
    lp_bound = None
    if max_switches is None:  # a bound for the full problem; under a budget, time better spent on the MILP
        h = built.model.to_highs(relax=True, time_limit_seconds=time_limit_seconds, mip_rel_gap=mip_rel_gap)
        h.run()
        if h.getModelStatus() == status_of.kOptimal:
            lp_bound = float(h.getInfo().objective_function_value)
        if h.getModelStatus() == status_of.kInfeasible:
            raise UsageError(f"no placement satisfies {limits} (the relaxation is infeasible): {fix}")
    h = built.model.to_highs(relax=False, time_limit_seconds=max(0.1, time_limit_seconds - (time.perf_counter() - began)),
                             mip_rel_gap=mip_rel_gap)
    if start is not None and len(start) == len(cls):
        cols = [col for (c, d), col in built.x.items() if start[built.members[c][0]] == d]
        h.setSolution(len(cols), np.array(cols, np.int32), np.ones(len(cols)))
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    if info.primal_solution_status != 2:  # 2 = feasible
        if status == status_of.kInfeasible:
            raise UsageError(f"no placement satisfies {limits}: {fix}")
        raise UsageError(f"the MILP found no placement within {time_limit_seconds} s "
                         f"({h.modelStatusToString(status)}): raise the time limit or use compress=True")
    values = h.getSolution().col_value
    per_class = dict(built.fixed)
    weight: dict[int, float] = {}
    for (c, d), col in built.x.items():  # each class where its binary is largest: robust to a solver's slack
        if values[col] > weight.get(c, 0.0):
            per_class[c], weight[c] = d, values[col]
    missing = sorted(set(cls) - set(per_class))
    if missing:
        raise UsageError(f"the MILP's answer places no device for {len(missing)} launch class(es) "
                         "(costs far out of scale?): check the cost table")
    assignment = [per_class[c] for c in cls]
    objective = float(info.objective_function_value)
    dual = float(info.mip_dual_bound)
    bounds = zero_comm_bound(problem)
    # the MILP's own bounds hold for the full problem only when every launch was free
    valid = [bounds["lp"]] + ([dual, lp_bound or 0.0] if repeats is None and max_switches is None else [])
    details = {
        "home": problem.home, "solve_seconds": time.perf_counter() - began,
        "status": h.modelStatusToString(status), "mip_gap": float(info.mip_gap),
        "mip_dual_bound_seconds": dual, "lp_relaxation_seconds": lp_bound,
        "zero_comm_lp_seconds": bounds["lp"], "zero_comm_simple_seconds": bounds["simple"],
        "classes": max(cls, default=-1) + 1, "columns": len(built.model.cost), "rows": len(built.model.rows),
        "repeats": None if repeats is None else {"start": repeats.start, "period": repeats.period,
                                                 "count": repeats.count, "groups": groups},
        "max_switches": max_switches, "switches": switches(problem, assignment),
    }
    return Plan("throughput-milp", assignment, objective, max(valid), details)
