"""The kernel-program IR (buffers, launches, accesses) and, later, its capture from PyTorch."""
