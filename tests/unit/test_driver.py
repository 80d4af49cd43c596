"""The driver object and its null twin (kernels/cuda/): the twin has the real driver's methods,
records what it is asked to build, and reads recorded captures as the real one reads a graph;
DriverError names a remedy, checked through fake bindings (no GPU, no libcuda)."""

import enum
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelfleet.kernels.cuda.doorway import GENERIC_REMEDY, REMEDIES, DriverError
from kernelfleet.kernels.cuda.driver import CudaDriver
from kernelfleet.kernels.cuda.null import NullDriver
from kernelfleet.kernels.cuda.replayer import NodeReplayer
from kernelfleet.kernels.raw import RawCapture, RawNode

pytestmark = pytest.mark.unit

CAPTURE = Path(__file__).parents[1] / "data" / "h200-capture" / "hf-llama-prefill.capture.json.gz"


def interface(cls: type) -> dict[str, inspect.Signature]:
    """Public methods by name, with their signatures (names, defaults, annotations)."""
    return {name: inspect.signature(f) for name, f in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")}


def test_the_null_driver_has_exactly_the_real_drivers_methods():
    real, null = interface(CudaDriver), interface(NullDriver)
    assert {"add_copy_of", "green_streams", "kernel_node", "load_and_launch", "in_context"} <= set(real)
    assert sorted(set(real) ^ set(null)) == []
    assert {name: str(s) for name, s in null.items()} == {name: str(s) for name, s in real.items()}


def test_the_interface_check_sees_a_drifted_twin():
    class Drifted(NullDriver):
        def launch(self, executable, stream, flags=0):  # a parameter the real driver lacks
            pass

        def extra(self):
            pass

    assert interface(Drifted) != interface(CudaDriver)
    assert set(interface(Drifted)) - set(interface(CudaDriver)) == {"extra"}


def bindings(name: str, result: tuple = (None,)) -> SimpleNamespace:
    """Fake ``cuda.bindings.driver`` whose cuGraphCreate answers ``name`` (then ``result``)."""
    status = enum.IntEnum("CUresult", {"CUDA_SUCCESS": 0, name: 999} if name != "CUDA_SUCCESS" else {name: 0})
    return SimpleNamespace(cuGraphCreate=lambda flags: (status[name], *result))


@pytest.mark.parametrize("name, says", [
    ("CUDA_ERROR_NO_DEVICE", "CUDA_VISIBLE_DEVICES"),
    ("CUDA_ERROR_NOT_INITIALIZED", "create a CUDA context first"),
    ("CUDA_ERROR_INVALID_CONTEXT", "make the device current"),
    ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory: free tensors"),
    ("CUDA_ERROR_ILLEGAL_ADDRESS", "context is poisoned: restart the process"),
    ("CUDA_ERROR_LAUNCH_FAILED", "context is poisoned: restart the process"),
    ("CUDA_ERROR_NOT_SUPPORTED", "does not offer the feature"),
    ("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "choose the memcpy copy method"),
    ("CUDA_ERROR_INVALID_VALUE", "refused an argument"),
    ("CUDA_ERROR_INVALID_HANDLE", "released already"),
])
def test_a_failed_call_names_the_function_the_error_and_what_to_do(name, says):
    with pytest.raises(DriverError) as caught:
        CudaDriver(bindings(name)).create_graph()
    message = str(caught.value)
    assert message == f"cuGraphCreate failed: {name}; {REMEDIES[name]}" and says in message
    assert "\n" not in message and caught.value.name == name


def test_an_unknown_error_gets_the_generic_remedy():
    with pytest.raises(DriverError, match="CUDA_ERROR_SOMETHING_NEW; look the error name up") as caught:
        CudaDriver(bindings("CUDA_ERROR_SOMETHING_NEW")).create_graph()
    assert str(caught.value).endswith(GENERIC_REMEDY)


def test_a_successful_call_returns_its_results_without_the_status():
    assert CudaDriver(bindings("CUDA_SUCCESS", ("graph",))).create_graph() == "graph"
    assert CudaDriver(bindings("CUDA_SUCCESS", ("graph", 2))).create_graph() == ("graph", 2)


def test_the_runtime_api_goes_through_its_own_doorway():
    status = enum.IntEnum("cudaError_t", {"cudaSuccess": 0, "cudaErrorInvalidValue": 1})
    answers = {0x1000: (status.cudaSuccess, SimpleNamespace(device=1)), 0x2000: (status.cudaErrorInvalidValue, None)}
    driver = CudaDriver(runtime_bindings=SimpleNamespace(cudaPointerGetAttributes=answers.__getitem__))
    assert driver.pointer_device(0x1000) == 1
    with pytest.raises(DriverError, match="cudaPointerGetAttributes failed: cudaErrorInvalidValue; look the error"):
        driver.pointer_device(0x2000)


def test_a_replayed_node_is_a_chain_of_copies_built_once_and_released():
    null = NullDriver()
    replayer = NodeReplayer(["memset", "a", "b", "kernel"], "green0.0", null)
    replayer.repeated(3, 2, 7, prelude=(0,))
    replayer.repeated(3, 2, 7, prelude=(0,))  # the same graph again
    assert [(x.what, x.after, x.ctx) for x in null.added] == [
        ("memset", (), "green0.0"), ("kernel", (0,), "green0.0"), ("memset", (1,), "green0.0"), ("kernel", (2,), "green0.0")]
    assert null.launched == [("exec1", 7), ("exec1", 7)]
    replayer.close()
    assert null.live == set()
    with pytest.raises(DriverError, match="CUDA_ERROR_INVALID_HANDLE"):
        null.destroy("graph0", "exec1")  # released twice


def test_null_partitions_are_disjoint_and_refuse_what_does_not_fit():
    null = NullDriver(sms=132)  # 16 groups of 8 SMs, as an H200 splits
    parts = null.green_streams(0, [56, 64])
    assert [sms for _, _, sms in parts] == [56, 64] and len({ctx for ctx, _, _ in parts}) == 2
    with pytest.raises(DriverError, match=r"cannot carve \[64, 72\] SMs from 16 groups of 8"):
        null.green_streams(0, [64, 72])


def test_capture_reads_a_recorded_graph_through_the_null_driver_as_it_was_recorded():
    from kernelfleet.kernels.cuda.capture import _raw_node

    recorded = RawCapture.load(CAPTURE).nodes + [RawNode("memcpy", dst=0x7F00_0000_0000, src=0x7F00_0010_0000,
                                                         length_bytes=4096)]  # no recording holds a memcpy
    assert {n.kind for n in recorded} == {"kernel", "memset", "memcpy"}
    assert [_raw_node(n, NullDriver()) for n in recorded] == recorded


def test_the_null_driver_and_the_multi_device_runtime_import_without_torch_or_cuda_python():
    from test_layers import blocked_import_failures  # the layering test's blocker, in a fresh interpreter

    assert blocked_import_failures(["kernelfleet.kernels.cuda.null", "kernelfleet.kernels.cuda.driver",
                                    "kernelfleet.kernels.cuda.replayer", "kernelfleet.runtime.executor",
                                    "kernelfleet.runtime.link", "kernelfleet.runtime.distributed"]) == []


def test_null_partitions_start_at_the_group_asked_and_count_what_is_left():
    null = NullDriver(sms=132)
    (first,) = null.green_streams(0, [64])
    (second,) = null.green_streams(0, [32], first_group=8)
    assert first[0] != second[0] and second[2] == 32
    with pytest.raises(DriverError, match=r"cannot carve \[72\] SMs from 8 groups of 8"):
        null.green_streams(0, [72], first_group=8)


def test_open_profiles_take_the_lowest_sm_groups_no_other_holds():
    from kernelfleet.profile.devices import ProfileSpec, _first_free, sm_groups

    assert sm_groups(ProfileSpec("a", 64)) == 8 and sm_groups(ProfileSpec("c", 56, 64)) == 15
    assert sm_groups(ProfileSpec("whole")) == 0
    assert _first_free({}, 8) == 0
    assert _first_free({0: 8}, 4) == 8  # b beside an open a:64
    assert _first_free({8: 4}, 8) == 0 and _first_free({8: 4}, 9) == 12  # a gap that fits, and one that does not
    assert _first_free({0: 4, 6: 2}, 2) == 4


class _KernelNodeBindings:
    """Fake ``cuda.bindings.driver`` holding one captured kernel node of ``shared`` bytes of dynamic
    shared memory whose function's limit is ``limit``; it refuses a node past the limit, as the
    driver did (CUDA_ERROR_INVALID_VALUE), and records every call."""

    CUresult = enum.IntEnum("CUresult", {"CUDA_SUCCESS": 0, "CUDA_ERROR_INVALID_VALUE": 1})
    CUgraphNodeType = enum.IntEnum("CUgraphNodeType", {"CU_GRAPH_NODE_TYPE_KERNEL": 0, "CU_GRAPH_NODE_TYPE_MEMCPY": 1,
                                                       "CU_GRAPH_NODE_TYPE_MEMSET": 2})
    CUfunction_attribute = enum.IntEnum("CUfunction_attribute", {"CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES": 8})
    CUlaunchAttributeID = SimpleNamespace(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION=4)

    def __init__(self, shared: int, limit: int) -> None:
        self.shared, self.limit, self.calls = shared, limit, []

    def _ok(self, *rest):
        return (self.CUresult.CUDA_SUCCESS, *rest)

    def cuGraphNodeGetType(self, node):
        return self._ok(self.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL)

    def cuGraphKernelNodeGetParams(self, node):
        return self._ok(SimpleNamespace(func=7, ctx=None, sharedMemBytes=self.shared))

    def cuFuncGetAttribute(self, attribute, function):
        return self._ok(self.limit)

    def cuFuncSetAttribute(self, function, attribute, value):
        self.calls.append(("cuFuncSetAttribute", function, int(attribute), value))
        self.limit = value
        return self._ok()

    def cuGraphAddKernelNode(self, graph, after, count, params):
        self.calls.append(("cuGraphAddKernelNode", params.sharedMemBytes))
        if params.sharedMemBytes > self.limit:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE, None)
        return self._ok("node")

    def cuGraphKernelNodeGetAttribute(self, node, attribute):
        return (self.CUresult.CUDA_ERROR_INVALID_VALUE, None)  # no cluster shape


@pytest.mark.parametrize("shared, limit, raised", [(4160, 2080, True), (2080, 2080, False), (0, 0, False)])
def test_a_copied_kernel_may_use_the_shared_memory_it_was_captured_with(shared, limit, raised):
    """On an H100 (2026-12-06) the driver refused every copy of cuDNN's lean_reduction_kernel
    captured for batch 1 (4,160 bytes) with the kernel's limit at 2,080, what batch 8's launch
    needs: the copy raises the limit to the node's own first, and only where it is lower."""
    fake = _KernelNodeBindings(shared, limit)
    assert CudaDriver(bindings=fake).add_copy_of("graph", "captured", [], "green") == "node"
    sets = [c for c in fake.calls if c[0] == "cuFuncSetAttribute"]
    assert sets == ([("cuFuncSetAttribute", 7, 8, shared)] if raised else [])
    assert fake.calls[-1] == ("cuGraphAddKernelNode", shared)
