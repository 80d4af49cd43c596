"""kernelfleet: see how well every GPU uses its tensor cores, and place one model's
kernels across GPUs of different types."""

__version__ = "0.1.0"
