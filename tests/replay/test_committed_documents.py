"""Every document committed under tests/data/ loads through its typed model, old shapes included."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from kernelfleet.documents import read_text
from kernelfleet.profile.calibration import Calibration
from kernelfleet.schemas import DOCUMENTS

DATA = Path(__file__).resolve().parent.parent / "data"
KEY = re.compile(rb'^\s*\{\s*"(kernelfleet_\w+)"')  # a document names its kind in its first key


def committed() -> dict[str, list[Path]]:
    """Committed documents by schema stem: those that name a registered kind in their first key,
    and the calibration sweeps from before calibration files had one."""
    found: dict[str, list[Path]] = {stem: [] for stem in DOCUMENTS}
    for path in sorted(DATA.rglob("*.json*")):
        head = (gzip.open(path) if path.suffix == ".gz" else path.open("rb")).read(200)
        match = KEY.match(head)
        stem = match.group(1).decode().removeprefix("kernelfleet_") if match else None
        if stem in found:
            found[stem].append(path)
        elif path.name.startswith("calibration"):
            found["calibration"].append(path)
    return found


FOUND = committed()


def test_every_kind_has_committed_documents():
    # trace files (kernelfleet_trace) and counter groups are read elsewhere
    assert {stem: len(paths) > 0 for stem, paths in FOUND.items()} == {stem: True for stem in FOUND}
    assert len(FOUND["capture"]) >= 22


@pytest.mark.parametrize("path", [p for paths in FOUND.values() for p in paths], ids=lambda p: p.name)
def test_a_committed_document_loads_and_round_trips(path):
    """Each loads, and writes the current version, which reads back equal."""
    stem = next(s for s, paths in FOUND.items() if path in paths)
    loaded = DOCUMENTS[stem].load(path)
    text = loaded.to_json()
    assert json.loads(text)[f"kernelfleet_{stem}"] == 1
    assert type(loaded).from_json(text) == loaded


def test_the_committed_calibration_is_the_older_bare_list():
    path = next(iter(FOUND["calibration"]))
    assert isinstance(json.loads(read_text(path)), list)
    assert Calibration.load(path).rows[0]["name"] == "all+0"
