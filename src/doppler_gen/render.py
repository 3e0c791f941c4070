"""Render a variant's Jinja template into WGSL.

Second stage of the pipeline. Rendering is strict (an undefined name is an error, never an empty
string) and deterministic (LF line ends, no trailing whitespace, at most one blank line in a row,
exactly one trailing newline). Every error is reported at the template line that caused it.

Each rendered line also carries the template line it came from (a *source map*), so that a WGSL
compiler's complaint about ``generated/X.wgsl:120`` can be shown at ``templates/Y:42``. The map is
built by rendering a second time from a copy of the templates with an invisible marker at the end
of every text line; it is used only when the marked render, markers removed, is identical to the
real one, so it can never change what is generated.

Templates are data, not code a checkout may run: they render in Jinja's sandbox (no ``__dunder__``
attributes, so no route to Python modules, the environment or the filesystem), read only files
that resolve inside templates/, and each variant has a time limit and an output size cap. There is
no on-disk bytecode cache: a cache keyed on less than the exact code that compiled it (Jinja folds
filter calls on literals at compile time) would let `generate` write old text. Within one process
compiled templates are shared between renderers (``_CompiledCode``), keyed on the exact source text:
a process that loads projects again and again (the test suite, ``tune``) compiles each distinct
template once instead of once per renderer, at 50-150 ms a template.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import jinja2
import jinja2.compiler
import jinja2.nodes
import jinja2.sandbox

from doppler_gen import observed
from doppler_gen.config import TEMPLATES_DIR, PassSpec, Project, Variant, universal_newlines
from doppler_gen.errors import TemplateError, file_kind, line_at, not_utf8
from doppler_gen.formats import QUANT_BITS

HEADER_MARK = "AUTO-GENERATED from"
GENERATOR = "doppler-gen"
HEADER_LINES = 3

# private-use characters: never whitespace to Jinja's trimming, never in a real template
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_JINJA_COMMENT_RE = re.compile(r"\{#.*?#\}", re.S)
# a reference to other templates: one string literal or a list of them (what the source hash
# can follow), then what may come after the name
_LITERAL = r"""(?:"[^"]*"|'[^']*')"""
_NAMES = rf"(?:{_LITERAL}|\[\s*{_LITERAL}(?:\s*,\s*{_LITERAL})*\s*,?\s*\])"
_REFERENCE_TAG = r"\{%[-+]?\s*(?:import|include|extends|from)\s+"
_AFTER_NAMES = r"\s*(?:[-+]?%\}|ignore\b|with\b|without\b|as\b|import\b)"
_REFERENCE_RE = re.compile(rf"{_REFERENCE_TAG}({_NAMES})(?={_AFTER_NAMES})")
_LITERAL_RE = re.compile(_LITERAL)
# a reference whose names are not literals (an expression, a conditional): the source hash could
# not follow it. (?=\S): the lookahead starts past all the whitespace
_DYNAMIC_REFERENCE_RE = re.compile(rf"{_REFERENCE_TAG}(?=\S)(?!{_NAMES}{_AFTER_NAMES})")
# what Python prints for an object without a repr of its own: a memory address, another on
# every run (``<function fail at 0x7f...>``, ``<jinja2.utils.Joiner object at 0x...>``)
_ADDRESS_RE = re.compile(r"<[^<>\n]* at 0x[0-9a-fA-F]+>")
# characters a generated file may not hold: control characters other than LF and tab (WGSL
# counts CR, VT, FF, NEL and U+2028/9 as line breaks, so the file's lines and the compiler's
# would differ), a byte-order mark (not blankspace in WGSL) and the invisible direction marks
_UNSAFE_CHAR_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\ufeff]")
# {% raw %} ... {% endraw %}: template text, never a reference
_RAW_BLOCK_RE = re.compile(r"\{%[-+]?\s*raw\s*[-+]?%\}.*?\{%[-+]?\s*endraw\s*[-+]?%\}", re.S)
_MARK_RE = re.compile(f"{_MARK_OPEN}([0-9]+):([0-9]+){_MARK_CLOSE}")

# how templates are read: block tags own their line, comments and indentation kept verbatim
_ENV_OPTIONS = {
    "trim_blocks": True,
    "lstrip_blocks": True,
    "keep_trailing_newline": True,
    "autoescape": False,
    "auto_reload": False,
}

# per variant: a runaway template (a huge loop, endless recursion) fails instead of hanging
# `generate`, `check` and every pre-commit hook, or exhausting memory
RENDER_TIME_LIMIT_S = 10.0
OUTPUT_LIMIT_BYTES = 4 * 1024 * 1024  # the largest kernel today is about 10 KB
_POWER_LIMIT_BITS = 4096  # `**` in a template: no WGSL constant needs more
# address space one render may add (Linux): what escapes every other bound, such as
# `range(99999)|map("center", 4000000)|join` (400 GB), fails instead of exhausting the machine
RENDER_MEMORY_LIMIT_BYTES = 1 << 30

Origin = tuple[str, int]  # (template path relative to the project root, 1-based line)


@dataclass(frozen=True)
class RenderedPass:
    """The generated text of one pass of a variant and where each of its lines came from."""

    spec: PassSpec
    output: str  # the generated file, relative to the project root
    text: str
    source_hash: str
    sources: tuple[str, ...]  # every template file the pass's rendering read
    origins: (
        tuple[Origin | None, ...] | None
    )  # per generated line (1-based index - 1); None: unknown

    def origin(self, line: int) -> Origin | None:
        """The template line that produced generated line ``line`` (1-based), if known."""
        if self.origins is None or not 1 <= line <= len(self.origins):
            return None
        return self.origins[line - 1]


@dataclass(frozen=True)
class RenderedKernel:
    """The generated text of one variant: one rendered pass per dispatch, in order.

    ``text``, ``source_hash``, ``sources``, ``origins`` and ``origin`` are the single pass's,
    for the (usual) single-pass variant; a multi-pass variant is read through ``passes``.
    """

    variant: Variant
    passes: tuple[RenderedPass, ...]

    @property
    def only(self) -> RenderedPass:
        if len(self.passes) != 1:
            raise ValueError(
                f"variant {self.variant.name} has {len(self.passes)} passes; read kernel.passes"
            )
        return self.passes[0]

    @property
    def text(self) -> str:
        return self.only.text

    @property
    def source_hash(self) -> str:
        return self.only.source_hash

    @property
    def sources(self) -> tuple[str, ...]:
        return self.only.sources

    @property
    def origins(self) -> tuple[Origin | None, ...] | None:
        return self.only.origins

    def origin(self, line: int) -> Origin | None:
        return self.only.origin(line)


# The header line that records the hash of a kernel's sources and parameters
SOURCE_HASH_LINE = "// source-hash: sha256:"


def header(
    template_path: str, variant_name: str, source_hash: str, pass_name: str | None = None
) -> list[str]:
    """The banner every generated file starts with; ``HEADER_MARK`` identifies ours."""
    of = f"variant {variant_name}" + (f" pass {pass_name}" if pass_name else "")
    return [
        f"// {HEADER_MARK} {template_path} for {of} by {GENERATOR} - do not edit.",
        f"// Edit the template and variants.toml, then run `{GENERATOR} generate`.",
        f"{SOURCE_HASH_LINE}{source_hash}",
    ]


def is_generated_file(path: Path) -> bool:
    """True when ``path`` starts with our header: only such files may be removed as orphans."""
    try:
        # through `observed`, which digests the whole file (a check's verdict on an orphan rests
        # on its bytes) but keeps only the head: a user's 60 GB file is streamed, never held
        head = observed.read_head(path, _HEADER_BYTES)
        first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    except OSError:
        return False
    return first.startswith(f"// {HEADER_MARK} ") and f" by {GENERATOR} " in first


# longer than any first line a generated file has (the header names a template and a variant)
_HEADER_BYTES = 4096


def _line_breaks(match: re.Match[str]) -> str:
    return "\n" * match.group().count("\n")


def _without_address(value: Any) -> Any:
    """Every ``{{ ... }}`` value (Jinja's ``finalize``): a function or object printed by its
    default repr shows a memory address, which would make each render differ and a check pass
    only by luck. Strings pass untouched (a macro's WGSL may say "at 0x7e00"); an address
    joined into a string is caught in the rendered text (``_refuse_unsafe_output``)."""
    if type(value) in _PLAIN:
        return value
    found = _ADDRESS_RE.search(str(value))
    if found:
        raise _TemplateFailure(f"prints {_address_problem(found)}")
    return value


def _address_problem(found: re.Match[str]) -> str:
    return (
        f"{found.group()[:60]!r}, an object's memory address (another on every run): print a "
        "value, not a function, macro or object"
    )


_PLAIN = frozenset({str, int, float, bool})


def _refuse_unsafe_output(text: str, source: str, variant: str) -> str:
    """The rendered ``text``, unless it holds an object's default repr (``~`` or ``join`` on
    a function) or a character no generated file may hold (``_UNSAFE_CHAR_RE``, such as a
    ``{{ "\\r" }}``): the error names the template and the generated line."""
    found = _ADDRESS_RE.search(text) if "at 0x" in text else None
    if found:
        raise TemplateError(
            f"line {line_at(text, found.start())} of the output holds {_address_problem(found)} "
            f"(variant {variant})",
            location=source,
        )
    char = _UNSAFE_CHAR_RE.search(text)
    if char:
        raise TemplateError(
            f"line {line_at(text, char.start())} of the output holds U+{ord(char.group()):04X}, "
            "which a generated file may not: only LF ends a line, and no control character, "
            f"byte-order mark or direction mark is written (variant {variant})",
            location=source,
        )
    return text


class Renderer:
    """Renders the variants of one project; templates are compiled once and reused."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.env = self._environment(_SharedCodeLoader(self._plain_source))
        self._marked_env: jinja2.Environment | None = None
        self._file_ids: dict[str, int] = {}
        self._source_cache: dict[str, str] = {}
        self._sources_of: dict[str, tuple[str, ...]] = {}

    def _environment(self, loader: jinja2.BaseLoader) -> jinja2.Environment:
        env = _Sandbox(
            loader=loader,
            undefined=jinja2.StrictUndefined,
            finalize=_without_address,
            **_ENV_OPTIONS,
        )
        env.globals["fail"] = _template_fail
        env.globals["QUANT_BITS"] = dict(QUANT_BITS)
        # the two that give another text on every render: the same inputs must give the same
        # files, and a check that matched by luck must not be remembered as clean
        del env.filters["random"], env.globals["lipsum"]
        for name in _WIDTH_FILTERS:  # a width argument allocates before any output cap sees it
            env.filters[name] = _bounded_filter(env.filters[name])
        env.filters["u32"] = _wgsl_u32
        env.filters["wgsl_float"] = _wgsl_float
        return env

    # -- public -----------------------------------------------------------------------------

    def render(self, variant: Variant, *, with_origins: bool = False) -> RenderedKernel:
        """Render every pass of one variant; raises TemplateError pointing at the template line."""
        variant.require_metadata()
        passes = tuple(
            self.render_pass(variant, spec, with_origins=with_origins)
            for spec in variant.template.passes
        )
        return RenderedKernel(variant=variant, passes=passes)

    def render_pass(
        self, variant: Variant, spec: PassSpec, *, with_origins: bool = False
    ) -> RenderedPass:
        """One pass's file: the generated header, then its template's normalized output."""
        context = self.context(variant, spec)
        body = self._render(self.env, variant, spec, context)
        lines = normalize([(line, None) for line in body.split("\n")])
        sources = self.sources(spec.source)
        source_hash = self.source_hash(variant, sources, spec)
        multi = variant.template.multi_pass
        head = header(spec.source_path, variant.name, source_hash, spec.name if multi else None)
        text = "\n".join([*head, "", *(line for line, _ in lines)]) + "\n"
        _check_encodable(text, variant, spec)
        origins = None
        if with_origins:
            body_origins = self._origins(variant, spec, context, [line for line, _ in lines])
            if body_origins is not None:
                origins = tuple([None] * (len(head) + 1) + body_origins)
        return RenderedPass(
            spec=spec,
            output=variant.pass_output(spec),
            text=text,
            source_hash=source_hash,
            sources=tuple(f"{TEMPLATES_DIR}/{s}" for s in sources),
            origins=origins,
        )

    def context(self, variant: Variant, spec: PassSpec | None = None) -> dict[str, Any]:
        """The names a template sees: its parameters, plus the variant's (and pass's) identity."""
        return {
            **variant.params,
            "variant_name": variant.name,
            "pass_name": spec.name if spec else variant.template.passes[0].name,
            "requires": list(variant.requires),
        }

    def sources(self, template: str) -> tuple[str, ...]:
        """The template and everything it includes, imports or extends, transitively (sorted)."""
        if template not in self._sources_of:
            self._sources_of[template] = self._find_sources(template)
        return self._sources_of[template]

    def _find_sources(self, template: str) -> tuple[str, ...]:
        # A textual scan, not a Jinja parse: parsing every template again costs more than the
        # whole render, and only literal names can be followed either way.
        seen: set[str] = set()
        pending = [template]
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            try:
                # comments out, their line breaks kept: an error below names the right line
                text = _JINJA_COMMENT_RE.sub(_line_breaks, self._read(name))
                text = _RAW_BLOCK_RE.sub(_line_breaks, text)
            except jinja2.TemplateNotFound:
                # the render, which comes first, needed none that is missing: an include with
                # `ignore missing`, or one in a branch not taken. It has nothing to hash; if it
                # appears, the next scan finds it and the hash changes
                seen.discard(name)
                continue
            dynamic = _DYNAMIC_REFERENCE_RE.search(text)
            if dynamic:
                raise TemplateError(
                    "a template named by an expression, not a string literal: the source hash "
                    "(and `check`'s memo) could not follow it; write the name out",
                    location=f"{TEMPLATES_DIR}/{name}:{line_at(text, dynamic.start())}",
                )
            for names in _REFERENCE_RE.findall(text):
                pending.extend(literal[1:-1] for literal in _LITERAL_RE.findall(names))
        return tuple(sorted(seen))

    def source_hash(
        self, variant: Variant, sources: Iterable[str], spec: PassSpec | None = None
    ) -> str:
        """sha256 over the template sources and the parameters: changes iff the output may."""
        digest = hashlib.sha256()
        spec = spec or variant.template.passes[0]
        payload: dict[str, Any] = {
            "template": spec.source,
            "params": dict(sorted(variant.params.items())),
            "requires": list(variant.requires),
            "overrides": dict(variant.overrides),
            "globals": {"QUANT_BITS": dict(sorted(QUANT_BITS.items()))},
            # as Jinja reads them: CRLF or CR line ends render as LF, so a checkout with CRLF
            # templates must hash (and write) the same bytes as one with LF
            "sources": {
                name: hashlib.sha256(universal_newlines(self._read(name)).encode()).hexdigest()
                for name in sources
            },
        }
        if variant.template.multi_pass:
            payload["pass"] = spec.name
        digest.update(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode())
        return digest.hexdigest()

    # -- rendering ----------------------------------------------------------------------------

    def _render(
        self, env: jinja2.Environment, variant: Variant, spec: PassSpec, context: dict[str, Any]
    ) -> str:
        try:
            template = env.get_template(spec.source)
        except RecursionError:  # Jinja's parser and code generator recurse per nesting level
            raise TemplateError(
                f"nested too deeply to compile (brackets, expressions or blocks inside one "
                f"another) (variant {variant.name})",
                location=spec.source_path,
            ) from None
        except jinja2.TemplateSyntaxError as exc:
            raise _syntax_error(exc, variant.name, self.project.templates_dir) from None
        except SyntaxError as exc:
            raise self._code_error(env, exc, variant.name) from None
        except jinja2.TemplateNotFound as exc:
            missing = _not_a_template(self.project.templates_dir, exc.name)
            raise TemplateError(
                f"template {exc.name!r} {missing} (variant {variant.name})",
                location=spec.source_path,
            ) from None
        try:
            text = _limited_render(template, context)
        except jinja2.TemplateSyntaxError as exc:
            raise _syntax_error(exc, variant.name, self.project.templates_dir) from None
        except SyntaxError as exc:  # an imported or included template's code
            raise self._code_error(env, exc, variant.name) from None
        except jinja2.TemplateNotFound as exc:
            where = _template_frame(sys.exc_info()[2], self.project.templates_dir)
            missing = _not_a_template(self.project.templates_dir, exc.name)
            raise TemplateError(
                f"included template {exc.name!r} {missing} (variant {variant.name})",
                location=where,
            ) from None
        except _TemplateFailure as exc:
            where = _template_frame(exc.__traceback__, self.project.templates_dir)
            where = where or variant.template.source_path
            raise TemplateError(f"{exc} (variant {variant.name})", location=where) from None
        except (jinja2.UndefinedError, jinja2.TemplateRuntimeError) as exc:
            where = _template_frame(exc.__traceback__, self.project.templates_dir)
            raise TemplateError(f"{exc.message} (variant {variant.name})", location=where) from None
        except RecursionError as exc:
            where = _template_frame(exc.__traceback__, self.project.templates_dir)
            raise TemplateError(
                f"recursion too deep: a macro or include calls itself without end, or an "
                f"included template nests too deeply (variant {variant.name})",
                location=where or spec.source_path,
            ) from None
        except (RuntimeError, AssertionError) as exc:
            # Jinja's own checks: an empty cycler(), truncate() to a negative length, ...
            where = _template_frame(exc.__traceback__, self.project.templates_dir)
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise TemplateError(
                f"{detail} (variant {variant.name})", location=where or spec.source_path
            ) from None
        except MemoryError:
            raise TemplateError(
                f"ran out of memory rendering (variant {variant.name})",
                location=variant.template.source_path,
            ) from None
        except NameError as exc:
            # Jinja folds constant expressions while compiling and writes the value into its
            # Python code by repr(): an infinite or NaN float comes out as `inf` / `nan`, a name.
            # Any other NameError is a bug of ours (exit 3, internal error).
            if type(exc) is not NameError or exc.name not in ("inf", "nan"):
                raise
            where = _template_frame(exc.__traceback__, self.project.templates_dir)
            raise TemplateError(
                f"a constant expression that Jinja folded to {exc.name}, which it cannot write "
                f"into its compiled code: compute it from a parameter instead (variant "
                f"{variant.name})",
                location=where or spec.source_path,
            ) from None
        except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError) as exc:
            where = _template_frame(exc.__traceback__, self.project.templates_dir)
            raise TemplateError(
                f"{type(exc).__name__}: {exc} (variant {variant.name})", location=where
            ) from None
        return _refuse_unsafe_output(text, spec.source_path, variant.name)

    def _code_error(self, env: jinja2.Environment, exc: SyntaxError, variant: str) -> TemplateError:
        """A template that parses but whose compiled Python does not (``{% macro m(a, a) %}``, a
        call repeating a keyword): Jinja checks neither. Located at the template line that
        generated the failing code line, from the line map Jinja writes into its code."""
        name = _template_name(exc.filename, self.project.templates_dir)
        location = f"{TEMPLATES_DIR}/{name}" if name else None
        if name in self._source_cache:
            line = _template_line(
                env.compile(self._source_cache[name], name, exc.filename, raw=True), exc.lineno
            )
            if line is not None:
                location = f"{location}:{line}"
        return TemplateError(
            f"Jinja compiled this template to invalid Python ({exc.msg}): a repeated macro "
            f"argument or keyword? (variant {variant})",
            location=location,
        )

    def changed_source(self) -> str | None:
        """The first template this renderer read whose file no longer holds that text (changed,
        gone or unreadable), as ``templates/NAME``; None when every one is as it was read."""
        for name, text in sorted(self._source_cache.items()):
            try:
                now = _read_template(self.project.templates_dir, name)
            except (jinja2.TemplateNotFound, TemplateError):
                now = None
            if now != text:
                return f"{TEMPLATES_DIR}/{name}"
        return None

    def _read(self, name: str) -> str:
        """The text of template ``name``: read once, so what renders is what is hashed.

        Only regular files that resolve inside templates/ can be read: a symlink (to a file or
        a directory) that leads out of templates/ is refused, so every byte a template can
        reach lies in templates/, where the `check` memo hashes it. Raises TemplateNotFound for
        a missing name (Jinja reports it at the including line) and TemplateError otherwise.
        """
        if name not in self._source_cache:
            self._source_cache[name] = _read_template(self.project.templates_dir, name)
        return self._source_cache[name]

    def _plain_source(self, name: str) -> tuple[str, str, Callable[[], bool]]:
        return self._read(name), self._filename(name), lambda: True

    def _filename(self, name: str) -> str:
        return str(self.project.templates_dir / name)

    # -- source map ---------------------------------------------------------------------------

    def _origins(
        self, variant: Variant, spec: PassSpec, context: dict[str, Any], expected: list[str]
    ) -> list[Origin | None] | None:
        """Per normalized body line, the template line it came from; None if unavailable."""
        if self._marked_env is None:
            self._marked_env = self._environment(_SharedCodeLoader(self._marked_source))
        try:
            template = self._marked_env.get_template(spec.source)
            marked = _limited_render(template, context)
        except Exception:  # the real render succeeded; a map is a convenience, never a blocker
            return None
        names = {index: name for name, index in self._file_ids.items()}
        raw: list[tuple[str, Origin | None]] = []
        for line in marked.split("\n"):
            match = _MARK_RE.search(line)
            origin = None
            if match:
                origin = (f"{TEMPLATES_DIR}/{names[int(match.group(1))]}", int(match.group(2)))
            raw.append((_MARK_RE.sub("", line), origin))
        lines = normalize(raw)
        if [text for text, _ in lines] != expected:
            return None
        return [origin for _, origin in lines]

    def _marked_source(self, name: str) -> tuple[str, str, Callable[[], bool]]:
        file_id = self._file_ids.setdefault(name, len(self._file_ids))
        return mark_lines(self._read(name), file_id), self._filename(name), lambda: True


def _check_encodable(text: str, variant: Variant, spec: PassSpec) -> None:
    """A rendered pass must be UTF-8: a lone surrogate (``{{ "\\udcff" }}``) would render, then
    fail in every command that hashes, writes or prints the text. Refused once, here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = line_at(text, exc.start)
        raise TemplateError(
            f"renders {exc.object[exc.start]!r}, a lone surrogate that UTF-8 cannot encode, at "
            f"{variant.pass_output(spec)}:{line} (variant {variant.name})",
            location=spec.source_path,
        ) from None


class _CompiledCode:
    """Jinja's compiled code of each template source this process has compiled (at most
    ``capacity``, least recently used dropped first).

    The key is everything compiling depends on: the environment's class (its code generator),
    the functions of its filters and tests (Jinja calls them at compile time on literal
    arguments and keeps the result), the template's name and file name (tracebacks point at it)
    and its exact source text. Every environment here comes from ``Renderer._environment``, with
    the same options; a changed template, or a filter replaced in this process, is a new key.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._code: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    def get(self, env: jinja2.Environment, name: str, filename: str, source: str) -> Any:
        key = (type(env), _folding_functions(env), name, filename, source)
        with self._lock:
            code = self._code.pop(key, None)
            if code is not None:
                self._code[key] = code  # most recently used last
                return code
        code = env.compile(source, name, filename)  # raises TemplateSyntaxError; nothing kept
        with self._lock:
            self._code[key] = code
            while len(self._code) > self.capacity:
                del self._code[next(iter(self._code))]
        return code

    def __len__(self) -> int:
        return len(self._code)


_COMPILED = _CompiledCode()


def _folding_functions(env: jinja2.Environment) -> tuple[Any, ...]:
    """The filters and tests Jinja may call while compiling, as the functions that run (a
    bounded filter by the one it wraps, since every environment wraps its own)."""
    return tuple(
        (kind, name, getattr(function, "__wrapped__", function))
        for kind, table in (("filter", env.filters), ("test", env.tests))
        for name, function in sorted(table.items())
    )


class _SharedCodeLoader(jinja2.BaseLoader):
    """A loader over ``source_of`` (name -> (source, filename, uptodate)) whose templates reuse
    code this process compiled before from the same source (``_COMPILED``)."""

    def __init__(self, source_of: Callable[[str], tuple[str, str, Callable[[], bool]]]) -> None:
        self._source_of = source_of

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str, Callable[[], bool]]:
        return self._source_of(template)

    def load(
        self,
        environment: jinja2.Environment,
        name: str,
        globals: Any = None,
    ) -> jinja2.Template:
        source, filename, uptodate = self.get_source(environment, name)
        code = _COMPILED.get(environment, name, filename, source)
        return environment.template_class.from_code(environment, code, globals or {}, uptodate)


_WS_CONTROL_RE = re.compile(r"\s*\{[{%#]-")


def mark_lines(source: str, file_id: int) -> str:
    """Append an origin marker to every template line that emits text.

    Markers go only into text (never inside ``{{ }}``, ``{% %}`` or ``{# #}``), not on lines
    ending in a block or comment tag, whose newline ``trim_blocks`` removes, nor in a ``-}}``
    expression, which strips its own newline, and not before a
    ``{%-``-style tag that strips the newline (the body of an inline macro belongs to its caller).
    """
    closers = {"{{": "}}", "{%": "%}", "{#": "#}"}
    opener = re.compile(r"\{\{|\{%|\{#|\n")
    out: list[str] = []
    current = ""  # the source text of the line being scanned, up to the scan position
    line = 1
    position = 0
    while position < len(source):
        match = opener.search(source, position)
        if match is None:
            out.append(source[position:])
            break
        text = source[position : match.start()]
        out.append(text)
        current += text
        if match.group() == "\n":
            tail = current.rstrip()
            stripped_by_next = _WS_CONTROL_RE.match(source, match.end()) is not None
            # a line ending in "-}}" has its newline stripped by that tag, like a block tag's
            if tail and not tail.endswith(("%}", "#}", "-}}")) and not stripped_by_next:
                out.append(f"{_MARK_OPEN}{file_id}:{line}{_MARK_CLOSE}")
            out.append("\n")
            line += 1
            current = ""
            position = match.end()
            continue
        end = source.find(closers[match.group()], match.end())
        end = len(source) if end < 0 else end + 2
        tag = source[match.start() : end]
        out.append(tag)
        line += tag.count("\n")
        current = current + tag if "\n" not in tag else tag[tag.rfind("\n") + 1 :]
        position = end
    return "".join(out)


def normalize(lines: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Strip trailing whitespace, collapse blank-line runs and drop blank lines at block edges.

    Carries a payload (the origin) along with each line so the source map stays aligned.
    """
    cleaned = [(text.rstrip(), payload) for text, payload in lines]
    result: list[tuple[str, Any]] = []
    for index, (text, payload) in enumerate(cleaned):
        if text:
            result.append((text, payload))
            continue
        previous = result[-1][0] if result else ""
        following = next((t for t, _ in cleaned[index + 1 :] if t), "")
        if not previous or not following:
            continue  # leading/trailing blank line, or a run already holding one blank
        if previous.endswith("{") or following.lstrip().startswith("}"):
            continue
        result.append((text, payload))
    return result


# -- template helpers -----------------------------------------------------------------------


def _not_a_template(templates_dir: Path, name: object) -> str:
    """Why ``name`` gave no template, for the error: absent, or something that is no file (a
    directory or FIFO, which the loader treats as absent so that ``ignore missing`` holds)."""
    pieces = str(name).replace("\\", "/").split("/")
    absent = f"not found in {TEMPLATES_DIR}/"
    if str(name).startswith("/") or ".." in pieces:  # refused by the loader, whatever is there
        return absent
    try:
        mode = templates_dir.joinpath(*pieces).stat().st_mode
    except (OSError, ValueError):
        return absent
    return absent if stat.S_ISREG(mode) else f"is {file_kind(mode)} in {TEMPLATES_DIR}/, not a file"


def _read_template(templates_dir: Path, name: str) -> str:
    """Read ``templates/NAME``, refusing anything outside templates/ (see ``Renderer._read``)."""
    pieces = [piece for piece in name.replace("\\", "/").split("/") if piece not in ("", ".")]
    if not pieces or ".." in pieces:
        raise jinja2.TemplateNotFound(name)
    relative = "/".join(pieces)
    shown = f"{TEMPLATES_DIR}/{relative}"
    path = templates_dir.joinpath(*pieces)
    try:
        # through `observed`: a check remembers where each name led, not only the bytes there
        resolved = observed.resolve(path)
        inside = resolved.is_relative_to(observed.resolve(templates_dir))
    except FileNotFoundError:
        raise jinja2.TemplateNotFound(name) from None
    except OSError as exc:  # a symlink loop, a file where a directory should be, no access
        raise TemplateError(f"cannot read: {exc}", location=shown) from None
    if not inside:
        raise TemplateError(
            f"resolves outside {TEMPLATES_DIR}/ through a symlink (to {resolved}); templates "
            f"may only read files inside {TEMPLATES_DIR}/: move the files there",
            location=shown,
        )
    if not resolved.is_file():
        observed.missing(resolved)
        raise jinja2.TemplateNotFound(name)  # a directory, FIFO or device is no template
    try:
        data = observed.read_bytes(resolved)
    except OSError as exc:
        raise TemplateError(f"cannot read: {exc.strerror or exc}", location=shown) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, message = not_utf8(data, exc)
        raise TemplateError(message, location=f"{shown}:{line}") from None
    if text.startswith("\ufeff"):  # it would reach the kernel, where WGSL does not allow it
        raise TemplateError(
            "starts with a UTF-8 byte-order mark (BOM); save the file as UTF-8 without BOM",
            location=f"{shown}:1",
        )
    return text


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's sandbox, plus bounds on ``*`` and ``**`` so one expression cannot exhaust memory.

    Immutable: a template cannot modify a list or dict it did not build (such as the shared
    ``QUANT_BITS``), so no variant's output can depend on what an earlier variant did.
    """

    intercepted_binops = frozenset({"*", "**", "%", "+", "-"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "-":
            result = super().call_binop(context, operator, left, right)
            if isinstance(result, set | frozenset):  # `d.keys() - other`: ordered by hash seed
                return _in_order(result)
            return result
        if operator == "**":
            _check_power(left, right)
        elif operator == "+":  # doubling a string or list in a loop or a recursive macro
            _check_length(left, right)
        elif operator == "%":
            if isinstance(left, str):  # "%999999999d" % 1 builds a 1 GB string
                _check_format(left, _PRINTF_WIDTHS, right if isinstance(right, tuple) else (right,))
        else:
            _check_repeat(left, right)
        return super().call_binop(context, operator, left, right)

    def call(self, context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Bounds the sizes given to str methods: ``"a".center(10**9)``."""
        text = getattr(obj, "__self__", None)
        if isinstance(text, str):
            if getattr(obj, "__name__", "") == "replace":
                _check_replace(text, *args, **kwargs)
            # center, ljust, rjust, zfill, expandtabs: the integer is the size
            _check_sizes((*args, *kwargs.values()))
        return super().call(context, obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """str.format / format_map, which the sandbox wraps: ``"{:>999999999}".format(1)``."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text = value.__self__

        def bounded(*args: Any, **kwargs: Any) -> str:
            mapping = args[0].values() if args and isinstance(args[0], Mapping) else ()
            _check_format(text, _FORMAT_WIDTHS, (*args, *kwargs.values(), *mapping))
            return wrapped(*args, **kwargs)

        return bounded

    def bounded_join(self, parts: Iterable[Any]) -> str:
        """``a ~ b`` (see _BoundedCodeGenerator), bounded like ``+``."""
        strings = [str(part) for part in parts]
        _check_length(*strings)
        return "".join(strings)


class _BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
    """Compiles ``~`` to the sandbox's bounded join (Jinja's own join has no hook)."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.bounded_join((")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))")


_Sandbox.code_generator_class = _BoundedCodeGenerator


def _check_length(*parts: Any) -> None:
    """Refuse concatenating strings, lists or tuples into more items than the output limit."""
    if all(isinstance(part, str | list | tuple) for part in parts):
        total = sum(len(part) for part in parts)
        if total > OUTPUT_LIMIT_BYTES:
            raise _TemplateFailure(
                f"concatenating {total} items exceeds the output limit of {OUTPUT_LIMIT_BYTES} "
                "bytes"
            )


# filters whose integer arguments size the string they build (`format` is printf-style)
_WIDTH_FILTERS = ("center", "indent", "format", "replace")
# width and precision of a printf-style (`%`) and of a str.format conversion; `*` or a nested
# `{}` takes the width from the arguments
_PRINTF_WIDTHS = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\d+|\*)?(?:\.(\d+|\*))?")
_FORMAT_WIDTHS = re.compile(r"\{[^{}:]*:(?:[^{}]?[<>=^])?[-+ ]?z?#?0?(\d+|\{)?[,_]?(?:\.(\d+|\{))?")


def _check_sizes(values: Iterable[Any]) -> None:
    """Refuse a size larger than the output limit: it would build a string that large before
    the output cap could stop it."""
    for value in values:
        if _is_int(value) and abs(value) > OUTPUT_LIMIT_BYTES:
            raise _TemplateFailure(
                f"a width or size of {value} exceeds the output limit of {OUTPUT_LIMIT_BYTES} bytes"
            )


def _check_format(text: str, widths: re.Pattern[str], arguments: Iterable[Any]) -> None:
    """The literal widths of a format string, and its arguments where a width comes from them
    (a plain integer argument, e.g. 4294967295 for `{}u`, is a value, not a size)."""
    found = [n for group in widths.findall(text) for n in group if n]
    _check_sizes(int(n) for n in found if n.isdigit())
    if any(not n.isdigit() for n in found):
        _check_sizes(arguments)


def _bounded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    """A filter with its size arguments (or, for `format`, its format string) bounded."""

    @functools.wraps(function)
    def bounded(value: Any, *args: Any, **kwargs: Any) -> Any:
        arguments = (*args, *kwargs.values())
        if function.__name__ == "do_format":
            if isinstance(value, str):
                _check_format(value, _PRINTF_WIDTHS, arguments)
        elif function.__name__ == "do_replace":  # value is the eval context here
            _check_replace(*args, **kwargs)
        else:
            _check_sizes(arguments)
            if function.__name__ == "do_indent":
                _check_indent(value, *args)
        return function(value, *args, **kwargs)

    return bounded


def _check_indent(text: Any, width: Any = 4, *_: Any) -> None:
    """Indenting every line of ``text`` by ``width`` would exceed the output limit."""
    lines = text.count("\n") + 1 if isinstance(text, str) else 0
    if _is_int(width) and lines * width > OUTPUT_LIMIT_BYTES:
        raise _TemplateFailure(
            f"indenting {lines} lines by {width} exceeds the output limit of "
            f"{OUTPUT_LIMIT_BYTES} bytes"
        )


def _check_replace(text: Any, old: Any = "", new: Any = "", count: Any = -1, *_: Any) -> None:
    """``text.replace(old, new)`` would build a string over the output limit: refuse it first
    (4000 × "a" replaced by 40 000 × "b" is 160 MB)."""
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return
    found = text.count(old) if old else len(text) + 1
    if _is_int(count) and count >= 0:
        found = min(found, count)
    total = len(text) + found * (len(new) - len(old))
    if total > OUTPUT_LIMIT_BYTES:
        raise _TemplateFailure(
            f"replacing gives {total} characters, over the output limit of "
            f"{OUTPUT_LIMIT_BYTES} bytes"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_power(base: Any, exponent: Any) -> None:
    if not (_is_int(base) and _is_int(exponent) and abs(base) > 1 and exponent > 0):
        return
    if exponent * math.log2(abs(base)) > _POWER_LIMIT_BITS:
        raise _TemplateFailure(
            f"{base} ** {exponent} has more than {_POWER_LIMIT_BITS} bits; refused"
        )


def _in_order(values: set[Any] | frozenset[Any]) -> list[Any]:
    """A set a template computed, as a sorted list: a set's own order follows Python's hash
    seed, so iterating it would give another text under another seed."""
    try:
        return sorted(values)
    except TypeError:
        raise _TemplateFailure(
            "a set difference (`keys() - ...`) of values that cannot be sorted has no fixed "
            "order: it follows Python's hash seed, so output would differ between runs"
        ) from None


def _check_repeat(left: Any, right: Any) -> None:
    for sequence, count in ((left, right), (right, left)):
        repeatable = isinstance(sequence, str | list | tuple) and _is_int(count)
        if repeatable and len(sequence) * count > OUTPUT_LIMIT_BYTES:
            raise _TemplateFailure(
                f"repeating a sequence of {len(sequence)} items {count} times exceeds the "
                f"output limit of {OUTPUT_LIMIT_BYTES} bytes"
            )


class _RenderTimeout(Exception):
    """Raised (from SIGALRM) when a variant renders for longer than the time limit."""


def _limited_render(template: jinja2.Template, context: dict[str, Any]) -> str:
    """``template.render(context)`` within the time limit and the output size cap."""
    chunks: list[str] = []
    size = 0
    deadline = time.monotonic() + RENDER_TIME_LIMIT_S
    limit = f"{RENDER_TIME_LIMIT_S:g} s"
    try:
        with _alarm(RENDER_TIME_LIMIT_S), _memory_limit(RENDER_MEMORY_LIMIT_BYTES):
            for chunk in template.generate(context):
                size += len(chunk)
                if size > OUTPUT_LIMIT_BYTES:
                    raise _TemplateFailure(
                        f"output exceeds {OUTPUT_LIMIT_BYTES} bytes (runaway loop?)"
                    )
                if time.monotonic() > deadline:  # where no alarm can be set (not main thread)
                    raise _RenderTimeout()
                chunks.append(chunk)
    except _RenderTimeout as exc:  # keep the template frames: they say where it ran away
        failure = _TemplateFailure(f"rendering took longer than {limit} (runaway loop?)")
        raise failure.with_traceback(exc.__traceback__) from None
    except MemoryError as exc:
        failure = _TemplateFailure(
            f"rendering needs more than {RENDER_MEMORY_LIMIT_BYTES >> 20} MiB of memory "
            "(runaway template?)"
        )
        raise failure.with_traceback(exc.__traceback__) from None
    return "".join(chunks)


@contextlib.contextmanager
def _memory_limit(extra: int) -> Any:
    """Cap the process's address space at its current size plus ``extra`` (then restore it).

    Linux and the main thread only (the limit is per process; `render` runs there); elsewhere,
    or where a tighter limit is set already, nothing changes.
    """
    previous = _address_space_limit(extra)
    if previous is None:
        yield
        return
    import resource

    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, previous)


def _address_space_limit(extra: int) -> tuple[int, int] | None:
    """Set RLIMIT_AS to the current size plus ``extra``; returns the old limits, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm", encoding="ascii") as stream:
            used = int(stream.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = used + extra
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        if soft != resource.RLIM_INFINITY and soft <= limit:
            return None
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError, IndexError):
        return None
    return soft, hard


@contextlib.contextmanager
def _alarm(seconds: float) -> Any:
    """Raise _RenderTimeout in the main thread after ``seconds`` (no-op in other threads)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _RenderTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # someone else's timer was running: let it go off as it would have
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-3))


class _TemplateFailure(Exception):
    """Raised by ``fail()`` in a template: a parameter combination the template rejects."""


def _template_fail(message: str) -> NoReturn:
    raise _TemplateFailure(message)


def _wgsl_u32(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 0xFFFFFFFF:
        raise _TemplateFailure(f"u32 filter needs an integer in 0..2^32-1, got {value!r}")
    return f"{value}u"


def _wgsl_float(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _TemplateFailure(f"wgsl_float filter needs a number, got {value!r}")
    text = repr(float(value))
    return text if ("." in text or "e" in text) else f"{text}.0"


# -- error locations ------------------------------------------------------------------------


def _syntax_error(
    exc: jinja2.TemplateSyntaxError, variant: str | None, templates_dir: Path
) -> TemplateError:
    name = exc.name or (Path(exc.filename).name if exc.filename else "?")
    if exc.filename is None and exc.name:
        # Jinja's lexer raises some errors (an unclosed `{% raw %}`) with the file's path where
        # the template's name goes, and no path: `templates/templates/X` was reported
        name = _template_name(exc.name, templates_dir) or name
    suffix = f" (variant {variant})" if variant else ""
    return TemplateError(f"{exc.message}{suffix}", location=f"{TEMPLATES_DIR}/{name}:{exc.lineno}")


def _template_name(path: str | None, templates_dir: Path) -> str | None:
    """``path`` (a file Jinja names: a code object's, an error's) as the name of a template in
    ``templates_dir``; None when it lies elsewhere."""
    if not path:
        return None
    try:
        return Path(path).resolve().relative_to(templates_dir.resolve()).as_posix()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop
        return None


def _template_line(code: str, code_line: int | None) -> int | None:
    """The template line that generated line ``code_line`` of Jinja's Python ``code``, from the
    ``debug_info = 'TEMPLATE=CODE&...'`` map at its end; None when there is no such line."""
    found = re.search(r"^debug_info = '([0-9=&]*)'$", code, re.MULTILINE)
    if found is None or code_line is None:
        return None
    line = None
    for pair in filter(None, found.group(1).split("&")):
        template_line, generated = (int(part) for part in pair.split("="))
        if generated <= code_line:
            line = template_line
    return line


def _template_frame(tb: TracebackType | None, templates_dir: Path) -> str | None:
    """The innermost traceback frame inside a template file, as ``templates/X:LINE``.

    Jinja rewrites tracebacks so that frames executing template code carry the template's
    filename and line number; the innermost such frame is where the error happened.
    """
    where = None
    while tb is not None:
        name = _template_name(tb.tb_frame.f_code.co_filename, templates_dir)
        if name is not None:
            where = f"{TEMPLATES_DIR}/{name}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where
