"""Green contexts through the driver: disjoint SM partitions of one GPU, each with a stream."""

from __future__ import annotations

from typing import Any

from kernelfleet.kernels.cuda.doorway import Doorways, DriverError


class GreenContexts(Doorways):
    """The driver's partitioning method (part of :class:`~kernelfleet.kernels.cuda.driver.CudaDriver`)."""

    def green_streams(self, device: int, sm_counts: list[int], granule: int = 8,
                      first_group: int = 0) -> list[tuple[Any, int, int]]:
        """Disjoint SM partitions of ``device`` with a stream each: [(context, stream, SMs)], the
        context being the green context as a ``CUcontext`` (what graphs for the partition are built in).

        The device's SMs are split into groups of ``granule`` SMs and each partition takes the next
        groups in turn from ``first_group``, so partitions never share an SM. Every split of the
        whole device lists the same groups in the same order (and the driver refuses to split a
        split's remainder), so partitions carved by two calls are disjoint only when the second
        starts past the groups the first took: ``profile/devices.py`` keeps that count. Kernels launched on a
        partition's stream run on its SMs only; a graph does so only if it was built in the
        partition's context (a graph keeps the context it was made in, whatever stream launches it).
        """
        cu, call = self.cu, self.call
        dev = call("cuDeviceGet", device)
        whole = call("cuDeviceGetDevResource", dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
        groups, count, _ = call("cuDevSmResourceSplitByCount", int(whole.sm.smCount) // granule, whole, 0, granule)
        groups = list(groups)[:int(count)]
        out, taken = [], first_group
        for sms in sm_counts:
            need = -(-sms // granule)
            if taken + need > len(groups):
                raise DriverError(too_many(sm_counts, len(groups) - first_group, granule))
            mine = groups[taken:taken + need]
            taken += need
            desc = call("cuDevResourceGenerateDesc", mine, len(mine))
            context = call("cuGreenCtxCreate", desc, dev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM)
            stream = call("cuGreenCtxStreamCreate", context, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0)
            out.append((call("cuCtxFromGreenCtx", context), int(stream), sum(int(g.sm.smCount) for g in mine)))
        return out


def too_many(sm_counts: list[int], groups: int, granule: int) -> str:
    """Why partitions of ``sm_counts`` SMs do not fit a device of ``groups`` groups (the null twin
    says it the same way)."""
    return f"cannot carve {sm_counts} SMs from {groups} groups of {granule}: ask for fewer SMs in all"
