"""variants.toml -> typed objects.

The first stage of the pipeline. Everything a later stage needs to know about a kernel family
(its template, parameters with their defaults and allowed values, dispatch rule) or about a
variant (its output file, parameters, required features) is validated here, so rendering and
validation can trust it. Errors name the file and, where the TOML text lets us find it, the line.
"""

from __future__ import annotations

import bisect
import difflib
import errno
import io
import math
import os
import re
import stat
import tomllib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from doppler_gen import observed
from doppler_gen.errors import ConfigError, file_kind, not_utf8
from doppler_gen.expressions import Expression, ExpressionError
from doppler_gen.expressions import parse as parse_expression

CONFIG_NAME = "variants.toml"
TEMPLATES_DIR = "templates"
GENERATED_DIR = "generated"

KNOWN_FEATURES = ("shader-f16", "subgroups", "timestamp-query")
# The host tiers Doppler's attention selector knows (variantMetadata.tier of its kernel registry).
DOPPLER_TIERS = (
    "tiled_large",
    "tiled_small",
    "streaming",
    "subgroup",
    "flash_prefill",
    "flash_reduce",
)

_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")  # always with fullmatch: `$` admits a final newline
# NAME_MAX of Linux, macOS and Windows file systems; `generate` first writes each file as
# ".FILE.xxxxxxxx.tmp" next to it (outputs.stage), 14 bytes more than FILE
FILE_NAME_LIMIT_BYTES = 255
MAX_OUTPUT_NAME_BYTES = FILE_NAME_LIMIT_BYTES - len("..xxxxxxxx.tmp")
_TEMPLATE_KEYS = {
    "source",
    "entry",
    "family",
    "description",
    "dispatch",
    "params",
    "choices",
    "tunable",
    "pass",
    "scratch",
    "dispatch_fold",
}
_PASS_KEYS = {"name", "source", "entry", "dispatch", "dispatch_fold"}
_VARIANT_KEYS = {"name", "template", "output", "description", "requires", "params", "overrides"}
# Doppler registry placement (see DopplerExport); kept apart so the export's keys stay one block
_TEMPLATE_KEYS |= {"doppler_operation"}
_VARIANT_KEYS |= {"doppler_operation", "doppler_id", "doppler_tier"}
ParamValue = int | float | str | bool
SINGLE_PASS = "main"  # the name of the one pass of a short-form template

# Names a template sees besides its parameters (render.Renderer.context and the environment's
# globals), and Jinja's own names: a parameter called one of these hid it (`fail` became an int)
# or was silently replaced. tests/test_bad_input.py checks that the renderer's names are here.
RESERVED_PARAM_NAMES = frozenset(
    {"variant_name", "pass_name", "requires", "fail", "QUANT_BITS"}
    | {"range", "dict", "lipsum", "cycler", "joiner", "namespace"}
    | {"loop", "self", "caller", "varargs", "kwargs"}
)
# Jinja's literal and operator words: no template can name a variable so
_JINJA_WORDS = frozenset(
    {"true", "false", "none", "True", "False", "None", "and", "or", "not", "in", "is", "if", "else"}
)


@dataclass(frozen=True)
class PassSpec:
    """One dispatch of a template: its own source template, entry point and workgroup count."""

    name: str
    source: str  # path relative to templates/
    dispatch: str  # workgroup-count expression over uniform fields and override constants
    entry: str | None = None  # None: the rendered module's only @compute function
    # ``dispatch`` parsed by the whitelisted grammar of doppler_gen.expressions (at load time,
    # so a bad rule never reaches the manifest) and the variants.toml line it is set on
    dispatch_expr: Expression | None = None
    line: int = 0
    # the kernel takes its workgroup count folded into a 2-D grid (x * y >= count, see
    # runtime.runner.dispatch_grid) where one dimension cannot hold it; read from workgroup_id
    # and num_workgroups, its linear index skips the x * y - count spare workgroups
    fold: bool = False

    @property
    def dispatch_expression(self) -> Expression:
        return self.dispatch_expr or parse_expression(self.dispatch, what="dispatch")

    @property
    def source_path(self) -> str:
        return f"{TEMPLATES_DIR}/{self.source}"


@dataclass(frozen=True)
class TemplateSpec:
    """A kernel template: one or more passes and the parameters they accept."""

    name: str
    family: str
    description: str
    params: Mapping[str, ParamValue]  # defaults; the key set is the accepted parameter set
    choices: Mapping[str, tuple[ParamValue, ...]]
    tunable: Mapping[str, tuple[ParamValue, ...]]
    line: int
    passes: tuple[PassSpec, ...] = ()
    # scratch buffer name -> size in elements, an expression over uniforms and constants
    scratch: Mapping[str, str] = field(default_factory=dict)
    # default Doppler registry operation of this template's variants (a variant may override it)
    doppler_operation: str | None = None
    params_line: int = 0  # the [templates.NAME.params] table's line
    # each scratch size parsed by the grammar of doppler_gen.expressions, and its line
    scratch_exprs: Mapping[str, Expression] = field(default_factory=dict)
    scratch_lines: Mapping[str, int] = field(default_factory=dict)

    @property
    def multi_pass(self) -> bool:
        return len(self.passes) > 1

    @property
    def source(self) -> str:
        """The first pass's template (the only one of a short-form template)."""
        return self.passes[0].source

    @property
    def dispatch(self) -> str:
        return self.passes[0].dispatch

    @property
    def dispatch_expr(self) -> Expression | None:
        return self.passes[0].dispatch_expr

    @property
    def dispatch_line(self) -> int:
        return self.passes[0].line

    @property
    def source_path(self) -> str:
        return f"{TEMPLATES_DIR}/{self.source}"

    @property
    def dispatch_expression(self) -> Expression:
        return self.dispatch_expr or parse_expression(self.dispatch, what="dispatch")


@dataclass(frozen=True)
class DopplerExport:
    """Where a variant goes in Doppler's kernel registry: ``operations.<operation>.variants.<id>``
    for each id, serving the host tier ``tier``. Declared in variants.toml, never derived from
    names, because the host's ids (``prefill_f16kv``) are not doppler-gen's variant names."""

    operation: str
    ids: tuple[str, ...]
    tier: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"operation": self.operation, "ids": list(self.ids), "tier": self.tier}


@dataclass(frozen=True)
class Variant:
    """One generated kernel: a template plus parameter values."""

    name: str
    template: TemplateSpec
    output: str  # path relative to the project root, always under generated/
    description: str
    requires: tuple[str, ...]
    params: Mapping[str, ParamValue]  # template defaults merged with the variant's own values
    line: int
    # pipeline-overridable constants the host should set when creating the pipeline (e.g. a
    # tuned WORKGROUP_SIZE); checked against the WGSL's `override` declarations
    overrides: Mapping[str, int | float] = field(default_factory=dict)
    # variants.toml line of each override, for errors found after render (type, range)
    override_lines: Mapping[str, int] = field(default_factory=dict)
    # its place in Doppler's kernel registry; None: not exported (no doppler_id declared)
    doppler: DopplerExport | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        """What a host needs to pick, size and dispatch this kernel.

        The keys are the family's (its required and optional host-metadata parameters), then
        the dispatch rule (one string, or one per pass) and the required features.
        """
        family = self.require_metadata()
        meta: dict[str, Any] = {key: self.params[key] for key in family.metadata}
        meta.update({key: self.params.get(key) for key in family.optional_metadata})
        if self.template.multi_pass:
            meta["dispatch"] = {p.name: p.dispatch for p in self.template.passes}
        else:
            meta["dispatch"] = self.template.dispatch
        meta["requires"] = list(self.requires)
        return meta

    def require_metadata(self) -> Any:
        """The variant's family, after checking the template defines the family's host metadata.

        Checked when a variant is rendered or its metadata read, not when variants.toml loads:
        loading stays free of family imports (``check``'s fast path).
        """
        from doppler_gen.families import get_family

        family = get_family(self.template.family)
        missing = [key for key in family.metadata if key not in self.params]
        if missing:
            template = self.template
            raise ConfigError(
                f"[templates.{template.name}.params] must define {', '.join(missing)} (host "
                f"metadata of family {template.family!r})",
                location=f"{CONFIG_NAME}:{template.params_line or template.line}",
            )
        return family

    def pass_output(self, spec: PassSpec) -> str:
        """The generated file of one pass: ``output`` itself, or ``NAME.PASS.wgsl`` for each
        pass of a multi-pass template."""
        if not self.template.multi_pass:
            return self.output
        return f"{self.output[: -len('.wgsl')]}.{spec.name}.wgsl"

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every file this variant generates, in pass order."""
        return tuple(self.pass_output(p) for p in self.template.passes)


@dataclass(frozen=True)
class Project:
    """A doppler-gen project: its root, templates and variants (in declaration order)."""

    root: Path
    templates: Mapping[str, TemplateSpec]
    variants: tuple[Variant, ...]
    config_text: str = field(repr=False, default="")

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def templates_dir(self) -> Path:
        return self.root / TEMPLATES_DIR

    @property
    def generated_dir(self) -> Path:
        return self.root / GENERATED_DIR

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise ConfigError(f"unknown variant {name!r} ({self.name_hint(name)})")

    def name_hint(self, name: str) -> str:
        """The nearest variant names, or where to find them all: a list of every name (over 70,
        some 3,000 characters) buried the one the user meant."""
        names = [v.name for v in self.variants]
        near = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        if near:
            return f"did you mean {', '.join(near)}?"
        return f"`doppler-gen list` shows the {len(names)} variants"


def find_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding a variants.toml."""
    start = start.resolve()
    for candidate in (start, *start.parents):
        if (candidate / CONFIG_NAME).is_file():
            return candidate
    raise ConfigError(f"no {CONFIG_NAME} found in {start} or any parent directory (use --root)")


def load_project(root: Path) -> Project:
    """Read and validate ``root/variants.toml``."""
    return parse_project(root, read_config(root, newline=None))


def read_config(root: Path, *, newline: str | None) -> str:
    """The text of ``root/variants.toml``: ``newline=None`` reads CRLF as LF (what the parser
    and the memo see), ``""`` keeps every line ending as it is (what an edit must write back)."""
    path = root / CONFIG_NAME
    try:
        # a FIFO or device would block the read forever (and with it every pre-commit hook)
        if not stat.S_ISREG(path.stat().st_mode):
            raise ConfigError(f"{path}: not a regular file; doppler-gen refuses to read it")
        # through `observed`, so a check remembers the exact bytes it parsed
        data = observed.read_bytes(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:  # where it is, not a byte offset into the file
        line, message = not_utf8(data, exc)
        where = f"{CONFIG_NAME}:{line}"
        raise ConfigError(f"{message}; TOML files are UTF-8", location=where) from None
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline=newline).read()


def universal_newlines(text: str) -> str:
    """``text`` with CRLF and CR line ends as LF: what ``read_config(newline=None)`` gives for
    variants.toml, and what Jinja's lexer reads in a template."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse_project(root: Path, text: str) -> Project:
    """Validate ``text`` as the variants.toml of ``root`` (its templates are looked up there)."""
    if text.startswith("\ufeff"):
        raise ConfigError(
            "starts with a UTF-8 byte-order mark (BOM), which TOML does not allow; save the file "
            "as UTF-8 without BOM",
            location=f"{CONFIG_NAME}:1",
        )
    locator = _Locator(text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_syntax_error(exc, text) from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(
            "invalid TOML: arrays or inline tables nested too deeply",
            location=f"{CONFIG_NAME}:{_most_nested_line(text)}",
        ) from None
    return _Parser(root, locator).project(data, text)


def _most_nested_line(text: str) -> int:
    """The line with the most opening brackets and braces: where a too-deep nesting starts."""
    lines = text.splitlines() or [""]
    counts = [line.count("[") + line.count("{") for line in lines]
    return counts.index(max(counts)) + 1


def _toml_syntax_error(exc: tomllib.TOMLDecodeError, text: str) -> ConfigError:
    message = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match:
        where = f"{CONFIG_NAME}:{match.group(1)}:{match.group(2)}"
        return ConfigError(f"invalid TOML: {message[: match.start()]}", location=where)
    match = re.search(r"\s*\(at end of document\)$", message)
    if match:  # e.g. an unclosed array or a key without a value on the last line
        where = f"{CONFIG_NAME}:{max(1, len(text.splitlines()))}"
        return ConfigError(
            f"invalid TOML: {message[: match.start()]} at end of file", location=where
        )
    return ConfigError(f"invalid TOML: {message}", location=CONFIG_NAME)


_SHOWN_LIMIT = 60  # a longer name is cut short in messages


def _shorten(text: str) -> str:
    """``text``, or its start and its length when it would swamp a one-line message."""
    if len(text) <= _SHOWN_LIMIT:
        return text
    return f"{text[:_SHOWN_LIMIT]}... ({len(text)} characters)"


def _source_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a template file, in words; None for a regular file.

    "Not found" only when nothing is there: a directory, a FIFO, a symlink loop or a name the
    file system refuses says what it is instead.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return f"is a symlink to {os.readlink(path)}, which does not exist"
        return "not found"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symlink loop"
        if exc.errno == errno.ENAMETOOLONG:
            return "has a name too long for the file system"
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    return f"is {file_kind(mode)}, not a template file"


# a table header, up to its comment: quoted names may hold '#' and ']'
_HEADER_RE = re.compile(r"""\s*(\[\[?(?:"[^"]*"|'[^']*'|[^\]"'#])*\]\]?)""")


def toml_code(lines: list[str]) -> list[str | None]:
    """Each line's TOML code: outside comments, with every string's text left out (``""``
    stays), so that a description reading ``requires = ...`` or ``[[variant]]`` is never taken
    for a key or a header. None for a line that starts inside a multi-line string or array:
    no key or header can start there. The scan tracks strings, comments and bracket depth
    across lines."""
    codes: list[str | None] = []
    quote = ""  # the open string's delimiter: ", ', \"\"\" or '''
    depth = 0  # open [ of arrays in values
    for line in lines:
        top = not quote and depth == 0
        if top and line.lstrip().startswith("["):  # a header holds no string or array left open
            header = _HEADER_RE.match(line)
            codes.append(header.group(1) if header else line.split("#", 1)[0])
            continue
        code: list[str] = []
        position = 0
        while position < len(line):
            if quote:
                if quote in ('"', '"""') and line[position] == "\\":
                    position += 2
                    continue
                if line.startswith(quote, position):
                    position += len(quote)
                    code.append(quote)
                    quote = ""
                    continue
                position += 1
                continue
            char = line[position]
            if char == "#":
                break
            if line.startswith('"""', position) or line.startswith("'''", position):
                quote = line[position : position + 3]
            elif char in "\"'":
                quote = char
            elif char == "[":
                depth += 1
            elif char == "]":
                depth = max(0, depth - 1)
            code.append(quote or char)
            position += len(quote) or 1
        if quote in ('"', "'"):
            quote = ""  # a one-line string cannot continue (invalid TOML; tomllib reports it)
        codes.append("".join(code) if top else None)
    return codes


def table_name(header: str) -> str:
    """A header line's table, spelled as this module asks for it: ``[[ variant ]]  # x`` is
    ``[[variant]]``, ``[templates."rmsnorm" . params]`` is ``[templates.rmsnorm.params]``
    (a comment, whitespace around dots and the quotes of a quoted name are TOML spelling; the
    name itself is what tomllib gives, for any name without escapes)."""
    found = _HEADER_RE.match(header)
    text = (found.group(1) if found else header.split("#", 1)[0]).strip()
    double = text.startswith("[[")
    inner = text[2:] if double else text[1:]
    end = inner.rfind("]]" if double else "]")
    if end < 0:
        return text
    parts = []
    for part in re.findall(r'\s*("[^"]*"|\'[^\']*\'|[^."\']+)\s*(?:\.|$)', inner[:end]):
        name = part.strip()
        parts.append(name[1:-1] if name[:1] in "\"'" else name)
    joined = ".".join(parts)
    return f"[[{joined}]]" if double else f"[{joined}]"


# names Windows reserves for devices whatever the extension: no generated file may have one
_WINDOWS_DEVICES = frozenset(
    ["con", "prn", "aux", "nul"] + [f"{port}{n}" for port in ("com", "lpt") for n in range(10)]
)


class _Locator:
    """Finds the line of a table or key in the TOML text; tomllib does not report positions.

    Every project load asks for the lines of every variant's and template's keys (thousands of
    questions for this project), so the text is indexed once: each line without its comment,
    the lines of each header, and the lines matching each table-ending pattern.
    """

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        codes = toml_code(self.lines)
        self._code = [code or "" for code in codes]
        self._headers: dict[str, list[int]] = {}
        self._header_names: dict[int, str] = {}
        for number, code in enumerate(codes, start=1):
            if code is not None and code.lstrip().startswith("["):
                name = table_name(code)
                self._headers.setdefault(name, []).append(number)
                self._header_names[number] = name
        self._stops: dict[str, list[int]] = {}

    def _table_line(self, header: str, occurrence: int = 0) -> int | None:
        """The line of the ``occurrence``-th ``header`` (however spaced or quoted)."""
        found = self._headers.get(header, [])
        return found[occurrence] if occurrence < len(found) else None

    def _end(self, start: int, stop: str) -> int:
        """The first header after ``start`` whose table name matches ``stop`` (one past the
        last line if none)."""
        if stop not in self._stops:
            pattern = re.compile(stop)
            self._stops[stop] = [
                number for number, name in self._header_names.items() if pattern.match(name)
            ]
        found = self._stops[stop]
        index = bisect.bisect_right(found, start)
        return found[index] if index < len(found) else len(self.lines) + 1

    def _key_line(
        self, start: int | None, key: str, stop: str = r"^\s*\[", prefix: str | None = None
    ) -> int | None:
        """The first line at or after ``start`` assigning ``key`` (with ``prefix``: the dotted
        ``prefix.key``), before a header matching ``stop``."""
        if start is None:
            return None
        dotted = rf"{re.escape(prefix)}\s*\.\s*" if prefix else ""
        pattern = re.compile(r"(^|[{,\s])" + dotted + re.escape(key) + r"\s*=")
        for number in range(start, self._end(start, stop)):
            if pattern.search(self._code[number - 1]):
                return number
        return None

    def variant(self, index: int, key: str | None = None) -> int | None:
        start = self._table_line("[[variant]]", index)
        if key is None:
            return start
        # a variant's keys may sit in its own sub-tables ([variant.params]), so only the next
        # [[variant]] or [templates.*] header ends the search; a parameter or override may be
        # a dotted key (params.dtype = ...)
        stop = r"^\s*\[(\[|templates)"
        found = self._key_line(start, key, stop)
        for prefix in ("params", "overrides"):
            found = found or self._key_line(start, key, stop, prefix)
        return found or start

    def template(self, name: str, key: str | None = None, sub: str | None = None) -> int | None:
        start = self._table_line(f"[templates.{name}]")
        if sub is not None:
            sub_start = self._table_line(f"[templates.{name}.{sub}]")
            if sub_start is not None:
                return (self._key_line(sub_start, key) if key else None) or sub_start
            found = self._key_line(start, sub) or (
                self._key_line(start, key, prefix=sub) if key else None
            )
            if found:
                return found
        if key is not None:
            return self._key_line(start, key) or start
        return start


class _Parser:
    """Turns the decoded TOML into a Project, raising ConfigError at the first problem."""

    def __init__(self, root: Path, locator: _Locator) -> None:
        self.root = root
        self.locate = locator

    def fail(self, message: str, line: int | None) -> ConfigError:
        where = f"{CONFIG_NAME}:{line}" if line else CONFIG_NAME
        return ConfigError(message, location=where)

    def project(self, data: dict[str, Any], text: str) -> Project:
        unknown = sorted(set(data) - {"templates", "variant"})
        if unknown:
            raise self.fail(
                f"unknown top-level key {unknown[0]!r} (expected [templates.NAME] tables and "
                "[[variant]] entries)",
                self.locate._key_line(1, unknown[0]) or self.locate._table_line(f"[{unknown[0]}]"),
            )
        templates_data = data.get("templates", {})
        if not isinstance(templates_data, dict) or not templates_data:
            raise self.fail("no [templates.NAME] table declared", None)
        templates = {name: self.template(name, spec) for name, spec in templates_data.items()}
        variants_data = data.get("variant", [])
        if not isinstance(variants_data, list) or not variants_data:
            raise self.fail("no [[variant]] entries declared", None)
        variants = tuple(self.variant(i, entry, templates) for i, entry in enumerate(variants_data))
        self.check_unique(variants)
        self.check_doppler_unique(variants)
        return Project(root=self.root, templates=templates, variants=variants, config_text=text)

    def template(self, name: str, spec: Any) -> TemplateSpec:
        line = self.locate.template(name)
        if not _NAME_RE.fullmatch(name):
            raise self.fail(f"template name {name!r} must match [a-z][a-z0-9_]*", line)
        if not isinstance(spec, dict):
            raise self.fail(f"[templates.{name}] must be a table", line)
        for key in sorted(set(spec) - _TEMPLATE_KEYS):
            raise self.fail(
                f"unknown key {key!r} in [templates.{name}] (allowed: "
                f"{', '.join(sorted(_TEMPLATE_KEYS))})",
                self.locate.template(name, key),
            )
        table = f"[templates.{name}]"
        family = self.string(spec, "family", table, self.locate.template(name, "family"))
        self.check_family(name, family)
        passes = self.passes(name, spec)
        params = self.template_params(name, spec.get("params"))
        choices = self.value_lists(name, spec.get("choices", {}), params, "choices")
        tunable = self.value_lists(name, spec.get("tunable", {}), params, "tunable")
        for param, allowed in choices.items():
            self.check_choice(
                param, params[param], allowed, self.locate.template(name, param, "params")
            )
        for param, values in tunable.items():  # else tune times a value --write then refuses
            for value in values if param in choices else ():
                self.check_choice(
                    param,
                    value,
                    choices[param],
                    self.locate.template(name, param, "tunable"),
                    f"[templates.{name}.tunable]",
                )
        return TemplateSpec(
            name=name,
            family=family,
            description=self.optional_string(
                spec, "description", table, self.locate.template(name, "description")
            ),
            params=params,
            choices=choices,
            tunable=tunable,
            line=line or 0,
            passes=passes,
            params_line=self.locate.template(name, None, "params") or 0,
            doppler_operation=self.doppler_name(
                spec, "doppler_operation", table, self.locate.template(name, "doppler_operation")
            ),
            **self.scratch(name, spec.get("scratch", {}), len(passes)),
        )

    def check_family(self, name: str, family: str) -> None:
        from doppler_gen.families import FAMILIES

        if family not in FAMILIES:
            raise self.fail(
                f"[templates.{name}] family {family!r} is not registered (registered: "
                f"{', '.join(FAMILIES)})",
                self.locate.template(name, "family"),
            )

    def passes(self, name: str, spec: Mapping[str, Any]) -> tuple[PassSpec, ...]:
        """The short form (source + dispatch: one pass named "main") or [[templates.X.pass]]."""
        table = f"[templates.{name}]"
        listed = spec.get("pass")
        if listed is None:
            source = self.string(spec, "source", table, self.locate.template(name, "source"))
            self.check_template_source(name, source, self.locate.template(name, "source"))
            line = self.locate.template(name, "dispatch")
            dispatch = self.string(spec, "dispatch", table, line)
            entry = self.optional_entry(spec, table, self.locate.template(name, "entry"))
            expr = self.expression(dispatch, f"[templates.{name}] dispatch", line)
            fold = self.optional_bool(
                spec, "dispatch_fold", table, self.locate.template(name, "dispatch_fold")
            )
            return (PassSpec(SINGLE_PASS, source, dispatch, entry, expr, line or 0, fold),)
        line = self.locate._table_line(f"[[templates.{name}.pass]]")
        for key in ("source", "dispatch", "entry", "dispatch_fold"):
            if key in spec:
                raise self.fail(
                    f"{table}: {key} belongs in each [[templates.{name}.pass]] when passes "
                    "are declared",
                    self.locate.template(name, key),
                )
        if not isinstance(listed, list) or not listed:
            raise self.fail(f"{table}: pass must be a list of [[templates.{name}.pass]]", line)
        passes: list[PassSpec] = []
        for index, entry in enumerate(listed):
            where = f"[[templates.{name}.pass]] #{index + 1}"
            at = self.locate._table_line(f"[[templates.{name}.pass]]", index) or line
            if not isinstance(entry, dict):
                raise self.fail(f"{where} must be a table", at)
            for key in sorted(set(entry) - _PASS_KEYS):
                raise self.fail(
                    f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(_PASS_KEYS))})",
                    self.locate._key_line(at, key) or at,
                )
            pass_name = self.string(entry, "name", where, self.locate._key_line(at, "name") or at)
            if not _NAME_RE.fullmatch(pass_name) or pass_name in {p.name for p in passes}:
                raise self.fail(
                    f"{where}: pass name {pass_name!r} must match [a-z][a-z0-9_]* and be unique",
                    self.locate._key_line(at, "name") or at,
                )
            source_line = self.locate._key_line(at, "source") or at
            source = self.string(entry, "source", where, source_line)
            self.check_template_source(name, source, source_line)
            dispatch_line = self.locate._key_line(at, "dispatch") or at
            dispatch = self.string(entry, "dispatch", where, dispatch_line)
            entry_point = self.optional_entry(entry, where, self.locate._key_line(at, "entry"))
            expr = self.expression(dispatch, f"{where} dispatch", dispatch_line)
            fold_line = self.locate._key_line(at, "dispatch_fold") or at
            fold = self.optional_bool(entry, "dispatch_fold", where, fold_line)
            passes.append(
                PassSpec(pass_name, source, dispatch, entry_point, expr, dispatch_line or 0, fold)
            )
        return tuple(passes)

    def optional_entry(self, table: Mapping[str, Any], where: str, line: int | None) -> str | None:
        if "entry" not in table:
            return None
        entry = table["entry"]
        if not isinstance(entry, str) or not re.fullmatch(r"[A-Za-z_]\w*", entry):
            raise self.fail(f"{where}: entry must be a WGSL function name, got {entry!r}", line)
        return entry

    def expression(self, text: str, what: str, line: int | None) -> Expression:
        """``text`` parsed by the dispatch grammar; an error is a config error at ``line``."""
        try:
            return parse_expression(text, what=what)
        except ExpressionError as error:
            raise self.fail(error.message, line) from None

    def scratch(self, name: str, table: Any, pass_count: int) -> dict[str, Any]:
        """Scratch buffers: name -> size in elements (an expression over uniforms/constants)."""
        line = self.locate.template(name, None, "scratch")
        if not isinstance(table, dict):
            raise self.fail(f"[templates.{name}.scratch] must be a table of size expressions", line)
        if table and pass_count < 2:
            raise self.fail(
                f"[templates.{name}.scratch]: scratch buffers need two or more passes (one "
                "pass's intermediate values belong in workgroup memory)",
                line,
            )
        for buffer, size in table.items():
            where = self.locate.template(name, buffer, "scratch")
            if not re.fullmatch(r"[A-Za-z_]\w*", buffer):
                raise self.fail(f"[templates.{name}.scratch] {buffer!r} is not a WGSL name", where)
            if not isinstance(size, str) or not size.strip():
                raise self.fail(
                    f"[templates.{name}.scratch] {buffer} must be a size expression string "
                    f"(elements), got {size!r}",
                    where,
                )
        return {
            "scratch": dict(table),
            "scratch_exprs": {
                buffer: self.expression(
                    size,
                    f"[templates.{name}.scratch] {buffer}",
                    self.locate.template(name, buffer, "scratch"),
                )
                for buffer, size in table.items()
            },
            "scratch_lines": {
                buffer: self.locate.template(name, buffer, "scratch") or 0 for buffer in table
            },
        }

    def check_template_source(self, name: str, source: str, line: int | None) -> None:
        relative = PurePosixPath(source)
        if relative.is_absolute() or ".." in relative.parts:
            raise self.fail(
                f"[templates.{name}] source {source!r} must be a path inside templates/", line
            )
        if "\0" in source:
            raise self.fail(f"[templates.{name}] source {source!r} contains a NUL byte", line)
        if str(relative) != source:
            # `./x.j2` or `lib//x.j2` reads the same file under another name: another header
            # and source hash for the same kernels
            raise self.fail(
                f"[templates.{name}] source {source!r} is not written plainly: write "
                f"{str(relative)!r}",
                line,
            )
        problem = _source_problem(self.root / TEMPLATES_DIR / relative)
        if problem:
            raise self.fail(f"template file templates/{_shorten(source)} {problem}", line)

    def template_params(self, name: str, params: Any) -> dict[str, ParamValue]:
        line = self.locate.template(name, None, "params")
        if not isinstance(params, dict):
            raise self.fail(
                f"[templates.{name}.params] must be a table of parameter defaults", line
            )
        for param, value in params.items():
            if not (param.isascii() and param.isidentifier()) or param in _JINJA_WORDS:
                raise self.fail(
                    f"[templates.{name}.params] {_shorten(param)!r} is no name a template can "
                    "use: ASCII letters, digits and _, not starting with a digit",
                    self.locate.template(name, param, "params"),
                )
            if param in RESERVED_PARAM_NAMES:
                raise self.fail(
                    f"[templates.{name}.params] {param!r} is a name every template already has "
                    f"(reserved: {', '.join(sorted(RESERVED_PARAM_NAMES))})",
                    self.locate.template(name, param, "params"),
                )
            if not isinstance(value, ParamValue):
                raise self.fail(
                    f"[templates.{name}.params] {param} must be an integer, float, string or "
                    f"boolean, not {type(value).__name__}",
                    self.locate.template(name, param, "params"),
                )
            if isinstance(value, float) and not math.isfinite(value):
                raise self.fail(
                    f"[templates.{name}.params] {param} = {value} is not a finite number (the "
                    "manifest is JSON, which has no nan or inf)",
                    self.locate.template(name, param, "params"),
                )
        return dict(params)

    def value_lists(
        self, name: str, table: Any, params: Mapping[str, ParamValue], sub: str
    ) -> dict[str, tuple[ParamValue, ...]]:
        if not isinstance(table, dict):
            raise self.fail(
                f"[templates.{name}.{sub}] must be a table", self.locate.template(name, None, sub)
            )
        result: dict[str, tuple[ParamValue, ...]] = {}
        for param, values in table.items():
            line = self.locate.template(name, param, sub)
            if param not in params:
                raise self.fail(f"[templates.{name}.{sub}] names unknown parameter {param!r}", line)
            if not isinstance(values, list) or not values:
                raise self.fail(f"[templates.{name}.{sub}] {param} must be a non-empty list", line)
            for value in values:
                self.check_type(param, value, params[param], line, f"[templates.{name}.{sub}]")
            result[param] = tuple(values)
        return result

    def variant(self, index: int, entry: Any, templates: Mapping[str, TemplateSpec]) -> Variant:
        line = self.locate.variant(index)
        where = f"[[variant]] #{index + 1}"
        if not isinstance(entry, dict):
            raise self.fail(f"{where} must be a table", line)
        name = self.string(entry, "name", where, self.locate.variant(index, "name"))
        where = f"variant {name!r}"
        if not _NAME_RE.fullmatch(name):
            raise self.fail(
                f"{where}: name must match [a-z][a-z0-9_]*", self.locate.variant(index, "name")
            )
        if name in _WINDOWS_DEVICES:  # generated/nul.wgsl opens the device there
            raise self.fail(
                f"{where}: {name} is a device name on Windows, where {GENERATED_DIR}/{name}.wgsl "
                "cannot be a file (a checkout there would fail): pick another name",
                self.locate.variant(index, "name"),
            )
        for key in sorted(set(entry) - _VARIANT_KEYS):
            raise self.fail(
                f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(_VARIANT_KEYS))})",
                self.locate.variant(index, key),
            )
        template_line = self.locate.variant(index, "template")
        template_name = self.string(entry, "template", where, template_line)
        if template_name not in templates:
            raise self.fail(
                f"{where}: unknown template {template_name!r} (declared: {', '.join(templates)})",
                self.locate.variant(index, "template"),
            )
        template = templates[template_name]
        output_line = self.locate.variant(index, "output")
        output = self.output_path(
            self.string(entry, "output", where, output_line), where, output_line, name
        )
        requires = entry.get("requires", [])
        if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
            raise self.fail(
                f"{where}: requires must be a list of feature names",
                self.locate.variant(index, "requires"),
            )
        for position, feature in enumerate(requires):
            if feature not in KNOWN_FEATURES:
                raise self.fail(
                    f"{where}: unknown feature {feature!r} (known: {', '.join(KNOWN_FEATURES)})",
                    self.locate.variant(index, "requires"),
                )
            if feature in requires[:position]:
                raise self.fail(
                    f"{where}: requires lists {feature!r} twice",
                    self.locate.variant(index, "requires"),
                )
        return Variant(
            name=name,
            template=template,
            output=output,
            description=self.optional_string(
                entry, "description", where, self.locate.variant(index, "description")
            ),
            requires=tuple(sorted(set(requires))),
            params=self.variant_params(index, where, entry.get("params", {}), template),
            line=line or 0,
            overrides=self.variant_overrides(index, where, entry.get("overrides", {})),
            override_lines=self.override_lines(index, entry.get("overrides", {})),
            doppler=self.doppler_export(index, where, entry, template),
        )

    def override_lines(self, index: int, table: Mapping[str, Any]) -> dict[str, int]:
        fallback = self.locate.variant(index, "overrides") or 0
        return {name: self.locate.variant(index, name) or fallback for name in table}

    def variant_overrides(self, index: int, where: str, table: Any) -> dict[str, int | float]:
        """Values that are numbers whatever the WGSL type; type and range are checked against
        the rendered WGSL's `override` declarations (manifest.check_overrides)."""
        line = self.locate.variant(index, "overrides")
        if not isinstance(table, dict):
            raise self.fail(f"{where}: overrides must be a table of override-constant values", line)
        for name, value in table.items():
            key_line = self.locate.variant(index, name) or line
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.fail(
                    f"{where}: override {name} must be a number, got {value!r}", key_line
                )
            if isinstance(value, float) and not math.isfinite(value):
                raise self.fail(
                    f"{where}: override {name} = {value} is not a finite number", key_line
                )
        return dict(sorted(table.items()))

    def variant_params(
        self, index: int, where: str, params: Any, template: TemplateSpec
    ) -> dict[str, ParamValue]:
        if not isinstance(params, dict):
            raise self.fail(
                f"{where}: params must be a table", self.locate.variant(index, "params")
            )
        merged = dict(template.params)
        for param, value in params.items():
            line = self.locate.variant(index, param)
            if param not in template.params:
                raise self.fail(
                    f"{where}: unknown parameter {param!r} for template {template.name!r} "
                    f"(accepted: {', '.join(sorted(template.params))})",
                    line,
                )
            self.check_type(param, value, template.params[param], line, where)
            if param in template.choices:
                self.check_choice(param, value, template.choices[param], line, where)
            merged[param] = value
        return merged

    def check_type(
        self, param: str, value: Any, default: ParamValue, line: int | None, where: str
    ) -> None:
        expected = type(default)
        ok = type(value) is expected or (expected is float and type(value) is int)
        if not ok:
            raise self.fail(
                f"{where}: parameter {param} must be {expected.__name__}, got "
                f"{type(value).__name__} {value!r}",
                line,
            )
        if expected is int and value <= 0:
            raise self.fail(
                f"{where}: parameter {param} must be a positive integer, got {value}", line
            )
        if expected is float and not math.isfinite(value):
            raise self.fail(
                f"{where}: parameter {param} = {value} is not a finite number (the manifest is "
                "JSON, which has no nan or inf)",
                line,
            )

    def check_choice(
        self,
        param: str,
        value: Any,
        allowed: tuple[ParamValue, ...],
        line: int | None,
        where: str = "",
    ) -> None:
        if value not in allowed:
            prefix = f"{where}: " if where else ""
            raise self.fail(
                f"{prefix}parameter {param}={value!r} is not one of "
                f"{', '.join(repr(a) for a in allowed)}",
                line,
            )

    def output_path(self, output: str, where: str, line: int | None, name: str = "") -> str:
        if any(ord(char) < 32 or ord(char) == 127 for char in output):
            raise self.fail(
                f"{where}: output {output!r} contains a control character (newline, tab, ...)",
                line,
            )
        if unicodedata.normalize("NFC", output) != output:
            raise self.fail(
                f"{where}: output {output!r} is not in Unicode NFC form (it could name a different "
                "file on another file system)",
                line,
            )
        path = PurePosixPath(output)
        if (
            path.is_absolute()
            or ".." in path.parts
            or len(path.parts) != 2
            or path.parts[0] != GENERATED_DIR
            or "\\" in output
        ):
            raise self.fail(
                f"{where}: output {output!r} must be a file directly inside {GENERATED_DIR}/ "
                f"(e.g. {GENERATED_DIR}/NAME.wgsl)",
                line,
            )
        if path.name == ".wgsl" or path.name.startswith("."):
            raise self.fail(
                f"{where}: output {output!r} has no file name (or a hidden one); use "
                f"{GENERATED_DIR}/{name or 'NAME'}.wgsl",
                line,
            )
        if path.suffix != ".wgsl":
            raise self.fail(f"{where}: output {output!r} must end in .wgsl", line)
        return output

    def check_unique(self, variants: tuple[Variant, ...]) -> None:
        names: dict[str, Variant] = {}
        outputs: dict[str, Variant] = {}
        for index, variant in enumerate(variants):
            if variant.name in names:
                raise self.fail(
                    f"duplicate variant name {variant.name!r} (first declared at line "
                    f"{names[variant.name].line})",
                    self.locate.variant(index, "name"),
                )
            for output in variant.outputs:
                self.check_file_name_length(variant, output, index)
                key = unicodedata.normalize("NFKC", output).casefold()
                if key in outputs:
                    raise self.fail(
                        f"variant {variant.name!r}: output {output!r} is already produced by "
                        f"variant {outputs[key].name!r}",
                        self.locate.variant(index, "output"),
                    )
                outputs[key] = variant
            if variant.output != f"{GENERATED_DIR}/{variant.name}.wgsl":
                raise self.fail(
                    f"variant {variant.name!r}: output {variant.output!r} must be "
                    f"{GENERATED_DIR}/{variant.name}.wgsl (named after the variant, so that a "
                    "kernel's file always says which variant it is)",
                    self.locate.variant(index, "output"),
                )
            names[variant.name] = variant

    def check_file_name_length(self, variant: Variant, output: str, index: int) -> None:
        """Refuse a name whose file, or the temporary file `generate` writes first
        (``.NAME.wgsl.xxxxxxxx.tmp``, see outputs.Transaction), would pass the file system's
        limit: found at load, not half-way through a write."""
        file_name = PurePosixPath(output).name
        size = len(file_name.encode("utf-8"))
        if size > MAX_OUTPUT_NAME_BYTES:
            raise self.fail(
                f"variant {_shorten(variant.name)}: name too long: the file name of "
                f"{_shorten(output)} has {size} bytes, over {MAX_OUTPUT_NAME_BYTES} (the temporary "
                f"file .FILE.xxxxxxxx.tmp that generate writes first must fit the file system's "
                f"{FILE_NAME_LIMIT_BYTES}-byte limit)",
                self.locate.variant(index, "name"),
            )

    # -- Doppler registry placement (doppler_operation, doppler_id, doppler_tier) --------------

    def doppler_name(
        self, table: Mapping[str, Any], key: str, where: str, line: int | None
    ) -> str | None:
        """An optional registry name (operation, id or tier): lower-case identifier or absent."""
        if key not in table:
            return None
        value = table[key]
        if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
            raise self.fail(f"{where}: {key} must be a name matching [a-z][a-z0-9_]*", line)
        return value

    def doppler_export(
        self, index: int, where: str, entry: Mapping[str, Any], template: TemplateSpec
    ) -> DopplerExport | None:
        """The variant's registry placement; None (not exported) when it declares no doppler_id."""
        operation = self.doppler_name(
            entry, "doppler_operation", where, self.locate.variant(index, "doppler_operation")
        )
        tier_line = self.locate.variant(index, "doppler_tier")
        tier = self.doppler_name(entry, "doppler_tier", where, tier_line)
        if tier is not None and tier not in DOPPLER_TIERS:
            raise self.fail(
                f"{where}: doppler_tier {tier!r} is not one of {', '.join(DOPPLER_TIERS)}",
                tier_line,
            )
        id_line = self.locate.variant(index, "doppler_id")
        ids = entry.get("doppler_id")
        if ids is None:
            if operation is not None or tier is not None:
                key = "doppler_operation" if operation is not None else "doppler_tier"
                raise self.fail(
                    f"{where}: {key} without doppler_id (the host's variant id, e.g. "
                    '"prefill_f16kv")',
                    self.locate.variant(index, key),
                )
            return None
        ids = [ids] if isinstance(ids, str) else ids
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, str) and _NAME_RE.fullmatch(i) for i in ids)
            or len(set(ids)) != len(ids)
        ):
            raise self.fail(
                f"{where}: doppler_id must be a name or a list of distinct names matching "
                "[a-z][a-z0-9_]*",
                id_line,
            )
        operation = operation or template.doppler_operation
        if operation is None:
            raise self.fail(
                f"{where}: doppler_id needs a registry operation: set doppler_operation on the "
                f"variant or on [templates.{template.name}]",
                id_line,
            )
        return DopplerExport(operation=operation, ids=tuple(ids), tier=tier)

    def check_doppler_unique(self, variants: tuple[Variant, ...]) -> None:
        """One registry entry per (operation, id): two variants cannot claim the same slot."""
        owners: dict[tuple[str, str], Variant] = {}
        for index, variant in enumerate(variants):
            if variant.doppler is None:
                continue
            for doppler_id in variant.doppler.ids:
                slot = (variant.doppler.operation, doppler_id)
                if slot in owners:
                    raise self.fail(
                        f"variant {variant.name!r}: doppler_id {doppler_id!r} of operation "
                        f"{slot[0]!r} is already declared by variant {owners[slot].name!r}",
                        self.locate.variant(index, "doppler_id"),
                    )
                owners[slot] = variant

    def string(self, table: Mapping[str, Any], key: str, where: str, line: int | None) -> str:
        if key not in table:
            raise self.fail(f"{where}: missing required key {key!r}", line)
        value = table[key]
        if not isinstance(value, str) or not value.strip():
            raise self.fail(f"{where}: {key} must be a non-empty string, got {value!r}", line)
        return value

    def optional_bool(
        self, table: Mapping[str, Any], key: str, where: str, line: int | None
    ) -> bool:
        value = table.get(key, False)
        if not isinstance(value, bool):
            raise self.fail(f"{where}: {key} must be true or false, got {value!r}", line)
        return value

    def optional_string(
        self, table: Mapping[str, Any], key: str, where: str, line: int | None
    ) -> str:
        value = table.get(key, "")
        if not isinstance(value, str):
            raise self.fail(f"{where}: {key} must be a string, got {value!r}", line)
        return value
