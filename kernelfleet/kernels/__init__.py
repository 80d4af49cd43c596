"""The kernel-program IR (buffers, launches, accesses), pure; its CUDA edge is ``kernels.cuda``."""
