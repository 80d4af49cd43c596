"""GPU workloads for recording traces: each runs for a set time and keeps a timeline.

Run only on a GPU machine (imports torch). Each loop returns a ``Timeline``:
the wall-clock end time of every iteration, reconstructed from CUDA events
(GPU time since an anchor event recorded right after a synchronize, plus the
host wall time at that synchronize), and the FLOPs or bytes of one iteration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from kernelfleet.validation.timeline import work_between


@dataclass
class Timeline:
    name: str
    work_per_iteration: float  # FLOPs (GEMMs) or bytes moved (copies)
    unit: str  # "flop" or "byte"
    start_wall: float = 0.0
    ends_wall: list[float] = field(default_factory=list)

    def work_between(self, start: float, end: float) -> float:
        """Work completed in [start, end], apportioning iterations that straddle an edge."""
        return work_between(self.start_wall, self.ends_wall, self.work_per_iteration, start, end)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "work_per_iteration": self.work_per_iteration,
            "unit": self.unit,
            "start_wall": self.start_wall,
            "ends_wall": self.ends_wall,
        }


def _run(name: str, step, work: float, unit: str, seconds: float, warmup: int = 5) -> Timeline:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    anchor = torch.cuda.Event(enable_timing=True)
    anchor.record()
    torch.cuda.synchronize()
    timeline = Timeline(name, work, unit, start_wall=time.time())
    events = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        step()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        events.append(event)
        if len(events) % 64 == 0:
            events[-32].synchronize()  # keep the queue short so the deadline holds
    torch.cuda.synchronize()
    timeline.ends_wall = [timeline.start_wall + anchor.elapsed_time(e) / 1000.0 for e in events]
    return timeline


def gemm(seconds: float, size: int = 8192, dtype: torch.dtype = torch.bfloat16) -> Timeline:
    a = torch.randn(size, size, device="cuda", dtype=dtype)
    b = torch.randn(size, size, device="cuda", dtype=dtype)
    c = torch.empty(size, size, device="cuda", dtype=dtype)
    return _run(f"{dtype}-gemm-{size}", lambda: torch.mm(a, b, out=c), 2.0 * size**3, "flop", seconds)


def fp8_gemm(seconds: float, size: int = 8192) -> Timeline:
    a = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.ones((), device="cuda")
    return _run(
        f"fp8-gemm-{size}",
        lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        2.0 * size**3,
        "flop",
        seconds,
    )


def copy(seconds: float, gib: int = 1) -> Timeline:
    src = torch.randn(gib * 2**28, device="cuda")
    dst = torch.empty_like(src)
    nbytes = 2.0 * src.numel() * src.element_size()  # read + write
    return _run(f"copy-{gib}GiB", lambda: dst.copy_(src), nbytes, "byte", seconds)


def transformer(seconds: float, layers: int = 8, width: int = 2048, batch: int = 8, tokens: int = 1024) -> Timeline:
    """A small encoder stack, forward + backward + AdamW step, bf16 autocast."""
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(width, nhead=16, dim_feedforward=4 * width, batch_first=True),
        num_layers=layers,
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, tokens, width, device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # Model FLOPs per step: 6 × params × tokens (matmuls) + attention 12·L·T²·d (fwd+bwd).
    params = sum(p.numel() for p in model.parameters())
    flops = 6.0 * params * batch * tokens + 12.0 * layers * batch * tokens**2 * width
    return _run("transformer-train", step, flops, "flop", seconds, warmup=3)
