"""The only code that talks to counters: sources yield plain :class:`Sample` batches."""

from kernelfleet.telemetry.sample import ProcessSample, Sample

__all__ = ["ProcessSample", "Sample"]
