"""Requests per second of a serving mix under each way of using two (or more) devices.

A request is one prefill step's share and ``output_tokens`` decode steps' shares: a prefill step
serves ``prefill.rows`` requests, a decode step gives ``decode.rows`` requests one token each.
Times come from plans evaluated on measured costs (steady state: the busiest device's time per
step), so every strategy is judged under the same cost model:

* **single device d**: one request every ``prefill(d) / rows_p + output_tokens * decode(d) / rows_d``;
* **replicas** (request distribution): the devices' single-device rates added up;
* **prefill/decode split** (P prefills, D decodes, the KV cache of each request sent P -> D): the
  slowest of P's prefill rate, D's decode rate and the link's rate for the KV bytes, best over
  the ordered pairs;
* **kernel placement**: both phases spread over all devices by their placement plans, each request
  costing ``prefill_placed / rows_p + output_tokens * decode_placed / rows_d``.

Pure arithmetic on plain numbers; the counts it returns are what a benchmark on the executor must
reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelfleet.errors import UsageError


@dataclass(frozen=True, slots=True)
class Phase:
    single_seconds: dict[str, float]  # device -> seconds of one step alone on it
    placed_seconds: float  # seconds per step under the kernel-placement plan (busiest device)
    rows: int  # requests one step serves


def rates(prefill: Phase, decode: Phase, output_tokens: int, kv_bytes_per_request: int,
          link_bytes_per_second: float) -> dict[str, float]:
    """Requests per second of each strategy (see the module docstring)."""
    if output_tokens < 1 or prefill.rows < 1 or decode.rows < 1:
        raise UsageError("output tokens and rows per step must be at least 1")
    devices = sorted(set(prefill.single_seconds) & set(decode.single_seconds))
    if len(devices) < 2:
        raise UsageError("a serving comparison needs both phases measured on at least two devices")

    def per_request(p: float, d: float) -> float:
        return p / prefill.rows + output_tokens * d / decode.rows

    out = {f"single:{d}": 1 / per_request(prefill.single_seconds[d], decode.single_seconds[d]) for d in devices}
    out["replicas"] = sum(out[f"single:{d}"] for d in devices)
    link_rate = link_bytes_per_second / kv_bytes_per_request if kv_bytes_per_request > 0 else float("inf")
    splits = {f"prefill:{p}/decode:{d}": min(prefill.rows / prefill.single_seconds[p],
                                             decode.rows / (output_tokens * decode.single_seconds[d]), link_rate)
              for p in devices for d in devices if p != d}
    best = max(splits, key=splits.get)
    out[f"pd-split ({best})"] = splits[best]
    out["kernel placement"] = 1 / per_request(prefill.placed_seconds, decode.placed_seconds)
    return out
