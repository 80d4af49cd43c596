"""Typed documents: one-line errors with the file and the field path, versions, published schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelfleet.costs.table import CostTable
from kernelfleet.errors import UsageError
from kernelfleet.kernels.ir import Access, Buffer, Launch, Program
from kernelfleet.plan.model import Plan
from kernelfleet.profile.calibration import Calibration
from kernelfleet.schemas import SCHEMA_DIR, schema_files


def test_the_committed_schemas_are_the_models_schemas():
    """Fails when a model changed and ``make schemas`` was not run (or a schema file is left over)."""
    expected = schema_files()
    committed = {p.name: p.read_text() for p in SCHEMA_DIR.glob("*.schema.json")}
    assert sorted(committed) == sorted(expected), "run `make schemas`"
    stale = [name for name, text in expected.items() if committed[name] != text]
    assert not stale, f"stale {stale}: run `make schemas`"


def test_a_schema_requires_the_version_key_and_gives_field_types():
    schema = json.loads(schema_files()["costs.schema.json"])
    assert schema["required"] == ["kernelfleet_costs", "seconds"]
    assert schema["properties"]["kernelfleet_costs"]["const"] == 1
    precision = json.loads(schema_files()["program.schema.json"])["$defs"]["Access"]["properties"]["mode"]
    assert precision["enum"] == ["read", "write", "readwrite"]


@pytest.mark.parametrize("text, message", [
    ('{"kernelfleet_costs": 1, "seconds": [{}, {}, {}, {"gpu0": "fast"}]}',
     "costs.json: not a cost table: seconds.3.gpu0: Input should be a valid number"),
    ('{"kernelfleet_costs": 1, "seconds": [{"gpu0": NaN}]}', "costs.json: not a cost table: seconds.0.gpu0: "),
    ('{"kernelfleet_costs": 1, "seconds": [{"gpu0": Infinity}]}', "seconds.0.gpu0: Input should be a finite number"),
    ('{"kernelfleet_costs": 1, "seconds": [{"gpu0": 1e999}]}', "seconds.0.gpu0: Input should be a finite number"),
    ('{"kernelfleet_costs": 1, "seconds": [{}], "bytes": [-3]}', "bytes must be a number >= 0 or null, got -3"),
    ('{"kernelfleet_costs": 1, "seconds": [{}], "precision": ["bf17"]}', "precision.0: precision must be one of"),
    ('{"kernelfleet_costs": 1, "seconds": [], "colour": "red"}', "colour: unknown field"),
    ('{"kernelfleet_costs": 2, "seconds": []}', "costs.json: cost table: kernelfleet_costs: expected kernelfleet_costs=1, got 2"),
    ('{"seconds": []}', "expected kernelfleet_costs=1"),
    ('{"kernelfleet_costs": 1, "seconds": [', "costs.json: not a cost table: Invalid JSON"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_the_field(text, message):
    with pytest.raises(UsageError) as caught:
        CostTable.from_json(text, "costs.json")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_bad_plan_names_the_field_inside_its_details():
    plan = json.loads(Plan("single:a", ["a"], 1.0, details={"home": "a"}).to_json())
    plan["details"]["in_flight"] = {"requests": "three"}
    with pytest.raises(UsageError, match=r"^p.json: not a plan: details.in_flight.requests: Input should be a valid "
                                         r"integer"):
        Plan.from_json(json.dumps(plan), "p.json")
    plan["details"] = {"hom": "a"}
    with pytest.raises(UsageError, match="details.hom: unknown field"):
        Plan.from_json(json.dumps(plan), "p.json")


def test_building_a_document_in_code_gives_the_same_errors():
    with pytest.raises(UsageError, match=r"^buffer: size_bytes: Input should be greater than 0, got 0$"):
        Buffer(1, 0, 0, 0)
    with pytest.raises(UsageError, match="access: mode: mode must be one of"):
        Access(0, 0, 1, "peek", "schema")
    with pytest.raises(UsageError, match=r"launch 0: access to unknown buffer 3"):
        Program([], [Launch(0, "kernel", "k", (Access(3, 0, 1, "read", "schema"),))])
    with pytest.raises(UsageError, match=r"^plan: details.in_flight.chosen: Field required \(2 more errors\)$"):
        Plan("p", [], 0.0, details={"in_flight": {"requests": 1}})


def test_an_older_shape_is_upgraded_on_reading(tmp_path: Path):
    rows = [{"name": "all+0", "sms": None, "granted_sms": None, "hog_sms": None, "gemm_flops_per_second": 8e14,
             "gemv_bytes_per_second": 3.5e12, "copy_bytes_per_second": None, "hog_bytes_per_second": None}]
    (tmp_path / "old.json").write_text(json.dumps(rows))
    old = Calibration.load(tmp_path / "old.json")
    old.save(tmp_path / "new.json.gz")
    assert Calibration.load(tmp_path / "new.json.gz") == old == Calibration(rows)
    (tmp_path / "bad.json").write_text(json.dumps([{**rows[0], "gemm_flops_per_second": -1}]))
    with pytest.raises(UsageError, match="bad.json: not a calibration: rows.0.gemm_flops_per_second: Input should be "
                                         "greater than 0"):
        Calibration.load(tmp_path / "bad.json")
    with pytest.raises(UsageError, match="expected kernelfleet_calibration=1"):
        Calibration.from_json('{"rows": []}')
