"""Dynamic range probe: rewrite one kernel's PTX so each global access records the bytes it reached.

Static analysis (ptx.access) says *which* parameters a kernel touches; it cannot say *how far*,
and it gives up on pointers read from memory. The probe answers both by running the kernel once:
before every global memory instruction the rewritten kernel computes the instruction's address
and folds it into two u64 slots of an extra buffer with `red.global.min.u64` and
`red.global.max.u64` (`red` is `atom` without the returned old value, which nobody reads). A
predicated instruction is probed under the same predicate, so accesses a thread never made leave
no trace. Only text is inserted, never changed: the original instructions stay byte for byte, and
other entries of the module are kept unchanged.

Per-thread atomics on every access are slow, but the probe runs once; a warp-level reduction
first would add shuffles and convergence hazards to save time nobody is waiting for.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from kernelfleet.errors import UsageError
from kernelfleet.ptx.access import _Analysis, _space
from kernelfleet.ptx.parser import Entry, Instruction, Operand, integer, parse

_SLOT = struct.Struct("<QQ")  # one site: lowest address, highest address (little-endian, as on the GPU)
_NO_MIN = 2**64 - 1
_TYPE = re.compile(r"(?:b|s|u|f|bf)(\d+)(?:x(\d+))?")  # b32, f16x2, bf16x2, b128
_NOT_PROBED = {"tex": "texture", "tld4": "texture", "suld": "surface", "sust": "surface",
               "sured": "surface", "multimem": "multimem address"}


@dataclass(frozen=True)
class ProbeSite:
    """One instrumented memory instruction and where its range lands in the probe buffer."""

    index: int  # slot number in the probe buffer: bytes [16 * index, 16 * index + 16)
    line: int  # 1-based line of the original instruction in the input text
    opcode: str  # e.g. "ld.global.v4.b32"
    mode: str  # "read" | "write" | "readwrite" (atom, red and reducing copies)
    width_bytes: int  # bytes one execution touches from its address; 1 for a copy sized by a register
    params: tuple[str, ...]  # parameters the address derives from (ptx.access origins); may be empty


@dataclass(frozen=True)
class ProbedKernel:
    """A rewritten module. Only `entry` is instrumented; every other entry is kept unchanged.

    The launcher passes the kernel's captured arguments plus, as the last argument, a device
    buffer of `probe_bytes` initialised with `initial_probe_bytes`, then reads it back for decode.
    """

    entry: str
    ptx: str  # the whole rewritten module text
    probe_param: str  # name of the added `.param .u64`, appended as the last parameter
    sites: tuple[ProbeSite, ...]
    unprobed: tuple[str, ...]  # "line N: opcode: why" for accesses that have no byte address to probe

    @property
    def probe_bytes(self) -> int:
        """Size of the probe buffer: 16 bytes per site (u64 minimum address, u64 maximum address)."""
        return _SLOT.size * len(self.sites)


# (site, lowest byte address, one past the highest byte touched), or (site, None, None): never run.
SiteRange = tuple[ProbeSite, int, int] | tuple[ProbeSite, None, None]


@dataclass(frozen=True)
class _Plan:
    """How to probe one instruction: its address operand and what bounds the bytes it touches."""

    mode: str
    addr: Operand
    width: int
    size_reg: str | None = None  # actual byte count at run time (cp.async src-size, bulk size)
    generic: bool = False  # generic address: record only when it points into global memory
    ignore_src: str | None = None  # cp.async ignore-src predicate: when true, nothing is read


def instrument(text: str, entry: str) -> ProbedKernel:
    """Rewrite `entry` of the PTX module `text` so every global access records its address range.

    Raises UsageError (PtxSyntaxError for bad PTX) for an unknown entry or a 32-bit module.
    """
    module = parse(text)
    kernel = next((e for e in module.entries if e.name == entry), None)
    if kernel is None:
        names = ", ".join(e.name for e in module.entries) or "none"
        raise UsageError(f"no kernel entry {entry!r} in the PTX (entries: {names})")
    if module.address_size != 64:
        raise UsageError(f"probe needs .address_size 64, the PTX has {module.address_size}")
    # access.py keeps its origin pass private; the probe needs per-register origins (not only the
    # per-line evidence KernelAccess publishes), so it reuses the pass rather than repeat it.
    analysis = _Analysis(module, kernel)
    analysis.run()
    regs = _Registers(text[kernel.body_start:kernel.instructions[-1].start if kernel.instructions else None])
    param = _fresh(text, f"{entry}_kf_probe")
    prefix = _fresh(text, "%kf_probe_")
    sites: list[ProbeSite] = []
    unprobed: list[str] = []
    edits = [_param_edit(text, kernel, param), (kernel.body_start, _prologue(prefix, param))]
    for ins in kernel.instructions:
        plan = _plan(ins, analysis, regs, unprobed)
        if plan is not None:
            origins = analysis.origins.get(plan.addr.base or "", frozenset())
            params = tuple(sorted(name for kind, name in origins if kind == "param"))
            sites.append(ProbeSite(len(sites), ins.line, ins.name, plan.mode, plan.width, params))
            edits.append((ins.start, _indented(text, ins, _probe(ins, plan, len(sites) - 1, prefix))))
    for pos, insert in sorted(edits, key=lambda e: e[0], reverse=True):
        text = text[:pos] + insert + text[pos:]
    return ProbedKernel(entry, text, param, tuple(sites), tuple(unprobed))


def initial_probe_bytes(kernel: ProbedKernel) -> bytes:
    """The probe buffer before the launch: every min slot 2**64-1 and every max slot 0."""
    return _SLOT.pack(_NO_MIN, 0) * len(kernel.sites)


def decode(kernel: ProbedKernel, raw: bytes) -> list[SiteRange]:
    """Per site: (site, lowest byte address, one past the highest byte touched), or (site, None,
    None) when no thread executed it. `raw` is the probe buffer read back after the launch."""
    if len(raw) != kernel.probe_bytes:
        raise UsageError(f"probe buffer of {kernel.entry} must be {kernel.probe_bytes} bytes, got {len(raw)}")
    out: list[SiteRange] = []
    for site in kernel.sites:
        low, high = _SLOT.unpack_from(raw, _SLOT.size * site.index)
        if (low, high) == (_NO_MIN, 0):
            out.append((site, None, None))
        elif low == _NO_MIN or high == 0:
            raise UsageError(f"probe slot {site.index} (line {site.line}) has only one bound set; "
                             "was the buffer initialised with initial_probe_bytes?")
        else:
            out.append((site, low, high + site.width_bytes))
    return out


# --- which instructions, and how ---------------------------------------------------------------
def _plan(ins: Instruction, analysis: _Analysis, regs: _Registers, unprobed: list[str]) -> _Plan | None:
    """A probe plan for a global access, None for anything else; unprobable ones go to `unprobed`."""
    op, name, ops, space = ins.opcode, ins.name, ins.operands, _space(ins)
    why = _NOT_PROBED.get(op)
    if name.startswith(("cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor")):
        why = "copies through a tensor map (TMA): it names a box of coordinates, not a byte address"
    elif op == "call":
        why = f"accesses inside {ops[0].text if ops else 'the callee'} are not probed"
    if why:
        unprobed.append(f"line {ins.line}: {name}: {why}")
        return None
    if op in ("ld", "ldu", "st", "atom", "red") and space in (None, "global"):
        addr = _operand(ins, 0 if op in ("st", "red") else 1, "address")
        if space is None and _provably_not_global(addr, analysis):
            return None
        mode = {"ld": "read", "ldu": "read", "st": "write"}.get(op, "readwrite")
        return _Plan(mode, addr, _element_bytes(ins), generic=space is None)
    if name.startswith(("cp.async.bulk.prefetch", "cp.async.bulk.commit", "cp.async.bulk.wait")):
        return None
    if name.startswith(("cp.async.bulk", "cp.reduce.async.bulk")):
        dst, src = ([m.split("::")[0] for m in ins.modifiers[2:] if m.split("::")[0] in ("global", "shared")]
                    + ["", ""])[:2]
        mode = "readwrite" if op == "cp" and "reduce" in name else "write" if dst == "global" else "read"
        if "global" not in (dst, src):
            return None
        return _sized(_operand(ins, 0 if dst == "global" else 1, "address"), mode, _operand(ins, 2))
    if ins.modifiers[:1] == ("async",) and op == "cp" and "global" in ins.modifiers:
        return _cp_async(ins, regs)
    if name.startswith("tensormap.cp_fenceproxy") and "global" in ins.modifiers:
        return _sized(_operand(ins, 0, "address"), "write", _operand(ins, 2))
    return None


def _operand(ins: Instruction, k: int, kind: str | None = None) -> Operand:
    """Operand k, checked: a malformed access is an error, never a silently skipped probe."""
    if k < len(ins.operands) and kind in (None, ins.operands[k].kind):
        return ins.operands[k]
    raise UsageError(f"PTX line {ins.line}: {ins.name}: expected {kind or 'an operand'} as operand {k + 1}")


def _provably_not_global(addr: Operand, analysis: _Analysis) -> bool:
    """A generic address static analysis traces only to shared or local variables. Anything else,
    pointers read from memory included, is probed; the probe checks `isspacep.global` at run time."""
    if addr.base is None:
        return False
    if not addr.base.startswith("%"):
        return analysis.symbols.get(addr.base) in ("shared", "local", "param", "const")
    origins = analysis.origins.get(addr.base, frozenset())
    return bool(origins) and all(kind in ("shared", "local") for kind, _ in origins)


def _element_bytes(ins: Instruction) -> int:
    """Bytes one execution touches: vector length times element width (`.v4.b32` is 16)."""
    vec = next((int(m[1:]) for m in ins.modifiers if re.fullmatch(r"v\d+", m)), 1)
    for m in ins.modifiers:
        if t := _TYPE.fullmatch(m):
            return vec * int(t[1]) * int(t[2] or 1) // 8
    raise UsageError(f"PTX line {ins.line}: {ins.name}: no element type to size the access")


def _sized(addr: Operand, mode: str, size: Operand) -> _Plan:
    """A copy whose byte count is an operand: an immediate is the width; a register is read at
    run time and the site reports width 1 with the max slot holding the last byte's address."""
    if size.kind == "immediate":
        return _Plan(mode, addr, _width(size))
    return _Plan(mode, addr, 1, size_reg=size.text)


def _width(size: Operand) -> int:
    value = integer(size.text)
    if value is None or value < 0:
        raise UsageError(f"a copy size must be a non-negative integer, got {size.text!r}")
    return value


def _cp_async(ins: Instruction, regs: _Registers) -> _Plan:
    """`cp.async.{ca,cg}.shared.global [dst], [src], cp-size{, src-size | ignore-src}{, policy}`.

    Triton masks with src-size 0 (`selp %r, 16, 0, %mask`): the masked-off copy reads nothing, and
    its address is typically out of bounds, so such a copy must not be recorded."""
    src = _operand(ins, 1, "address")
    plan = _sized(src, "read", _operand(ins, 2))
    # The cache policy (with .L2::cache_hint) is a trailing u64, not a size.
    extra = ins.operands[3:-1] if "L2::cache_hint" in ins.modifiers else ins.operands[3:]
    if not extra:
        return plan
    if extra[0].kind == "immediate":
        return _Plan("read", src, _width(extra[0]))
    if regs.type_of(extra[0].text.lstrip("!")) == ".pred":
        return _Plan("read", src, plan.width, ignore_src=extra[0].text)
    return _Plan("read", src, plan.width, size_reg=extra[0].text)


# --- the inserted text -------------------------------------------------------------------------
def _fresh(text: str, name: str) -> str:
    """A name no identifier in the module contains, so new names cannot collide or shadow."""
    while name in text:
        name += "_"
    return name


def _param_edit(text: str, kernel: Entry, param: str) -> tuple[int, str]:
    decl = f".param .u64 {param}"
    if text[kernel.params_end] != ")":
        return kernel.params_end, f"({decl})"  # `.entry k {` has no parameter list at all
    # Inserted at the `)`, not after the last parameter, which may end in a `//` comment.
    return kernel.params_end, ("," if kernel.params else "") + f"\t{decl}\n"


def _indented(text: str, ins: Instruction, lines: list[str]) -> str:
    """Probe lines to insert at the instruction's first token: a label or `{` earlier on its line
    stays before the probe, so a branch to that label runs the probe too."""
    indent = text[text.rfind("\n", 0, ins.start) + 1:ins.start]
    indent = indent if indent.isspace() else "\t"
    return "".join(f"{line}\n{indent}" for line in lines)


def _prologue(prefix: str, param: str) -> str:
    # d0: probe buffer (global), d1: address, d2: highest byte's address, d3: a widened size.
    return (f"\n\t.reg .b64 {prefix}d<4>;\n\t.reg .pred {prefix}p;\n"
            f"\tld.param.u64 {prefix}d0, [{param}];\n\tcvta.to.global.u64 {prefix}d0, {prefix}d0;\n")


def _probe(ins: Instruction, plan: _Plan, index: int, prefix: str) -> list[str]:
    """Lines inserted just before `ins` (at its first token, so labels and scopes stay put)."""
    d0, addr_reg, high_reg, size64, pred = (f"{prefix}d0", f"{prefix}d1", f"{prefix}d2",
                                            f"{prefix}d3", f"{prefix}p")
    lines, addr = _address(plan.addr, addr_reg)
    high = addr
    conds: list[str] = [c for c in (ins.predicate, _negate(plan.ignore_src)) if c]
    if plan.generic:
        lines.append(f"isspacep.global {pred}, {addr};")
        conds.insert(0, pred)
    if plan.size_reg:
        # decode() adds width_bytes to the max slot, so store addr + size - width there.
        lines.append(f"setp.ne.u32 {pred}, {plan.size_reg}, 0;")  # zero bytes copied: nothing touched
        conds.insert(0, pred)
        lines += [f"cvt.u64.u32 {size64}, {plan.size_reg};", f"add.s64 {high_reg}, {addr}, {size64};",
                  f"add.s64 {high_reg}, {high_reg}, {-plan.width};"]
        high = high_reg
    guard = conds[0] if conds else None
    for cond in conds[1:]:
        lines.append(f"and.pred {pred}, {guard}, {cond};")
        guard = pred
    at = f"@{guard} " if guard else ""
    lines += [f"{at}red.global.min.u64 [{d0}+{16 * index}], {addr};",
              f"{at}red.global.max.u64 [{d0}+{16 * index + 8}], {high};"]
    return lines


def _negate(pred: str | None) -> str | None:
    if pred is None:
        return None
    return pred[1:] if pred.startswith("!") else "!" + pred


def _address(op: Operand, reg: str) -> tuple[list[str], str]:
    """Code putting the effective address `[base+offset]` in a 64-bit register, and that register.

    Bases are 64-bit registers or variables: ptxas rejects 32-bit global addresses on sm_90 and
    immediate-only ones outside `.local`; `[imm]` is still handled so such PTX fails in ptxas."""
    if op.base is None:
        return [f"mov.u64 {reg}, {op.offset};"], reg
    if op.base.startswith("%"):
        return ([f"add.s64 {reg}, {op.base}, {op.offset};"], reg) if op.offset else ([], op.base)
    lines = [f"mov.u64 {reg}, {op.base};"]  # a variable's address
    if op.offset:
        lines.append(f"add.s64 {reg}, {reg}, {op.offset};")
    return lines, reg


class _Registers:
    """Declared register types of one body: `.reg .b64 %rd<8>;` declares %rd0..%rd7."""

    def __init__(self, body: str) -> None:
        self.types: dict[str, str] = {}
        for kind, names in re.findall(r"\.reg\s+(?:\.v\d+\s+)?(\.\w+)\s+([^;]+);", body):
            for name in names.split(","):
                self.types[re.sub(r"<\d+>", "", name.strip())] = kind

    def type_of(self, reg: str) -> str | None:
        return self.types.get(reg) or self.types.get(reg.rstrip("0123456789"))
