"""When a window lists its GPU's processes again, and when it may keep the last list.

Listing the compute processes was the dearest read of a window under load: on an H200 running a
GEMM, 305 µs of CPU right after the loop's sleep (35 warm; docs/validation/h200-2026-12-01,
sampler_cost-3.json), where memory and power together cost 106. A process cannot come or go
unseen in the GPU's used memory, which the window reads anyway: a new CUDA context allocates device
memory (hundreds of MB), and an exit frees what its process held. So a window lists again only when

* the used memory differs from the window before's (a process came, went, or allocated), or did
  in the window before (one list more, so a process listed a moment after its memory shows is
  not missed);
* the last list held more than one process: a shared GPU is split by per-process SM shares,
  which change every window without the memory changing;
* the last list is ``max_age_seconds`` old (a PID reused, or one process leaving while another
  of exactly its size arrives, is seen within that bound);
* the memory could not be read, or there is no list yet this NVML session.

Otherwise the window carries the last list, which is what a new one would say: the same PIDs and
names, and (one process) its memory, which is the GPU's used memory less a constant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.telemetry.nvml_api import Nvml
from kernelfleet.telemetry.processes import running_processes
from kernelfleet.telemetry.sample import ProcessSample

# The longest a window carries a list unread, while the used memory holds still: a PID reused,
# or a swap of two processes of one size, shows within this; every window cost 0.3 ms of CPU
# on an H200 under load. 0 lists every window (the path before 2026-12-02).
PROCESS_LIST_MAX_AGE_SECONDS = 10.0


@dataclass
class ProcessWatch:
    """The processes of one GPU (or MIG instance), listed only when something says they changed."""

    nvml: Nvml
    handle: Any
    lister: Callable[[], list[Any]]  # telemetry/processes.py: process_lister
    proc_root: Path
    max_age_seconds: float = PROCESS_LIST_MAX_AGE_SECONDS
    lists_total: int = 0  # lists made (the benchmark counts them per window)
    _names: dict[int, str | None] = field(default_factory=dict)  # pid -> name, while it stays
    _last: tuple[ProcessSample, ...] | None = None
    _listed_at: float = 0.0
    _memory_seen: int | None = None  # the used memory of the window before
    _settling: bool = True  # the window before saw the memory change (or there was none)

    def read(self, memory_used_bytes: int | None, now: float, since_microseconds: int) -> tuple[ProcessSample, ...]:
        """This window's processes: listed (``since_microseconds`` bounds a shared GPU's SM shares),
        or the last list where nothing says it changed."""
        changed = memory_used_bytes != self._memory_seen
        due = (changed or self._settling or memory_used_bytes is None or self._last is None
               or len(self._last) > 1 or now - self._listed_at >= self.max_age_seconds)
        if due:
            self._last = running_processes(self.nvml, self.handle, since_microseconds, self.proc_root, self._names,
                                           self.lister)
            self._listed_at = now
            self.lists_total += 1
        # only after a list that worked: a failed one leaves the next window due
        self._settling, self._memory_seen = changed, memory_used_bytes
        return self._last  # type: ignore[return-value] - due when there is none
