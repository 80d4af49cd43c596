"""Which row of a ``bench disagg`` result the planner's model chooses: the one it predicts fastest.

``kernelfleet plan --in-flight K`` ranks every plan in every slot mode by ``slots.per_request``;
``bench disagg`` records beside each strategy what ``contention.predict`` gave for its graph; this
picks among those rows what ``plan`` would have picked, so the benchmark's "chosen" (and the
placement table's, ``bench/place_table.py``) is the planner's own choice (no torch here: the table
runs on any machine).
"""

from __future__ import annotations

from kernelfleet.plan.slots import SUFFIXES

# the plans `kernelfleet plan --policy all` writes beside the single devices ("single:NAME"), as
# bench disagg names their rows
PLANS = ("replicas", "pipeline", "attention-ffn", "latency-greedy", "throughput-milp")


def candidates(strategies: dict[str, dict]) -> dict[str, float]:
    """Predicted seconds per slot of every row that runs a plan (:data:`PLANS`, a single device)
    in a slot mode, passed its gate and has a prediction."""
    out = {}
    for name, r in strategies.items():
        plan, _, mode = name.partition(", ")
        if ((plan in PLANS or plan.startswith("single:")) and (", " + mode if mode else "") in SUFFIXES.values()
                and r.get("seconds") and r.get("predicted_seconds")):
            out[name] = r["predicted_seconds"] / r["slots"]
    return out


def chosen(strategies: dict[str, dict]) -> str | None:
    """The row predicted fastest per slot (the first of a tie: chained before free), or None where
    none has a prediction."""
    found = candidates(strategies)
    return min(found, key=found.get) if found else None
