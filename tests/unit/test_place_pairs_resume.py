"""``bench.place_pairs --resume``: a table larger than one device call is made in several. The rows an
earlier run into the same folder finished are kept, not run again; the others run (here none may:
``--budget-s -1`` lists them as not run, so no GPU is needed)."""

import json

import pytest

from bench import place_pairs
from kernelfleet.serve.plan_buckets import on_gpu

pytestmark = pytest.mark.unit


def earlier_run(out, finished, failed=()):
    rows = [{"target": t, "pair": "same", "seconds": {"profile": 1.0}} for t in finished]
    rows += [{"target": t, "pair": "same", "seconds": {"profile": 1.0}, "failed": "profile"} for t in failed]
    for t in (*finished, *failed):
        (out / f"{t}.same").mkdir(parents=True)
    for t in finished:
        (out / f"{t}.same" / "disagg.json").write_text("{}")
    (out / "runs.json").write_text(json.dumps({"command": "first call", "rows": rows, "not_run": []}))


def test_resume_keeps_finished_rows_and_runs_the_rest(tmp_path, capsys):
    earlier_run(tmp_path, ["llama-decode"], failed=["moe-decode"])
    code = place_pairs.main(["--out", str(tmp_path), "--pairs", "same", "--targets", "llama-decode", "moe-decode",
                             "dit-denoise", "--budget-s", "-1", "--resume"])
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert code == 0
    assert [r["target"] for r in runs["rows"]] == ["llama-decode"]  # kept as it was
    assert runs["rows"][0]["seconds"] == {"profile": 1.0}
    assert runs["not_run"] == ["moe-decode.same", "dit-denoise.same"]  # a failed row is run again
    assert runs["command"].startswith("first call && ")
    assert "0 rows run, 1 kept from an earlier run, 2 not run" in capsys.readouterr().out


def test_without_resume_an_earlier_run_is_not_kept(tmp_path):
    earlier_run(tmp_path, ["llama-decode"])
    place_pairs.main(["--out", str(tmp_path), "--pairs", "same", "--targets", "llama-decode", "--budget-s", "-1"])
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert runs["rows"] == [] and runs["not_run"] == ["llama-decode.same"]
    assert not runs["command"].startswith("first call")


def test_the_two_gpu_pairs_put_b_on_gpu_1_in_every_command(tmp_path):
    """Issue 20's rows: the one-GPU pairs with b on GPU 1, and two whole GPUs. Each command names b's GPU
    (profile, then bench disagg's devices); on the CPU profile then fails in one line, which the row keeps."""
    assert [on_gpu(p) for p in place_pairs.PAIRS["different-x2"]] == ["a:64@0",
                                                                                    "b:32@1/math-attention"]
    assert [on_gpu(p) for p in place_pairs.PAIRS["gpus"]] == ["a@0", "b@1/math-attention"]
    row = place_pairs.run_row("llama-decode", "gpus", tmp_path / "row", tmp_path / "work", 2, 1, 1)
    log = (tmp_path / "row" / "log.txt").read_text()
    assert log.startswith("$ python -m kernelfleet profile llama-decode --profile a --profile b@1/math-attention ")
    assert row["failed"].startswith("profile exited ") and "Traceback" not in log


def test_the_nccl_phase_runs_bench_disagg_nccl_a_process_per_gpu(tmp_path):
    """``--phases nccl``: the row's plans under torchrun, one process a device, each device on its own
    GPU (here no plans were made: each process stops in one line, which the row keeps)."""
    row = place_pairs.run_row("llama-decode", "gpus", tmp_path / "row", tmp_path / "work", 2, 1, 1, ("nccl",))
    log = (tmp_path / "row" / "log.txt").read_text()
    assert log.startswith("$ python -m torch.distributed.run --nproc-per-node 2 -m kernelfleet bench disagg-nccl "
                          "llama-decode --plans ")
    assert "--device a@0 --device b@1/math-attention --slots 2" in log
    assert row["failed"].startswith("nccl exited 1: kernelfleet: error: ") and "plans: no such folder" in row["failed"]
    assert list(row["seconds"]) == ["nccl"]


def test_the_nccl_phase_refuses_a_pair_on_one_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        place_pairs.main(["--out", str(tmp_path), "--pairs", "gpus", "different", "--phases", "nccl"])
    assert stopped.value.code == 2
    assert "--phases nccl needs each pair on two GPUs (NCCL runs one process a GPU): different is on one" in \
        capsys.readouterr().err
