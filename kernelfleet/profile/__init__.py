"""Per-kernel cost on each device profile, and a cost model for catalog SKUs that are not present.

``costmodel`` (pure Python, with ``roofline``) fits a roofline model to a measured
:class:`~kernelfleet.plan.model.CostTable` and predicts every launch on a catalog SKU
(DESIGN.md, the *place* half, step 4). ``groups`` and ``counters`` turn an Nsight Compute run
(``ncu_run``, ``bench/profile_counters.sh``) into a class per kernel and profile; ``graphtime``
sets cost tables against measured graph times. Timing on a GPU lives in its own modules
(``timing``, ``run``, ``ncu_run``); importing this package imports neither torch nor a device.
"""
