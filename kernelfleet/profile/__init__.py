"""Per-kernel cost on each device profile, and a cost model for catalog SKUs that are not present.

``costmodel`` (pure Python, with ``roofline``) fits a roofline model to a measured
:class:`~kernelfleet.plan.model.CostTable` and predicts every launch on a catalog SKU
(DESIGN.md, the *place* half, step 4). Timing on a GPU lives in its own modules; importing this
package imports neither torch nor a device.
"""
