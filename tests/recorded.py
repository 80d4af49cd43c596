"""Helpers for tests that replay recordings (importable: tests/ is on the path, see conftest.py)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


def at_end_of(*recordings: Path):
    """An agent's clock for replayed recordings: the end of their last window, standing still (time is
    passed in, STYLE rule 3). The agent refuses windows far from its clock, so a recording from the
    past is replayed at the time it was made."""
    from kernelfleet.telemetry.replay import ReplaySource

    end = max(s.timestamp_seconds for path in recordings for batch in ReplaySource(path).batches() for s in batch)
    return lambda: end


# Prompts of different lengths for the serving tests, as token ids of the tiny models
PROMPTS = [[5, 9, 100, 3], [7] * 11, [1, 2, 3, 4, 5, 6, 7], [200], [42, 17] * 9, [3, 1, 4, 1, 5, 9, 2, 6]]


def reference(model, prompt: list[int], max_tokens: int, eos: bool = True) -> list[int]:
    """What transformers generates for ``prompt`` alone, greedily (``eos``: stopping at the end token)."""
    import torch

    ids = torch.tensor([prompt])
    extra = {} if eos else {"eos_token_id": None}
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                         pad_token_id=0, **extra)
    return out[0, len(prompt):].tolist()


def tiny_causal_lm(kind: str = "llama", seed: int = 0, vocab_size: int = 256):
    """A transformers causal LM small enough for a test on two CPU cores, random weights from
    ``seed``: ``llama`` (dense) or ``qwen2-moe`` (4 experts, 2 a token, a shared expert)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2MoeConfig

    shape = {"vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
    if kind == "llama":
        config = LlamaConfig(**shape)
    elif kind == "qwen2-moe":
        config = Qwen2MoeConfig(**shape, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                num_experts=4, num_experts_per_tok=2)
    else:
        raise ValueError(f"no tiny model {kind!r}")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().requires_grad_(False)


def served_model(model, name: str = "tiny", tokenizer=None):
    """``model`` as ``kernelfleet serve`` holds a loaded directory (kernelfleet.serve.model.Served)."""
    from kernelfleet.serve.model import Served

    eos = model.generation_config.eos_token_id
    return Served(name, model, tokenizer, frozenset([eos] if isinstance(eos, int) else eos or []),
                  model.config.vocab_size, model.config.max_position_embeddings)


@contextmanager
def serving(served, slots: int = 4, max_queue: int = 64, context_tokens: int = 128, token: str | None = None):
    """The server of ``served`` on a free loopback port, run by uvicorn as ``kernelfleet serve``
    runs it: yields its base URL and its engine; stopped on the way out."""
    from kernelfleet.fleet.listener import Listener, bind
    from kernelfleet.serve.command import build

    engine, app = build(served, slots, max_queue, context_tokens, token)
    sock = bind("127.0.0.1", 0)
    server = Listener(app, sock).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine
    finally:
        server.stop()
        engine.close()
