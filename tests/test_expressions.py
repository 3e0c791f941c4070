"""Dispatch expressions and override values are judged when variants.toml is loaded (or, for what
needs the WGSL, right after render), never at validate time: each bad one is one line naming its
variants.toml line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_one_line_error, edit, line_of, run_cli, snapshot

from doppler_gen.errors import DopplerGenError
from doppler_gen.expressions import ExpressionError, parse
from doppler_gen.runtime.runner import evaluate_dispatch

# -- the grammar ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        (
            "ceil(query_len / BLOCK_SIZE) * num_heads",
            {"query_len": 65, "BLOCK_SIZE": 64, "num_heads": 3},
            6,
        ),
        (
            "ceil(query_len / BLOCK_SIZE) * num_heads",
            {"query_len": 64, "BLOCK_SIZE": 64, "num_heads": 3},
            3,
        ),
        ("num_heads", {"num_heads": 32}, 32),
        ("max(1, min(a, b) - 2)", {"a": 5, "b": 9}, 3),
        ("ceil(a / 3) + -(-a) * 2", {"a": 7}, 17),
        ("ceil(ceil(a / 2) / 2)", {"a": 5}, 2),
        ("(a + b) * (a - b)", {"a": 5, "b": 3}, 16),
    ],
)
def test_expressions_evaluate_exactly(text: str, values: dict[str, int], expected: int) -> None:
    assert parse(text).evaluate(values) == expected
    assert evaluate_dispatch(text, values) == expected  # the harness uses the same evaluator


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_heads // 0", "// is not an operator"),
        ("num_heads +", "ends too early"),
        ("[num_heads] * 3", "'[' is not allowed"),
        ("num_heads * 9**9**8", "** is not an operator"),
        ("num_heads / 3", "a division outside ceil() may not give a whole number"),
        ("ceil(num_heads / 0)", "division by zero"),
        ("ceil(num_heads / (2 - 2))", "division by zero"),
        ("__import__('os')", '"\'" is not allowed'),
        ("num_heads.real", "'.' is not allowed"),
        ("floor(num_heads)", "unknown function floor()"),
        ("ceil(a, b)", "ceil() takes 1 argument(s), got 2"),
        ("max(a)", "max() takes 2 to 8 argument(s), got 1"),
        ("ceil", "ceil must be called"),
        ("a b", "unexpected 'b'"),
        ("(a", "missing ')'"),
        ("a * 4294967296", "larger than 4294967295"),
        ("1.5 * a", "'.' is not allowed"),
        ("(" * 20 + "a" + ")" * 20, "nested deeper than 16"),
        ("-" * 40 + "a", "nested deeper than 16"),
        ("a+" * 200 + "a", "longer than 256 characters"),
        ("", "must be a non-empty expression"),
        # only ASCII: a JS host reads 0-9 and ASCII blanks (these were accepted and exported)
        ("num_heads * \u0661", "'\u0661' is not allowed"),
        ("num_heads * \uff12", "'\uff12' is not allowed"),
        ("num_heads\u3000* 2", "'\\u3000' is not allowed"),
        ("num_heads * 2\u00a0", "'\\xa0' is not allowed"),
    ],
)
def test_the_grammar_rejects_everything_else(text: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        parse(text)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"a": 4, "b": 0}, "division by zero for these values"),
        ({"a": 2**60, "b": 1}, "exceeds 2^53"),
        ({"a": 1.5, "b": 1}, "not a whole number"),
        ({"a": float("nan"), "b": 1}, "not a whole number"),
        ({"a": 1}, "uses unknown names b"),
    ],
)
def test_evaluation_errors_are_one_line_errors(values: dict[str, float], message: str) -> None:
    with pytest.raises(DopplerGenError, match=message.replace("^", r"\^")):
        evaluate_dispatch("ceil(a / b) * 2", values)


def test_intermediate_values_are_bounded() -> None:
    with pytest.raises(ExpressionError, match="exceeds 2\\^53"):
        parse("a * a * a * a").evaluate({"a": 2**20})


def test_a_negative_workgroup_count_is_refused() -> None:
    with pytest.raises(DopplerGenError, match="gives -2 workgroups"):
        evaluate_dispatch("a - 5", {"a": 3})


# -- at load time, through the CLI ----------------------------------------------------------------

DISPATCH = 'dispatch = "ceil(query_len / BLOCK_SIZE) * num_heads"'


def _assert_refused(root: Path, needle: str, message: str) -> None:
    """generate and check: exit 2, one line at the variants.toml line holding ``needle``."""
    before = snapshot(root / "generated")
    expected_line = line_of((root / "variants.toml").read_text(encoding="utf-8"), needle)
    for command in ("generate", "check"):
        result = run_cli(root, command)
        assert result.exit_code == 2, (command, result.output)
        line = assert_one_line_error(result.stderr)
        assert line.startswith(f"error: variants.toml:{expected_line}: "), line
        assert message in line, line
    assert snapshot(root / "generated") == before


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("num_heads // 0", "// is not an operator"),
        ("num_heads +", "ends too early"),
        ("[num_heads] * 3", "'[' is not allowed"),
        ("num_heads * 9**9**8", "** is not an operator"),
        ("num_heads / 3", "a division outside ceil()"),
    ],
)
def test_bad_dispatch_rules_are_refused_at_load(
    fresh_project: Path, rule: str, message: str
) -> None:
    edit(fresh_project / "variants.toml", DISPATCH, f'dispatch = "{rule}"')
    _assert_refused(
        fresh_project, f'dispatch = "{rule}"', f"[templates.attention] dispatch {rule!r}: {message}"
    )


def test_dispatch_names_must_be_uniform_fields_or_constants(fresh_project: Path) -> None:
    rule = "ceil(query_len / BLOCK_SIZE) * num_heads * bogus"
    edit(fresh_project / "variants.toml", DISPATCH, f'dispatch = "{rule}"')
    _assert_refused(
        fresh_project, "* bogus", "uses bogus, which the WGSL of variant attention declares neither"
    )


def test_a_module_constant_is_a_valid_dispatch_name(fresh_project: Path) -> None:
    # MAX_KV_LEN is a module `const` of the tiered kernels (not a uniform, not an override)
    edit(
        fresh_project / "variants.toml",
        'dispatch = "num_heads"',
        'dispatch = "num_heads * min(1, MAX_KV_LEN)"',
    )
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.stderr


OVERRIDE_VARIANT = 'params = { kv_dtype = "f16", block_size = 16 }'


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("WORKGROUP_SIZE = 64.5", "override WORKGROUP_SIZE = 64.5: u32 needs an integer"),
        ("WORKGROUP_SIZE = -4", "override WORKGROUP_SIZE = -4: out of range for u32"),
        ("WORKGROUP_SIZE = 4294967296", "out of range for u32 (0 to 4294967295)"),
        ("WORKGROUP_SIZE = nan", "override WORKGROUP_SIZE = nan is not a finite number"),
        ("WORKGROUP_SIZE = inf", "override WORKGROUP_SIZE = inf is not a finite number"),
        ("WORKGROUP_SIZE = -inf", "override WORKGROUP_SIZE = -inf is not a finite number"),
        ("BLOCK_SIZE = 0", "override BLOCK_SIZE = 0: it sizes the dispatch or the workgroup"),
        (
            "WORKGROUP_SIZE = 0",
            "override WORKGROUP_SIZE = 0: it sizes the dispatch or the workgroup",
        ),
        ('WORKGROUP_SIZE = "64"', "override WORKGROUP_SIZE must be a number"),
        ("WORKGROUP_SIZE = true", "override WORKGROUP_SIZE must be a number"),
    ],
)
def test_bad_override_values_are_refused(fresh_project: Path, overrides: str, message: str) -> None:
    edit(
        fresh_project / "variants.toml",
        OVERRIDE_VARIANT,
        f"{OVERRIDE_VARIANT}\noverrides = {{ {overrides} }}",
    )
    _assert_refused(fresh_project, f"overrides = {{ {overrides} }}", message)


def test_each_override_is_reported_at_its_own_line(fresh_project: Path) -> None:
    edit(
        fresh_project / "variants.toml",
        OVERRIDE_VARIANT,
        f"{OVERRIDE_VARIANT}\n\n[variant.overrides]\nHEAD_TILE = 16\nBLOCK_SIZE = 0\n",
    )
    _assert_refused(fresh_project, "BLOCK_SIZE = 0", "override BLOCK_SIZE = 0")


def test_good_overrides_generate(fresh_project: Path) -> None:
    edit(
        fresh_project / "variants.toml",
        OVERRIDE_VARIANT,
        f"{OVERRIDE_VARIANT}\noverrides = {{ WORKGROUP_SIZE = 16, BLOCK_SIZE = 16, HEAD_TILE = 0 }}",
    )
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.stderr  # HEAD_TILE sizes nothing: 0 is a valid u32
