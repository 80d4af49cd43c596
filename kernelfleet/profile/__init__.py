"""Per-kernel cost on each device profile: what is measured on a GPU, and how it is read.

``timing``, ``run`` and ``ncu_run`` time kernels and record their counters on a GPU (green-context
profiles from ``devices``, the pair chosen by ``calibration``); ``table`` turns the times into a
:class:`~kernelfleet.costs.table.CostTable`; ``groups`` and ``counters`` turn an Nsight Compute run
(``bench/profile_counters.sh``) into a class per kernel and profile; ``graphtime`` sets cost tables
against measured graph times. The roofline prediction for SKUs that are not present is pure and
lives in ``kernelfleet.costs``. Importing this package imports neither torch nor a device.
"""
