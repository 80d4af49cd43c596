"""A parser for the PTX that Triton 3.x and nvcc emit (sm_80, sm_90), into plain dataclasses.

Only what access analysis needs is kept: module header, global variables, kernel entries with
their parameters, and every instruction with its predicate, opcode, modifiers and operands.
Debug directives (`.loc`, `.file`, `.section` blocks) are read and dropped. Anything the parser
does not understand is an error naming the line, never silently skipped: a skipped instruction
could be the one store that makes a kernel unsafe to move.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kernelfleet.errors import UsageError


class PtxSyntaxError(UsageError):
    """Malformed PTX: the message names the line number and the text of that line."""

    def __init__(self, line: int, what: str, text: str) -> None:
        super().__init__(f"PTX line {line}: {what}: {text.strip()!r}")
        self.line = line


@dataclass(frozen=True)
class Operand:
    """One operand. kind: register, immediate, address, vector, pair, list, symbol or label.

    An address `[base + offset]` has `base` (a register or symbol) and `offset`; the tensor form
    `[tmap, {c0, c1}]` also has the coordinates in `items`. A vector `{a, b}`, a pair `a|b` and a
    call's `(a, b)` list hold their elements in `items`.
    """

    kind: str
    text: str
    base: str | None = None
    offset: int = 0
    items: tuple[Operand, ...] = ()


@dataclass(frozen=True)
class Instruction:
    line: int
    predicate: str | None  # "%p1", or "!%p1" when negated
    opcode: str  # first dotted part: "ld", "cp", "tensormap"
    modifiers: tuple[str, ...]  # the rest: ("global", "b32"), ("async", "bulk", "tensor", "2d", ...)
    operands: tuple[Operand, ...]
    start: int = -1  # offset in the parsed text of the first token (`@` or the opcode)

    @property
    def name(self) -> str:
        """The full dotted opcode, e.g. ``cp.async.cg.shared.global``."""
        return ".".join((self.opcode,) + self.modifiers)


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # ".u64", ".b8" ...
    is_pointer_hint: bool  # declared `.ptr` (Triton does this for every pointer argument)
    align: int | None
    array_bytes: int | None = None  # `.b8 name[128]`: a by-value struct or tensor map


@dataclass(frozen=True)
class Variable:
    """A module- or function-scope variable: `.global .u32 counter;`, `.extern .shared ... smem[];`."""

    name: str
    space: str  # "global", "shared", "local", "const"
    line: int


@dataclass
class Entry:
    name: str
    kind: str  # "entry" (a kernel) or "func"
    params: list[Param]
    instructions: list[Instruction] = field(default_factory=list)
    locals: list[Variable] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # label -> index of the next instruction
    # Offsets in the parsed text, for rewriters: where a parameter can be added (the `)` closing the
    # list, or just past the name when there is no list) and just past the body's opening `{`.
    params_end: int = -1
    body_start: int = -1


@dataclass
class Module:
    version: str | None
    target: str | None
    address_size: int
    entries: list[Entry]
    globals: list[Variable]
    functions: list[Entry] = field(default_factory=list)


_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+) | (?P<nl>\n)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<num>0[xX][0-9a-fA-F]+U?|0[fF][0-9a-fA-F]{8}|0[dD][0-9a-fA-F]{16}|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?U?)
  | (?P<id>[A-Za-z_$%.](?:[A-Za-z0-9_$.%]|::)*)
  | (?P<punct>[{}()\[\],;:@!+\-|<>=*/])
""", re.VERBOSE)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
# Directives that end at the end of their line instead of at a semicolon.
_LINE_DIRECTIVES = {".version", ".target", ".address_size", ".loc", ".file", ".reqntid", ".maxntid",
                    ".minnctapersm", ".maxnctapersm", ".maxnreg", ".reqnctapercluster",
                    ".explicitcluster", ".maxclusterrank", ".abi_preserve",
                    ".abi_preserve_control", ".blocksareclusters"}
_SPACES = {".global", ".shared", ".local", ".const"}
_LINKAGE = {".visible", ".extern", ".weak", ".common"}


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    line: int
    pos: int  # offset in the text (comments are blanked to spaces, so offsets stay true)


class _Parser:
    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.toks = self._lex(text)
        self.i = 0

    # --- tokens -------------------------------------------------------------------------------
    def _lex(self, text: str) -> list[_Tok]:
        # Blank comments out but keep their newlines so line numbers stay true.
        text = _COMMENTS.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
        toks, pos, line = [], 0, 1
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                self.fail(line, f"unexpected character {text[pos]!r}")
            kind = m.lastgroup or ""
            if kind == "nl":
                line += 1
            elif kind != "ws":
                toks.append(_Tok(kind, m.group(), line, m.start()))
            pos = m.end()
        return toks

    def integer(self, words: list[str], line: int, what: str) -> int:
        """The integer literal ``words`` starts with, or a syntax error naming ``what``."""
        value = integer(words[0]) if words else None
        if value is None or value < 0:
            self.fail(line, f"{what} must be a non-negative integer, got {words[0] if words else 'nothing'!r}")
        return value

    def fail(self, line: int, what: str) -> None:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else "<end of file>"
        raise PtxSyntaxError(line, what, text)

    def peek(self, k: int = 0) -> _Tok | None:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def next(self) -> _Tok:
        tok = self.peek()
        if tok is None:
            last = self.toks[-1].line if self.toks else 1
            self.fail(last, "unexpected end of file")
        self.i += 1
        return tok  # type: ignore[return-value]

    def expect(self, text: str) -> _Tok:
        tok = self.next()
        if tok.text != text:
            self.fail(tok.line, f"expected {text!r}, found {tok.text!r}")
        return tok

    def rest_of_line(self, line: int) -> list[_Tok]:
        out = []
        while (tok := self.peek()) is not None and tok.line == line and tok.text != ";":
            out.append(self.next())
        if (tok := self.peek()) is not None and tok.text == ";" and tok.line == line:
            self.next()
        return out

    def until_semicolon(self) -> list[_Tok]:
        out = []
        while (tok := self.next()).text != ";":
            out.append(tok)
        return out

    def skip_block(self) -> None:
        """Skip a `{ ... }` block (debug sections), balancing braces."""
        start = self.expect("{")
        depth = 1
        while depth:
            tok = self.peek()
            if tok is None:
                self.fail(start.line, "unbalanced '{': never closed")
            self.i += 1
            depth += {"{": 1, "}": -1}.get(tok.text, 0)

    # --- module -------------------------------------------------------------------------------
    def module(self) -> Module:
        mod = Module(None, None, 64, [], [])
        while (tok := self.peek()) is not None:
            if tok.text in (".version", ".target", ".address_size"):
                self.next()
                args = [t.text for t in self.rest_of_line(tok.line)]
                if not args:
                    self.fail(tok.line, f"{tok.text} needs a value")
                if tok.text == ".version":
                    mod.version = args[0]
                elif tok.text == ".target":
                    mod.target = "".join(args)
                elif not args[0].isdigit():
                    self.fail(tok.line, "bad .address_size")
                else:
                    mod.address_size = int(args[0])
            elif tok.text in (".file", ".loc"):
                self.next()
                self.rest_of_line(tok.line)
            elif tok.text == ".section":
                self.next()
                self.next()
                self.skip_block()
            elif tok.text == ".pragma":
                self.next()
                self.until_semicolon()
            else:
                self.declaration(mod)
        return mod

    def declaration(self, mod: Module) -> None:
        start = self.peek()
        assert start is not None
        while (tok := self.peek()) is not None and tok.text in _LINKAGE:
            self.next()
        tok = self.next()
        if tok.text in (".entry", ".func"):
            entry = self.function(tok)
            if entry is not None:
                (mod.entries if tok.text == ".entry" else mod.functions).append(entry)
        elif tok.text in _SPACES:
            mod.globals.append(self.variable(tok))
        elif tok.text == "}":
            self.fail(tok.line, "unbalanced '}'")
        else:
            self.fail(tok.line, f"unexpected {tok.text!r} at module level")

    def variable(self, space: _Tok) -> Variable:
        toks = self.until_semicolon()
        names = [t for t in toks if t.kind == "id" and not t.text.startswith(".")]
        if not names:
            self.fail(space.line, "variable declaration without a name")
        return Variable(names[0].text, space.text[1:], space.line)

    def function(self, head: _Tok) -> Entry | None:
        if head.text == ".func" and (tok := self.peek()) is not None and tok.text == "(":
            self.param_list()  # return value(s)
        name = self.next()
        if name.kind != "id":
            self.fail(name.line, f"expected a {head.text[1:]} name, found {name.text!r}")
        params_end = name.pos + len(name.text)
        params: list[Param] = []
        if (tok := self.peek()) is not None and tok.text == "(":
            params = self.param_list()
            params_end = self.toks[self.i - 1].pos
        while (tok := self.peek()) is not None and tok.text in _LINE_DIRECTIVES:
            self.next()
            self.rest_of_line(tok.line)
        if (tok := self.peek()) is not None and tok.text == ".noreturn":  # LLVM marks __assertfail so
            self.next()
        if (tok := self.peek()) is not None and tok.text == ";":
            self.next()  # a prototype
            return None
        entry = Entry(name.text, head.text[1:], params, params_end=params_end)
        self.body(entry)
        return entry

    def param_list(self) -> list[Param]:
        open_ = self.expect("(")
        params: list[Param] = []
        toks: list[_Tok] = []
        while True:
            tok = self.next()
            if tok.text in (",", ")"):
                if toks:
                    params.append(self.param(toks))
                elif tok.text == "," or params:
                    self.fail(tok.line, "empty parameter")
                toks = []
                if tok.text == ")":
                    return params
            elif tok.text in ("{", "}", ";"):
                self.fail(tok.line, f"unclosed parameter list (opened on line {open_.line})")
            else:
                toks.append(tok)

    def param(self, toks: list[_Tok]) -> Param:
        words = [t.text for t in toks]
        if words[0] not in (".param", ".reg"):
            self.fail(toks[0].line, f"expected .param, found {words[0]!r}")
        align = self.integer(words[words.index(".align") + 1:], toks[0].line, ".align") if ".align" in words else None
        types = [w for w in words if re.fullmatch(r"\.[bsuf](8|16|32|64)|\.pred", w)]
        names = [t for t in toks[1:] if t.kind == "id" and not t.text.startswith(".")]
        if not types or not names:
            self.fail(toks[0].line, "parameter needs a type and a name")
        size = None
        if "[" in words:
            k = words.index("[")
            if types[0] == ".pred":
                self.fail(toks[0].line, "a .pred parameter cannot be an array")
            count = self.integer(words[k + 1:], toks[0].line, "array size") if words[k + 1:k + 2] != ["]"] else 0
            size = count * int(types[0][2:]) // 8
        return Param(names[0].text, types[0], ".ptr" in words, align, size)

    # --- function body ------------------------------------------------------------------------
    def body(self, entry: Entry) -> None:
        open_ = self.expect("{")
        entry.body_start = open_.pos + 1
        depth = 1
        while depth:
            tok = self.peek()
            if tok is None:
                self.fail(open_.line, f"unbalanced '{{': body of {entry.name} never closed")
            if tok.text in ("{", "}"):
                self.next()
                depth += 1 if tok.text == "{" else -1
            elif tok.text in (".reg", ".pragma"):
                self.next()
                self.until_semicolon()
            elif tok.text in (".loc", ".file"):
                self.next()
                self.rest_of_line(tok.line)
            elif tok.text in _SPACES or tok.text == ".param":
                self.next()
                entry.locals.append(self.variable(tok))
            elif tok.kind == "id" and (nxt := self.peek(1)) is not None and nxt.text == ":":
                self.next()
                self.next()
                entry.labels[tok.text] = len(entry.instructions)
            elif tok.text.startswith(".") or tok.kind != "id" and tok.text != "@":
                self.fail(tok.line, f"unexpected {tok.text!r} in the body of {entry.name}")
            else:
                entry.instructions.append(self.instruction())
        labels = set(entry.labels)
        entry.instructions = [_relabel(ins, labels) for ins in entry.instructions]

    def instruction(self) -> Instruction:
        first = self.peek()
        assert first is not None
        pred = None
        if first.text == "@":
            self.next()
            neg = "!" if self.peek() is not None and self.peek().text == "!" else ""  # type: ignore[union-attr]
            if neg:
                self.next()
            reg = self.next()
            if reg.kind != "id" or reg.text.startswith("."):
                self.fail(reg.line, f"bad predicate {reg.text!r}")
            pred = neg + reg.text
        op = self.next()
        if op.kind != "id" or not op.text[0].isalpha():
            self.fail(op.line, f"expected an opcode, found {op.text!r}")
        parts = op.text.split(".")
        groups: list[list[_Tok]] = [[]]
        depth = 0
        while (tok := self.next()).text != ";" or depth:
            depth += {"[": 1, "{": 1, "(": 1, "]": -1, "}": -1, ")": -1}.get(tok.text, 0)
            if depth < 0:
                self.fail(tok.line, f"unbalanced {tok.text!r}")
            if tok.text == "," and depth == 0:
                groups.append([])
            else:
                groups[-1].append(tok)
        if groups == [[]]:
            groups = []
        operands = tuple(self.operand(g, op.line) for g in groups)
        return Instruction(op.line, pred, parts[0], tuple(parts[1:]), operands, first.pos)

    def operand(self, toks: list[_Tok], line: int) -> Operand:
        if not toks:
            self.fail(line, "empty operand")
        text = " ".join(t.text for t in toks)
        head, last = toks[0].text, toks[-1].text
        if head == "[" and last == "]":
            return self.address(toks[1:-1], text, toks[0].line)
        if (head, last) in (("{", "}"), ("(", ")")):
            items = tuple(self.operand(g, toks[0].line) for g in _split(toks[1:-1]) if g)
            return Operand("vector" if head == "{" else "list", text, items=items)
        if len(toks) == 3 and toks[1].text == "|":
            return Operand("pair", text, items=(self.operand(toks[:1], line), self.operand(toks[2:], line)))
        if head in ("-", "!") and len(toks) == 2:
            inner = self.operand(toks[1:], line)
            return Operand(inner.kind, head + inner.text)
        if len(toks) == 1:
            tok = toks[0]
            if tok.kind == "num":
                return Operand("immediate", tok.text)
            if tok.kind == "id" and tok.text.startswith("%"):
                return Operand("register", tok.text)
            if tok.kind == "id" and not tok.text.startswith("."):
                return Operand("symbol", tok.text)
            if tok.text == "_":
                return Operand("register", "_")
        self.fail(toks[0].line, f"bad operand {text!r}")
        raise AssertionError  # unreachable: fail raises

    def address(self, toks: list[_Tok], text: str, line: int) -> Operand:
        groups = _split(toks)
        if len(groups) == 2 and groups[1] and groups[1][0].text == "{":
            coords = self.operand(groups[1], line)
            inner = self.address(groups[0], text, line)
            return Operand("address", text, inner.base, inner.offset, coords.items)
        if len(groups) != 1 or not toks:
            self.fail(line, f"bad address {text!r}")
        base, offset, k = None, 0, 0
        if toks[0].kind == "id":
            base, k = toks[0].text, 1
        sign = 1
        for tok in toks[k:]:
            if tok.text in "+-" and tok.kind == "punct":
                sign = sign * (-1 if tok.text == "-" else 1)
            elif tok.kind == "num" and (base is None or toks.index(tok) > k):
                value = integer(tok.text)
                if value is None:
                    self.fail(line, f"bad address offset {tok.text!r}")
                offset += sign * value
                sign = 1
            else:
                self.fail(line, f"bad address {text!r}")
        if toks[-1].text in "+-" and toks[-1].kind == "punct":
            self.fail(line, f"bad address {text!r}")
        return Operand("address", text, base, offset)


def _split(toks: list[_Tok]) -> list[list[_Tok]]:
    groups: list[list[_Tok]] = [[]]
    depth = 0
    for tok in toks:
        depth += {"[": 1, "{": 1, "(": 1, "]": -1, "}": -1, ")": -1}.get(tok.text, 0)
        if tok.text == "," and depth == 0:
            groups.append([])
        else:
            groups[-1].append(tok)
    return groups


def _relabel(ins: Instruction, labels: set[str]) -> Instruction:
    if not any(op.kind == "symbol" and op.text in labels for op in ins.operands):
        return ins
    ops = tuple(Operand("label", op.text) if op.kind == "symbol" and op.text in labels else op
                for op in ins.operands)
    return Instruction(ins.line, ins.predicate, ins.opcode, ins.modifiers, ops, ins.start)


def integer(text: str) -> int | None:
    """A PTX integer literal (decimal, ``0x`` hex, ``0b`` binary; an unsigned ``U`` suffix), or None."""
    try:
        return int(text.rstrip("U"), 0)
    except ValueError:
        return None


def parse(text: str) -> Module:
    """Parse a PTX module. Raises PtxSyntaxError (a UsageError) naming the first bad line."""
    return _Parser(text).module()
