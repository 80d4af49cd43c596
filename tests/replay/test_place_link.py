"""The recorded placement run (tests/data/h200-place-pairs) re-predicted with a measured link
(``python -m bench.place_table --link``): a link that says what today's flags say (4 µs + bytes at
25 GB/s, no wait) changes no prediction; a wait across devices raises every row that copies and no
other; and the link the lead measures on the H200 (``python -m bench.link_cost``, committed under
tests/data/h200-link/) re-predicts all 22 rows."""

from dataclasses import replace
from pathlib import Path

import pytest

from bench import place_table
from kernelfleet.costs.links import LinkTable

pytestmark = pytest.mark.replay

DATA = place_table.ROOT / "tests" / "data"
MEASURED = DATA / "h200-link" / "links.json"
FLAGS = DATA / "links-synthetic" / "flags.links.json"  # what the flags say, as a link document (not measured)
FOLDERS = sorted(p.parent for p in place_table.RECORDED.glob("*/disagg.json"))
MISSED = [f for f in FOLDERS if f.name in ("dit-denoise.same", "vlm-prefill.same")]  # rows of many-copy misses


def with_wait(wait_seconds: float) -> LinkTable:
    flags = LinkTable.load(FLAGS).links[0]
    return LinkTable([replace(flags, wait_seconds=wait_seconds)], "synthetic, not measured")


def predictions(found: dict) -> dict[str, float]:
    """Every re-predicted row's prediction (the strategies in a slot mode: no ablation, paced link or one slot)."""
    return {n: r["predicted_seconds"] for n, r in found.items() if r.get("predicted_seconds")
            and not n.startswith(("link ", "ablation")) and not n.endswith("1 slot")}


@pytest.mark.parametrize("folder", MISSED, ids=[f.name for f in MISSED])
def test_a_link_as_the_flags_say_changes_nothing_and_a_wait_raises_only_the_rows_that_copy(folder: Path):
    today = predictions(place_table.repredicted(folder))
    assert predictions(place_table.repredicted(folder, LinkTable.load(FLAGS))) == pytest.approx(today, rel=1e-12)
    waited = place_table.repredicted(folder, with_wait(1e-6))
    for name, seconds in predictions(waited).items():
        if waited[name].get("copies"):
            assert seconds > today[name], name
        else:
            assert seconds == pytest.approx(today[name], rel=1e-12), name


@pytest.mark.skipif(not MEASURED.is_file(), reason="no link measured on the H200 yet: python -m bench.link_cost "
                    "--out tests/data/h200-link (docs/validation/place-h200-pairs.md)")
def test_the_measured_link_re_predicts_every_recorded_row():
    measured = LinkTable.load(MEASURED)
    assert {(link.a, link.b) for link in measured.links} == {("a", "b")}
    rows = [place_table.row_of(folder, place_table.repredicted(folder, measured)) for folder in FOLDERS]
    assert len(rows) == 22 and all(r.predictions for r in rows)
    print(place_table.verdicts(rows))  # the figure the validation note reports (pytest -s)
