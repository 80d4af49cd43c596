"""Static access analysis: which pointer parameters a kernel reads, writes, or both.

Each register gets the set of *origins* its value may derive from: a parameter, the address of a
variable, or a value loaded from memory. PTX is not SSA (loops re-assign registers and Triton
writes `mov %r, 0; @%p ld %r, [...]`), so the pass is flow-insensitive: a register's origins are
the union over all its assignments, iterated to a fixed point. That over-approximates, which only
ever adds parameters to an access or pins a kernel; it never drops an access.

Then every memory instruction is attributed to the parameters its address derives from. An
address the pass cannot bound (no parameter origin, a 64-bit value loaded from memory, a global
variable, a call) pins the kernel, with the reason and the line: a kernel we cannot bound is
never assumed safe to move.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kernelfleet.errors import UsageError
from kernelfleet.ptx.parser import Entry, Instruction, Module, Operand, PtxSyntaxError, integer

Origin = tuple[str, str]  # ("param", name) | ("mem32"/"mem64", line) | ("global"/"shared"/"local", name)

# Opcodes whose first operand is not a destination register.
_NO_DEST = {"st", "red", "bar", "barrier", "bra", "ret", "exit", "trap", "membar", "fence", "prefetch",
            "prefetchu", "cp", "tensormap", "stmatrix", "wgmma", "call", "brkpt", "griddepcontrol",
            "setmaxnreg", "mbarrier", "discard", "applypriority", "st.async", "red.async"}
# Results that scale their inputs are offsets, not pointers: `mul.wide.s32 %rd, %r, 4`.
_SCALING = {"mul", "shl", "div", "rem", "mul24"}
# CUDA's own device functions that touch no user memory: the assert handler and printf read only
# their format strings (constants) and argument buffers (local memory).
_SYSTEM_CALLS = {"__assertfail", "vprintf"}
_TEXTURE = {"tex", "tld4", "suld", "sust", "sured", "suq", "txq"}
_NO_DATA_COPIES = ("cp.async.bulk.prefetch", "cp.async.bulk.commit", "cp.async.bulk.wait", "cp.async.commit",
                   "cp.async.wait", "cp.async.mbarrier")
_WIDE = re.compile(r"[bsuf]64")


@dataclass
class KernelAccess:
    """What one kernel entry does with its pointer parameters.

    params: name -> "read" | "write" | "readwrite" | "unused", for every parameter that can hold
    a pointer (64-bit scalars and by-value byte arrays such as tensor maps).
    pinned: the analysis could not bound some access; reasons say which and where.
    evidence: (line, param, kind) for every attributed access, kind "read"/"write"/"readwrite".
    """

    entry: str
    params: dict[str, str]
    pinned: bool
    reasons: list[str] = field(default_factory=list)
    evidence: list[tuple[int, str, str]] = field(default_factory=list)


def analyze(module: Module) -> list[KernelAccess]:
    """Analyse every kernel entry of a parsed module, in order. A module without one (an empty or
    cut file, or a library of ``.func`` device functions alone) is a UsageError, not an empty answer."""
    if not module.entries:
        also = f" ({len(module.functions)} .func device functions only)" if module.functions else ""
        raise UsageError(f"no .entry kernel in this PTX{also}: an empty, truncated or non-kernel file")
    return [analyze_entry(module, entry) for entry in module.entries]


def analyze_entry(module: Module, entry: Entry) -> KernelAccess:
    """Analyse one kernel entry of `module`."""
    return _Analysis(module, entry).run()


def _wide(ins: Instruction) -> bool:
    return any(_WIDE.fullmatch(m) for m in ins.modifiers)


def _space(ins: Instruction) -> str | None:
    """The first state space among the modifiers (`shared::cta` counts as shared)."""
    for m in ins.modifiers:
        s = m.split("::")[0]
        if s in ("global", "shared", "local", "const", "param"):
            return s
    return None


class _Analysis:
    def __init__(self, module: Module, entry: Entry) -> None:
        self.module, self.entry = module, entry
        self.wide_bits = module.address_size
        self.pointer_params = [p.name for p in entry.params if p.array_bytes is not None
                               or p.is_pointer_hint or (p.type[2:] == "64" and module.address_size == 64)
                               or (p.type[2:] == "32" and module.address_size == 32)]
        self.byval = {p.name for p in entry.params if p.array_bytes is not None}
        self.symbols: dict[str, str] = {p.name: "param" for p in entry.params}
        for var in module.globals + entry.locals:
            self.symbols[var.name] = var.space
        self.origins: dict[str, frozenset[Origin]] = {}
        self.access: dict[str, set[str]] = {p: set() for p in self.pointer_params}
        self.reasons: list[str] = []
        self.evidence: list[tuple[int, str, str]] = []
        self.defs: dict[str, list[Instruction]] = {}

    # --- register origins ---------------------------------------------------------------------
    def run(self) -> KernelAccess:
        for ins in self.entry.instructions:
            for reg in self._dests(ins):
                self.defs.setdefault(reg, []).append(ins)
        changed = True
        while changed:
            changed = False
            for ins in self.entry.instructions:
                new = self._value(ins)
                for reg in self._dests(ins):
                    old = self.origins.get(reg, frozenset())
                    if not new <= old:
                        self.origins[reg] = old | new
                        changed = True
        self.tmap_smem: dict[tuple[str, int], frozenset[Origin]] = {}
        self.tmap_global: dict[tuple[str, int], frozenset[Origin]] = {}
        for ins in self.entry.instructions:
            self._memory(ins)
        params = {p: _kind(self.access[p]) for p in self.pointer_params}
        return KernelAccess(self.entry.name, params, bool(self.reasons), self.reasons, self.evidence)

    def _dests(self, ins: Instruction) -> list[str]:
        if not ins.operands or ins.opcode in _NO_DEST or ins.name.startswith(("st.async", "red.async")):
            return []
        op = ins.operands[0]
        regs = [op] if op.kind == "register" else list(op.items) if op.kind in ("vector", "pair") else []
        return [r.text for r in regs if r.kind == "register" and r.text != "_"]

    def _of(self, op: Operand) -> frozenset[Origin]:
        if op.kind == "register":
            return self.origins.get(op.text.lstrip("!-"), frozenset())
        if op.kind == "symbol":
            space = self.symbols.get(op.text)
            return frozenset({(space, op.text)}) if space else frozenset()
        if op.kind in ("vector", "pair"):
            return frozenset().union(*(self._of(i) for i in op.items))
        return frozenset()

    def _value(self, ins: Instruction) -> frozenset[Origin]:
        """Origins of the value `ins` writes to its destination registers."""
        srcs = ins.operands[1:]
        if ins.opcode == "ld" and _space(ins) == "param":
            addr = srcs[0] if srcs else None
            if addr is not None and addr.base in self.symbols and self.symbols[addr.base] == "param":
                return frozenset({("param", addr.base)}) if addr.base in self.access else frozenset()
            return frozenset({("mem64", str(ins.line))})
        if ins.opcode in ("ld", "ldu", "atom") or ins.name.startswith(("mbarrier.arrive", "mbarrier.test")):
            # A value read from memory. Only a 64-bit one can be a whole pointer.
            return frozenset({("mem64" if _wide(ins) else "mem32", str(ins.line))})
        if ins.opcode in _SCALING or ins.opcode in ("setp", "set", "elect", "activemask", "popc", "clz"):
            return frozenset()
        if ins.opcode in ("mad", "fma") and len(srcs) == 3:
            return self._of(srcs[2])  # a*b is an offset; the addend carries the base
        if ins.opcode == "selp" and len(srcs) == 3:
            return self._of(srcs[0]) | self._of(srcs[1])
        if ins.opcode == "call":
            return frozenset({("mem64", str(ins.line))})
        value = frozenset().union(*(self._of(s) for s in srcs)) if srcs else frozenset()
        if ins.opcode == "mov" and srcs and srcs[0].kind == "vector" and _wide(ins):
            # Two 32-bit halves packed into 64 bits can rebuild a pointer read from memory.
            value = frozenset(("mem64", o[1]) if o[0] == "mem32" else o for o in value)
        return value

    # --- memory instructions ------------------------------------------------------------------
    def _memory(self, ins: Instruction) -> None:
        op, name, ops = ins.opcode, ins.name, ins.operands
        moves = op in ("ld", "ldu", "st", "atom", "red", "tensormap") or (
            name.startswith(("cp.async", "cp.reduce.async")) and not name.startswith(_NO_DATA_COPIES))
        if moves and len(ops) < 2:
            raise PtxSyntaxError(ins.line, f"{name} needs an address and a value, has {len(ops)} operand(s)", name)
        if op in _TEXTURE:
            self._pin(ins, "texture/surface access cannot be followed to a parameter")
        elif op == "call":
            if not (ops and ops[0].text in _SYSTEM_CALLS):
                self._pin(ins, f"calls {ops[0].text if ops else 'a function'}; arguments are not followed into it")
        elif op in ("ld", "ldu") and _space(ins) != "param":
            self._touch(ins, ops[1], "read")
        elif op == "st":
            self._touch(ins, ops[0], "write")
        elif op == "atom":
            self._touch(ins, ops[1], "readwrite")
        elif op == "red":
            self._touch(ins, ops[0], "readwrite")
        elif name.startswith("tensormap.replace") and "global_address" in ins.modifiers:
            self.tmap_smem[self._key(ops[0])] = self._of(ops[1])
        elif name.startswith("tensormap.cp_fenceproxy"):
            self._touch(ins, ops[0], "write")
            self.tmap_global[self._key(ops[0])] = self.tmap_smem.get(self._key(ops[1]), frozenset())
        elif name.startswith(("cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor")):
            self._tensor(ins)
        elif name.startswith(_NO_DATA_COPIES):
            return  # a prefetch moves no data the kernel consumes; commits and waits move none
        elif name.startswith(("cp.async.bulk", "cp.reduce.async.bulk")):
            spaces = [m.split("::")[0] for m in ins.modifiers[2:] if m.split("::")[0] in ("global", "shared")]
            dst, src = (spaces + ["", ""])[:2]
            if dst == "global":
                self._touch(ins, ops[0], "readwrite" if "reduce" in name else "write", "global")
            if src == "global":
                self._touch(ins, ops[1], "read", "global")
        elif name.startswith("cp.async") and len(ops) >= 2 and "global" in ins.modifiers:
            self._touch(ins, ops[1], "read", "global")  # shared <- global: the source is ours

    def _tensor(self, ins: Instruction) -> None:
        """TMA: the address operand is a tensor map; the buffer is the one that map names."""
        dirs = [m.split("::")[0] for m in ins.modifiers if m.split("::")[0] in ("global", "shared")]
        store = dirs[:1] == ["global"]
        kind = "readwrite" if "reduce" in ins.name else "write" if store else "read"
        tmap = ins.operands[0 if store else 1]
        key = self._key(tmap)
        if key in self.tmap_global:
            # A map the kernel built itself: `tensormap.replace ... global_address` then copied out.
            # The TMA unit also reads the map from where the kernel wrote it (Triton's scratch).
            self._attribute(ins, self.tmap_global[key], kind)
            self._touch(ins, tmap, "read", "global")
            return
        origins = self._of(Operand("register", tmap.base)) if (tmap.base or "").startswith("%") \
            else self._of(Operand("symbol", tmap.base or ""))
        if origins and all(o[0] == "param" and o[1] in self.byval for o in origins):
            self._attribute(ins, origins, kind)  # a by-value (grid-constant) map: the param is the buffer
        else:
            self._pin(ins, "tensor map read from memory; the buffer it names cannot be followed")

    def _key(self, op: Operand) -> tuple[str, int]:
        """A symbolic address: (root register or symbol, constant offset), following moves,
        conversions and constant adds through registers assigned once."""
        base, offset = op.base or op.text, op.offset
        for _ in range(64):
            defs = self.defs.get(base, [])
            if len(defs) != 1:
                break
            d = defs[0]
            srcs = d.operands[1:]
            if d.opcode in ("mov", "cvta", "cvt") and len(srcs) == 1 and srcs[0].kind in ("register", "symbol"):
                base = srcs[0].text
            elif d.opcode == "add" and len(srcs) == 2 and integer(srcs[1].text) is not None:
                base, offset = srcs[0].text, offset + integer(srcs[1].text)
            else:
                break
        return base, offset

    def _touch(self, ins: Instruction, addr: Operand, kind: str, space: str | None = None) -> None:
        space = space or _space(ins)
        if space in ("shared", "local", "param", "const"):
            return  # not global memory: nothing another kernel can see
        if addr.base is None:
            self._pin(ins, f"access to a fixed address {addr.text}")
            return
        if addr.base.startswith("%"):
            origins = self.origins.get(addr.base, frozenset())
        else:
            origins = self._of(Operand("symbol", addr.base))
        if origins and all(o[0] in ("shared", "local") for o in origins):
            return  # a generic access through an address of a shared or local variable
        self._attribute(ins, origins, kind)

    def _attribute(self, ins: Instruction, origins: frozenset[Origin], kind: str) -> None:
        globals_ = sorted(o[1] for o in origins if o[0] in ("global", "const"))
        loaded = sorted({int(o[1]) for o in origins if o[0] == "mem64"})
        params = sorted(o[1] for o in origins if o[0] == "param")
        if globals_ and kind == "read" and not params and not loaded and self._module_tables(globals_):
            return  # a constant table of the kernel's own module: it is loaded wherever the kernel is
        if globals_:
            self._pin(ins, f"address derives from global variable {', '.join(globals_)}")
        elif loaded:
            self._pin(ins, f"address derives from a 64-bit value loaded from memory on line "
                      f"{', '.join(map(str, loaded))} (a pointer read from memory)")
        elif not params:
            self._pin(ins, "address cannot be traced to a pointer parameter")
        for p in params:
            self.access.setdefault(p, set()).add(kind)
            self.evidence.append((ins.line, p, kind))

    def _module_tables(self, names: list[str]) -> bool:
        """Globals defined by a one-kernel module (libdevice's sin/cos reduction table in Triton code):
        only this kernel can reach them, and a write by it pins it anyway."""
        defined = {v.name for v in self.module.globals if v.space == "global"}
        return len(self.module.entries) == 1 and all(n in defined for n in names)

    def _pin(self, ins: Instruction, why: str) -> None:
        self.reasons.append(f"line {ins.line}: {ins.name}: {why}")


def _kind(kinds: set[str]) -> str:
    read = bool(kinds & {"read", "readwrite"})
    write = bool(kinds & {"write", "readwrite"})
    return "readwrite" if read and write else "read" if read else "write" if write else "unused"
