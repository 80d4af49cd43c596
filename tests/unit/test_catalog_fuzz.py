"""Hostile catalog overrides: every seeded mutant of the built-in gpus.toml, given as an override
file, either loads or stops at one UsageError line naming the file — never a traceback. (A campaign
of 1,200 such mutants found none once the catalog was a typed document; the corpus keeps it so.)"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kernelfleet.catalog import Catalog
from kernelfleet.errors import UsageError

pytestmark = pytest.mark.unit

BUILTIN = Path(__file__).parents[2] / "kernelfleet" / "catalog" / "gpus.toml"
VALUES = ("nan", "inf", "-inf", "-1", "1e400", "0", '"x"', '""', "[]", "{}", "true", "99999999999999999999999",
          "[1, [2]]")


def mutant(lines: list[str], rng: random.Random) -> str:
    lines = list(lines)
    for _ in range(rng.randrange(1, 3)):
        op, i = rng.randrange(4), rng.randrange(len(lines))
        if op == 0 and "=" in lines[i]:
            lines[i] = lines[i].split("=")[0] + "= " + rng.choice(VALUES)
        elif op == 1:
            del lines[i]
        elif op == 2:
            lines.insert(i, lines[rng.randrange(len(lines))])
        else:
            j = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:j] + rng.choice(("[", "]", "=", '"', "\x00", "#")) + lines[i][j:]
    text = "\n".join(lines)
    return text[:rng.randrange(len(text))] if rng.random() < 0.3 else text


@pytest.mark.parametrize("seed", range(2))
def test_seeded_mutants_of_the_catalog_load_or_fail_in_one_line(seed, tmp_path):
    rng = random.Random(seed)
    lines = BUILTIN.read_text().split("\n")
    outcomes = {"loaded": 0, "refused": 0}
    for k in range(150):
        path = tmp_path / f"override-{k}.toml"
        path.write_text(mutant(lines, rng))
        try:
            Catalog.load(path)
            outcomes["loaded"] += 1
        except UsageError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc).strip(), str(exc)
            outcomes["refused"] += 1
    assert outcomes["loaded"] > 0 and outcomes["refused"] > 0
