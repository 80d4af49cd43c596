"""What a copy between two devices costs inside the executor's graph, as measured (``kernelfleet_links``).

Until 2026-12-01 every prediction priced a copy as ``--copy-us`` (4 µs) plus its bytes at
``--link-gbps`` (25 GB/s), figures fitted on two plans of one H200's partitions, never measured on
the pair a plan runs on; the 9 of 147 chained rows that missed their prediction by more than 10 %
were all plans of 12-47 copies (docs/validation/place-h200-pairs.md). ``profile/linkcost.py``
measures, on the pair, graphs built as the executor builds them (``runtime/link.py``: memcpy nodes
in the destination's context; kernels copied into each partition's context):

* ``queued``: copies of one size chained on the link, nothing else: what a copy costs when copies
  queue (free slots' copies do), as a fixed cost and a bandwidth fitted over the sizes;
* ``wait_seconds``: what a dependency between nodes of two devices adds to the later one's start
  (kernels alternating between the devices, against the same kernels with one switch);
* ``fork_seconds``: what a copy branching off a chain of kernels (a kernel whose bytes a copy
  takes, nobody on the chain waiting for it) adds to that chain, per copy: copies *beside* kernels;
* ``between``: a copy between a kernel on one device and its reader on the other, less the two
  waits around it: the copy as a plan's critical path meets it, fitted the same way.

The predictions (``plan/slots.estimate``, ``plan/contention.py``) then take a copy as
``between`` says, add ``wait_seconds`` wherever a node waits for one on another stream and hold a
stream ``fork_seconds`` longer after a node another stream waits for.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from kernelfleet.documents import Document, Rate, document, model

LINKS_FORMAT = 1
# A fixed cost per copy or per wait beyond 10 ms is no graph's: a corrupt measurement.
SmallSeconds = Annotated[float, Field(ge=0, le=0.01)]


@model("link fit")
class LinkFit:
    """``seconds_per_copy + bytes / bytes_per_second`` fitted on ``sizes_bytes`` against
    ``seconds`` (the measured seconds per copy at each size)."""

    seconds_per_copy: SmallSeconds
    bytes_per_second: Rate
    sizes_bytes: list[Annotated[int, Field(ge=0)]]
    seconds: list[Annotated[float, Field(ge=0, le=1)]]

    @model_validator(mode="after")
    def _paired(self) -> LinkFit:
        if len(self.sizes_bytes) != len(self.seconds):
            raise ValueError(f"{len(self.sizes_bytes)} sizes for {len(self.seconds)} times")
        return self

    def copy_seconds(self, nbytes: int) -> float:
        return self.seconds_per_copy + nbytes / self.bytes_per_second


@model("measured link")
class MeasuredLink:
    """The link between devices ``a`` and ``b`` (both directions), as ``profile/linkcost.py``
    measured it (module docstring)."""

    a: str
    b: str
    between: LinkFit
    queued: LinkFit
    wait_seconds: SmallSeconds
    fork_seconds: SmallSeconds

    @model_validator(mode="after")
    def _two(self) -> MeasuredLink:
        if self.a == self.b:
            raise ValueError(f"a link joins two different devices, got {self.a!r} twice")
        return self

    def joins(self, x: str, y: str) -> bool:
        return {x, y} == {self.a, self.b}


@document("kernelfleet_links", LINKS_FORMAT, "link measurement")
class LinkTable(Document):
    """Measured links (``python -m bench.link_cost`` writes one; ``kernelfleet profile`` keeps its
    own in the cost table, ``CostTable.links``)."""

    links: list[MeasuredLink]
    source: str = "unknown"  # "measured on NVIDIA H200, profiles a:64, b:32, 2026-12-01"
    DUMP: ClassVar[dict[str, Any]] = {"indent": 1}


def find(links: list[MeasuredLink] | None, x: str, y: str) -> MeasuredLink | None:
    """The measured link joining ``x`` and ``y``, or None."""
    return next((link for link in links or () if link.joins(x, y)), None)


def describe(link: MeasuredLink) -> str:
    """One line: the link as the predictions use it."""
    between, queued = link.between, link.queued
    return (f"link {link.a}-{link.b} measured: a copy between kernels {between.seconds_per_copy * 1e6:.2f} µs + bytes "
            f"at {between.bytes_per_second / 1e9:.0f} GB/s, queued {queued.seconds_per_copy * 1e6:.2f} µs + bytes at "
            f"{queued.bytes_per_second / 1e9:.0f} GB/s, a wait across devices {link.wait_seconds * 1e6:.2f} µs, a fork "
            f"{link.fork_seconds * 1e6:.2f} µs")
