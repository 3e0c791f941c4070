"""The decode kernels' merge of their key groups' softmax states (`merge_scan`).

"four" scans workgroup memory in four independent chains (guards for a count that is not a
multiple of four) and, in the split partials, sums each head's rescaled row sums by rows and
publishes the head's max once; "serial" is the one-load-at-a-time form the long-context split
variant keeps. The shipped workgroups give counts that are multiples of four (64 key groups,
16 streams), where the guards never act, so these tests run the kernels with WORKGROUP_SIZE
overrides that give 5 key groups or 5 streams a head, and plant bugs that must fail there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT, edit, render_variant, subgroup_device
from gpu_support import adapter_problem

from doppler_gen.backends import Device
from doppler_gen.render import TemplateError
from doppler_gen.runtime.verify import validate_variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

# 80 invocations of 8-lane key groups in 2 slots: 5 streams a head, merged in 3 rounds of 2
SPLIT = (
    "attention_decode_split_d128_f16",
    {"WORKGROUP_SIZE": 80, "KV_SPLITS": 8, "MIN_SPLIT_KEYS": 1},
)
# 40 invocations of 8-lane key groups: 5 key groups
ONE_DISPATCH = ("attention_decode_sg_d64_f16", {"WORKGROUP_SIZE": 40})
# the key-group width these counts assume, whatever width the variant ships
LANES = {SPLIT[0]: {"lanes_per_key": 8}}


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    yield from subgroup_device(name for name, _ in (SPLIT, ONE_DISPATCH))


def _quick(device: Device, root: Path, name: str, constants: dict, scan: str) -> str:
    kernel, entry = render_variant(root, name, {"merge_scan": scan, **LANES.get(name, {})})
    report = validate_variant(device, kernel, entry, quick=True, seed=0, constants=constants)
    return report.status


def test_merge_scan_renders_four_chains_or_one_load_at_a_time() -> None:
    four, _ = render_variant(REPO_ROOT, SPLIT[0], {"merge_scan": "four"})
    serial, _ = render_variant(REPO_ROOT, SPLIT[0], {"merge_scan": "serial"})
    partials = four.passes[0].text
    assert "s < streams; s = s + 4u" in partials
    assert "s + 3u < streams" in partials
    assert "merge_head_m[h]" in partials and "merge_l[h * rows_per_head + row]" in partials
    assert "s = s + 4u" not in serial.passes[0].text
    assert "merge_head_m" not in serial.passes[0].text
    one, _ = render_variant(REPO_ROOT, ONE_DISPATCH[0], {"merge_scan": "four"})
    assert "s < nkg; s = s + 4u" in one.text and "l_all_3" in one.text


def test_merge_scan_outside_four_and_serial_is_refused_at_render() -> None:
    with pytest.raises(TemplateError, match="merge_scan must be"):
        render_variant(REPO_ROOT, SPLIT[0], {"merge_scan": "eight"})


def test_the_long_context_split_variant_keeps_the_serial_merge() -> None:
    # on the H200 the four-chain merge made its key loop 37-49 % slower (README)
    kernel, _ = render_variant(REPO_ROOT, "attention_decode_split_long_d128_f16")
    assert "merge_head_m" not in kernel.passes[0].text


@pytest.mark.parametrize("scan", ["four", "serial"])
@pytest.mark.parametrize(
    ("name", "constants"), [SPLIT, ONE_DISPATCH], ids=["split", "one-dispatch"]
)
def test_both_merges_pass_with_counts_that_are_not_multiples_of_four(
    device: Device, name: str, constants: dict, scan: str
) -> None:
    assert _quick(device, REPO_ROOT, name, constants, scan) == "PASS"


LIB = "lib/attention_decode.wgsl.j2"
PARTIALS = "attention_decode_split_partials.wgsl.j2"
MERGE_BUGS = [
    # the four-chain guards one too wide: the last key group's sum counted twice
    (LIB, '"select(%s, %s, s + %du < %s)"', '"select(%s, %s, s + %du <= %s)"', ONE_DISPATCH),
    # a head's row sums never restarted: the previous chunk's or query's add in
    (PARTIALS, "select(merge_l[head_row{{ hs[h] }}], 0.0, r == 0u)",
     "merge_l[head_row{{ hs[h] }}]", SPLIT),
    # the head's max published from one stream's own max instead of the head's
    (PARTIALS, "= m_head{{ hs[h] }};\n{% endfor %}\n            }",
     "= m{{ hs[h] }};\n{% endfor %}\n            }", SPLIT),
]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "old", "new", "target"),
    MERGE_BUGS,
    ids=["guard-one-too-wide", "row-sums-not-restarted", "stream-max-published"],
)
def test_merge_planted_bugs_fail(
    device: Device, project_copy: Path, template: str, old: str, new: str, target: tuple
) -> None:
    edit(project_copy / "templates" / template, old, new)
    name, constants = target
    assert _quick(device, project_copy, name, constants, "four") == "FAIL"
