"""The CUDA edge of the kernel IR: CUDA-graph capture, replay checks and the one driver doorway.

Everything here may touch torch and the GPU; the IR beside it (``kernels/``) never does.
"""
