"""Read a WGSL module's host-facing interface, and lay out its types by WGSL's rules.

The manifest is built from what the generated WGSL *declares*, never from a second hand-written
description, so the two cannot drift: bindings (group, index, address space, access, type), the
uniform struct with byte offsets (WGSL alignment and size rules), override constants with their
defaults, module constants, workgroup variables (for static workgroup storage) and the entry
point with its workgroup size. This is not a full WGSL parser: it reads module-scope
declarations, which is all a host needs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from doppler_gen.errors import InterfaceError, line_at

SCALARS = {"f32": (4, 4), "u32": (4, 4), "i32": (4, 4), "f16": (2, 2), "bool": (4, 4)}


@dataclass(frozen=True)
class WgslType:
    """A parsed WGSL type: a scalar, vector, matrix, (runtime-sized) array, atomic or struct."""

    kind: str  # "scalar" | "vec" | "mat" | "array" | "atomic" | "struct"
    name: str  # scalar or struct name; for vec/mat/array/atomic the element's text
    element: WgslType | None = None
    count: int | None = None  # vec size, array length (None: runtime-sized), mat columns
    rows: int | None = None  # mat rows

    def __str__(self) -> str:
        if self.kind in ("scalar", "struct"):
            return self.name
        if self.kind == "vec":
            return f"vec{self.count}<{self.element}>"
        if self.kind == "mat":
            return f"mat{self.count}x{self.rows}<{self.element}>"
        if self.kind == "atomic":
            return f"atomic<{self.element}>"
        if self.count is None:
            return f"array<{self.element}>"
        return f"array<{self.element}, {self.count}>"


@dataclass(frozen=True)
class Binding:
    group: int
    binding: int
    name: str
    address_space: str  # "uniform" | "storage"
    access: str  # "read" | "read_write"
    type: WgslType

    @property
    def element_type(self) -> str | None:
        """The scalar the host fills a storage array binding with.

        ``array<vec4<f16>>`` (a kernel reading four elements per load) is filled with f16 like
        ``array<f16>``: the vector only changes how the kernel reads the same bytes.
        """
        if self.type.kind != "array" or self.type.element is None:
            return None
        element = self.type.element
        return str(element.element if element.kind == "vec" else element)

    @property
    def vector_width(self) -> int:
        """Elements per array element: 4 for ``array<vec4<f16>>``, 1 for ``array<f16>``."""
        element = self.type.element if self.type.kind == "array" else None
        return int(element.count or 1) if element is not None and element.kind == "vec" else 1


@dataclass(frozen=True)
class StructField:
    name: str
    type: WgslType
    offset: int
    size: int
    align: int


@dataclass(frozen=True)
class Struct:
    name: str
    fields: tuple[StructField, ...]
    size: int
    align: int


@dataclass(frozen=True)
class Override:
    name: str
    type: str
    default: int | float | bool | None
    id: int | None = None


@dataclass(frozen=True)
class EntryPoint:
    """One ``@compute`` function: its workgroup size and the module-scope names it reaches.

    ``uses`` holds every identifier the function or any function it calls (transitively)
    mentions; a binding or workgroup variable is *used by* the entry point when its name is in
    it. That is what WebGPU's ``layout: "auto"`` and its workgroup-storage limit count.
    """

    name: str
    workgroup_size: tuple[str, ...]
    uses: frozenset[str] = frozenset()


@dataclass
class Module:
    """The module-scope declarations of one WGSL source."""

    enables: list[str] = field(default_factory=list)
    constants: dict[str, int | float | bool] = field(default_factory=dict)
    overrides: dict[str, Override] = field(default_factory=dict)
    structs: dict[str, Struct] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    workgroup_vars: dict[str, WgslType] = field(default_factory=dict)
    entry_points: dict[str, EntryPoint] = field(default_factory=dict)
    # identifiers each function body mentions, by function name (for reachability)
    function_uses: dict[str, frozenset[str]] = field(default_factory=dict)
    # subgroup builtin functions called and subgroup builtin values declared: each needs
    # `enable subgroups;` in Tint, while naga (wgpu) checks only the device's capability
    subgroup_builtins: frozenset[str] = frozenset()

    @property
    def entry_point(self) -> str | None:
        """The module's only compute entry point; None when it has none or several."""
        return next(iter(self.entry_points)) if len(self.entry_points) == 1 else None

    @property
    def workgroup_size(self) -> tuple[str, ...]:
        """The workgroup size of the only entry point (``()`` when there is not exactly one)."""
        entry = self.entry(self.entry_point)
        return entry.workgroup_size if entry else ()

    def entry(self, name: str | None) -> EntryPoint | None:
        return self.entry_points.get(name) if name else None

    def binding(self, name: str) -> Binding | None:
        return next((b for b in self.bindings if b.name == name), None)

    def bindings_of(self, entry: str) -> list[Binding]:
        """The bindings ``entry`` uses: exactly what its ``layout: "auto"`` bind group holds."""
        uses = self.entry_points[entry].uses
        return [b for b in self.bindings if b.name in uses]

    def entry_storage_bytes(self, entry: str) -> int:
        """Static workgroup storage of the variables ``entry`` reaches (WebGPU's count)."""
        uses = self.entry_points[entry].uses
        return sum(
            _round_up(16, self.size_of(t)) for n, t in self.workgroup_vars.items() if n in uses
        )

    def entry_workgroup_size(self, entry: str, overrides: dict[str, Any] | None = None):
        """``entry``'s workgroup size with override defaults (or the given values) applied."""
        names = self._names(overrides)
        return tuple(int(evaluate(e, names)) for e in self.entry_points[entry].workgroup_size)

    def size_of(self, wgsl_type: WgslType) -> int:
        return layout(wgsl_type, self.structs)[0]

    @property
    def workgroup_storage_bytes(self) -> int:
        """Static workgroup storage as WebGPU counts it: each variable rounded up to 16 bytes."""
        return sum(_round_up(16, self.size_of(t)) for t in self.workgroup_vars.values())

    def workgroup_size_values(self, overrides: dict[str, Any] | None = None) -> tuple[int, ...]:
        """The workgroup size with override defaults (or the given override values) applied."""
        names = self._names(overrides)
        return tuple(int(evaluate(expr, names)) for expr in self.workgroup_size)

    def _names(self, overrides: dict[str, Any] | None = None) -> dict[str, int | float | bool]:
        names: dict[str, int | float | bool] = dict(self.constants)
        for name, decl in self.overrides.items():
            if decl.default is not None:
                names[name] = decl.default
        names.update(overrides or {})
        return names

    def interface(self) -> dict[str, Any]:
        """A comparable description of what a host binds and sets (used to diff kernels)."""
        uniform = next((b for b in self.bindings if b.address_space == "uniform"), None)
        struct = self.structs.get(uniform.type.name) if uniform else None
        return {
            "enables": sorted(self.enables),
            "bindings": [
                (b.group, b.binding, b.address_space, b.access, str(b.type), b.name)
                for b in sorted(self.bindings, key=lambda b: (b.group, b.binding))
            ],
            "uniforms": [(f.name, str(f.type), f.offset) for f in struct.fields] if struct else [],
            "overrides": sorted((o.name, o.type, o.default) for o in self.overrides.values()),
            "entry_point": self.entry_point,
            "workgroup_size": self.workgroup_size,
        }


# -- parsing ----------------------------------------------------------------------------------


def strip_comments(source: str) -> str:
    """Remove // and (nested) /* */ comments, keeping newlines so offsets map to lines."""
    out: list[str] = []
    position, depth, n = 0, 0, len(source)
    while position < n:
        if depth == 0:
            match = _OUTSIDE_COMMENT_RE.search(source, position)
            if match is None:
                out.append(source[position:])
                break
            out.append(source[position : match.start()])
            if match.group() == "//":
                end = source.find("\n", match.end())
                position = n if end < 0 else end
            else:
                depth, position = 1, match.end()
            continue
        match = _INSIDE_COMMENT_RE.search(source, position)
        end = n if match is None else match.start()
        out.append("\n" * source.count("\n", position, end))
        if match is None:
            break
        depth += 1 if match.group() == "/*" else -1
        position = match.end()
    return "".join(out)


# what ends plain text (a line or block comment) and what nests or ends a block comment
_OUTSIDE_COMMENT_RE = re.compile(r"//|/\*")
_INSIDE_COMMENT_RE = re.compile(r"/\*|\*/")
_BRACE_RE = re.compile(r"[{}]")


_ATTRS = r"((?:@\w+(?:\([^)]*\))?\s*)*)"
_IDENT = r"[A-Za-z_]\w*"
# WGSL's subgroup builtin functions (the `subgroups` extension) called, and its builtin values
_SUBGROUP_CALL_RE = re.compile(
    r"\b(subgroup(?:(?:Exclusive|Inclusive)?(?:Add|Mul)|All|Any|And|Or|Xor|Min|Max|Ballot"
    r"|Broadcast(?:First)?|Elect|Shuffle(?:Xor|Up|Down)?)|quad(?:Broadcast|Swap(?:X|Y|Diagonal)))"
    r"\s*\("
)
_SUBGROUP_VALUE_RE = re.compile(r"@builtin\s*\(\s*(subgroup_(?:invocation_id|size))\s*\)")
_DECL_RE = re.compile(
    _ATTRS + r"\b(?P<kw>enable|const|override|struct|var|fn|alias|requires|diagnostic)\b"
)


def parse_module(source: str) -> Module:
    """Parse module-scope declarations; raises InterfaceError on something it cannot read."""
    text = strip_comments(source)
    module = Module()
    depth = 0
    position = 0
    while True:
        match = _DECL_RE.search(text, position)
        if match is None:
            break
        depth += text.count("{", position, match.start()) - text.count("}", position, match.start())
        if depth != 0:
            position = match.end()
            continue
        try:
            position = _parse_declaration(module, text, match)
        except InterfaceError as exc:
            if exc.line is None:  # the declaration's first line
                exc.line = line_at(text, match.start("kw"))
            raise
    _resolve_uses(module)
    called = {m.group(1) for m in _SUBGROUP_CALL_RE.finditer(text)} - set(module.function_uses)
    module.subgroup_builtins = frozenset(
        called | {m.group(1) for m in _SUBGROUP_VALUE_RE.finditer(text)}
    )  # a function the module declares itself (fn subgroupAdd) is no builtin
    return module


def _parse_declaration(module: Module, text: str, match: re.Match[str]) -> int:
    """Read the module-scope declaration ``match`` starts; returns the offset after it."""
    attrs, keyword = match.group(1) or "", match.group("kw")
    start = match.start("kw")
    if keyword in ("struct", "fn"):
        brace = text.find("{", start)
        if brace < 0:
            raise InterfaceError(
                f"{keyword} declaration at line {line_at(text, start)} has no body"
            )
        end = _matching_brace(text, brace)
        if keyword == "struct":
            _parse_struct(module, text[start : end + 1])
        else:
            _parse_fn(module, attrs, text[start:end])
        return end + 1
    end = text.find(";", start)
    if end < 0:
        raise InterfaceError(f"unterminated {keyword} declaration at line {line_at(text, start)}")
    statement = " ".join(text[start:end].split())
    _parse_statement(module, attrs, keyword, statement, line_at(text, start))
    return end + 1


def _resolve_uses(module: Module) -> None:
    """Close each entry point's identifiers over the functions it calls."""
    for name, entry in list(module.entry_points.items()):
        seen: set[str] = set()
        pending = [name]
        uses: set[str] = set()
        while pending:
            function = pending.pop()
            if function in seen:
                continue
            seen.add(function)
            mentioned = module.function_uses.get(function, frozenset())
            uses |= mentioned
            pending.extend(m for m in mentioned if m in module.function_uses)
        module.entry_points[name] = EntryPoint(name, entry.workgroup_size, frozenset(uses))


def _matching_brace(text: str, open_index: int) -> int:
    depth = 0
    for match in _BRACE_RE.finditer(text, open_index):
        if match.group() == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return match.start()
    raise InterfaceError(f"unbalanced braces from line {line_at(text, open_index)}")


def _attr(attrs: str, name: str) -> str | None:
    match = re.search(r"@" + name + r"\s*\(([^)]*)\)", attrs)
    return match.group(1).strip() if match else None


def _parse_statement(module: Module, attrs: str, keyword: str, stmt: str, line: int) -> None:
    if keyword == "enable":
        module.enables.extend(e.strip() for e in stmt[len("enable") :].split(",") if e.strip())
        return
    if keyword in ("const", "override"):
        match = re.match(
            rf"{keyword}\s+(?P<name>{_IDENT})\s*(?::\s*(?P<type>[^=]+?))?\s*(?:=\s*(?P<expr>.+))?$",
            stmt,
        )
        if not match:
            raise InterfaceError(f"cannot read {keyword} declaration at line {line}: {stmt}")
        name, type_text, expr = match.group("name"), match.group("type"), match.group("expr")
        names = module._names()
        value = evaluate(expr, names) if expr else None
        if keyword == "const":
            if value is None:
                raise InterfaceError(f"const {name} at line {line} has no value")
            module.constants[name] = value
        else:
            ident = _attr(attrs, "id")
            module.overrides[name] = Override(
                name=name,
                type=(type_text or _type_of_literal(value)).strip(),
                default=value,
                id=int(ident) if ident else None,
            )
        return
    if keyword == "var":
        match = re.match(
            rf"var\s*(?:<\s*(?P<space>\w+)\s*(?:,\s*(?P<access>\w+))?\s*>)?\s*"
            rf"(?P<name>{_IDENT})\s*:\s*(?P<type>.+?)(?:\s*=.*)?$",
            stmt,
        )
        if not match:
            raise InterfaceError(f"cannot read var declaration at line {line}: {stmt}")
        space = match.group("space") or "private"
        wgsl_type = parse_type(match.group("type"), module._names())
        if space == "workgroup":
            module.workgroup_vars[match.group("name")] = wgsl_type
        elif space in ("uniform", "storage"):
            group, binding = _attr(attrs, "group"), _attr(attrs, "binding")
            if group is None or binding is None:
                raise InterfaceError(f"{space} variable at line {line} lacks @group/@binding")
            access = match.group("access") or "read"
            module.bindings.append(
                Binding(int(group), int(binding), match.group("name"), space, access, wgsl_type)
            )


def _parse_struct(module: Module, text: str) -> None:
    match = re.match(rf"struct\s+(?P<name>{_IDENT})\s*\{{(?P<body>.*)\}}$", text, re.S)
    if not match:
        raise InterfaceError(f"cannot read struct: {text[:60]}")
    members: list[tuple[str, WgslType]] = []
    for part in _split_top_level(match.group("body")):
        part = re.sub(r"@\w+(\([^)]*\))?", "", part).strip()
        if not part:
            continue
        name, _, type_text = part.partition(":")
        members.append((name.strip(), parse_type(type_text, module._names())))
    offset, align = 0, 1
    fields: list[StructField] = []
    for name, member_type in members:
        size, member_align = layout(member_type, module.structs)
        offset = _round_up(member_align, offset)
        fields.append(StructField(name, member_type, offset, size, member_align))
        offset += size
        align = max(align, member_align)
    struct = Struct(match.group("name"), tuple(fields), _round_up(align, offset), align)
    module.structs[struct.name] = struct


def _parse_fn(module: Module, attrs: str, text: str) -> None:
    match = re.match(rf"fn\s+(?P<name>{_IDENT})", text)
    if match:
        body = text[match.end() :]
        module.function_uses[match.group("name")] = frozenset(re.findall(_IDENT, body))
    if "@compute" not in attrs:
        return
    size = _attr(attrs, "workgroup_size")
    if not match or size is None:
        raise InterfaceError("compute entry point without a name or @workgroup_size")
    name = match.group("name")
    if name in module.entry_points:
        raise InterfaceError(f"compute entry point {name} is declared twice")
    workgroup = tuple(" ".join(p.split()) for p in _split_top_level(size))
    workgroup += ("1",) * (3 - len(workgroup))  # omitted y and z are 1, as WGSL says
    module.entry_points[name] = EntryPoint(name, workgroup)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char in "<([":
            depth += 1
        elif char in ">)]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if "".join(current).strip():
        parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_type(text: str, names: dict[str, Any]) -> WgslType:
    text = " ".join(text.split())
    if text in SCALARS:
        return WgslType("scalar", text)
    match = re.match(r"^(vec([234])|mat([234])x([234])|array|atomic)\s*<(.*)>$", text)
    if not match:
        if re.fullmatch(_IDENT, text):
            return WgslType("struct", text)
        raise InterfaceError(f"cannot read WGSL type {text!r}")
    head, args = match.group(1), _split_top_level(match.group(5))
    element = parse_type(args[0], names)
    if head.startswith("vec"):
        return WgslType("vec", str(element), element, int(match.group(2)))
    if head.startswith("mat"):
        return WgslType("mat", str(element), element, int(match.group(3)), int(match.group(4)))
    if head == "atomic":
        return WgslType("atomic", str(element), element)
    count = int(evaluate(args[1], names)) if len(args) > 1 else None
    return WgslType("array", str(element), element, count)


# -- layout -----------------------------------------------------------------------------------


def _round_up(k: int, n: int) -> int:
    return -(-n // k) * k


def layout(wgsl_type: WgslType, structs: dict[str, Struct]) -> tuple[int, int]:
    """(SizeOf, AlignOf) per the WGSL specification's memory layout rules."""
    if wgsl_type.kind == "scalar":
        return SCALARS[wgsl_type.name]
    if wgsl_type.kind == "atomic":
        return layout(wgsl_type.element, structs)  # type: ignore[arg-type]
    if wgsl_type.kind == "vec":
        scalar_size = SCALARS[wgsl_type.element.name][0]  # type: ignore[union-attr]
        n = wgsl_type.count or 0
        return n * scalar_size, (4 if n == 3 else n) * scalar_size
    if wgsl_type.kind == "mat":
        column = WgslType("vec", "", wgsl_type.element, wgsl_type.rows)
        column_size, column_align = layout(column, structs)
        stride = _round_up(column_align, column_size)
        return stride * (wgsl_type.count or 0), column_align
    if wgsl_type.kind == "array":
        size, align = layout(wgsl_type.element, structs)  # type: ignore[arg-type]
        stride = _round_up(align, size)
        return stride * (wgsl_type.count or 1), align
    struct = structs.get(wgsl_type.name)
    if struct is None:
        raise InterfaceError(f"unknown struct {wgsl_type.name!r}")
    return struct.size, struct.align


# -- constant expressions ---------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"\s*(?:(?P<num>0[xX][0-9a-fA-F]+[iu]?|\d+\.\d*(?:[eE][+-]?\d+)?[fh]?|\d*\.\d+(?:[eE][+-]?\d+)?[fh]?"
    r"|\d+[eE][+-]?\d+[fh]?|\d+[iufh]?)|(?P<name>[A-Za-z_]\w*)|(?P<op>[-+*/%()]))"
)


def _type_of_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return "f32" if isinstance(value, float) else "u32"


def evaluate(expr: str, names: dict[str, Any]) -> int | float | bool:
    """Evaluate a constant WGSL expression of literals, names and + - * / % ( )."""
    tokens = _tokenize(expr)
    value, rest = _expr(tokens, names)
    if rest:
        raise InterfaceError(f"cannot evaluate WGSL expression {expr!r}")
    return value


def _tokenize(expr: str) -> list[str]:
    tokens, position = [], 0
    expr = expr.strip()
    while position < len(expr):
        match = _TOKEN_RE.match(expr, position)
        if not match or match.end() == position:
            raise InterfaceError(f"cannot evaluate WGSL expression {expr!r}")
        tokens.append(match.group().strip())
        position = match.end()
    return tokens


def _expr(tokens: list[str], names: dict[str, Any]) -> tuple[Any, list[str]]:
    value, tokens = _term(tokens, names)
    while tokens and tokens[0] in "+-":
        op, (rhs, tokens) = tokens[0], _term(tokens[1:], names)
        value = value + rhs if op == "+" else value - rhs
    return value, tokens


def _term(tokens: list[str], names: dict[str, Any]) -> tuple[Any, list[str]]:
    value, tokens = _unary(tokens, names)
    while tokens and tokens[0] in ("*", "/", "%"):
        op, (rhs, tokens) = tokens[0], _unary(tokens[1:], names)
        if op == "*":
            value = value * rhs
        elif rhs == 0:
            raise InterfaceError("division by zero in WGSL expression")
        elif isinstance(value, int) and isinstance(rhs, int):
            # WGSL integer division and remainder truncate toward zero (Python's floor)
            quotient = abs(value) // abs(rhs) * (1 if (value < 0) == (rhs < 0) else -1)
            value = quotient if op == "/" else value - quotient * rhs
        else:
            value = value / rhs if op == "/" else math.fmod(value, rhs)
    return value, tokens


def _unary(tokens: list[str], names: dict[str, Any]) -> tuple[Any, list[str]]:
    if not tokens:
        raise InterfaceError("unexpected end of WGSL expression")
    head = tokens[0]
    if head == "-":
        value, rest = _unary(tokens[1:], names)
        return -value, rest
    if head == "(":
        value, rest = _expr(tokens[1:], names)
        if not rest or rest[0] != ")":
            raise InterfaceError("unbalanced parentheses in WGSL expression")
        return value, rest[1:]
    if head in ("true", "false"):
        return head == "true", tokens[1:]
    if re.fullmatch(r"[A-Za-z_]\w*", head):
        if head not in names:
            raise InterfaceError(f"WGSL expression uses unknown name {head!r}")
        return names[head], tokens[1:]
    return _literal(head), tokens[1:]


def _literal(token: str) -> int | float:
    if token.lower().startswith("0x"):
        return int(token.rstrip("iu"), 16)
    if re.fullmatch(r"\d+[iu]?", token):
        return int(token.rstrip("iu"))
    return float(token.rstrip("fh"))
