"""What a kernel mostly does, from its PTX: tensor-core work, or moving memory.

A kernel with a tensor-core instruction (``mma``, ``wgmma``, ``tcgen05``) is tensor-core work. One
without but with global loads or stores is taken as memory-bound: Triton and TorchInductor emit
such kernels for pointwise ops and reductions, whose time is their memory traffic. Anything else
(no global access at all) is "other". Better than a kernel's name, which can say "attention" for a
fused pointwise kernel that merely feeds an attention op.
"""

from __future__ import annotations

from kernelfleet.ptx.parser import Entry

TENSOR_OPCODES = {"mma", "wgmma", "tcgen05"}
MEMORY_OPCODES = {"ld", "st", "atom", "red", "cp"}


def kind_of(entry: Entry) -> str:
    opcodes = {i.opcode for i in entry.instructions}
    if opcodes & TENSOR_OPCODES:
        return "tensor-core"
    global_access = any(i.opcode in MEMORY_OPCODES and ("global" in i.modifiers or not
                                                         {"shared", "local", "param", "const"} & set(i.modifiers))
                        for i in entry.instructions)
    return "memory-bound" if global_access else "other"
