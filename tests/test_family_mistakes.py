"""A family module's mistakes: refused with one line, failed, or named, never a passed kernel.

Each family of tests/families/mistakes.py is the test-only two-pass ``rowsum`` family with one
mistake, registered as ``rowsum`` over a copy of tests/fixtures/twopass.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, edit, run_cli
from families import mistakes, twopass
from gpu_support import adapter_problem

from doppler_gen.families import register_family
from doppler_gen.tolerance import judge

needs_adapter = pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
rowsum_family = pytest.fixture(autouse=True)(twopass.registered_rowsum)
project = pytest.fixture(twopass.generated_copy)


def _validate(root: Path, *args: str) -> tuple[int, dict]:
    result = run_cli(root, "validate", "rowsum", "--quick", "--json", *args)
    return result.exit_code, json.loads(result.stdout)


# -- judged: a case matrix or tolerance that checks nothing is a FAIL ----------------------------


def test_an_infinite_tolerance_passes_nothing() -> None:
    verdict = judge(np.array([5.0, 1.0]), np.array([1.0, 1.0]), float("inf"), "test")
    assert verdict.passed is False and verdict.ratio == float("inf")
    assert judge(np.array([1.0]), np.array([1.0]), 1e-6, "test").passed


@needs_adapter
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("family", "reason"),
    [
        (mistakes.NoQuickCases(), "the family gives no case for this tier"),
        (mistakes.EmptyOutputs(), "no case compared any output element (3 case(s)"),
        (mistakes.InfiniteTolerance(), "the family's tolerance is inf, not a finite number"),
    ],
    ids=["no cases", "empty outputs", "infinite tolerance"],
)
def test_a_family_that_checks_nothing_fails_validate(
    project: Path, family: object, reason: str
) -> None:
    register_family(family)  # type: ignore[arg-type]
    code, document = _validate(project)
    assert "variants" in document, document
    variant = document["variants"][0]
    assert (code, variant["status"]) == (1, "FAIL"), variant
    assert reason in variant["reason"]


@needs_adapter
@pytest.mark.gpu
def test_an_empty_case_among_real_ones_is_judged_as_usual(project: Path) -> None:
    register_family(mistakes.EmptyAndFullOutputs())
    code, document = _validate(project)
    assert (code, document["variants"][0]["status"]) == (0, "PASS"), document


# -- refused at generate: roles the runtime cannot honour ----------------------------------------


@pytest.mark.parametrize(
    ("family", "message"),
    [
        (mistakes.BadRole(), "family 'rowsum' gives binding y the role 'outptu'"),
        (mistakes.OutputAsInput(), "binding y is an input of family 'rowsum' but is bound "),
        (mistakes.TwoOutputs(), "the entry points bind 2 outputs (x, y)"),
    ],
    ids=["unknown role", "written input", "two outputs"],
)
def test_roles_the_runtime_cannot_honour_are_refused_at_generate(
    project: Path, family: object, message: str
) -> None:
    register_family(family)  # type: ignore[arg-type]
    for command in ("generate", "check"):
        result = run_cli(project, command)
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert "variants.toml:" in line and message in line, line


def test_an_input_the_kernel_may_write_is_refused_at_generate(project: Path) -> None:
    """A kernel that overwrote its input (a KV cache) would pass: nothing reads inputs back."""
    edit(
        project / "templates/rowsum_partials.wgsl.j2",
        "var<storage, read> x:",
        "var<storage, read_write> x:",
    )
    result = run_cli(project, "generate")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "binding x is an input of family 'rowsum' but is bound read_write" in line


# -- a family's own bug names the family -----------------------------------------------------------


@needs_adapter
@pytest.mark.gpu
def test_an_exception_in_family_code_names_its_module_and_line(project: Path) -> None:
    register_family(mistakes.ReferenceRaises())
    result = run_cli(project, "validate", "rowsum", "--quick")
    assert result.exit_code == 3, result.output
    line = assert_one_line_error(result.stderr)
    assert "internal error (a bug in family code, " in line, line
    assert "families/mistakes.py:" in line and "(in reference)" in line, line


@needs_adapter
@pytest.mark.gpu
def test_unhashable_case_specs_name_the_family(project: Path) -> None:
    register_family(mistakes.UnhashableSpecs())
    result = run_cli(project, "validate", "rowsum", "--quick")
    assert result.exit_code == 3, result.output
    line = assert_one_line_error(result.stderr)
    assert "family 'rowsum' (families.mistakes)" in line, line
    assert "is not hashable (make it @dataclass(frozen=True))" in line, line


def test_the_family_framework_is_not_blamed_as_family_code() -> None:
    """The registry, the base class and the memo are the core's: an error raised there is a
    bug in doppler-gen, while one in a family module names that module."""
    from doppler_gen.families import family_code_at

    package = Path(family_code_at.__code__.co_filename).parent
    for core in ("base.py", "memo.py", "__init__.py"):
        error = RuntimeError(f'boom\n  File "{package / core}", line 10, in tolerance\n')
        assert family_code_at(error) is None, core
    error = RuntimeError(f'boom\n  File "{package / "tiled.py"}", line 7, in specs\n')
    assert family_code_at(error).endswith("tiled.py:7 (in specs)")
