"""The family contract: what every registered family (and the test-only two-pass one) must hold.

Parametrized over the registry, so a new family is held to it without a new test: its case
matrix is deterministic, its quick tier is a subset of its default tier (large at least as big),
an f32 kernel of it matches its float64 reference on the adapter, its shape labels parse back
to the same shape, and a case the device cannot hold is refused before any buffer or dispatch.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from conftest import REPO_ROOT, run_cli
from families.rowsum import ROWSUM
from gpu_support import adapter_problem

from doppler_gen.config import Project, load_project
from doppler_gen.families import FAMILIES, get_family, memo, register_family
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.render import Renderer
from doppler_gen.runtime.runner import KernelRunner, Refusal
from doppler_gen.shapes import parse_shape
from doppler_gen.validate import validate

FIXTURE = Path(__file__).parent / "fixtures" / "twopass"
PRODUCT = [name for name in FAMILIES if name != ROWSUM.name]
needs_adapter = pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))


@pytest.fixture(scope="module")
def twopass(tmp_path_factory: pytest.TempPathFactory) -> Path:
    register_family(ROWSUM)
    root = tmp_path_factory.mktemp("contract") / "twopass"
    shutil.copytree(FIXTURE, root)
    assert run_cli(root, "generate").exit_code == 0
    return root


@pytest.fixture(params=[*PRODUCT, ROWSUM.name])
def family_project(request: pytest.FixtureRequest, twopass: Path) -> tuple[Any, Project]:
    register_family(ROWSUM)
    root = twopass if request.param == ROWSUM.name else REPO_ROOT
    return get_family(request.param), load_project(root)


def teardown_module() -> None:
    FAMILIES.pop(ROWSUM.name, None)


def _entries(family: Any, project: Project) -> list[tuple[Any, dict]]:
    renderer = Renderer(project)
    found = []
    for variant in project.variants:
        if variant.template.family == family.name:
            kernel = renderer.render(variant)
            found.append((kernel, variant_entry(kernel, parse_kernel(kernel))))
    assert found, f"no variant of family {family.name} to hold to the contract"
    return found


def _unseeded(specs: list) -> list:
    return [dataclasses.replace(s, seed=0) for s in specs]


def test_the_registry_lists_the_product_families() -> None:
    assert {"tiled", "tiered", "rmsnorm"} <= set(PRODUCT)


def test_cases_and_inputs_are_deterministic(family_project: tuple[Any, Project]) -> None:
    family, project = family_project
    for _, entry in _entries(family, project):
        first, again = family.specs(entry, "default", 3), family.specs(entry, "default", 3)
        assert first == again and len(first) >= 8
        assert family.specs(entry, "default", 4) != first  # the seed matters
        assert len({s.seed for s in first}) == len(first)  # every case its own tensors
        for spec in first[:3]:
            one = family.build(spec, entry)
            memo.clear()  # a second build from scratch, not the memo's shared case
            two = family.build(spec, entry)
            assert one.buffers.keys() and all(
                one.buffers[k] is not two.buffers[k] for k in one.buffers
            )
            assert one.uniforms == two.uniforms
            assert one.buffers.keys() == two.buffers.keys()
            for name, array in one.buffers.items():
                assert array.tobytes() == two.buffers[name].tobytes(), name


def test_quick_is_within_default_and_large_goes_further(
    family_project: tuple[Any, Project],
) -> None:
    """quick ⊂ default; large has at least as many cases (its sizes may replace default's)."""
    family, project = family_project
    for _, entry in _entries(family, project):
        quick, default, large = (family.specs(entry, t, 0) for t in ("quick", "default", "large"))
        assert 0 < len(quick) < len(default) <= len(large)
        assert set(_unseeded(quick)) < set(_unseeded(default))
        assert set(_unseeded(quick)) <= set(_unseeded(large))


def test_reference_shapes_match_the_output(family_project: tuple[Any, Project]) -> None:
    family, project = family_project
    _, entry = _entries(family, project)[0]
    for spec in family.specs(entry, "quick", 0):
        data = family.build(spec, entry)
        ref = family.reference(data, entry)
        assert ref.shape == family.output_shape(data) and ref.dtype == np.float64
        assert np.isfinite(ref).all()


def test_shape_labels_round_trip(family_project: tuple[Any, Project]) -> None:
    family, _ = family_project
    for text in family.default_shapes:
        shape = parse_shape(text)
        assert shape.family == family.name
        assert parse_shape(shape.label) == shape and shape.label == parse_shape(shape.label).label
        assert shape.flops() > 0
    for kind in family.shape_keys:
        shape = parse_shape(kind)
        assert parse_shape(shape.label) == shape


class _NothingFits:
    """A device that binds no buffer: every case must be refused, nothing built or run."""

    limits: ClassVar[dict[str, int]] = {
        "max-storage-buffer-binding-size": 0,
        "max-compute-workgroups-per-dimension": 0,
    }
    features = frozenset({"shader-f16", "timestamp-query"})

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the runner called device.{name} for a refused case")


def test_refusals_happen_before_any_buffer_or_dispatch(
    family_project: tuple[Any, Project],
) -> None:
    family, project = family_project
    for kernel, entry in _entries(family, project):
        runner = KernelRunner(_NothingFits(), kernel, entry)  # type: ignore[arg-type]
        for spec in family.specs(entry, "quick", 0):
            refusal = runner.prepare(spec)
            assert isinstance(refusal, Refusal) and refusal.reason, spec
            result = runner.run_case(spec)
            assert result.refused and not result.passed


@needs_adapter
@pytest.mark.gpu
def test_an_f32_kernel_matches_the_f64_reference(family_project: tuple[Any, Project]) -> None:
    family, project = family_project
    f32 = [
        kernel.variant.name
        for kernel, entry in _entries(family, project)
        if {
            b["element_type"]
            for p in entry["passes"]
            for b in p["bindings"]
            if b["role"] == "output"
        }
        == {"f32"}
    ]
    assert f32, f"family {family.name} has no f32-output variant"
    run = validate(project, (f32[-1],), quick=True, storage_overrun=True)
    (report,) = run.variants
    assert report.status == "PASS", report.reason
    assert all(c.verdict and c.verdict.policy.startswith("f32") for c in report.cases)


def test_a_template_missing_its_family_metadata_is_a_config_error(project_copy: Path) -> None:
    """Checked where the metadata is read (loading variants.toml imports no family)."""
    toml = project_copy / "variants.toml"
    text = toml.read_text(encoding="utf-8")
    toml.write_text(text.replace("max_head_dim = 64\nmasked_row", "masked_row", 1), "utf-8")
    line = text.splitlines().index("[templates.attention.params]") + 1
    for command in ("generate", "check"):
        result = run_cli(project_copy, command)
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == (
            f"error: variants.toml:{line}: [templates.attention.params] must define "
            "max_head_dim (host metadata of family 'tiled')"
        )
