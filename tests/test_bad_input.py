"""Bad input: one line on stderr naming file and line, exit code 2, generated/ left untouched.

Each case mutates a copy of the project, runs `generate` and `check`, and compares generated/ byte
for byte with a snapshot taken before. The expected line number is found in the *mutated* file
(the line holding a needle), so the cases keep working when unrelated lines move.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import (
    REPO_ROOT,
    assert_one_line_error,
    edit,
    line_of,
    project_snapshot,
    run_cli,
    run_process,
    snapshot,
)

from doppler_gen.config import RESERVED_PARAM_NAMES, load_project
from doppler_gen.render import Renderer

Where = Callable[[str], int]


@dataclass(frozen=True)
class Mutation:
    """An edit of one project file and where the error must point (file, line finder)."""

    file: str
    apply: Callable[[str], str]
    where_file: str
    where: Where

    def __call__(self, root: Path) -> str:
        path = root / self.file
        if self.apply is DELETE:
            path.unlink()
        else:
            path.write_text(self.apply(path.read_text(encoding="utf-8")), encoding="utf-8")
        where_path = root / self.where_file
        text = where_path.read_text(encoding="utf-8") if where_path.exists() else ""
        return f"{self.where_file}:{self.where(text)}"


def DELETE(text: str) -> str:  # marker: remove the file
    raise AssertionError("not called")


def at(needle: str, occurrence: int = 0) -> Where:
    return lambda text: line_of(text, needle, occurrence)


def last_line(text: str) -> int:
    return len(text.splitlines())


def variant_header(name: str) -> Where:
    """The `[[variant]]` line of the variant called ``name``."""

    def find(text: str) -> int:
        lines = text.splitlines()
        number = line_of(text, f'name = "{name}"')
        while not lines[number - 1].strip().startswith("[[variant]]"):
            number -= 1
        return number

    return find


def replace(old: str, new: str) -> Callable[[str], str]:
    def apply(text: str) -> str:
        assert old in text, f"{old!r} not in the file: update this case"
        return text.replace(old, new, 1)

    return apply


def insert_before(anchor: str, new: str) -> Callable[[str], str]:
    """Insert ``new`` (whole lines) before the line holding ``anchor``."""

    def apply(text: str) -> str:
        lines = text.splitlines(keepends=True)
        number = line_of(text, anchor)
        return "".join([*lines[: number - 1], new, *lines[number - 1 :]])

    return apply


def insert_after(anchor: str, new: str) -> Callable[[str], str]:
    """Insert ``new`` (whole lines) after the line holding ``anchor``."""

    def apply(text: str) -> str:
        lines = text.splitlines(keepends=True)
        number = line_of(text, anchor)
        return "".join([*lines[:number], new, *lines[number:]])

    return apply


def set_variant_key(name: str, key: str, new: str | None) -> Callable[[str], str]:
    """Replace (``new``) or remove (None) the ``key = ...`` line of variant ``name``."""

    def apply(text: str) -> str:
        lines = text.splitlines(keepends=True)
        number = line_of(text, f'name = "{name}"')
        for index in range(number, len(lines)):
            if lines[index].lstrip().startswith("["):
                break
            if re.match(rf"\s*{key}\s*=", lines[index]):
                lines[index : index + 1] = [] if new is None else [new + "\n"]
                return "".join(lines)
        raise AssertionError(f"variant {name} has no {key} line: update this case")

    return apply


def append(new: str) -> Callable[[str], str]:
    return lambda text: text + new


def toml(apply: Callable[[str], str], where: Where) -> Mutation:
    return Mutation("variants.toml", apply, "variants.toml", where)


def toml_at(old: str, new: str, needle: str | None = None, occurrence: int = 0) -> Mutation:
    """Replace ``old`` by ``new`` in variants.toml; the error is at the line holding ``needle``
    (default: the first line of ``new``)."""
    return toml(replace(old, new), at(needle or new.splitlines()[0].strip(), occurrence))


MAIN = "templates/attention.wgsl.j2"
LIB = "templates/lib/attention_common.wgsl.j2"
SMALL_PARAMS = 'params = { kv_dtype = "f16", block_size = 16 }'
F16KV_OUTPUT = 'output = "generated/attention_f16kv.wgsl"'


def small_params(extra: str) -> str:
    return f'params = {{ kv_dtype = "f16", block_size = 16, {extra} }}'


def extra_variant(*lines: str) -> Mutation:
    """Append a [[variant]]; the error is at its header (the last [[variant]] line)."""
    block = "\n[[variant]]\n" + "".join(f"{line}\n" for line in lines)
    return toml(append(block), at("[[variant]]", -1))


CASES: list[tuple[str, Mutation, str]] = [
    # -- TOML syntax ----------------------------------------------------------------------------
    ("toml-syntax", toml_at("block_size = 64\n", "block_size = = 64\n"), "invalid TOML"),
    ("toml-unclosed-at-eof", toml(append("extra = [1,\n"), last_line), "invalid TOML"),
    (
        "toml-duplicate-key",
        toml(insert_after('name = "attention_f16"', 'name = "again"\n'), at('name = "again"')),
        "invalid TOML",
    ),
    # -- unknown keys ---------------------------------------------------------------------------
    (
        "unknown-top-level-key",
        toml(insert_before("[templates.attention]", 'colour = "blue"\n\n'), at('colour = "blue"')),
        "unknown top-level key 'colour'",
    ),
    (
        "unknown-top-level-table",
        toml(append("\n[settings]\nfast = true\n"), at("[settings]")),
        "unknown top-level key 'settings'",
    ),
    (
        "unknown-variant-key",
        toml(insert_after('name = "attention_f16"', "priority = 3\n"), at("priority = 3")),
        "unknown key 'priority'",
    ),
    (
        "unknown-template-key",
        toml(insert_after('source = "attention.wgsl.j2"', 'author = "me"\n'), at('author = "me"')),
        "unknown key 'author' in [templates.attention]",
    ),
    (
        "dispatch-fold-not-a-boolean",
        toml_at("dispatch_fold = true\n", 'dispatch_fold = "yes"\n'),
        "[templates.attention_prefill]: dispatch_fold must be true or false, got 'yes'",
    ),
    (
        "dispatch-fold-in-a-template-with-passes",
        toml(
            insert_after("[templates.attention_decode_split]", "dispatch_fold = true  # here\n"),
            at("dispatch_fold = true  # here"),
        ),
        "dispatch_fold belongs in each [[templates.attention_decode_split.pass]]",
    ),
    # -- missing required fields ----------------------------------------------------------------
    (
        "missing-name",
        extra_variant('template = "attention"', 'output = "generated/extra.wgsl"'),
        "missing required key 'name'",
    ),
    (
        "missing-template",
        extra_variant('name = "extra"', 'output = "generated/extra.wgsl"'),
        "variant 'extra': missing required key 'template'",
    ),
    (
        "missing-output",
        extra_variant('name = "extra"', 'template = "attention"'),
        "variant 'extra': missing required key 'output'",
    ),
    # -- wrongly typed fields -------------------------------------------------------------------
    (
        "output-not-a-string",
        toml_at(F16KV_OUTPUT, "output = 3"),
        "output must be a non-empty string, got 3",
    ),
    (
        "name-not-a-string",
        toml_at('name = "attention_f16kv"', "name = 42"),
        "name must be a non-empty string",
    ),
    (
        # generated/nul.wgsl is the null device on Windows: a checkout there fails
        "name-a-windows-device",
        toml_at(
            'name = "rmsnorm_f16"\ntemplate = "rmsnorm"\noutput = "generated/rmsnorm_f16.wgsl"',
            'name = "nul"\ntemplate = "rmsnorm"\noutput = "generated/nul.wgsl"',
            'name = "nul"',
        ),
        "variant 'nul': nul is a device name on Windows",
    ),
    ("output-empty", toml_at(F16KV_OUTPUT, 'output = ""'), "output must be a non-empty string"),
    (
        "template-not-a-string",
        toml_at(
            'name = "attention_f16kv"\ntemplate = "attention"',
            'name = "attention_f16kv"\ntemplate = ["attention"]',
            'template = ["attention"]',
        ),
        "template must be a non-empty string",
    ),
    (
        "description-not-a-string",
        toml(
            set_variant_key("attention_f16kv", "description", "description = 3"),
            at("description = 3"),
        ),
        "description must be a string",
    ),
    (
        "requires-not-a-list",
        toml(
            insert_after('name = "attention"', 'requires = "shader-f16"\n'),
            at('requires = "shader-f16"'),
        ),
        "requires must be a list of feature names",
    ),
    (
        "params-not-a-table",
        toml_at(SMALL_PARAMS, 'params = "fast"'),
        "params must be a table",
    ),
    (
        "param-str-for-int",
        toml_at(SMALL_PARAMS, 'params = { kv_dtype = "f16", block_size = "16" }'),
        "parameter block_size must be int, got str '16'",
    ),
    (
        "param-bool-for-int",
        toml_at(SMALL_PARAMS, 'params = { kv_dtype = "f16", block_size = true }'),
        "parameter block_size must be int, got bool",
    ),
    (
        "param-float-for-int",
        toml_at(SMALL_PARAMS, 'params = { kv_dtype = "f16", block_size = 16.5 }'),
        "parameter block_size must be int, got float",
    ),
    (
        "param-int-for-str",
        toml_at(SMALL_PARAMS, "params = { kv_dtype = 16, block_size = 16 }"),
        "parameter kv_dtype must be str, got int 16",
    ),
    (
        "param-not-positive",
        toml_at(SMALL_PARAMS, 'params = { kv_dtype = "f16", block_size = 0 }'),
        "block_size must be a positive integer",
    ),
    (
        "template-family-not-a-string",
        toml_at('family = "tiled"', "family = 1"),
        "family must be a non-empty string",
    ),
    # -- parameters the template does not accept, values outside choices --------------------------
    (
        "param-not-accepted",
        toml_at(SMALL_PARAMS, small_params("tile_k = 8")),
        "unknown parameter 'tile_k' for template 'attention'",
    ),
    (
        "param-outside-choices",
        toml_at(SMALL_PARAMS, 'params = { kv_dtype = "bf16", block_size = 16 }'),
        "parameter kv_dtype='bf16' is not one of 'f32', 'f16'",
    ),
    (
        "template-default-outside-choices",
        toml_at('masked_row = "zero"\n', 'masked_row = "nan"\n'),
        "parameter masked_row='nan' is not one of",
    ),
    (
        # tune would validate and time it, then --write refuse it at the end
        "tunable-outside-choices",
        toml_at(
            '[templates.rmsnorm.choices]\ndtype = ["f32", "f16"]\n',
            '[templates.rmsnorm.choices]\ndtype = ["f32", "f16"]\n\n'
            '[templates.rmsnorm.tunable]\ndtype = ["f16", "f64"]\n',
            'dtype = ["f16", "f64"]',
        ),
        "[templates.rmsnorm.tunable]: parameter dtype='f64' is not one of 'f32', 'f16'",
    ),
    (
        # the manifest is JSON: it was written with a bare NaN that JSON.parse rejects
        "template-param-nan",
        toml_at(
            '[templates.rmsnorm.params]\ndtype = "f32"\n',
            '[templates.rmsnorm.params]\ndtype = "f32"\neps = nan\n',
            "eps = nan",
        ),
        "[templates.rmsnorm.params] eps = nan is not a finite number",
    ),
    (
        "variant-param-inf",
        toml(
            lambda text: replace(
                '[templates.rmsnorm.params]\ndtype = "f32"\n',
                '[templates.rmsnorm.params]\ndtype = "f32"\neps = 1.0\n',
            )(replace('params = { dtype = "f16" }', 'params = { dtype = "f16", eps = inf }')(text)),
            at('params = { dtype = "f16", eps = inf }'),
        ),
        "parameter eps = inf is not a finite number",
    ),
    # -- valid TOML spellings the line finder must read as tomllib does -------------------------
    (
        "spaced-variant-header",
        toml(
            lambda text: replace('params = { dtype = "f16" }', 'params = { dtype = "f64" }')(
                replace('[[variant]]\nname = "rmsnorm_f16"', '[[ variant ]]\nname = "rmsnorm_f16"')(
                    text
                )
            ),
            at('params = { dtype = "f64" }'),
        ),
        "parameter dtype='f64' is not one of 'f32', 'f16'",
    ),
    (
        "a-header-inside-a-multi-line-description",
        toml(
            lambda text: replace('params = { dtype = "f16" }', 'params = { dtype = "f64" }')(
                replace(
                    'description = "input, weight and output f16; f32 arithmetic"',
                    'description = """\n[[variant]]\nname = "x"\n"""',
                )(text)
            ),
            at('params = { dtype = "f64" }'),
        ),
        "parameter dtype='f64' is not one of 'f32', 'f16'",
    ),
    (
        "a-key-name-inside-a-string",
        toml(
            lambda text: replace(
                'requires = ["shader-f16"]\nparams = { dtype = "f16" }',
                'requires = ["shader-f64"]\nparams = { dtype = "f16" }',
            )(
                replace(
                    'description = "input, weight and output f16; f32 arithmetic"',
                    'description = "see requires = here"',
                )(text)
            ),
            at('requires = ["shader-f64"]'),
        ),
        "unknown feature 'shader-f64'",
    ),
    (
        "a-dotted-key",
        toml_at('params = { dtype = "f16" }', 'params.dtype = "f64"'),
        "parameter dtype='f64' is not one of 'f32', 'f16'",
    ),
    (
        # the bare key matched choices.dtype, one line above
        "dotted-keys-of-two-sub-tables",
        toml_at(
            '[templates.rmsnorm.params]\ndtype = "f32"\nworkgroup_size = 256\n\n'
            '[templates.rmsnorm.choices]\ndtype = ["f32", "f16"]\n',
            'choices.dtype = ["f32", "f16"]\nparams.dtype = "f64"\nparams.workgroup_size = 256\n',
            'params.dtype = "f64"',
        ),
        "parameter dtype='f64' is not one of 'f32', 'f16'",
    ),
    (
        "a-quoted-table-name",
        toml(
            lambda text: replace('family = "rmsnorm"', "family = 1")(
                replace("[templates.rmsnorm]\n", '[templates."rmsnorm"]\n')(text)
            ),
            at("family = 1"),
        ),
        "family must be a non-empty string",
    ),
    (
        "unknown-feature",
        toml_at('requires = ["shader-f16"]', 'requires = ["shader-f64"]'),
        "unknown feature 'shader-f64'",
    ),
    (
        "unknown-template",
        toml_at(
            'name = "attention_f16kv"\ntemplate = "attention"',
            'name = "attention_f16kv"\ntemplate = "attn"',
            'template = "attn"',
        ),
        "unknown template 'attn'",
    ),
    (
        "bad-variant-name",
        toml_at('name = "attention_f16kv"', 'name = "Attention-F16KV"'),
        "name must match [a-z][a-z0-9_]*",
    ),
    # -- duplicates -----------------------------------------------------------------------------
    (
        "duplicate-name",
        toml_at('name = "attention_f16kv"', 'name = "attention_f16"', occurrence=-1),
        "duplicate variant name 'attention_f16'",
    ),
    (
        "duplicate-output",
        toml_at(F16KV_OUTPUT, 'output = "generated/attention_f16.wgsl"', occurrence=-1),
        "is already produced by variant 'attention_f16'",
    ),
    (
        "duplicate-output-other-case",
        toml_at(F16KV_OUTPUT, 'output = "generated/Attention_F16.wgsl"'),
        "is already produced by variant 'attention_f16'",
    ),
    # -- output outside generated/ ----------------------------------------------------------------
    *[
        (
            f"output-{label}",
            toml_at(F16KV_OUTPUT, f"output = {value}"),
            "must be a file directly inside generated/",
        )
        for label, value in [
            ("absolute", '"/tmp/evil.wgsl"'),
            ("dotdot", '"../evil.wgsl"'),
            ("generated-dotdot", '"generated/../evil.wgsl"'),
            ("nested", '"generated/sub/evil.wgsl"'),
            ("other-dir", '"kernels/evil.wgsl"'),
            ("root", '"evil.wgsl"'),
            ("backslash", "'generated\\evil.wgsl'"),
        ]
    ],
    ("output-suffix", toml_at(F16KV_OUTPUT, 'output = "generated/evil.txt"'), "must end in .wgsl"),
    # -- template files -------------------------------------------------------------------------
    (
        "missing-template-file",
        toml_at('source = "attention.wgsl.j2"', 'source = "missing.wgsl.j2"'),
        "template file templates/missing.wgsl.j2 not found",
    ),
    (
        "template-source-outside",
        toml_at('source = "attention.wgsl.j2"', 'source = "../variants.toml"'),
        "must be a path inside templates/",
    ),
    (
        "template-source-too-long",
        toml_at('source = "attention.wgsl.j2"', f'source = "{"x" * 5000}"'),
        "has a name too long for the file system",
    ),
    (
        "template-source-is-a-directory",
        toml_at('source = "attention.wgsl.j2"', 'source = "lib"'),
        "template file templates/lib is a directory, not a template file",
    ),
    (
        "template-source-with-a-nul-byte",
        toml_at('source = "attention.wgsl.j2"', 'source = "x\\u0000y"'),
        "source 'x\\x00y' contains a NUL byte",
    ),
    (
        "template-source-with-a-newline",
        toml_at('source = "attention.wgsl.j2"', 'source = "x\\ny.j2"'),
        "template file templates/x\\ny.j2 not found",
    ),
    (
        "pass-name-with-a-final-newline",
        toml_at('name = "reduce"', 'name = "reduce\\n"'),
        "pass name 'reduce\\n' must match [a-z][a-z0-9_]*",
    ),
    (
        "doppler-id-with-a-final-newline",
        toml_at('doppler_id = "prefill"', 'doppler_id = "prefill\\n"'),
        "doppler_id must be a name or a list of distinct names",
    ),
    (
        "toml-nested-too-deeply",
        toml(append(f"deep = {'[' * 100_000}{']' * 100_000}\n"), last_line),
        "invalid TOML: arrays or inline tables nested too deeply",
    ),
    (
        "variant-name-too-long-for-a-file-name",
        toml_at(
            f'name = "attention_f16kv"\ntemplate = "attention"\n{F16KV_OUTPUT}',
            f'name = "{"a" * 237}"\ntemplate = "attention"\noutput = "generated/{"a" * 237}.wgsl"',
        ),
        "name too long: the file name of generated/",
    ),
    (
        "override-breaking-a-family-constraint",
        toml_at(
            'output = "generated/rmsnorm.wgsl"',
            'output = "generated/rmsnorm.wgsl"\noverrides = { WORKGROUP_SIZE = 0x200 }',
            "overrides = { WORKGROUP_SIZE = 0x200 }",
        ),
        "WORKGROUP_SIZE 512 must be a power of two <= MAX_WORKGROUP_SIZE 256 (a constraint of",
    ),
    (
        # the decode kernels' workgroup arrays hold MAX_WORKGROUP_SIZE invocations: past it
        # WGSL's clamped indices give a wrong answer, not an error
        "override-past-the-workgroup-arrays",
        toml_at(
            'output = "generated/attention_decode_split_d128_f16.wgsl"',
            'output = "generated/attention_decode_split_d128_f16.wgsl"\n'
            "overrides = { WORKGROUP_SIZE = 0x200 }",
            "overrides = { WORKGROUP_SIZE = 0x200 }",
        ),
        "WORKGROUP_SIZE 512 must be <= MAX_WORKGROUP_SIZE 256 (partials pass) (a constraint "
        "of the tiled family)",
    ),
    (
        "override-splitting-a-key-group",
        toml_at(
            'output = "generated/attention_decode_wg_d64.wgsl"',
            'output = "generated/attention_decode_wg_d64.wgsl"\n'
            "overrides = { WORKGROUP_SIZE = 102 }",
            "overrides = { WORKGROUP_SIZE = 102 }",
        ),
        "WORKGROUP_SIZE 102 must be a multiple of LANES_PER_KEY 4 (main pass)",
    ),
    (
        "override-the-split-reduce-cannot-halve",
        toml_at(
            'output = "generated/attention_decode_split_d64_f16.wgsl"',
            'output = "generated/attention_decode_split_d64_f16.wgsl"\n'
            "overrides = { REDUCE_WORKGROUP_SIZE = 96 }",
            "overrides = { REDUCE_WORKGROUP_SIZE = 96 }",
        ),
        "REDUCE_WORKGROUP_SIZE 96 must be a power of two (reduce pass)",
    ),
    (
        "override-past-the-prefill-q-tile",
        toml_at(
            'output = "generated/attention_prefill_large_sg_d64_f16.wgsl"',
            'output = "generated/attention_prefill_large_sg_d64_f16.wgsl"\n'
            "overrides = { BLOCK_Q = 256 }",
            "overrides = { BLOCK_Q = 256 }",
        ),
        "BLOCK_Q 256 must be <= MAX_BLOCK_Q 128 (main pass)",
    ),
    (
        # it named the variant's [[variant]] line; the other override errors name their own
        "override-the-wgsl-does-not-declare",
        toml_at(
            'output = "generated/rmsnorm.wgsl"',
            'output = "generated/rmsnorm.wgsl"\noverrides = { NOPE = 1 }',
            "overrides = { NOPE = 1 }",
        ),
        "overrides sets NOPE, which the WGSL does not declare as `override`",
    ),
    (
        # it hid the template function: `fail(...)` became "'int' object is not callable"
        "parameter-named-like-a-template-function",
        toml_at(
            "[templates.rmsnorm.params]\n", "[templates.rmsnorm.params]\nfail = 1\n", "fail = 1"
        ),
        "'fail' is a name every template already has",
    ),
    (
        # replaced without a word by the renderer's own pass_name
        "parameter-named-like-a-renderer-name",
        toml_at(
            "[templates.rmsnorm.params]\n",
            '[templates.rmsnorm.params]\npass_name = "x"\n',
            'pass_name = "x"',
        ),
        "'pass_name' is a name every template already has",
    ),
    (
        "parameter-named-like-a-jinja-word",
        toml_at(
            "[templates.rmsnorm.params]\n", "[templates.rmsnorm.params]\nnone = 1\n", "none = 1"
        ),
        "'none' is no name a template can use",
    ),
    (
        # the same file under another name: another header and source hash for the same kernels
        "template-source-not-written-plainly",
        toml_at('source = "attention.wgsl.j2"', 'source = "./attention.wgsl.j2"'),
        "source './attention.wgsl.j2' is not written plainly: write 'attention.wgsl.j2'",
    ),
    (
        "feature-required-twice",
        toml_at('requires = ["shader-f16"]\n', 'requires = ["shader-f16", "shader-f16"]\n'),
        "requires lists 'shader-f16' twice",
    ),
    (
        "missing-included-file",
        Mutation(LIB, DELETE, MAIN, at('"lib/attention_common.wgsl.j2"')),
        "included template 'lib/attention_common.wgsl.j2' not found",
    ),
    (
        "jinja-syntax-main",
        Mutation(
            MAIN,
            insert_before("fn is_masked(", "{{ block_size + }}\n"),
            MAIN,
            at("{{ block_size + }}"),
        ),
        "unexpected",
    ),
    (
        "jinja-syntax-lib",
        Mutation(
            LIB, insert_after("fn get_kv_head_idx(", "    {% endfor %}\n"), LIB, at("{% endfor %}")
        ),
        "unknown tag 'endfor'",
    ),
    (
        # Jinja's lexer names the file where the template name goes: the location was
        # templates/ followed by the file's whole path
        "unclosed-raw-in-a-lib",
        Mutation(LIB, lambda text: text + "{% raw %}\n", LIB, last_line),
        "Missing end of raw directive",
    ),
    (
        "undefined-main",
        Mutation(
            MAIN,
            insert_before("fn is_masked(", "// {{ no_such_param }}\n"),
            MAIN,
            at("no_such_param"),
        ),
        "'no_such_param' is undefined (variant attention)",
    ),
    (
        "undefined-lib-macro",
        Mutation(
            LIB,
            insert_after("fn get_kv_head_idx(", "    // {{ no_such_lib_name }}\n"),
            LIB,
            at("no_such_lib_name"),
        ),
        "'no_such_lib_name' is undefined",
    ),
    (
        # Jinja parses these and writes Python that does not compile (exit 3, "internal error",
        # at a line of the generated Python); located now from Jinja's line map
        "macro-repeats-an-argument-in-a-lib",
        Mutation(
            LIB,
            insert_after("fn get_kv_head_idx(", "{% macro twice(a, a) %}{% endmacro %}\n"),
            LIB,
            at("twice(a, a)"),
        ),
        "invalid Python (duplicate argument",
    ),
    (
        "call-repeats-a-keyword",
        Mutation(
            MAIN, insert_before("fn is_masked(", "// {{ dict(a=1, a=2) }}\n"), MAIN, at("a=2")
        ),
        "invalid Python (keyword argument repeated: a)",
    ),
    (
        # folded while compiling, and written into the code as the name `inf`
        "constant-infinite-float",
        Mutation(
            MAIN,
            insert_before("fn is_masked(", '// {% set big = "inf"|float %}{{ big > 1 }}\n'),
            MAIN,
            at('"inf"|float'),
        ),
        "a constant expression that Jinja folded to inf, which it cannot write",
    ),
    (
        "type-error-main",
        Mutation(
            MAIN, insert_before("fn is_masked(", '// {{ block_size + "px" }}\n'), MAIN, at('"px"')
        ),
        "TypeError",
    ),
    (
        "template-set-difference-follows-the-hash-seed",
        Mutation(
            MAIN,
            insert_before(
                "fn is_masked(", '// {% for k in {"a": 1, 2: 3}.keys() - [] %}{{ k }}{% endfor %}\n'
            ),
            MAIN,
            at('{"a": 1, 2: 3}.keys() - []'),
        ),
        "a set difference (`keys() - ...`) of values that cannot be sorted has no fixed order",
    ),
    (
        "template-prints-a-memory-address",
        Mutation(MAIN, insert_before("fn is_masked(", "// {{ fail }}\n"), MAIN, at("{{ fail }}")),
        "an object's memory address (another on every run)",
    ),
    (
        "template-named-by-an-expression",
        Mutation(
            MAIN,
            insert_before("fn is_masked(", '{% include "lib/" ~ "attention_common.wgsl.j2" %}\n'),
            MAIN,
            at('{% include "lib/" ~'),
        ),
        "a template named by an expression, not a string literal",
    ),
    (
        "template-fail",
        Mutation(
            "variants.toml",
            replace(SMALL_PARAMS, small_params("max_head_dim = 128")),
            MAIN,
            at("fail("),
        ),
        "max_head_dim (128) must not exceed head_tile (64)",
    ),
    # -- metadata that disagrees with the WGSL -----------------------------------------------------
    (
        "f16-without-requires",
        toml(set_variant_key("attention_f16", "requires", None), variant_header("attention_f16")),
        'the WGSL enables f16 but the variant does not list requires = ["shader-f16"]',
    ),
    (
        "dispatch-fold-never-reads-the-grid",
        toml(
            insert_after('source = "attention.wgsl.j2"', "dispatch_fold = true\n"),
            variant_header("attention"),
        ),
        "dispatch_fold = true but the entry point never reads @builtin(num_workgroups)",
    ),
    (
        # naga (wgpu) runs this on a device with the subgroup capability; Tint rejects it
        "subgroup-builtin-without-enable",
        Mutation(
            MAIN,
            insert_before(
                "fn is_masked(", "fn leak() -> u32 { return subgroupBroadcastFirst(1u); }\n"
            ),
            "variants.toml",
            variant_header("attention"),
        ),
        "the WGSL uses subgroupBroadcastFirst but has no `enable subgroups;`",
    ),
    (
        # the variant's overrides and the export's constants give it once for every pass
        "passes-disagreeing-on-a-shared-override",
        Mutation(
            "templates/attention_decode_split_reduce.wgsl.j2",
            replace(
                "override KV_SPLITS: u32 = {{ kv_splits | u32 }};",
                "override KV_SPLITS: u32 = {{ (kv_splits + 1) | u32 }};",
            ),
            "variants.toml",
            variant_header("attention_decode_tiered_split_f16"),  # the first to use it
        ),
        "override KV_SPLITS is u32 = 32 in pass partials but u32 = 33 in pass reduce",
    ),
    (
        "requires-f16-without-enable",
        toml(
            insert_after('name = "attention"', 'requires = ["shader-f16"]\n'),
            variant_header("attention"),
        ),
        "the variant requires shader-f16 but the WGSL has no `enable f16;`",
    ),
]


def location_of(line: str) -> str:
    """`error: FILE:LINE[:COL]: message` -> `FILE:LINE`."""
    match = re.match(r"error: ([^:\s]+):(\d+)(?::\d+)?: ", line)
    assert match, f"no FILE:LINE in {line!r}"
    return f"{match.group(1)}:{match.group(2)}"


@pytest.mark.parametrize(
    ("mutation", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input(fresh_project: Path, mutation: Mutation, expected: str) -> None:
    before = snapshot(fresh_project / "generated")
    where = mutation(fresh_project)
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, (command, result.output, result.stderr)
        line = assert_one_line_error(result.stderr)
        assert result.stdout == "", (command, result.stdout)
        assert expected in line, line
        assert location_of(line) == where, line
        assert snapshot(fresh_project / "generated") == before
    assert not (fresh_project / "evil.wgsl").exists()
    assert not (fresh_project.parent / "evil.wgsl").exists()


@pytest.mark.parametrize("junk", ["struct Broken {", "struct NoBody"])
def test_unreadable_generated_wgsl_is_named_at_the_template_line(
    fresh_project: Path, junk: str
) -> None:
    """The error named the generated file on disk (the old, correct one) and a line of the
    render that was never written; a struct with no body was an internal error (exit 3)."""
    template = fresh_project / "templates/rmsnorm.wgsl.j2"
    edit(template, "// RMSNorm Kernel (", f"{junk}\n// RMSNorm Kernel (")
    before = snapshot(fresh_project / "generated")
    where = line_of(template.read_text(encoding="utf-8"), junk)
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, (command, result.output, result.stderr)
        line = assert_one_line_error(result.stderr)
        assert line.startswith(
            f"error: templates/rmsnorm.wgsl.j2:{where} (generated/rmsnorm.wgsl:"
        ), line
        assert "variant rmsnorm): cannot read the interface of the generated WGSL" in line
        assert snapshot(fresh_project / "generated") == before


def test_a_variants_toml_that_is_not_utf8_names_the_line_and_column(fresh_project: Path) -> None:
    """A Latin-1 comment was reported as a byte offset into the file."""
    path = fresh_project / "variants.toml"
    data = path.read_bytes()
    at = data.index(b"[[variant]]", 2000)
    path.write_bytes(data[:at] + "# é ".encode() + b"caf\xe9\n" + data[at:])
    where = data.count(b"\n", 0, at) + 1
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert location_of(line) == f"variants.toml:{where}", line
        assert "not valid UTF-8: byte 0xe9 at column 8" in line, line  # characters: é is one


def test_cases_have_unique_ids() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


def test_real_process_exit_codes_and_one_line_stderr(fresh_project: Path) -> None:
    """The installed command, as a hook runs it: 0 clean, 1 stale, 2 bad input (one line)."""
    clean = run_process(fresh_project, "check")
    assert clean.returncode == 0, clean.stderr
    assert clean.stderr == ""

    kernel = fresh_project / "generated" / "attention.wgsl"
    kernel.write_text(kernel.read_text(encoding="utf-8") + "// edit\n", encoding="utf-8")
    stale = run_process(fresh_project, "check")
    assert stale.returncode == 1
    assert stale.stderr.count("\n") == 1 and "doppler-gen generate" in stale.stderr
    assert "Traceback" not in stale.stderr

    before = snapshot(fresh_project / "generated")
    toml = fresh_project / "variants.toml"
    toml.write_text(
        toml.read_text(encoding="utf-8").replace(F16KV_OUTPUT, "output = 3", 1), encoding="utf-8"
    )
    expected_line = line_of(toml.read_text(encoding="utf-8"), "output = 3")
    for command in ("generate", "check"):
        bad = run_process(fresh_project, command)
        assert bad.returncode == 2, bad.stderr
        line = assert_one_line_error(bad.stderr)
        assert location_of(line) == f"variants.toml:{expected_line}"
        assert bad.stdout == ""
    assert snapshot(fresh_project / "generated") == before


def test_unknown_variant_for_show(fresh_project: Path) -> None:
    result = run_cli(fresh_project, "show", "no_such_variant")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert "unknown variant 'no_such_variant'" in line


def test_missing_variants_toml(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "check")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert "variants.toml" in line and "not found" in line


@pytest.mark.parametrize("command", [("check",), ("check", "--full"), ("generate",)])
def test_a_fifo_as_variants_toml_is_one_line_not_a_hang(fresh_project: Path, command) -> None:
    """Reading a FIFO blocks until a writer comes: a pre-commit hook would hang forever."""
    config = fresh_project / "variants.toml"
    config.unlink()
    os.mkfifo(config)
    result = run_process(fresh_project, *command)  # a real process: a hang is a timeout
    assert result.returncode == 2, result.stdout + result.stderr
    line = assert_one_line_error(result.stderr)
    assert "variants.toml: not a regular file" in line


def test_unreadable_generated_wgsl_is_one_line(fresh_project: Path) -> None:
    """A template that renders WGSL the interface reader cannot evaluate: exit 2, no traceback."""
    before = snapshot(fresh_project / "generated")
    template = fresh_project / "templates/attention.wgsl.j2"
    template.write_text(
        insert_before("fn is_masked(", "const BAD: u32 = 1u / 0u;\n")(
            template.read_text(encoding="utf-8")
        ),
        encoding="utf-8",
    )
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "generated/attention.wgsl" in line and "division by zero" in line
    assert snapshot(fresh_project / "generated") == before


# -- generated/ that cannot be written as asked ---------------------------------------------------


def _generated_is_a_file(root: Path, outside: Path) -> None:
    shutil.rmtree(root / "generated")
    (root / "generated").write_text("not a directory\n")


def _generated_is_a_dangling_symlink(root: Path, outside: Path) -> None:
    shutil.rmtree(root / "generated")
    (root / "generated").symlink_to("no-such-dir", target_is_directory=True)


def _generated_outside_the_project(root: Path, outside: Path) -> None:
    shutil.move(root / "generated", outside)
    (outside / "other_project_kernel.wgsl").write_bytes((outside / "attention.wgsl").read_bytes())
    (root / "generated").symlink_to(outside, target_is_directory=True)


def _output_is_a_directory(root: Path, outside: Path) -> None:
    (root / "generated/attention.wgsl").unlink()
    (root / "generated/attention.wgsl").mkdir()


def _output_is_a_fifo(root: Path, outside: Path) -> None:
    (root / "generated/attention_f16.wgsl").unlink()
    os.mkfifo(root / "generated/attention_f16.wgsl")


FILESYSTEM_CASES = [
    ("generated-is-a-file", _generated_is_a_file, "generated: exists but is not a directory"),
    (
        "generated-dangling-symlink",
        _generated_is_a_dangling_symlink,
        "generated: is a symlink to no-such-dir, which does not exist",
    ),
    (
        "generated-outside-the-project",
        _generated_outside_the_project,
        "generated: resolves to ",
    ),
    (
        "output-is-a-directory",
        _output_is_a_directory,
        "generated/attention.wgsl: is a directory, not a regular file",
    ),
    (
        "output-is-a-fifo",
        _output_is_a_fifo,
        "generated/attention_f16.wgsl: is a FIFO, not a regular file",
    ),
]


def everything(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its kind (and bytes for files): "nothing changed"."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if ".doppler-gen" in path.relative_to(root).parts:
            continue
        if path.is_symlink():
            found[name] = f"link {os.readlink(path)}"
        elif path.is_file():
            found[name] = path.read_bytes().hex()
        else:
            found[name] = "dir" if path.is_dir() else "special"
    return found


@pytest.mark.parametrize(
    ("setup", "expected"), [c[1:] for c in FILESYSTEM_CASES], ids=[c[0] for c in FILESYSTEM_CASES]
)
def test_generated_filesystem_problems(
    fresh_project: Path, tmp_path: Path, setup: Callable[[Path, Path], None], expected: str
) -> None:
    outside = tmp_path / "elsewhere"
    edit(fresh_project / "templates/attention.wgsl.j2", "fn is_masked(", "// v2\nfn is_masked(")
    setup(fresh_project, outside)
    before = everything(fresh_project), everything(tmp_path)
    for command in (("generate",), ("check", "--full")):
        # a real process with a timeout: a FIFO once blocked check forever
        result = run_process(fresh_project, *command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        line = assert_one_line_error(result.stderr)
        assert line.startswith(f"error: {expected}"), line
        assert (everything(fresh_project), everything(tmp_path)) == before


# -- runaway templates ----------------------------------------------------------------------------

RUNAWAY = "templates/attention.wgsl.j2"


def _runaway(root: Path, text: str) -> str:
    """Insert ``text`` (a line) into the main template; returns its FILE:LINE."""
    path = root / RUNAWAY
    path.write_text(insert_before("fn is_masked(", text + "\n")(path.read_text()), "utf-8")
    return f"{RUNAWAY}:{line_of(path.read_text(encoding='utf-8'), text)}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{% for i in range(10**12) %}x{% endfor %}", "Range too big"),
        (
            "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
            "rendering took longer than 0.5 s",
        ),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}// {{ f(0) }}", "recursion too deep"),
        ('// {{ "x" * 200000000 }}', "exceeds the output limit of 4194304 bytes"),
        ("// {{ 7 ** 99999 }}", "7 ** 99999 has more than 4096 bits"),
        # a width builds the whole string before the output cap sees it (300 MB, 1.2 GB RSS)
        ('// {{ "a"|center(300000000) }}', "a width or size of 300000000 exceeds the output"),
        ('// {{ "a"|indent(300000000, true) }}', "a width or size of 300000000 exceeds"),
        ('// {{ "a".rjust(300000000) }}', "a width or size of 300000000 exceeds"),
        ('// {{ "%300000000d" % 1 }}', "a width or size of 300000000 exceeds"),
        ('// {{ "%*d" % (300000000, 1) }}', "a width or size of 300000000 exceeds"),
        ('// {{ "%.300000000f"|format(1) }}', "a width or size of 300000000 exceeds"),
        ('// {{ "{:0>300000000}".format(1) }}', "a width or size of 300000000 exceeds"),
        ('// {{ "{:>{}}".format(1, 300000000) }}', "a width or size of 300000000 exceeds"),
        ('// {{ "{:>{w}}".format_map({"w": 300000000}) }}', "a width or size of 300000000"),
        ('{% set s = ("a" * 4000)|replace("a", "b" * 40000) %}', "replacing gives 160000000"),
        ('{% set s = ("a" * 4000).replace("a", "b" * 40000) %}', "replacing gives 160000000"),
        ('{% set s = ("a\\n" * 4000)|indent(40000) %}', "indenting 4001 lines by 40000 exceeds"),
        # doubling in a loop: 2**27 bytes at 27 steps, 2**33 (8 GB) at 33
        (
            '{% set ns = namespace(s="x") %}{% for i in range(27) %}'
            "{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "concatenating 8388608 items exceeds the output limit",
        ),
        (
            '{% set ns = namespace(s="x") %}{% for i in range(27) %}'
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "concatenating 8388608 items exceeds the output limit",
        ),
        (
            "{% set ns = namespace(s=[1]) %}{% for i in range(27) %}"
            "{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "concatenating 8388608 items exceeds the output limit",
        ),
        (
            "{% macro d(s, n) %}{{ d(s ~ s, n - 1) if n else s|length }}{% endmacro %}"
            '// {{ d("x", 27) }}',
            "concatenating 8388608 items exceeds the output limit",
        ),
    ],
    ids=[
        "huge-range",
        "time-limit",
        "recursion",
        "huge-repeat",
        "huge-power",
        "center",
        "indent",
        "rjust",
        "percent",
        "percent-star",
        "format-filter",
        "str-format",
        "str-format-nested",
        "format-map",
        "replace-filter",
        "replace-method",
        "indent-lines",
        "doubling-plus",
        "doubling-tilde",
        "doubling-list",
        "doubling-recursion",
    ],
)
def test_runaway_template(fresh_project: Path, monkeypatch, text: str, expected: str) -> None:
    from doppler_gen import render

    monkeypatch.setattr(render, "RENDER_TIME_LIMIT_S", 0.5)
    before = snapshot(fresh_project / "generated")
    where = _runaway(fresh_project, text)
    for command in ("generate", "check"):
        started = time.monotonic()
        result = run_cli(fresh_project, command)
        assert time.monotonic() - started < 20
        assert result.exit_code == 2, (command, result.output)
        line = assert_one_line_error(result.stderr)
        assert expected in line and "(variant attention" in line, line
        assert location_of(line) == where, line
        assert len(line) < 400
    assert snapshot(fresh_project / "generated") == before


def test_memory_beyond_every_other_bound_is_one_line(fresh_project: Path, monkeypatch) -> None:
    """Many strings, each within the bounds, joined or listed: the address-space cap stops it."""
    import resource

    from doppler_gen import render

    monkeypatch.setattr(render, "RENDER_MEMORY_LIMIT_BYTES", 64 << 20)
    before = snapshot(fresh_project / "generated")
    limits = resource.getrlimit(resource.RLIMIT_AS)
    text = '{% set s = range(200)|map("center", 1000000)|join %}'  # 200 MB
    where = _runaway(fresh_project, text)
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line.startswith(f"error: {where}: rendering needs more than 64 MiB of memory"), line
    assert snapshot(fresh_project / "generated") == before
    assert resource.getrlimit(resource.RLIMIT_AS) == limits  # restored after the render


def test_large_values_are_not_widths(fresh_project: Path) -> None:
    """Only sizes are bounded: a u32 maximum formats as before, in every way of formatting."""
    text = (
        '// {{ "%du"|format(4294967295) }} {{ "{}u".format(4294967295) }} {{ "%du" % 4294967295 }}'
        ' {{ "{:08.3f}".format(1.5) }} {{ 4294967295 % 7 }} {{ "a" ~ 1 ~ [2] }} {{ 1 + 2 }}'
        ' {{ [1] + [2] }} {{ "abca"|replace("a", "xy") }} {{ "abca"|replace("a", "x", 1) }}'
        ' {{ "abca".replace("a", "z") }} {{ "a\\nb"|indent(2)|replace("\\n", "|") }}'
    )
    _runaway(fresh_project, text)
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.output + result.stderr
    kernel = (fresh_project / "generated" / "attention.wgsl").read_text(encoding="utf-8")
    assert (
        "// 4294967295u 4294967295u 4294967295u 0001.500 3 a1[2] 3 [1, 2] xybcxy xbca zbcz a|  b\n"
        in kernel
    )


def test_runaway_output_names_the_template(fresh_project: Path, monkeypatch) -> None:
    from doppler_gen import render

    monkeypatch.setattr(render, "OUTPUT_LIMIT_BYTES", 200_000)
    _runaway(fresh_project, "// {% for i in range(20000) %}more output {{ i }} {% endfor %}")
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert line.startswith(f"error: {RUNAWAY}: output exceeds 200000 bytes"), line


# -- template encoding ----------------------------------------------------------------------------


def test_non_utf8_byte_in_a_library_template_names_that_file(fresh_project: Path) -> None:
    lib = fresh_project / "templates/lib/attention_common.wgsl.j2"
    text = lib.read_text(encoding="utf-8")
    number = line_of(text, "// Causal mask")
    column = text.splitlines()[number - 1].index("// Causal mask") + len("// Causal ") + 1
    lib.write_bytes(text.encode().replace(b"// Causal mask", b"// Causal \xff mask", 1))
    before = snapshot(fresh_project / "generated")
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert location_of(line) == f"templates/lib/attention_common.wgsl.j2:{number}", line
        assert f"not valid UTF-8: byte 0xff at column {column}" in line, line
    assert snapshot(fresh_project / "generated") == before


# -- template sources that are not files ------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (os.mkfifo, "is a FIFO, not a template file"),
        (lambda path: path.symlink_to(path.name), "is a symlink loop"),
        (lambda path: path.symlink_to("nowhere.j2"), "is a symlink to nowhere.j2, which does not"),
    ],
    ids=["fifo", "symlink-loop", "dangling-symlink"],
)
def test_a_template_source_that_is_not_a_file_says_what_it_is(
    fresh_project: Path, make: Callable[[Path], None], expected: str
) -> None:
    """Not "not found": the file is there, and the message must say what is wrong with it."""
    make(fresh_project / "templates" / "odd.j2")
    edit(fresh_project / "variants.toml", 'source = "attention.wgsl.j2"', 'source = "odd.j2"')
    where = line_of((fresh_project / "variants.toml").read_text(encoding="utf-8"), "odd.j2")
    result = run_process(fresh_project, "check")  # a real process: reading a FIFO would hang
    assert result.returncode == 2, result.stdout + result.stderr
    line = assert_one_line_error(result.stderr)
    assert line.startswith(
        f"error: variants.toml:{where}: template file templates/odd.j2 {expected}"
    )


@pytest.mark.parametrize(
    ("make", "expected"),
    [(os.mkfifo, "is a FIFO in templates/, not a file"), (os.mkdir, "is a directory in")],
    ids=["fifo", "directory"],
)
def test_an_included_template_that_is_not_a_file_says_what_it_is(
    fresh_project: Path, make: Callable[[Path], None], expected: str
) -> None:
    """An include of a FIFO or a directory said "not found" though something was there."""
    lib = fresh_project / "templates/lib/attention_common.wgsl.j2"
    lib.unlink()
    make(lib)
    result = run_process(fresh_project, "check")  # a real process: reading a FIFO would hang
    assert result.returncode == 2, result.stdout + result.stderr
    line = assert_one_line_error(result.stderr)
    assert f"included template 'lib/attention_common.wgsl.j2' {expected}" in line, line


# -- templates that break Jinja itself ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("// {{ cycler().next() }}", "RuntimeError: at least one item has to be provided"),
        ('// {{ "abc"|truncate(-5) }}', "AssertionError: expected length >= 3, got -5"),
    ],
    ids=["empty-cycler", "negative-truncate"],
)
def test_jinja_runtime_and_assertion_errors_name_the_line(
    fresh_project: Path, text: str, expected: str
) -> None:
    before = snapshot(fresh_project / "generated")
    where = _runaway(fresh_project, text)
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, (command, result.output)
        line = assert_one_line_error(result.stderr)
        assert line == f"error: {where}: {expected} (variant attention)", line
    assert snapshot(fresh_project / "generated") == before


@pytest.mark.parametrize(
    "text",
    [
        f"// {{{{ {'(' * 3000}1{')' * 3000} }}}}",
        f"{'{% if true %}' * 2000}x{'{% endif %}' * 2000}",
    ],
    ids=["brackets", "blocks"],
)
def test_nesting_too_deep_to_compile_names_the_template(fresh_project: Path, text: str) -> None:
    _runaway(fresh_project, text)
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line.startswith(f"error: {RUNAWAY}: nested too deeply to compile"), line


@pytest.mark.parametrize(
    "command", [("generate",), ("check", "--full"), ("list",), ("export",), ("show", "attention")]
)
def test_a_lone_surrogate_in_the_output_is_one_template_error(
    fresh_project: Path, command: tuple[str, ...]
) -> None:
    """Every command that renders refuses it alike (show printed it, the others crashed)."""
    _runaway(fresh_project, '// {{ "\\udcff" }}')
    result = run_cli(fresh_project, *command)
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line.startswith(f"error: {RUNAWAY}: renders '\\udcff', a lone surrogate"), line
    assert "at generated/attention.wgsl:" in line and line.endswith("(variant attention)")


# -- a damaged generated/manifest.json --------------------------------------------------------------


def _damage_entries(root: Path, key: str, value: object) -> None:
    """Set ``key`` of two variants' manifest entries, and of an entry no variant has any more."""
    path = root / "generated/manifest.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    entries = document["variants"]
    entries["gone"] = dict(entries["attention_f16kv"])
    for name in ("attention", "attention_f16", "gone"):
        entries[name][key] = value
    path.write_text(json.dumps(document), encoding="utf-8")


def _check_stale_then_generate_repairs(root: Path) -> None:
    check = run_cli(root, "check")
    assert check.exit_code == 1, check.output + check.stderr
    assert "stale:    generated/manifest.json" in check.stdout
    assert run_cli(root, "generate").exit_code == 0
    assert run_cli(root, "check").exit_code == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("metadata", 5),
        ("doppler", {"operation": 5, "ids": "x"}),
        ("doppler", 5),
        ("passes", 5),
        ("passes", [5]),
        ("file", [1]),
        ("bindings", 5),
    ],
)
def test_malformed_manifest_entries_count_as_absent(
    fresh_project: Path, key: str, value: object
) -> None:
    """A partial generate keeps the other variants' recorded entries, never a crash. One
    damaged where doppler-gen reads it counts as absent, and the partial generate refuses (it
    would drop that variant from the manifest); one damaged elsewhere (``file``,
    ``bindings``) is carried over as recorded. Either way check calls the manifest stale and a
    full generate repairs it."""
    from doppler_gen.manifest import well_formed_entry

    _damage_entries(fresh_project, key, value)
    recorded = json.loads((fresh_project / "generated/manifest.json").read_text())["variants"]
    before = project_snapshot(fresh_project)
    partial = run_cli(fresh_project, "generate", "attention_small_f16kv")
    if well_formed_entry(recorded["attention"]):
        assert partial.exit_code == 0, partial.output + partial.stderr
    else:
        assert partial.exit_code == 2, partial.output + partial.stderr
        line = assert_one_line_error(partial.stderr)
        assert "generated/manifest.json: no usable entry for 2 variant(s) not named" in line
        assert project_snapshot(fresh_project) == before
    _check_stale_then_generate_repairs(fresh_project)


@pytest.mark.parametrize(
    "manifest",
    ["[" * 100_000 + "]" * 100_000, "{garbage", "[1]", '{"variants": 5}', None],
)
def test_a_partial_generate_refuses_a_manifest_it_cannot_keep_entries_from(
    fresh_project: Path, manifest: str | None
) -> None:
    """Unreadable, nested too deeply for the decoder, of the wrong shape, or missing: a
    partial generate once wrote a manifest and export of the named variant alone (exit 0)."""
    path = fresh_project / "generated/manifest.json"
    if manifest is None:
        path.unlink()
    else:
        path.write_text(manifest, encoding="utf-8")
    edit(fresh_project / "templates/rmsnorm.wgsl.j2", "one row per workgroup", "one row per WG")
    before = project_snapshot(fresh_project)
    partial = run_cli(fresh_project, "generate", "rmsnorm")
    assert partial.exit_code == 2, partial.output + partial.stderr
    line = assert_one_line_error(partial.stderr)
    assert "generated/manifest.json: no usable entry for" in line, line
    assert "run `doppler-gen generate` without names" in line
    assert project_snapshot(fresh_project) == before
    assert run_cli(fresh_project, "generate").exit_code == 0
    assert run_cli(fresh_project, "check").exit_code == 0


ENDLESS = Path("/proc/self/pagemap")  # a "regular file" of size 0 that yields bytes for ~512 GB


def _files_not_links(directory: Path) -> dict[str, bytes]:
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


@pytest.mark.skipif(not ENDLESS.is_file(), reason="needs Linux's /proc/self/pagemap")
@pytest.mark.parametrize("where", ["orphan", "output", "config"])
def test_a_link_to_a_file_that_never_ends_is_not_read_forever(
    fresh_project: Path, where: str
) -> None:
    """`check` read every file in generated/ to the end to see whether it was an orphan of ours,
    and a link to /proc/self/pagemap has none: the check (and a pre-commit hook) hung. A read
    now stops where a file runs on past its own size and 64 MiB: such an orphan is no file of
    ours, such an output is stale (`generate` replaces the link with the kernel), and a config
    behind such a link is one error line, exit 2."""
    path = {
        "orphan": fresh_project / "generated/extra.wgsl",
        "output": fresh_project / "generated/rmsnorm.wgsl",
        "config": fresh_project / "variants.toml",
    }[where]
    path.unlink(missing_ok=True)
    path.symlink_to(ENDLESS)
    before = _files_not_links(fresh_project / "generated")
    check = run_process(fresh_project, "check")  # 60 s timeout: a hang fails the test
    if where == "config":
        assert check.returncode == 2, check.stderr
        line = assert_one_line_error(check.stderr)
        assert (
            line.startswith("error: ") and "variants.toml: cannot read: larger than 64 MiB" in line
        )
        assert run_process(fresh_project, "generate").returncode == 2
        assert _files_not_links(fresh_project / "generated") == before and path.is_symlink()
        return
    if where == "orphan":
        assert check.returncode == 0, check.stderr
    else:
        assert check.returncode == 1, check.stderr
        assert "-<larger than 64 MiB: not read>" in check.stdout
    assert _files_not_links(fresh_project / "generated") == before
    generate = run_process(fresh_project, "generate")
    assert generate.returncode == 0, generate.stderr
    assert path.is_symlink() == (where == "orphan")  # an orphan not ours stays
    assert run_process(fresh_project, "check").returncode == 0


def test_an_output_past_64_mib_is_stale_and_generate_replaces_it(fresh_project: Path) -> None:
    """A read of an output stops at 64 MiB; the file is then stale, not an error, so that
    `generate` repairs it as it repairs any other wrong output."""
    kernel = fresh_project / "generated/rmsnorm.wgsl"
    with kernel.open("r+b") as handle:
        handle.truncate((64 << 20) + 1)  # sparse: no 64 MiB written
    assert run_cli(fresh_project, "check").exit_code == 1
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.stderr
    assert kernel.stat().st_size < 1 << 20
    assert run_cli(fresh_project, "check").exit_code == 0


def test_a_large_file_beside_the_kernels_is_digested_whole_and_the_memo_kept(
    fresh_project: Path,
) -> None:
    """An orphan candidate is streamed to its end (only its head kept): a file past 64 MiB that
    says how large it is is no endless file. Cut at 64 MiB, its digest was noted as unread,
    which the tree's snapshot could never confirm, so no check memo was saved."""
    big = fresh_project / "generated/weights.bin"
    with big.open("wb") as handle:
        handle.truncate((64 << 20) + 4096)  # sparse
    memo = fresh_project / ".doppler-gen/check-memo"
    memo.unlink(missing_ok=True)
    assert run_cli(fresh_project, "check").exit_code == 0
    assert memo.is_file()


@pytest.mark.parametrize("command", ["check", "generate"])
def test_a_generated_directory_that_cannot_be_searched_is_one_error_line(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """`chmod 000 generated` (for a user other than root, whom modes do not stop): asking
    whether generated/doppler is a link raised PermissionError, and the command ended in exit
    3, "internal error". Simulated by that question's answer, since the suite runs as root."""
    export = fresh_project / "generated" / "doppler"
    is_symlink = Path.is_symlink

    def denied(path: Path) -> bool:
        if path == export:
            raise PermissionError(13, "Permission denied", str(path))
        return is_symlink(path)

    monkeypatch.setattr(Path, "is_symlink", denied)
    before = snapshot(fresh_project / "generated")
    result = run_cli(fresh_project, command)
    assert result.exit_code == 2, (result.output, result.stderr)
    line = assert_one_line_error(result.stderr)
    assert line == "error: generated/doppler: cannot inspect: Permission denied", line
    assert snapshot(fresh_project / "generated") == before


def test_every_name_the_renderer_gives_a_template_is_reserved() -> None:
    """A template parameter may not take a name the renderer sets (RESERVED_PARAM_NAMES): the
    reserved set must grow with the renderer's context and globals."""
    project = load_project(REPO_ROOT)
    renderer = Renderer(project)
    variant = project.variants[0]
    given = set(renderer.context(variant)) - set(variant.params)
    assert given | set(renderer.env.globals) <= RESERVED_PARAM_NAMES
