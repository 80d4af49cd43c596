"""The CUDA edge of the kernel IR: CUDA-graph capture, replay checks, the driver object (one
doorway per CUDA API) and its null twin.

Everything here may touch torch and the GPU; the IR beside it (``kernels/``) never does. This
``__init__`` imports nothing, so the driver and ``null.py`` load without torch or cuda-python.
"""
