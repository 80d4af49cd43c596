"""The link model's defaults and checks, apart from the planners: the CLI offers them as flag
defaults on every machine, including a GPU node with the see half only (no numpy, no solver).
"""

from __future__ import annotations

from kernelfleet.errors import UsageError

# What one copy costs the executor's graph beyond its bytes: on an H200's two partitions, plans of
# the Llama decode and prefill steps with 54 and 23 copies ran 4.3 and 3.1 us per copy slower than
# their zero-cost prediction (docs/place.md, "Devices that capture different kernels").
COPY_US = 4.0
LINK_GBPS = 25.0  # a PCIe 4.0 x16 link's order: what two GPUs of different types in one host share
MAX_COPY_US = 10_000.0


def check_link(link_gbps: float, copy_us: float) -> None:
    """UsageError naming the flag unless ``--link-gbps`` and ``--copy-us`` make a link."""
    if not link_gbps > 0:
        raise UsageError(f"--link-gbps must be positive, got {link_gbps}")
    if not 0 <= copy_us <= MAX_COPY_US:
        raise UsageError(f"--copy-us must be between 0 and {MAX_COPY_US:g} microseconds, got {copy_us}")
