"""PTX: parse the PTX of a kernel and find which pointer parameters it reads and writes."""

from kernelfleet.ptx.access import KernelAccess, analyze
from kernelfleet.ptx.parser import Module, PtxSyntaxError, parse

__all__ = ["KernelAccess", "Module", "PtxSyntaxError", "analyze", "parse"]
