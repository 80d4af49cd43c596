"""Which containers the kubelet gave each GPU: the one doorway to its pod-resources API.

The kubelet serves ``v1.PodResourcesLister/List`` over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``). Its reply names, for every
container, the devices each device plugin allocated to it; the NVIDIA plugin's
device ids are GPU UUIDs (``GPU-…``, resource ``nvidia.com/gpu``) or MIG UUIDs
(``MIG-…``, resources ``nvidia.com/mig-<profile>`` under the "mixed" strategy),
with a ``::<n>`` replica suffix when the plugin time-slices a GPU, or plain
indices when it runs with ``DEVICE_ID_STRATEGY=index``.

The messages are built from a descriptor here rather than generated ``_pb2``
code: generated code is tied to the protoc that made it (protobuf refuses
``_pb2`` files newer than its runtime), and we read five fields of a stable v1
API. Field numbers follow the kubelet's ``pkg/apis/podresources/v1/api.proto``;
fields we do not declare (cpu ids, memory, topology, dynamic resources) are
skipped by the parser, as protobuf skips any unknown field.

Every failure is soft: :meth:`PodResources.holders` returns an empty mapping and
logs one line when an outage starts (and one when it ends), never a traceback.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from kernelfleet.telemetry.scrape import PodRef

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCE, MIG_RESOURCE_PREFIX = "nvidia.com/gpu", "nvidia.com/mig-"
DEADLINE_SECONDS = 2.0  # the kubelet answers from memory; a hung kubelet must not hold a window
# A node's reply is a few KB (110 pods at most by default); a bigger one is not a kubelet's.
MAX_REPLY_BYTES = 4 << 20
REFRESH_SECONDS = 10.0  # allocations change when pods start; the kubelet rate-limits this API


def _fields(*specs: tuple[str, int, int, str | None]) -> list[descriptor_pb2.FieldDescriptorProto]:
    F = descriptor_pb2.FieldDescriptorProto
    return [F(name=n, number=num, label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL,
              type=F.TYPE_MESSAGE if type_name else F.TYPE_STRING, type_name=type_name or None)
            for n, num, repeated, type_name in specs]


@functools.cache
def messages() -> tuple[type, type]:
    """The request and response classes of ``List``, built once, on first use (no work at import)."""
    D = descriptor_pb2.DescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="kernelfleet/podresources_v1.proto", package="v1", syntax="proto3",
        message_type=[
            D(name="ListPodResourcesRequest"),
            D(name="ListPodResourcesResponse", field=_fields(("pod_resources", 1, 1, ".v1.PodResources"))),
            D(name="PodResources", field=_fields(("name", 1, 0, None), ("namespace", 2, 0, None),
                                                  ("containers", 3, 1, ".v1.ContainerResources"))),
            D(name="ContainerResources", field=_fields(("name", 1, 0, None),
                                                        ("devices", 2, 1, ".v1.ContainerDevices"))),
            D(name="ContainerDevices", field=_fields(("resource_name", 1, 0, None), ("device_ids", 2, 1, None))),
        ],
    )
    # A pool of our own: the default one may already hold a "v1" package from another library.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    classes = message_factory.GetMessages([proto], pool=pool)
    return classes["v1.ListPodResourcesRequest"], classes["v1.ListPodResourcesResponse"]


def is_gpu_resource(name: str) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def device_holders(reply: bytes) -> dict[str, tuple[PodRef, ...]]:
    """GPU device id -> the containers it is allocated to, from one serialised ``List`` reply.

    The time-slicing replica suffix is dropped (``GPU-x::3`` is ``GPU-x``), so a shared GPU lists
    each container once. Raises ``DecodeError`` for bytes that are not such a reply.
    """
    _, response_type = messages()
    response = response_type.FromString(reply)
    holders: dict[str, list[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name or None)
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    device = device_id.split("::", 1)[0].strip()
                    if device and ref not in holders.setdefault(device, []):
                        holders[device].append(ref)
    return {device: tuple(refs) for device, refs in holders.items()}


@dataclass
class PodResources:
    """The kubelet's GPU allocations, asked for at most every ``refresh_seconds``.

    :meth:`open` is the way in: a missing socket gives None and one log line. A failed call
    (kubelet down, past ``deadline_seconds``, a reply over ``MAX_REPLY_BYTES`` or not a reply)
    gives an empty mapping until a call succeeds again, so GPUs fall back to process attribution.
    """

    socket_path: Path
    deadline_seconds: float = DEADLINE_SECONDS
    refresh_seconds: float = REFRESH_SECONDS
    clock: Callable[[], float] = time.monotonic
    _holders: dict[str, tuple[PodRef, ...]] = field(default_factory=dict, init=False)
    _asked: float | None = field(default=None, init=False)
    _failing: str | None = field(default=None, init=False)  # why the last call failed, while it does

    def __post_init__(self) -> None:
        request_type, _ = messages()
        options = [("grpc.max_receive_message_length", MAX_REPLY_BYTES), ("grpc.enable_retries", 0)]
        self._channel = grpc.insecure_channel(f"unix://{self.socket_path}", options=options)
        # Raw bytes back: we parse them ourselves, so a malformed reply is one line of ours,
        # not grpc's logged traceback from inside a deserializer.
        self._list = self._channel.unary_unary(METHOD, request_serializer=request_type.SerializeToString,
                                               response_deserializer=None)
        self._request = request_type()

    @classmethod
    def open(cls, socket_path: Path, **kwargs: Any) -> PodResources | None:
        if not socket_path.is_socket():
            why = "is not a socket" if socket_path.exists() else "does not exist"
            log.warning("pod attribution off: %s %s (mount the kubelet's /var/lib/kubelet/pod-resources "
                        "into the agent)", socket_path, why)
            return None
        return cls(socket_path, **kwargs)

    def holders(self) -> dict[str, tuple[PodRef, ...]]:
        """Device id -> containers, from the last call (a new call when the last is ``refresh_seconds`` old)."""
        now = self.clock()
        if self._asked is None or now - self._asked >= self.refresh_seconds:
            self._asked = now
            self._holders = self._ask()
        return self._holders

    def _ask(self) -> dict[str, tuple[PodRef, ...]]:
        try:
            holders = device_holders(self._list(self._request, timeout=self.deadline_seconds))
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            return self._failed(f"{getattr(code, 'name', 'error')}: {details}")
        except DecodeError as exc:
            return self._failed(f"the reply is not a pod-resources List reply ({exc})")
        if self._failing is not None:
            log.warning("pod attribution back: the kubelet at %s answers again", self.socket_path)
            self._failing = None
        return holders

    def _failed(self, why: str) -> dict[str, tuple[PodRef, ...]]:
        if self._failing is None:
            log.warning("pod attribution paused: the kubelet at %s: %s (GPUs fall back to process attribution "
                        "until it answers)", self.socket_path, why)
        self._failing = why
        return {}

    def close(self) -> None:
        self._channel.close()
