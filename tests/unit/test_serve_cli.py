"""``kernelfleet serve hf:DIR --cpu`` as a user runs it: a saved model directory with a tokenizer,
served by the real command in its own process, answering text prompts with the tokens
``generate`` gives; bad flags and targets are one line, before anything is served."""

import json
import socket

import httpx
import pytest
import torch
from recorded import ServeCommand, free_port, reference, run_main, tiny_causal_lm, word_tokenizer

from kernelfleet.errors import UsageError
from kernelfleet.serve.command import fitted
from kernelfleet.serve.device import Gpu
from kernelfleet.serve.memory import FIXED_WORKSPACE_BYTES

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_causal_lm("llama", seed=3).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def test_the_command_serves_text_prompts_whole_and_streamed(model_dir):
    from transformers import AutoModelForCausalLM

    with ServeCommand(f"hf:{model_dir}", "--cpu", "--slots", "2", "--context", "64") as server:
        url = server.url
        body = {"prompt": "w5 w9 w100 w3", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        whole = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60) as answer:
            chunks = [line for line in answer.iter_lines() if line.startswith("data: {")]
        models = httpx.get(f"{url}/v1/models").json()
    err = server.err
    assert server.returncode == 0, err
    assert f"kernelfleet serve: {model_dir.name} on {url}/v1 (2 slots of 64 tokens, the CPU)" in err
    saved = AutoModelForCausalLM.from_pretrained(model_dir)
    assert whole["token_ids"] == reference(saved, [5, 9, 100, 3], 8, eos=False)
    assert whole["text"] == " ".join(f"w{t}" for t in whole["token_ids"])
    assert "".join(json.loads(c[6:])["choices"][0]["text"] for c in chunks) == whole["text"]
    assert models["data"][0]["id"] == model_dir.name


@pytest.mark.parametrize(("strategy", "says"), [
    ("replicas", "(4 slots of 64 tokens, replicas: small (1 slots), big (3 slots))"),
    ("split", "(4 slots of 64 tokens, split: small (1 slots), big (4 slots))"),
])
def test_the_command_serves_under_a_strategy_over_two_cpu_twins(model_dir, strategy, says):
    from transformers import AutoModelForCausalLM

    with ServeCommand(f"hf:{model_dir}", "--cpu", "--strategy", strategy, "--device", "small:1", "--device", "big:3",
                      "--slots", "4", "--context", "64", "--prefill-chunk", "3") as server:  # the prompt in 2 chunks
        body = {"prompt": [5, 9, 100, 3], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
        metrics = httpx.get(f"{server.url}/metrics").text
    assert server.returncode == 0 and says in server.err, server.err
    assert whole["token_ids"] == reference(AutoModelForCausalLM.from_pretrained(model_dir), [5, 9, 100, 3], 6, eos=False)
    assert 'device_busy_seconds_total{device="small"}' in metrics  # the split's prefill, or the first replica's request


def test_a_model_over_each_cap_serves_under_the_pipeline_and_is_refused_whole(model_dir):
    """Caps under the whole model's weights but over each half's: the check single and replicas run
    on GPUs (command.fitted, each device the whole model) refuses them in one line; the pipeline
    serves ``generate``'s tokens over two CPU twins of those caps, each its own part."""
    from transformers import AutoModelForCausalLM

    weights = sum(p.numel() * p.element_size() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    cap_bytes = FIXED_WORKSPACE_BYTES + weights * 3 // 4
    for strategy, gpus in [("single", [Gpu("cuda:0", "a", cap_bytes, 10**12, True)]),
                           ("replicas", [Gpu("cuda:0", "a", cap_bytes, 10**12, True),
                                         Gpu("cuda:1", "b", cap_bytes, 10**12, True)])]:
        with pytest.raises(UsageError) as refused:
            fitted(gpus, f"hf:{model_dir}", strategy, 2, torch.float32, 64)
        assert str(refused.value).startswith("the model does not fit under the cap of a (cuda:0, "), strategy
    cap_gb = f"{cap_bytes / 1e9:.9f}"
    caps = ["--device", f"a:{cap_gb}", "--device", f"b:{cap_gb}", "--slots", "2", "--context", "64"]
    with ServeCommand(f"hf:{model_dir}", "--cpu", "--strategy", "pipeline", *caps) as server:
        body = {"prompt": [5, 9, 100, 3], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
        metrics = httpx.get(f"{server.url}/metrics").text
    assert server.returncode == 0, server.err
    assert ("(2 slots of 64 tokens, pipeline: a: layers 0-0 and the embedding, b: layers 1-1 and the norm and head; "
            "1 micro-batch)") in server.err  # two CPU stages cannot overlap: one group
    assert whole["token_ids"] == reference(AutoModelForCausalLM.from_pretrained(model_dir), [5, 9, 100, 3], 6, eos=False)
    assert whole["text"] == " ".join(f"w{t}" for t in whole["token_ids"])
    for device in "ab":
        assert f'kernelfleet_serve_device_busy_seconds_total{{device="{device}"}}' in metrics


@pytest.mark.parametrize(("args", "code", "says"), [
    pytest.param(["{dir}"], 2, "pass --cpu to run the model eagerly on the CPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU to serve on")),
    (["llama8b-decode", "--cpu"], 2, "kernelfleet serve takes hf:DIR"),
    (["hf:/no/such/dir", "--cpu"], 2, "no config.json there"),
    (["{dir}", "--cpu", "--listen", "0.0.0.0:8000", "--allow-remote"], 2, "without a token"),
    (["{dir}", "--cpu", "--listen", "0.0.0.0:8000"], 2, "not a loopback address"),
    (["{dir}", "--cpu", "--listen", "127.0.0.1:{port}", "--slots", "0"], 2, "--slots must be at least 1"),
    (["{dir}", "--cpu", "--listen", "127.0.0.1:{port}", "--context", "100000"], 2, "--context must be from 2"),
    (["{dir}", "--cpu", "--listen", "127.0.0.1:{busy}"], 3, "the port is in use"),
    (["{dir}", "--device", "h200"], 2, "--device takes NAME:MEMORY_GB[@GPU]"),
    (["{dir}", "--cpu", "--device", "h200:40"], 2, "--device names a GPU; with --cpu"),
    (["{dir}", "--dtype", "int8"], 2, "--dtype takes bfloat16, float16, float32"),
    (["{dir}", "--cpu", "--prefill-chunk", "-1"], 2, "--prefill-chunk takes a number of tokens, 0 for whole prompts"),
    (["{dir}", "--cpu", "--prefill-batch", "0"], 2, "--prefill-batch takes the whole prompts one forward prefills at most"),
    (["{dir}", "--cpu", "--prefill-batch", "4", "--prefill-chunk", "16"], 2,
     "--prefill-batch batches whole prompts and --prefill-chunk cuts them into chunks: pass one of the two"),
    (["{dir}", "--cpu", "--shortest-context", "0"], 2, "--shortest-context takes 1 or more tokens, got 0"),
    (["{dir}", "--plans", "{dir}", "--profile", "a:64", "--shortest-context", "0"], 2,
     "--shortest-context takes 1 or more tokens, got 0"),
    (["{dir}", "--cpu", "--strategy", "ring"], 2, "--strategy takes single, replicas, split, pipeline, got 'ring'"),
    (["{dir}", "--cpu", "--strategy", "pipeline", "--device", "a:2"], 2, "it takes two or more, got 1"),
    (["{dir}", "--cpu", "--strategy", "pipeline", "--device", "a:2", "--device", "b:2", "--device", "c:2"], 2,
     "cuts the model's 2 layers into one stage a --device: it takes 2 to 2 --device, got 3"),
    (["{dir}", "--cpu", "--strategy", "pipeline", "--device", "a:2", "--device", "b:2", "--micro-batches", "0"], 2,
     "--micro-batches must be at least 1, got 0"),
    (["{dir}", "--cpu", "--strategy", "pipeline", "--device", "a:2", "--device", "b:1.0737"], 2,
     "the model does not fit as stage 2 of 2 (layers 1-1 and the norm and head) under the cap of b (a CPU twin"),
    (["{dir}", "--cpu", "--strategy", "split", "--device", "a:1"], 2, "--strategy split takes two --device"),
    (["{dir}", "--cpu", "--strategy", "replicas", "--device", "a:1", "--device", "a:2"], 2,
     "--device names must differ"),
    (["{dir}", "--cpu", "--strategy", "replicas", "--device", "a:1@1", "--device", "b:1"], 2, "it has no @GPU"),
    (["{dir}", "--cpu", "--strategy", "replicas", "--device", "a:1", "--device", "b:1", "--slots", "1"], 2,
     "--slots 1 cannot give each of the 2 devices a slot"),
])
def test_bad_flags_and_targets_are_one_line(monkeypatch, capsys, model_dir, args, code, says):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        given = [a.format(dir=f"hf:{model_dir}", port=free_port(), busy=busy.getsockname()[1]) for a in args]
        got, line = run_main(monkeypatch, capsys, *given)
    assert got == code and says in line, line


def test_the_shortest_context_buckets_help_states_the_default_the_graphs_use():
    """``--shortest-context``'s default is serve/graphs.py's (the help says it; cli_serve does not import torch)."""
    import inspect

    from kernelfleet.cli_serve import serve
    from kernelfleet.serve.graphs import SHORTEST_CONTEXT

    option = inspect.signature(serve).parameters["shortest_context"].default
    assert option.default is None and f"(default {SHORTEST_CONTEXT})" in option.help
