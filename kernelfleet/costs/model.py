"""A roofline cost model: fitted on measured device profiles, predicting catalog SKUs not present.

**Model.** Launch k on device d takes

    t[k,d] = max( F_k / (P_d(p_k) * e_c[k]),  B_k / (W_d * e_m[k]) ) + o

with F_k its useful FLOPs, B_k the bytes it moves, p_k its precision, P_d(p) the device's dense
peak at that precision (the FP32 CUDA-core rate when p is None), W_d its memory bytes/s, e_c and
e_m the fraction of peak the launch reaches when compute or memory binds, and o the launch
overhead (one value for the table). Write y = t - o, c_d = F/P_d, m_d = B/W_d, a = 1/e_c,
b = 1/e_m; then y_d = max(a c_d, b m_d).

**Fit, per launch** (``roofline.fit_launch``). Minimise the squared log (relative) error over the
measured devices plus a weak prior,

    J(a, b) = sum_d (log max(a c_d, b m_d) - log y_d)^2 + lambda R(a, b).

The max splits the devices into those bound by compute (a c_d >= b m_d) and by memory; a split
that some (a, b) produces is a threshold on c_d / m_d, so only n + 1 splits exist. Within one,
log a is the mean of log(y_d / c_d) over its compute-bound devices and log b the mean of
log(y_d / m_d) over the memory-bound ones: an efficiency is the geometric mean of roofline over
achieved time where that resource binds. A side with no device is not identified by the launch:
the prior gives it, capped at the envelope min_d y_d / m_d (or / c_d), because a term that never
binds cannot exceed a measured time. The split with the lowest J wins; the prior breaks ties
between splits that fit alike (with one device, every split fits exactly).

* **Per-launch path** (F and B known): R = (log a - log a_K)^2 + (log b - log b_K)^2, lambda 0.1,
  with a_K, b_K the medians over the launch's class K from a first pass that used a = b = 1 (for
  one device that pass is the plain roofline: the longer roofline time binds). A launch informs
  its class about a resource only if the fit has a device bound by it *and* the plain roofline
  says it limits there, so noise on a tiny kernel cannot set a class's compute efficiency.
  Classes are ``graph.deps.kernel_kind`` (tensor-core, memory-bound, other); a class with no
  such launch takes the median over all classes, else 1.
* **Class path** (F or B unknown): efficiency cannot be told from work, so the fit finds the
  effective work X = F/e_c and Y = B/e_m directly (c_d = 1/P_d or m_d = 1/W_d for the unknown
  quantity), with a prior on the effective intensity, R = (log(X/Y) - log rho_K)^2, rho_K the
  median X/Y of the class's per-launch fits weighted by measured time (the launches that
  dominate the class's time decide). lambda is 0.01 here: a class mixes GEMMs and attention,
  whose intensities differ by orders of magnitude, so two measured devices must overrule it;
  with one device it decides which resource binds on a device the launch was not measured on.
* **Kind path** (no per-launch fit in the whole table): rho is 8x the highest ridge point P/W
  of the fitted devices for tensor-core launches (compute-bound), 1/8 of the lowest for
  memory-bound ones; other kinds get no prior (an unidentified side sits at its envelope: the
  launch is taken to be limited by whichever resource the target has less of).

**Overhead.** o is the point of a grid over [0, smallest measured time) that minimises the summed
J of both passes: with two or more devices of different balance a tiny kernel's times follow
the roofline ratios only once the overhead is off, and with one device the overhead that makes
each class's efficiencies most alike wins. ``overhead_seconds`` fixes it instead.

**Predict** on a target T: max(a c_T, b m_T) + o; None where T lacks the launch's precision or
no measured device ran the launch (STYLE rule 5: unknown is None). When the table has no
``precision`` list at all, tensor-core launches are taken as ``assume_precision`` (bf16).

**Error.** :func:`leave_one_out` fits on all measured devices but one (overhead included),
predicts the held-out one and reports the median and p90 relative error and the share of total
time mispredicted, sum |predicted - measured| / sum measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from kernelfleet.costs.roofline import INF, Capability, Prior, fit_launch, log_or_minus_inf
from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError

__all__ = ["Capability", "Fitted", "LaunchFit", "ModelError", "fit", "leave_one_out", "predict_table"]

OVERHEAD_GRID = 16


@dataclass(frozen=True)
class LaunchFit:
    """seconds = max(a * flops_scale / peak, b * bytes_scale / bandwidth) + overhead. Per-launch
    path: the scales are F and B, a = 1/e_c, b = 1/e_m. Class path: a scale is 1 where the
    quantity is unknown, and a (or b) is then the effective work."""

    a: float
    b: float
    flops_scale: float
    bytes_scale: float
    precision: str | None
    path: str  # "launch", "class" or "kind" (see the module docstring)
    identified: tuple[str, ...]  # the sides a measured device is bound by: "compute", "memory"

    def seconds(self, cap: Capability, overhead: float) -> float | None:
        compute = 0.0
        if self.a > 0 and self.flops_scale > 0:
            peak = cap.peak(self.precision)
            if peak is None:
                return None  # the target lacks this precision: it cannot run the kernel
            compute = self.a * self.flops_scale / peak
        return max(compute, self.b * self.bytes_scale / cap.memory_bytes_per_second) + overhead


@dataclass
class Fitted:
    """The fitted model: one LaunchFit per launch (None when no fitted device ran it)."""

    launches: list[LaunchFit | None]
    overhead_seconds: float
    devices: tuple[str, ...]
    efficiency: dict[str, dict[str, float]] = field(default_factory=dict)  # class -> side -> median e

    def predict(self, cap: Capability) -> list[float | None]:
        return [None if f is None else f.seconds(cap, self.overhead_seconds) for f in self.launches]

    def paths(self) -> dict[str, int]:
        """How many launches each path fitted ("unmeasured": no fitted device ran it)."""
        out: dict[str, int] = {}
        for f in self.launches:
            out["unmeasured" if f is None else f.path] = out.get("unmeasured" if f is None else f.path, 0) + 1
        return out


@dataclass(frozen=True)
class ModelError:
    """Leave-one-device-out error, pooled over the held-out devices and per held-out device."""

    median_ratio: float
    p90_ratio: float
    mispredicted_share: float
    pairs: int
    per_device: dict[str, dict[str, float]]

    def summary(self) -> str:
        return (f"leave-one-device-out median {100 * self.median_ratio:.1f}%, "
                f"p90 {100 * self.p90_ratio:.1f}%, "
                f"{100 * self.mispredicted_share:.1f}% of time mispredicted ({self.pairs} launch-devices)")


@dataclass
class _Row:
    """One launch's inputs on the fitted devices (logs of the roofline times at efficiency 1)."""

    lc: list[float]
    lm: list[float]
    seconds: list[float]
    order: list[int]  # devices by c / m, most compute-heavy first
    kind: str
    flops_scale: float
    bytes_scale: float
    precision: str | None
    known: bool  # FLOPs and bytes both known: the per-launch path


def _rows(table: CostTable, kinds: Sequence[str], caps: list[tuple[str, Capability]],
          assume_precision: str) -> list[_Row | None]:
    n = len(table.seconds)
    if len(kinds) != n:
        raise UsageError(f"cost model: {len(kinds)} kernel kinds for {n} launches")
    flops, nbytes = table.flops or [None] * n, table.bytes or [None] * n
    # no precision list at all: a tensor-core launch is taken as ``assume_precision``
    precisions = table.precision or [assume_precision if kind == "tensor-core" else None for kind in kinds]
    out: list[_Row | None] = []
    for k, row in enumerate(table.seconds):
        fs = 1.0 if flops[k] is None else float(flops[k])
        bs = 1.0 if nbytes[k] is None else float(nbytes[k])
        got = [(cap, row[d]) for d, cap in caps if row.get(d) is not None]
        got = [(cap, t) for cap, t in got if t > 0 and (fs == 0 or cap.peak(precisions[k]) is not None)]
        if not got:
            out.append(None)
            continue
        lc = [log_or_minus_inf(fs) - math.log(cap.peak(precisions[k]) or 1.0) for cap, _ in got]
        lm = [log_or_minus_inf(bs) - math.log(cap.memory_bytes_per_second) for cap, _ in got]
        order = sorted(range(len(got)), key=lambda d: lc[d] - lm[d] if lm[d] > -INF else INF, reverse=True)
        out.append(_Row(lc, lm, [t for _, t in got], order, kinds[k], fs, bs, precisions[k],
                        flops[k] is not None and nbytes[k] is not None))
    return out


def fit(table: CostTable, kinds: Sequence[str], capabilities: Mapping[str, Capability], *,
        devices: Sequence[str] | None = None, overhead_seconds: float | None = None,
        assume_precision: str = "bf16") -> Fitted:
    """Fit the model on ``devices`` (default: every device the table measured). ``kinds`` is
    ``graph.deps.kernel_kind`` of each launch; ``capabilities`` must cover the fitted devices.
    ``overhead_seconds=None`` fits the overhead (see the module docstring)."""
    names = _measured(table) if devices is None else list(devices)
    if not names:
        raise UsageError("cost model: the cost table measured no device")
    missing = [d for d in names if d not in capabilities]
    if missing:
        raise UsageError(f"cost model: no capability for measured device(s) {missing}: "
                         "say which catalog SKU or calibration each one is")
    rows = _rows(table, kinds, [(d, capabilities[d]) for d in names], assume_precision)
    if overhead_seconds is None:
        smallest = min((t for r in rows if r is not None for t in r.seconds), default=0.0)
        overhead_seconds = _search(lambda o: _fit_at(rows, o)[2], smallest)
    fits, efficiency, _ = _fit_at(rows, overhead_seconds)
    return Fitted(fits, overhead_seconds, tuple(names), efficiency)


def _fit_at(rows: list[_Row | None], overhead: float) -> tuple[list[LaunchFit | None], dict, float]:
    """Both passes at one overhead: the fits, the class efficiencies and the summed objective."""

    def one(r: _Row, prior: Prior) -> tuple[float, float, tuple[str, ...], float, float]:
        ly = [math.log(max(t - overhead, 0.01 * t)) for t in r.seconds]
        return fit_launch(r.lc, r.lm, ly, r.order, prior)

    known = [(k, r) for k, r in enumerate(rows) if r is not None and r.known]
    log_inv: dict[str, dict[str, list[float]]] = {}
    for k, r in known:
        la, lb, sides, _, _ = one(r, ("sides", 0.0, 0.0))
        # a launch informs its class about a resource only where the plain roofline (equal
        # efficiencies) says that resource limits it: a fit that calls a tiny elementwise kernel
        # compute-bound because of noise must not set the class's compute efficiency
        limits = {"compute": any(c >= m for c, m in zip(r.lc, r.lm)),
                  "memory": any(m >= c for c, m in zip(r.lc, r.lm))}
        for side, v in (("compute", la), ("memory", lb)):
            if side in sides and limits[side] and v > -INF:
                log_inv.setdefault(r.kind, {}).setdefault(side, []).append(v)
    overall = {s: [v for per in log_inv.values() for v in per.get(s, [])] for s in ("compute", "memory")}

    def prior_log(kind: str, side: str) -> float:
        values = log_inv.get(kind, {}).get(side) or overall[side]
        return median(values) if values else 0.0

    fits: list[LaunchFit | None] = [None] * len(rows)
    intensity: dict[str, list[tuple[float, float]]] = {}  # (log X / Y, weight): effective FLOPs per byte
    objective = 0.0
    for k, r in known:
        la, lb, sides, _, total = one(r, ("sides", prior_log(r.kind, "compute"), prior_log(r.kind, "memory")))
        fits[k] = LaunchFit(math.exp(la), math.exp(lb), r.flops_scale, r.bytes_scale, r.precision, "launch",
                            sides)
        objective += total
        if la > -INF and lb > -INF:
            intensity.setdefault(r.kind, []).append(
                (la + math.log(r.flops_scale) - lb - math.log(r.bytes_scale),
                 sum(r.seconds) / len(r.seconds)))
    every = [v for values in intensity.values() for v in values]
    for k, r in enumerate(rows):
        if r is None or r.known:
            continue
        logs = intensity.get(r.kind) or every
        if logs and r.flops_scale > 0 and r.bytes_scale > 0:
            prior, path = ("ratio", _weighted_median(logs) + math.log(r.bytes_scale / r.flops_scale)), "class"
        else:
            prior, path = _kind_prior(r), "kind"
        la, lb, sides, _, total = one(r, prior)
        fits[k] = LaunchFit(math.exp(la), math.exp(lb), r.flops_scale, r.bytes_scale, r.precision, path,
                            sides)
        objective += total
    efficiency = {kind: {s: math.exp(-median(v)) for s, v in per.items()} for kind, per in log_inv.items()}
    return fits, efficiency, objective


def _weighted_median(pairs: list[tuple[float, float]]) -> float:
    """The value below which half the weight lies. Weighted by measured time, so the launches that
    dominate a class's time (a planner's objective is a sum of times) decide its intensity."""
    pairs = sorted(pairs)
    half, seen = sum(w for _, w in pairs) / 2, 0.0
    for value, weight in pairs:
        seen += weight
        if seen >= half:
            return value
    return pairs[-1][0]


def _kind_prior(r: _Row) -> Prior:
    """With no per-launch fit in the table: a tensor-core launch is taken to be compute-bound on
    every fitted device with a margin (effective intensity 8x the highest ridge point P/W), a
    memory-bound one memory-bound (1/8 of the lowest); other kinds get no preference."""
    ridges = [m - c for c, m in zip(r.lc, r.lm)]  # log(P/W) + log(bytes scale / flops scale)
    if any(abs(x) == INF for x in ridges) or r.kind not in ("tensor-core", "memory-bound"):
        return ("none",)
    if r.kind == "tensor-core":
        return ("ratio", max(ridges) + math.log(8))
    return ("ratio", min(ridges) - math.log(8))


def _search(objective: Any, smallest: float) -> float:
    """argmin of objective(o) over [0, smallest): a coarse grid, then a finer one around its best."""
    if smallest <= 0:
        return 0.0
    step = smallest / OVERHEAD_GRID
    best = min((i * step for i in range(OVERHEAD_GRID)), key=objective)
    return min((min(max(best + step * (i / 5 - 1), 0.0), 0.99 * smallest) for i in range(11)), key=objective)


def _measured(table: CostTable) -> list[str]:
    return sorted({d for row in table.seconds for d, v in row.items() if v is not None})


def leave_one_out(table: CostTable, kinds: Sequence[str], capabilities: Mapping[str, Capability], *,
                  overhead_seconds: float | None = None, assume_precision: str = "bf16") -> ModelError | None:
    """Fit on every measured device but one, predict that one; None with fewer than two devices."""
    names = _measured(table)
    if len(names) < 2:
        return None
    pooled: list[tuple[float, float]] = []
    per_device: dict[str, dict[str, float]] = {}
    for held in names:
        model = fit(table, kinds, capabilities, devices=[d for d in names if d != held],
                    overhead_seconds=overhead_seconds, assume_precision=assume_precision)
        pairs = [(p, row[held]) for p, row in zip(model.predict(capabilities[held]), table.seconds)
                 if p is not None and row.get(held) is not None and row[held] > 0]
        if pairs:
            per_device[held] = _errors(pairs)
            pooled += pairs
    if not pooled:
        return None
    total = _errors(pooled)
    return ModelError(total["median_ratio"], total["p90_ratio"], total["mispredicted_share"], len(pooled),
                      per_device)


def _errors(pairs: list[tuple[float, float]]) -> dict[str, float]:
    rel = sorted(abs(p - t) / t for p, t in pairs)
    return {"median_ratio": median(rel),
            "p90_ratio": rel[max(0, math.ceil(0.9 * len(rel)) - 1)],  # nearest rank
            "mispredicted_share": sum(abs(p - t) for p, t in pairs) / sum(t for _, t in pairs),
            "launches": len(rel)}


def predict_table(table: CostTable, kinds: Sequence[str], capabilities: Mapping[str, Capability],
                  targets: Mapping[str, Capability],
                  **options: Any) -> tuple[CostTable, Fitted, ModelError | None]:
    """The table with a predicted column for each target it has not measured, the model and its
    leave-one-device-out error. Measured columns stay as measured; the source says what was
    fitted on what, so a plan made from the table is labelled."""
    model = fit(table, kinds, capabilities, **options)
    error = leave_one_out(table, kinds, capabilities, **options)
    rows = [dict(row) for row in table.seconds]
    added = [name for name in targets if name not in _measured(table)]
    for name in added:
        for row, value in zip(rows, model.predict(targets[name])):
            row[name] = value
    source = (f"roofline model fitted on {', '.join(model.devices)} (measured: {table.source}); "
              f"predicted {', '.join(added) or 'nothing'}; overhead {model.overhead_seconds * 1e6:.2f} us")
    if error is not None:
        source += f"; {error.summary()}"
    return CostTable(rows, source, table.flops, table.bytes, table.precision), model, error
