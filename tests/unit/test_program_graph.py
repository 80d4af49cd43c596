"""The kernel-program IR and its RAW dependency graph, on small programs with exact answers."""

import json

import pytest

from kernelfleet.errors import UsageError
from kernelfleet.graph.deps import Edge, dependencies, kernel_kind, to_dot
from kernelfleet.kernels.ir import Access, Buffer, Launch, Program

pytestmark = pytest.mark.unit


def acc(buffer, start, length, mode, source="ptx-static"):
    return Access(buffer, start, length, mode, source)


def program():
    buffers = [Buffer(0, 0, 0x1000, 4096, "input"), Buffer(1, 0, 0x3000, 4096, "activation"),
               Buffer(2, 0, 0x5000, 1024, "output")]
    launches = [
        Launch(0, "kernel", "elementwise_a", (acc(0, 0, 4096, "write"),)),
        Launch(1, "kernel", "nvjet_sm90_tst_128x256_64x4", (acc(0, 0, 4096, "read"), acc(1, 0, 4096, "write", "schema"))),
        # reads the second half of buffer 0 and all of buffer 1
        Launch(2, "kernel", "reduce_c", (acc(0, 2048, 2048, "read"), acc(1, 0, 4096, "read"), acc(2, 0, 1024, "write"))),
        # overwrites the first 1 KiB of buffer 1: later readers of it depend on launch 3, not 1
        Launch(3, "memset", "memset", (acc(1, 0, 1024, "write"),)),
        Launch(4, "kernel", "atomic_d", (acc(1, 512, 1024, "readwrite"),)),
        Launch(5, "kernel", "tail", (acc(1, 0, 4096, "read"),), pinned="loads a pointer from memory (line 88)"),
    ]
    return Program(buffers, launches)


def test_raw_edges_carry_the_bytes_of_the_overlap():
    assert dependencies(program()) == [
        Edge(0, 1, 0, 4096),
        Edge(0, 2, 0, 2048), Edge(1, 2, 1, 4096),
        # launch 4 reads [512, 1536): [512, 1024) from the memset, [1024, 1536) from launch 1
        Edge(1, 4, 1, 512), Edge(3, 4, 1, 512),
        # launch 5 reads all of buffer 1: [0,512) memset, [512,1536) atomic, rest launch 1
        Edge(1, 5, 1, 2560), Edge(3, 5, 1, 512), Edge(4, 5, 1, 1024),
    ]


def test_json_round_trip_and_dot():
    p = program()
    again = Program.from_json(p.to_json())
    assert again == p
    dot = to_dot(p, dependencies(p))
    assert 'n5 [label="5: tail\\nother", color=red]' in dot and 'n1 -> n2 [label="b1: 4096 B"]' in dot


def test_kernel_kinds_from_names():
    kinds = [kernel_kind(launch) for launch in program().launches]
    assert kinds == ["memory-bound", "tensor-core", "memory-bound", "memory-bound", "other", "other"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["buffers"][0].update(role="heap"), "role must be one of"),
        (lambda d: d["launches"][1]["accesses"][0].update(mode="peek"), "mode must be one of"),
        (lambda d: d["launches"][1]["accesses"][0].update(source="guess"), "source must be one of"),
        (lambda d: d["launches"][2]["accesses"][0].update(length_bytes=4096), "beyond buffer 0"),
        (lambda d: d["launches"][2]["accesses"][0].update(buffer=9), "unknown buffer 9"),
        (lambda d: d["launches"][2].update(index=7), "must be in order"),
        (lambda d: d.pop("launches"), "not a kernel program"),
    ],
)
def test_a_malformed_program_names_what_is_wrong(mutate, message):
    doc = json.loads(program().to_json())
    mutate(doc)
    with pytest.raises(UsageError, match=message):
        Program.from_json(json.dumps(doc), "p.json")
