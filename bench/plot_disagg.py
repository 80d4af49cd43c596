"""The disaggregation benchmark's recorded runs as a chart and a table for docs/place.md (CPU only).

    python3 bench/plot_disagg.py

Reads tests/data/h200x2-disagg/*.disagg.json (written by `kernelfleet bench disagg` on two H200s)
and writes docs/img/place-disagg-h200x2.png: slots per second of every strategy that passed the
correctness gate, per step, with the planner's prediction beside the plans that have one.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "data" / "h200x2-disagg"
OUT = ROOT / "docs" / "img" / "place-disagg-h200x2.png"
STEPS = ("llama8b-decode", "llama8b-prefill")


def main() -> None:
    fig, axes = plt.subplots(1, len(STEPS), figsize=(13, 6), sharex=False)
    for ax, step in zip(axes, STEPS):
        found = json.loads((RUNS / f"{step}.disagg.json").read_text())["strategies"]
        names = list(found)
        rates = [found[n].get("slots_per_second") or 0.0 for n in names]
        model = [1 / found[n]["model_seconds"] if found[n].get("model_seconds") else None for n in names]
        colors = ["tab:blue" if found[n]["gate"] == "identical" else "lightgray" for n in names]
        ax.barh(names, rates, color=colors)
        for y, (rate, predicted, n) in enumerate(zip(rates, model, names)):
            if predicted is not None and found[n]["gate"] == "identical":
                ax.plot([predicted], [y], "k|", markersize=12)
            label = f"{rate:.2f}" if rate else ("refused" if found[n]["gate"].startswith("refused") else "gate failed")
            ax.text(rate + 0.1, y, label, va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{step}, emulated pair, 3 slots per graph", fontsize=10)
        ax.set_xlabel("slots per second (bars: measured; |: planner's model)")
        ax.tick_params(axis="y", labelsize=8)
        print(f"{step}:")
        for n, rate in zip(names, rates):
            print(f"  {n:40} {found[n]['gate'][:50]:50} {rate:6.2f}/s")
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
