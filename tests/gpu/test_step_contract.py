"""The step contract on a real GPU: a replay from the saved state must give the outputs the last one
gave. A step with dropout in training mode draws new random numbers on every replay, so the gate
would have no reference to hold a plan to: it is refused in one line before anything is timed,
and the same step in eval mode is accepted."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def dropout_step(training: bool):
    import torch

    from kernelfleet.workloads.steps import Step

    def make(device: str, seed: int) -> Step:
        torch.manual_seed(seed)
        layer = torch.nn.Linear(256, 256, device=device)
        x = torch.randn(8, 256, device=device)
        return Step(lambda t: torch.nn.functional.dropout(layer(t), 0.5, training=training), (x,), layer,
                    "dropout-step")

    return make


def profiles():
    from kernelfleet.profile.devices import ProfileSpec

    return {"a": ProfileSpec("a", 64), "b": ProfileSpec("b", 32)}


def test_a_step_that_does_not_replay_alike_is_refused_naming_why():
    from kernelfleet.errors import UsageError
    from kernelfleet.runtime.gate import Gate

    with pytest.raises(UsageError, match=r"dropout-step: two replays on a from the same saved state differ in \d+ "
                                         r"output elements.*dropout"):
        Gate(dropout_step(True), profiles(), 1)


def test_the_same_step_in_eval_mode_replays_alike():
    from kernelfleet.runtime.gate import Gate

    gate = Gate(dropout_step(False), profiles(), 1)
    assert len(gate.references) == 1 and gate.references[0]["a"][0].shape == (8, 256)
