"""Hostile model directories: an ``hf:DIR`` whose config.json or checkpoint transformers cannot
read stops every command that reads it at one line naming the directory, never a traceback.

Before 2026-12-06 each of these gave transformers' own traceback (``kernelfleet serve hf:DIR
--cpu`` of a config.json that is not JSON: ``OSError``; of a T5: ``ValueError``; a head count of 0:
``ZeroDivisionError``). Each goes through the ways a user reaches a directory: ``kernelfleet serve
--cpu`` (one device, and ``--strategy pipeline``, which builds each stage's part itself), the place
targets' model build (``workloads.targets.causal_lm``), and plan-serve's sizing of a capped device
(``plan_buckets.reserving``)."""

from __future__ import annotations

import json
import re
import sys

import pytest
from recorded import free_port

from kernelfleet.errors import UsageError
from kernelfleet.serve import plan_buckets
from kernelfleet.serve.plan_buckets import Buckets
from kernelfleet.workloads.targets import causal_lm

pytestmark = pytest.mark.unit

TINY = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


# name -> (config.json's bytes, {other file: bytes}, what the line says: a regular expression)
CORPUS = {
    "not JSON": (b"[1", {}, "its config.json does not load"),
    "no model type": (b"{}", {}, "its config.json does not load"),
    "a string for a size": (json.dumps({**TINY, "hidden_size": "x"}).encode(), {}, "its config.json does not load"),
    "a float for a count": (json.dumps({**TINY, "num_hidden_layers": 1e30}).encode(), {},
                            "its config.json does not load"),
    "an unknown model type": (b'{"model_type": "nosuch"}', {}, "its config.json does not load"),
    "no causal LM": (b'{"model_type": "t5"}', {}, "its config does not build a transformers causal LM"),
    "no heads": (json.dumps({**TINY, "num_attention_heads": 0}).encode(), {}, "its config.json does not load"),
    "a negative vocabulary": (json.dumps({**TINY, "vocab_size": -5, "eos_token_id": None,
                                          "bos_token_id": None}).encode(),
                              {}, "its config does not build a transformers causal LM"),
    "nested 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, {}, "its config.json does not load"),
    "not UTF-8": (b"\xff\xfe\x00{", {}, "its config.json does not load"),
    "a checkpoint of noise": (json.dumps(TINY).encode(), {"model.safetensors": bytes(range(256)) * 8},
                              "does not load"),
    "a shard index of noise": (json.dumps(TINY).encode(), {"model.safetensors.index.json": b"{not json"},
                               "does not load|is not a checkpoint index"),
}


@pytest.fixture(params=list(CORPUS), ids=list(CORPUS))
def hostile(request, tmp_path):
    config, files, says = CORPUS[request.param]
    (tmp_path / "config.json").write_bytes(config)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path, says, bool(files)


@pytest.mark.parametrize("flags", [[], ["--strategy", "pipeline", "--device", "a:2", "--device", "b:2"]],
                         ids=["single", "pipeline"])
def test_serve_says_one_line(monkeypatch, capsys, hostile, flags):
    from kernelfleet.cli import main

    folder, says, _ = hostile
    monkeypatch.setattr(sys, "argv", ["kernelfleet", "serve", f"hf:{folder}", "--cpu", "--listen",
                                      f"127.0.0.1:{free_port()}",
                                      *flags])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert stop.value.code == 2 and "Traceback" not in err, err
    assert last.startswith(f"kernelfleet: error: hf:{folder}: ") and re.search(says, last), last


def test_the_place_targets_build_says_one_line(hostile):
    folder, says, _ = hostile
    with pytest.raises(UsageError) as found:
        causal_lm(folder, "cpu", 0, None)
    assert str(found.value).startswith(f"hf:{folder}: ") and re.search(says, str(found.value))


def test_plan_serve_sizing_a_capped_device_says_one_line(hostile, tmp_path_factory):
    folder, says, checkpoint = hostile
    work = tmp_path_factory.mktemp("plans")
    spec = Buckets(folder, 2, 64, ["a:64", "b:32"], ["a:20", "b:20"], work / "plans", work / "work")
    if checkpoint:  # sizing reads the config alone, and these configs are good
        assert plan_buckets.reserving(spec).beside_bytes > 0
        return
    with pytest.raises(UsageError) as found:
        plan_buckets.reserving(spec)
    assert str(found.value).startswith(f"hf:{folder}: ") and re.search(says, str(found.value))
