"""The two-pass ``rowsum`` project (tests/fixtures/twopass) for the test modules that run it.
Each module makes its fixtures from these two functions:

    rowsum_family = pytest.fixture(autouse=True)(twopass.registered_rowsum)
    project = pytest.fixture(twopass.generated_copy)
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from conftest import run_cli

from doppler_gen.families import FAMILIES, register_family
from families.rowsum import ROWSUM

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "twopass"


def registered_rowsum() -> Iterator[None]:
    """``rowsum`` registered for one test, and removed after it."""
    register_family(ROWSUM)
    yield
    FAMILIES.pop("rowsum", None)


def generated_copy(tmp_path: Path) -> Path:
    """A copy of the fixture project, generated."""
    root = tmp_path / "twopass"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("generated"))
    result = run_cli(root, "generate")
    assert result.exit_code == 0, result.output
    return root
