"""The sentence a user of a mixed H100/H200 fleet needs beside OFU (issue 19, item 6).

The H100 SXM and H200 SXM have the same GH100 compute, but OFU divides by each SKU's own
reference clock: the H200's is its datasheet clock over the SM-cycle ratio a probe measured
(1830 / 0.903 = 2027 MHz), the H100's the datasheet clock alone (1830 MHz), since no H100 has been
measured. So identical work reads higher on an H100 by the quotient, which is the datasheet's
assumption until an H100 is measured. The figures are read from the catalog, never typed here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelfleet.errors import KernelfleetError

if TYPE_CHECKING:  # the catalog's own types; this module is imported by the catalog's package
    from kernelfleet.catalog import Catalog, Sku

SAME_DIE = ("h100-sxm", "h200-sxm")  # GH100 compute in both (gpus.toml, reference_clock_note)


def same_die_note(catalog: Catalog, sku: Sku | None = None) -> str | None:
    """The note for ``sku`` (or for the catalog as a whole when None); None when it does not apply."""
    if sku is not None and sku.key not in SAME_DIE:
        return None
    try:
        h100, h200 = (catalog.get(key) for key in SAME_DIE)
    except KernelfleetError:
        return None  # an override catalog without one of them: nothing to compare
    (f100, basis100), (f200, basis200) = h100.ofu_reference_clock(), h200.ofu_reference_clock()
    if f100 == f200:
        return None
    change = 100 * abs(f200 / f100 - 1)
    direction = "higher" if f200 > f100 else "lower"
    return (f"OFU uses each SKU's reference clock: H100 SXM {f100 / 1e6:.0f} MHz ({basis100}), "
            f"H200 SXM {f200 / 1e6:.0f} MHz ({basis200}); identical work reads ~{change:.0f} % {direction} "
            f"on an H100. "
            f"The H100 figure is the datasheet's, not yet measured on an H100.")
