"""``kernelfleet serve --plans`` on one H200's two green-context partitions: the server's own decode
step profiled and planned per batch bucket through the commands a user runs, then served over HTTP
through the plans; its greedy tokens must equal the single-device server's, streamed or whole;
then, under a load of many clients at once (each step waits on other requests' prefills), the
online monitor must switch to the throughput plan, and every request still gets all its tokens.

The flow, for a tiny random-weight Llama (bf16, what the server serves), 2 slots (buckets 1 and 2):

    kernelfleet plan-serve hf:DIR --profile a:64 --profile b:32 --slots 2 --context 64 --out plans
    kernelfleet serve hf:DIR --plans plans --profile a:64@0 --profile b:32@0 --context 64   # as plan-serve prints it

plan-serve runs, per bucket B, ``kernelfleet profile hf:DIR,serve-decode,batch=B,slots=2,context=64
--profile a:64 --profile b:32`` and ``kernelfleet plan ... --policy all --state-home --in-flight 1``.

The second test serves with device b on SDPA's math attention (other kernels, plans over units):
its plan graphs pass the tolerance gate at start. The third serves a larger Llama (16 layers, 2.28 GB
of weights) on two devices each capped below what the whole model needs (``--device NAME:GB`` to
the planner and to the server), every plan made ``--weights-like`` one: each device holds only
the weights its plans read, prefill runs on the shares joined, and the tokens equal the
single-device server's. The fourth builds the plan graphs of a decode step with the 8B's attention
shape at its 2,048-token context (where the driver refused the 8B's until a copied kernel's
shared-memory limit was raised to its node's, 2026-12-06).

Run alone: ``pytest -m gpu tests/gpu/test_serve_placed.py -s`` (about 7 minutes on an H100).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import httpx
import pytest
from recorded import PROMPTS, ServeCommand, interleaved, tiny_causal_lm, whole_and_streamed

from kernelfleet.serve.graphs import buckets

pytestmark = pytest.mark.gpu
SLOTS, CONTEXT = 2, 64


def kernelfleet(*args: str) -> str:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kernelfleet", *args], capture_output=True, text=True, timeout=500,
                          check=False)
    print(f"$ kernelfleet {' '.join(args)}  ({time.monotonic() - began:.1f} s)\n{done.stderr[-1500:]}{done.stdout}")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def planned(tmp_path, folder, b: str = "b:32", devices: tuple[str, str] = ("a", "b"), slots: int = SLOTS,
            context: int = CONTEXT, extra: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Each bucket's step (of ``slots`` slots of ``context`` tokens) profiled on a:64 and ``b``, then
    planned on ``devices`` (``NAME[:GB]``, and ``extra`` flags of plan-serve) into ``tmp_path/plans``
    by ``kernelfleet plan-serve`` (the module docstring's commands); what each plan printed (its
    log, cut at each command) and the serve command plan-serve printed, as arguments."""
    printed = kernelfleet("plan-serve", f"hf:{folder}", "--profile", "a:64", "--profile", b,
                          *(f"--device={d}" for d in devices), "--slots", str(slots), "--context", str(context),
                          "--out", str(tmp_path / "plans"), "--work", str(tmp_path / "profiles"), *extra)
    serve = printed.strip().splitlines()[-1].removeprefix("serve them: kernelfleet ").split()
    log = (tmp_path / "profiles" / "plan-serve.log").read_text().split("$ kernelfleet ")
    return [said for said in log if said.startswith("plan ")], serve


def test_the_placed_server_gives_the_single_device_servers_greedy_tokens(tmp_path):
    folder = tmp_path / "llama"
    tiny_causal_lm("llama").config.save_pretrained(folder)  # config only: seeded weights, alike on every device
    said, serve = planned(tmp_path, folder)
    assert len(said) == len(buckets(SLOTS))
    for plan in said:
        assert "launches that touch the step's state are pinned to the home device" in plan
    assert serve == ["serve", f"hf:{folder}", "--plans", str(tmp_path / "plans"), "--profile", "a:64@0", "--profile",
                     "b:32@0", "--context", str(CONTEXT)]
    prompts = PROMPTS[:4]  # four requests on two slots: both buckets, slots reused
    with ServeCommand(f"hf:{folder}", "--slots", str(SLOTS), "--context", str(CONTEXT), startup_seconds=300) as single:
        want = asyncio.run(whole_and_streamed(single.url, prompts, 12))
    with ServeCommand(*serve[1:], startup_seconds=300) as placed:  # as plan-serve said, its slots the folder's
        got = asyncio.run(whole_and_streamed(placed.url, prompts, 12))
        metrics = httpx.get(f"{placed.url}/metrics").text
        # the load: 96 requests, 32 clients at once, on 2 slots; the monitor's windows are 300 ms
        loaded = [[(7 * i + j) % 256 for j in range(4 + i % 24)] for i in range(96)]
        answers = interleaved(placed.url, loaded, [24] * len(loaded), 32)
        after = httpx.get(f"{placed.url}/metrics").text
    print(placed.err)
    assert placed.returncode == 0, placed.err
    assert "through the plans of" in placed.err and "buckets 1, 2" in placed.err
    assert got == want
    # b holds only the weights its launches read in some plan (the latency plan is a alone here)
    held = dict(re.findall(r"\b([ab]) [0-9.]+ GiB \((\d+)%\)", placed.err))
    assert held["a"] == "100" and int(held["b"]) < 100, placed.err
    assert "kernelfleet_serve_plan_switches_total" in metrics
    steps = [line for line in metrics.splitlines() if line.startswith("kernelfleet_serve_plan_steps_total")]
    print("\n".join(steps))
    assert sum(float(line.rsplit(" ", 1)[1]) for line in steps) > 0
    steps_after = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in after.splitlines()
                   if line.startswith("kernelfleet_serve_plan_steps_total{")}
    switches = float(next(line for line in after.splitlines()
                          if line.startswith("kernelfleet_serve_plan_switches_total")).rsplit(" ", 1)[1])
    print(f"under load: steps by plan {steps_after}, switches {switches:g}")
    assert [len(tokens) for tokens in answers] == [24] * len(loaded)
    assert steps_after["throughput"] > 0 and switches >= 1


def test_the_placed_server_with_other_kernels_on_one_device_passes_the_tolerance_gate(tmp_path):
    """The same flow with device b on SDPA's math attention (other kernels for the same ops: the
    plans place units): each plan graph that mixes the two devices' kernels must pass the tolerance
    gate at start (the others bit for bit), and every request gets all its tokens; how many greedy
    tokens match the single-device server's is printed (random weights: near-ties may flip)."""
    folder = tmp_path / "llama"
    tiny_causal_lm("llama").config.save_pretrained(folder)
    planned(tmp_path, folder, b="b:32/math-attention")
    prompts = PROMPTS[:4]
    with ServeCommand(f"hf:{folder}", "--slots", str(SLOTS), "--context", str(CONTEXT), startup_seconds=300) as single:
        want = asyncio.run(whole_and_streamed(single.url, prompts, 12))
    with ServeCommand(f"hf:{folder}", "--plans", str(tmp_path / "plans"), "--profile", "a:64@0", "--profile",
                      "b:32@0/math-attention", "--slots", str(SLOTS), "--context", str(CONTEXT),
                      startup_seconds=300) as placed:
        got = asyncio.run(whole_and_streamed(placed.url, prompts, 12))
    print(placed.err)
    assert placed.returncode == 0, placed.err
    gates = [line for line in placed.err.splitlines() if line.strip().startswith("gate: ")]
    assert gates and all(line.strip().startswith(("gate: identical", "gate: within tolerance")) for line in gates)
    assert [len(tokens) for tokens in got] == [len(tokens) for tokens in want]
    same = sum(a == b for x, y in zip(got, want) for a, b in zip(x, y))
    print(f"greedy tokens equal to the single-device server's: {same} of {sum(map(len, want))}")


def test_a_model_larger_than_either_capped_device_is_served_through_the_plans(tmp_path):
    """Neither device may hold the whole model: planned with each capped at 1.3 GB (of the step's
    2.28 GB of weights) and served with each capped at 3.0 GB, where the whole model, its cache and
    the server's 1 GiB workspace need 3.36. A device holds what its launches read in every plan it
    may switch to (two buckets' two policies); plans made one by one need not agree on where the
    weights live (on an H200, 2026-12-06, four such plans had b read 2.08 of the 2.12 GiB between
    them), so every plan is made ``--weights-like`` the largest bucket's throughput plan
    (``plan-serve --one-share``). Both devices hold part, every graph is gated, and the tokens equal
    the single-device server's (greedy, whole and streamed)."""
    from transformers import LlamaConfig

    folder = tmp_path / "llama"
    LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=256).save_pretrained(folder)
    said, _ = planned(tmp_path, folder, devices=("a:1.3", "b:1.3"), extra=("--one-share",))
    first, *served = said  # the largest bucket's first plans, then every bucket's like its throughput plan
    assert "single:a" not in first and "single:b" not in first  # neither holds the step
    assert len(served) == len(buckets(SLOTS)) and all("weights like" in plan for plan in served)
    prompts = PROMPTS[:4]
    with ServeCommand(f"hf:{folder}", "--slots", str(SLOTS), "--context", str(CONTEXT), startup_seconds=300) as single:
        want = asyncio.run(whole_and_streamed(single.url, prompts, 12))
    with ServeCommand(f"hf:{folder}", "--plans", str(tmp_path / "plans"), "--profile", "a:64@0", "--profile", "b:32@0",
                      "--device", "a:3.0", "--device", "b:3.0", "--slots", str(SLOTS), "--context", str(CONTEXT),
                      startup_seconds=300) as placed:
        got = asyncio.run(whole_and_streamed(placed.url, prompts, 12))
    print(placed.err)
    assert placed.returncode == 0, placed.err
    held = {name: int(share) for name, share in re.findall(r"\b([ab]) [0-9.]+ GiB \((\d+)%\)", placed.err)}
    assert held["a"] < 100 and held["b"] < 100 and held["a"] + held["b"] >= 100, placed.err
    assert "over every device's share" in placed.err
    gates = [line for line in placed.err.splitlines() if line.strip().startswith("gate: ")]
    assert gates and all(line.strip().startswith(("gate: identical", "gate: within tolerance")) for line in gates)
    assert got == want


def test_a_long_context_decode_with_the_8bs_head_shape_builds_into_plan_graphs(tmp_path):
    """The 8B's attention shape (head dim 128, 4 query heads a KV head) at its 2,048-token context
    and 8 slots, in a 2-layer model: on the H200 (2026-12-06) the 8B's plan graphs could not be
    built, the driver refusing a copy of cuDNN's split-KV reduction kernel
    (``lean_reduction_kernel``), which the tiny models' short contexts never launch. Every bucket's
    plans must build, pass their gate and serve the tokens of the single-device server attending the
    whole context too (``--shortest-context 2048``: a kernel attending 128 positions sums in another
    order than one attending 2,048). Then the plans carried to context buckets from 128
    (``--shortest-context 128``) must give the tokens of the single-device server's own buckets."""
    from transformers import LlamaConfig

    folder = tmp_path / "llama"
    LlamaConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096).save_pretrained(folder)
    planned(tmp_path, folder, slots=8, context=2048)
    prompts = PROMPTS[:4]
    with ServeCommand(f"hf:{folder}", "--slots", "8", "--context", "2048", "--shortest-context", "2048",
                      startup_seconds=300) as single:
        want = asyncio.run(whole_and_streamed(single.url, prompts, 12))
    with ServeCommand(f"hf:{folder}", "--plans", str(tmp_path / "plans"), "--profile", "a:64@0", "--profile", "b:32@0",
                      "--slots", "8", "--context", "2048", startup_seconds=300) as placed:
        got = asyncio.run(whole_and_streamed(placed.url, prompts, 12))
    print(placed.err)
    assert placed.returncode == 0, placed.err
    assert got == want
    # the plans carried to context buckets from 128: the single-device server's graphs of the same buckets
    with ServeCommand(f"hf:{folder}", "--slots", "8", "--context", "2048", startup_seconds=300) as single:
        want = asyncio.run(whole_and_streamed(single.url, prompts, 12))
    with ServeCommand(f"hf:{folder}", "--plans", str(tmp_path / "plans"), "--profile", "a:64@0", "--profile", "b:32@0",
                      "--slots", "8", "--context", "2048", "--shortest-context", "128", startup_seconds=300) as placed:
        got = asyncio.run(whole_and_streamed(placed.url, prompts, 12))
    print(placed.err)
    assert placed.returncode == 0, placed.err
    assert "context buckets 128, 256, 512, 1024, 2048" in placed.err and "not carried" not in placed.err
    gates = [line for line in placed.err.splitlines() if line.strip().startswith("gate: ")]
    assert any("bucket 8 context 128 latency" in line for line in gates), gates
    assert got == want
