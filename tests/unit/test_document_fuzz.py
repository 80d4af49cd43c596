"""Hostile documents: every mutant of a committed program, capture, cost table or plan either goes
through or stops at one UsageError line, never a traceback and never a hang.

The corpus is seeded mutations of the committed documents (tests/data/plan's layered2 program, its
costs and plan; the tiny Llama decode capture): a value replaced by NaN, Infinity, -1, 10^30, a
string, a list, an object, null or a boolean; a key dropped; a value nested 50 or 5,000 lists
deep. Each mutant goes as far as a user's would: a capture through the assembler and the
dependency graph, a program or cost table through ``kernelfleet plan``'s setup and every policy,
a plan through its reader. A campaign of 1,200 such mutants found four faults after the typed
documents: a hex parameter that is not hex, a parameter whose claimed size sent the assembler
over 10^29 offsets (a hang), cost-table seconds so large the MILP's answer placed no device
(KeyError), and a value of 10^30 where a count belongs. ``REGRESSIONS`` keeps one of each, with
the substring of the line each now gives.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import signal
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import dependencies
from kernelfleet.kernels.assemble import assemble
from kernelfleet.kernels.raw import RawCapture
from kernelfleet.plan import command
from kernelfleet.plan.model import Plan

pytestmark = pytest.mark.unit

DATA = Path(__file__).parents[1] / "data"
PLAN = DATA / "plan"
CAPTURE = DATA / "h200-capture" / "llama-decode.capture.json.gz"
VALUES = (float("nan"), float("inf"), -1, 1e30, 10**30, "x", [], {}, None, True, [1, [2, [3]]], 2**63, 0.5)
DEEP = "__DEEP__"


def documents() -> dict[str, dict]:
    return {"program": json.loads((PLAN / "layered2.program.json").read_text()),
            "costs": json.loads((PLAN / "layered2.costs.json").read_text()),
            "plan": json.loads((PLAN / "layered2.plan.json").read_text()),
            "capture": json.loads(gzip.decompress(CAPTURE.read_bytes()))}


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:6]):
            yield from _paths(value, (*prefix, i))


def mutant(doc: dict, rng: random.Random) -> str:
    doc = json.loads(json.dumps(doc))
    path = rng.choice([p for p in _paths(doc) if p])
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    op = rng.randrange(4)
    if op == 1 and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = DEEP if op == 2 else rng.choice(VALUES)
    depth = rng.choice((50, 5000))
    return json.dumps(doc).replace(f'"{DEEP}"', "[" * depth + "0" + "]" * depth)


def go(kind: str, text: str, tmp_path: Path) -> str:
    """Take the document as a user's command would; "ok" or the one line it stopped at."""
    def hang(*_):
        raise TimeoutError(f"a {kind} mutant ran past 10 s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(10)
    try:
        with redirect_stdout(io.StringIO()):  # HiGHS greets on stdout
            if kind == "capture":
                (tmp_path / "c.json.gz").write_bytes(gzip.compress(text.encode()))
                dependencies(assemble(RawCapture.load(tmp_path / "c.json.gz")))
            elif kind == "plan":
                Plan.from_json(text, "plan.json")
            else:
                mine = {"program": (PLAN / "layered2.program.json").read_text(),
                        "costs": (PLAN / "layered2.costs.json").read_text(), kind: text}
                (tmp_path / "p.json").write_text(mine["program"])
                (tmp_path / "c.json").write_text(mine["costs"])
                done = command.setup(tmp_path / "p.json", tmp_path / "c.json", [], [], 25.0, [], [], None)
                command.make_plans(done.problem, "all", 2)
    except UsageError as exc:
        line = str(exc)
        assert line and "\n" not in line.strip(), repr(line)
        return line
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return "ok"


def _capture_with(params) -> str:
    doc = documents()["capture"]
    node = next(n for n in doc["nodes"] if n.get("params"))
    node["params"] = params
    return json.dumps(doc)


def _costs_with(seconds: float) -> str:
    doc = documents()["costs"]
    for row in doc["seconds"]:
        for device in row:
            row[device] = seconds
    return json.dumps(doc)


REGRESSIONS = {
    "a parameter that is not hex": ("capture", lambda: _capture_with([[0, 8, "zz" * 8]]), "params"),
    "a parameter claiming 10^30 bytes": ("capture", lambda: _capture_with([[0, 10**30, "00" * 8]]), "params"),
    "seconds the MILP cannot place by": ("costs", lambda: _costs_with(1e30), "seconds"),
    "NaN seconds": ("costs", lambda: _costs_with(float("nan")), "seconds"),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_each_mutant_that_once_broke_now_gives_one_line(name, tmp_path):
    kind, make, field = REGRESSIONS[name]
    line = go(kind, make(), tmp_path)
    assert line != "ok" and field in line


@pytest.mark.parametrize("seed", range(2))
def test_seeded_mutants_of_every_committed_document_go_through_or_stop_in_one_line(seed, tmp_path):
    rng = random.Random(seed)
    docs = documents()
    results = []
    for _ in range(60):
        kind = rng.choice(sorted(docs))
        results.append(go(kind, mutant(docs[kind], rng), tmp_path))
    assert len(results) == 60 and 0 < results.count("ok") < 60  # the corpus holds both kinds
