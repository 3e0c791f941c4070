"""`check` never calls a stale tree up to date: one test per way it once could.

1. a symlinked directory under templates/ (the memo did not look inside, Jinja did), a
   symlinked variants.toml or generated file or directory (the memo hashed only the link text),
   and a template found missing in a directory the digest never walked (behind a link out of
   the project, or unlistable); with them, link chains that crashed or slowed the digest;
2. a tree that changed while `check` ran (the memo recorded the digest of a tree it never saw),
   or changed and changed back (a file, a symlink's target, a directory moved away), a tree
   edited in two places while the memo's one walk passed (it hashed as the clean tree), a link
   out of the project whose target turned from a directory into a file, and a failing full
   check that left the old memo in place;
3. code that changed under an unchanged version string (the Jinja bytecode cache, and the memo,
   were keyed on versions), a subpackage behind a symlink, a module without source or a
   package in a zip (not hashed), interpreter settings that change rendering, and bytecode
   that Python ran though its source had changed (same size, same second; or a hash cache
   it was told not to check);
4. templates that run Python, read the environment (the memo cannot see what they read) or
   render another text every time (`random`, `lipsum`).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import assert_one_line_error, edit, run_cli, snapshot

from doppler_gen import check_memo, observed, outputs, render
from doppler_gen import cli as cli_module
from doppler_gen import export as export_module

LIB_FILE = "templates/lib/attention_common.wgsl.j2"
LIB_ANCHOR = "// Causal mask"


def memo_file(root: Path) -> Path:
    return root / ".doppler-gen" / "check-memo"


def assert_confirmed_from_memo(root: Path) -> None:
    result = run_cli(root, "check")
    assert result.exit_code == 0, result.output
    assert "unchanged since the last full check" in result.stdout


def assert_race_not_remembered(root: Path, monkeypatch, code: int = 1) -> None:
    """A check that raced with the change monkeypatched in passes (the tree it compared was
    clean) but leaves no memo; with the race undone, plain and full checks both fail with
    ``code`` (1: stale, 2: an error)."""
    assert run_cli(root, "check").exit_code == 0
    monkeypatch.undo()
    memo_saved = memo_file(root).exists()
    plain, full = run_cli(root, "check"), run_cli(root, "check", "--full")
    codes = (memo_saved, plain.exit_code, full.exit_code)
    assert codes == (False, code, code), (codes, plain.output + full.output)


def assert_not_up_to_date(root: Path, code: int = 1) -> str:
    result = run_cli(root, "check")
    assert result.exit_code == code, result.output + result.stderr
    assert "up to date" not in result.stdout
    return result.stderr


# -- 1. symlinks under templates/ ------------------------------------------------------------------


def test_symlinked_directory_leading_out_of_templates_is_refused(
    fresh_project: Path, tmp_path: Path
) -> None:
    """The issue's repro: templates/lib moved elsewhere and symlinked back."""
    elsewhere = tmp_path / "elsewhere" / "lib"
    elsewhere.parent.mkdir()
    shutil.move(fresh_project / "templates/lib", elsewhere)
    (fresh_project / "templates/lib").symlink_to(elsewhere, target_is_directory=True)
    for step in range(2):  # before and after an edit through the symlink: never "up to date"
        line = assert_one_line_error(assert_not_up_to_date(fresh_project, code=2))
        assert "templates/lib/" in line and "outside templates/ through a symlink" in line, line
        if step == 0:
            edit(elsewhere / "attention_common.wgsl.j2", LIB_ANCHOR, "// causal mask")
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2 and "outside templates/" in result.stderr


def test_symlinked_file_leading_out_of_templates_is_refused(
    fresh_project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "secret.j2"
    outside.write_text("{% macro x() %}{% endmacro %}\n", encoding="utf-8")
    lib = fresh_project / LIB_FILE
    shutil.move(lib, outside)
    lib.symlink_to(outside)
    line = assert_one_line_error(assert_not_up_to_date(fresh_project, code=2))
    assert f"{LIB_FILE}: resolves outside templates/" in line, line


def test_retargeted_symlink_inside_templates_is_seen(fresh_project: Path) -> None:
    """A symlink that stays inside templates/ is fine, and the memo covers where it points."""
    templates = fresh_project / "templates"
    shutil.copytree(templates / "lib", templates / "lib_a")
    shutil.copytree(templates / "lib", templates / "lib_b")
    edit(templates / "lib_b/attention_common.wgsl.j2", LIB_ANCHOR, "// causal mask")
    shutil.rmtree(templates / "lib")
    (templates / "lib").symlink_to("lib_a", target_is_directory=True)
    assert run_cli(fresh_project, "check", "--full").exit_code == 0
    assert_confirmed_from_memo(fresh_project)
    (templates / "lib").unlink()
    (templates / "lib").symlink_to("lib_b", target_is_directory=True)
    stderr = assert_not_up_to_date(fresh_project)
    assert "generated/ is out of date" in stderr


# -- 1b. symlinked inputs and outputs elsewhere in the project ------------------------------------


def test_symlinked_variants_toml_edited_through_the_link_is_seen(fresh_project: Path) -> None:
    """`tune --write` supports a symlinked variants.toml; the memo hashed only the link text."""
    (fresh_project / "variants.toml").rename(fresh_project / "kernels.toml")
    (fresh_project / "variants.toml").symlink_to("kernels.toml")
    assert run_cli(fresh_project, "check", "--full").exit_code == 0
    assert_confirmed_from_memo(fresh_project)
    edit(fresh_project / "kernels.toml", "block_size = 16", "block_size = 32")
    assert "generated/ is out of date" in assert_not_up_to_date(fresh_project)


def test_symlinked_generated_file_edited_through_the_link_is_seen(fresh_project: Path) -> None:
    kernel = fresh_project / "generated" / "attention.wgsl"
    kernel.rename(fresh_project / "attention.wgsl")
    kernel.symlink_to("../attention.wgsl")
    assert run_cli(fresh_project, "check", "--full").exit_code == 0
    assert_confirmed_from_memo(fresh_project)
    edit(fresh_project / "attention.wgsl", "fn main(", "fn main (")
    assert "generated/ is out of date" in assert_not_up_to_date(fresh_project)


def test_symlinked_export_directory_edited_through_the_link_is_seen(fresh_project: Path) -> None:
    export = fresh_project / "generated" / "doppler"
    export.rename(fresh_project / "doppler-export")
    export.symlink_to("../doppler-export", target_is_directory=True)
    assert run_cli(fresh_project, "check", "--full").exit_code == 0
    assert_confirmed_from_memo(fresh_project)
    edit(fresh_project / "doppler-export" / "registry.json", '"size": 80', '"size": 64')
    assert "generated/ is out of date" in assert_not_up_to_date(fresh_project)


def test_generated_directory_swapped_for_a_link_outside_the_project_is_seen(
    fresh_project: Path, tmp_path: Path
) -> None:
    """generated/ replaced by a symlink to an identical copy outside the project: the full check
    refuses it (exit 2), so the memo may not confirm it (it once hashed only the contents)."""
    assert run_cli(fresh_project, "check", "--full").exit_code == 0
    outside = Path(shutil.copytree(fresh_project / "generated", tmp_path / "elsewhere"))
    shutil.rmtree(fresh_project / "generated")
    (fresh_project / "generated").symlink_to(outside, target_is_directory=True)
    line = assert_one_line_error(assert_not_up_to_date(fresh_project, code=2))
    assert "outside the project root" in line, line


def test_template_included_from_a_pycache_directory_is_hashed(fresh_project: Path) -> None:
    """The memo skips __pycache__ of doppler-gen's code, never inside templates/ (it once did)."""
    cache = fresh_project / "templates/__pycache__"
    cache.mkdir()
    (cache / "extra.wgsl.j2").write_text("// extra v1\n", encoding="utf-8")
    edit(
        fresh_project / "templates/attention.wgsl.j2",
        "fn is_masked(",
        '{% include "__pycache__/extra.wgsl.j2" %}fn is_masked(',
    )
    assert run_cli(fresh_project, "generate").exit_code == 0
    assert run_cli(fresh_project, "check").exit_code == 0
    assert_confirmed_from_memo(fresh_project)
    (cache / "extra.wgsl.j2").write_text("// extra v2\n", encoding="utf-8")
    assert "generated/ is out of date" in assert_not_up_to_date(fresh_project)


@pytest.mark.parametrize(
    ("where", "target", "remembered"),
    [("templates", "/", True), ("generated", "/proc/self", False)],
)
def test_links_to_huge_directories_outside_the_project_are_not_walked(
    fresh_project: Path, where: str, target: str, remembered: bool
) -> None:
    """A link to / or /proc inside templates/ or generated/ once made the digest walk the
    whole filesystem (a hang); nothing doppler-gen reads can lie there, so only the link
    text counts. In generated/ the check still asks whether the link leads to a file (an
    orphan): the digest never looked, so no memo is saved
    (`test_a_link_out_of_the_project_that_turned_into_a_file_is_seen`)."""
    link = fresh_project / where / "everything"
    link.symlink_to(target, target_is_directory=True)
    started = time.monotonic()
    assert run_cli(fresh_project, "check").exit_code == 0
    assert memo_file(fresh_project).exists() == remembered
    if remembered:
        assert_confirmed_from_memo(fresh_project)
    assert time.monotonic() - started < 30
    link.unlink()
    link.symlink_to("/usr", target_is_directory=True)  # retargeted: the memo no longer holds
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 0 and "unchanged since" not in result.stdout


def _include_if_present(root: Path, name: str) -> None:
    """rmsnorm's template includes ``name`` when it exists (generated/ stays as it is)."""
    main = root / "templates/rmsnorm.wgsl.j2"
    main.write_text(main.read_text() + f'{{% include ["{name}"] ignore missing %}}\n')
    assert run_cli(root, "generate").exit_code == 0


@pytest.mark.parametrize(
    "statement",
    [
        '{% include "lib/later.j2" ignore missing %}',
        '{% if false %}{% include "lib/later.j2" %}{% endif %}',
    ],
)
def test_a_literal_include_the_render_did_not_need_is_not_an_error(
    fresh_project: Path, statement: str
) -> None:
    """The scan for a template's sources refused a missing literal name that the render had
    skipped (`ignore missing`, a branch not taken); once the file appears, the kernel is
    stale."""
    main = fresh_project / "templates/rmsnorm.wgsl.j2"
    main.write_text(main.read_text() + statement + "\n")
    assert run_cli(fresh_project, "generate").exit_code == 0
    assert run_cli(fresh_project, "check").exit_code == 0
    assert_confirmed_from_memo(fresh_project)
    (fresh_project / "templates/lib/later.j2").write_text("// later\n")
    assert_not_up_to_date(fresh_project)


def test_absence_behind_a_link_outside_the_project_is_not_remembered(
    fresh_project: Path, tmp_path: Path
) -> None:
    """A template looks for ext/extra.j2, where ext links to a directory outside the project
    that the digest does not walk: the check found it missing, but nothing in the digest would
    change when it appears, so the clean result may not be remembered."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (fresh_project / "templates/ext").symlink_to(outside, target_is_directory=True)
    _include_if_present(fresh_project, "ext/extra.j2")
    assert run_cli(fresh_project, "check").exit_code == 0
    assert not memo_file(fresh_project).exists()
    (outside / "extra.j2").write_text("// injected\n")
    line = assert_one_line_error(assert_not_up_to_date(fresh_project, code=2))
    assert "outside templates/ through a symlink" in line, line


def test_absence_in_a_directory_the_digest_could_not_list_is_not_remembered(
    fresh_project: Path, monkeypatch
) -> None:
    """The same for templates/priv, which the digest could not list (root reads anything, so
    the permission error is simulated): its contents are unknown, not empty."""
    priv = fresh_project / "templates/priv"
    priv.mkdir()
    _include_if_present(fresh_project, "priv/extra.j2")
    real_listdir = check_memo.os.listdir

    def refuse_priv(path):
        if Path(path) == priv.resolve():
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(check_memo.os, "listdir", refuse_priv)
    assert run_cli(fresh_project, "check").exit_code == 0
    assert not memo_file(fresh_project).exists()
    (priv / "extra.j2").write_text("// injected\n")
    assert "generated/ is out of date" in assert_not_up_to_date(fresh_project)


def test_a_long_chain_of_directory_links_is_walked_without_recursion(fresh_project: Path) -> None:
    """600 directories, each linking to the next, once overflowed the digest's recursion
    (exit 3); the walk is a queue now, and the tree is still remembered and confirmed."""
    chain = fresh_project / "templates/chain"
    for index in range(600):
        (chain / f"d{index}").mkdir(parents=True)
    for index in range(599):
        (chain / f"d{index}/next").symlink_to(f"../d{index + 1}", target_is_directory=True)
    assert run_cli(fresh_project, "check").exit_code == 0
    assert_confirmed_from_memo(fresh_project)
    (chain / "d599/new.j2").write_text("// reached only through the chain\n")
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 0 and "unchanged since" not in result.stdout


def test_each_file_is_hashed_once_however_many_links_reach_it(
    fresh_project: Path, monkeypatch
) -> None:
    """200 links into a 200-deep nest once rehashed every file below each link target (50 s);
    every directory is now walked once and every file read once."""
    nest = fresh_project / "templates/nest"
    deepest = nest.joinpath(*["a"] * 200)
    deepest.mkdir(parents=True)
    (deepest / "leaf.j2").write_text("// leaf\n")
    links = fresh_project / "templates/links"
    links.mkdir()
    for depth in range(1, 201):
        target = Path("..", "nest", *["a"] * depth)
        (links / f"l{depth}").symlink_to(target, target_is_directory=True)
    reads: list[str] = []
    real_sha = check_memo._file_sha

    def counted(path: str) -> str:
        reads.append(path)
        return real_sha(path)

    monkeypatch.setattr(check_memo, "_file_sha", counted)
    check_memo.snapshot(fresh_project)
    assert len(reads) == len(set(reads))
    assert str(deepest.resolve() / "leaf.j2") in reads


def test_one_long_chain_of_links_is_resolved_in_linear_time(fresh_project: Path) -> None:
    """3,000 links, each to the next, once made the digest quadratic (os.path.realpath
    re-resolves the rest of the chain for every link) and, past Python's recursion limit,
    dependent on the stack depth: the second digest never matched the first and no memo was
    ever saved. Each link now follows at most 40 others, as the kernel does."""
    chain = fresh_project / "templates/chain"
    chain.mkdir()
    (chain / "end").mkdir()
    (chain / "l3000").symlink_to("end", target_is_directory=True)
    for index in range(2999, -1, -1):
        (chain / f"l{index}").symlink_to(f"l{index + 1}", target_is_directory=True)
    started = time.monotonic()
    assert run_cli(fresh_project, "check").exit_code == 0
    assert_confirmed_from_memo(fresh_project)
    assert time.monotonic() - started < 30


def test_a_link_out_of_the_project_is_not_read(fresh_project: Path) -> None:
    """templates/notes.j2 -> /proc/self/pagemap (never included) was read whole by every
    digest: a hang. What a link leads to outside the project is not read; were it read, the
    alarm ends the test instead of the suite."""
    (fresh_project / "templates/notes.j2").symlink_to("/proc/self/pagemap")

    def timeout(signum, frame):
        raise TimeoutError("the digest read /proc/self/pagemap")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(30)
    try:
        assert run_cli(fresh_project, "check").exit_code == 0
        assert_confirmed_from_memo(fresh_project)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _zoo(root: Path, outside: Path) -> list[Path]:
    """Every kind of path a read can meet, under templates/: the paths to ask about."""
    zoo = root / "templates/zoo"
    (zoo / "dir/sub").mkdir(parents=True)
    (zoo / "file.j2").write_text("// file\n")
    (zoo / "dir/sub/deep.j2").write_text("// deep\n")
    os.mkfifo(zoo / "fifo")
    outside.mkdir()
    (outside / "far.j2").write_text("// far\n")
    links = {
        "to_file": "file.j2",
        "to_dir": "dir",
        "to_sub_up": "dir/sub/..",
        "through_file": "file.j2/../file.j2",
        "dangling": "nothing",
        "loop_a": "loop_b",
        "loop_b": "loop_a",
        "out_file": str(outside / "far.j2"),
        "out_dir": str(outside),
        "to_root": "../..",
        "chain0": "chain1",
    }
    for index in range(1, 45):
        links[f"chain{index}"] = f"chain{index + 1}"
    links["chain45"] = "file.j2"
    links["chain39"] = "chain40"  # chain5 is 40 links from file.j2, chain4 one more
    for name, target in links.items():
        (zoo / name).symlink_to(target)
    names = [*links, "file.j2", "dir", "fifo", "missing.j2"]
    paths = [zoo / name for name in names]
    paths += [zoo / "to_dir/sub/deep.j2", zoo / "to_dir/missing", zoo / "file.j2/x"]
    paths += [zoo / "to_sub_up/sub/deep.j2", zoo / "to_root/variants.toml", zoo / "dir/.."]
    paths += [zoo / "chain5", zoo / "chain4", zoo / "out_dir/far.j2", zoo / "fifo/x"]
    return paths


def _other_answers(question: str, answer: object) -> list[object]:
    """Answers a racing check could have got instead of ``answer``."""
    if question == observed.READ:
        return [observed.ABSENT, "0" * 64] if answer != observed.ABSENT else ["0" * 64]
    if question == observed.RESOLVE:
        return ["/elsewhere", observed.ABSENT] if answer != observed.ABSENT else ["/elsewhere"]
    if question == observed.LINK:
        return [not answer]
    if answer == observed.ABSENT:
        return [()]
    assert isinstance(answer, tuple)
    flipped = tuple((name, not is_file) for name, is_file in answer)
    return [observed.ABSENT, (*answer, ("extra", True)), *([flipped] if answer else [])]


def test_the_digest_answers_every_question_as_the_filesystem_does(
    fresh_project: Path, tmp_path: Path
) -> None:
    """For each path in a zoo of links (dangling, looping, 40 and 41 deep, through a file,
    out of the project), files, a FIFO and missing names, the snapshot's answer to each
    question `check` asks is the one the filesystem gives, or "unknown" (no memo): never a
    different one. The memo's soundness rests on exactly this."""
    paths = _zoo(fresh_project, tmp_path / "outside")
    before = check_memo.snapshot(fresh_project)
    known = 0
    for path in paths:
        for question in (observed.READ, observed.RESOLVE, observed.LINK, observed.LIST):
            with observed.recording() as log:
                try:
                    if question == observed.READ:
                        if path.name != "fifo":  # reading a FIFO blocks; `check` stats first
                            observed.read_bytes(path)
                    elif question == observed.RESOLVE:
                        observed.resolve(path)
                    elif question == observed.LINK:
                        observed.is_symlink(path)
                    else:
                        observed.regular_files(path)
                except OSError:
                    pass
            for (asked, named), answer in log.facts.items():
                found = before.lookup(named, follow=asked != observed.LINK)
                if found is None:
                    continue
                known += 1
                # what no read gets through (a loop, a file used as a directory) agrees with
                # nothing ("absent" there is not what the renderer saw), nor does a listing of
                # the root (the digest lists only its three names)
                listed_root = asked == observed.LIST and found[1] == before.real_root
                # a listing holding a link out of the project: whether that is a file is
                # unknown to the digest
                listed_out = asked == observed.LIST and found[1].endswith("/zoo")
                if found[0] != check_memo.UNREADABLE and not (listed_root or listed_out):
                    assert before.answers(asked, named, answer), (asked, path, answer, found)
                for wrong in _other_answers(asked, answer):
                    assert not before.answers(asked, named, wrong), (asked, path, wrong, found)
    assert known > 3 * len(paths)  # most questions were answered, not just "unknown"
    assert before.lookup(observed.named(paths[0].parent / "chain4")) == (
        check_memo.UNREADABLE,
        str(paths[0].parent / "chain4"),
        f"!{errno.ELOOP}",
    )


# -- 2. the memo and concurrent edits --------------------------------------------------------------


def test_tree_swapped_during_check_is_not_remembered(fresh_project: Path, monkeypatch) -> None:
    """check digests stale state A, the tree becomes clean state B before it is compared: A's
    digest must not be saved as clean."""
    lib = fresh_project / LIB_FILE
    clean = lib.read_text(encoding="utf-8")
    stale = clean.replace(LIB_ANCHOR, "// causal mask")
    lib.write_text(stale, encoding="utf-8")  # state A: a template edit without generate
    real_plan = outputs.plan

    def swap_then_plan(*args, **kwargs):
        lib.write_text(clean, encoding="utf-8")  # state B, after check took A's digest
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(outputs, "plan", swap_then_plan)
    swapped = run_cli(fresh_project, "check")
    assert swapped.exit_code == 0  # B is clean: true when it compared
    assert not memo_file(fresh_project).exists()  # but A's digest was not recorded
    monkeypatch.setattr(outputs, "plan", real_plan)
    lib.write_text(stale, encoding="utf-8")
    assert_not_up_to_date(fresh_project)


def test_config_saved_between_the_digest_and_its_read_is_not_remembered(
    fresh_project: Path, monkeypatch
) -> None:
    """variants.toml is parsed clean, then saved stale before the old code took its digest:
    the stale tree was recorded as verified. The digest now comes before the read."""
    assert run_cli(fresh_project, "generate").exit_code == 0
    real_load = cli_module.load_project

    def load_then_save(root: Path):
        project = real_load(root)
        edit(fresh_project / "variants.toml", "block_size = 16", "block_size = 32")
        return project

    monkeypatch.setattr(cli_module, "load_project", load_then_save)
    assert run_cli(fresh_project, "check").exit_code == 0  # it compared the clean config
    monkeypatch.undo()
    assert not memo_file(fresh_project).exists()
    assert "generated/ is out of date" in assert_not_up_to_date(fresh_project)


def test_change_reverted_while_the_check_ran_is_not_remembered(
    fresh_project: Path, monkeypatch
) -> None:
    """A stale tree (A) turns clean (B) while the templates are read, and back to A before the
    second digest: both digests say A, yet the check compared B. Each read is now checked
    against the bytes the first digest hashed."""
    lib = fresh_project / LIB_FILE
    clean = lib.read_text(encoding="utf-8")
    stale = clean.replace(LIB_ANCHOR, "// causal mask")
    lib.write_text(stale, encoding="utf-8")  # A
    real_plan = outputs.plan

    def clean_while_planning(*args, **kwargs):
        lib.write_text(clean, encoding="utf-8")  # B, read by the render
        try:
            return real_plan(*args, **kwargs)
        finally:
            lib.write_text(stale, encoding="utf-8")  # A again, before the second digest

    monkeypatch.setattr(outputs, "plan", clean_while_planning)
    assert run_cli(fresh_project, "check").exit_code == 0  # B is clean: true when it compared
    monkeypatch.undo()
    assert not memo_file(fresh_project).exists()
    assert "generated/ is out of date" in assert_not_up_to_date(fresh_project)


@pytest.mark.parametrize("hidden_as", ["nothing", "a directory"])
def test_orphan_hidden_while_the_check_ran_is_not_remembered(
    fresh_project: Path, monkeypatch, hidden_as: str
) -> None:
    """The same for a directory listing: an orphan absent, or a directory of the same name,
    only while generated/ was listed."""
    orphan = fresh_project / "generated/old_kernel.wgsl"
    data = (fresh_project / "generated/attention.wgsl").read_bytes()
    orphan.write_bytes(data)
    real_leftovers = outputs.leftovers

    def hide_orphan(project):
        orphan.unlink()
        if hidden_as == "a directory":
            orphan.mkdir()
        return real_leftovers(project)

    real_orphans = outputs.orphans

    def restore_after(plan):
        try:
            return real_orphans(plan)
        finally:
            if orphan.is_dir():
                orphan.rmdir()
            orphan.write_bytes(data)

    monkeypatch.setattr(outputs, "leftovers", hide_orphan)
    monkeypatch.setattr(outputs, "orphans", restore_after)
    assert run_cli(fresh_project, "check").exit_code == 0
    monkeypatch.undo()
    assert not memo_file(fresh_project).exists()
    assert "orphaned: generated/old_kernel.wgsl" in run_cli(fresh_project, "check").stdout


def test_generated_directory_gone_while_listed_is_not_remembered(
    fresh_project: Path, monkeypatch
) -> None:
    """generated/ is renamed away after the outputs were read and back after the orphan scan:
    the check found no orphan because it found no directory, and remembers that absence."""
    gen = fresh_project / "generated"
    aside = fresh_project / "generated.aside"
    (gen / "old_kernel.wgsl").write_bytes((gen / "attention.wgsl").read_bytes())
    real_leftovers, real_orphans = outputs.leftovers, outputs.orphans

    def hide(project):
        os.rename(gen, aside)
        return real_leftovers(project)

    def restore(plan):
        try:
            return real_orphans(plan)
        finally:
            os.rename(aside, gen)

    monkeypatch.setattr(outputs, "leftovers", hide)
    monkeypatch.setattr(outputs, "orphans", restore)
    assert_race_not_remembered(fresh_project, monkeypatch)


def test_export_directory_gone_while_listed_is_not_remembered(
    fresh_project: Path, monkeypatch
) -> None:
    """The same for generated/doppler/ and the export orphan it holds."""
    export = fresh_project / "generated/doppler"
    aside = fresh_project / "doppler.aside"
    (export / "old.json").write_text('{"generator": "doppler-gen"}\n')
    real = export_module.orphaned_exports

    def hidden(root, produced):
        os.rename(export, aside)
        try:
            return real(root, produced)
        finally:
            os.rename(aside, export)

    monkeypatch.setattr(outputs, "orphaned_exports", hidden)
    assert_race_not_remembered(fresh_project, monkeypatch)


def test_symlink_retargeted_and_back_while_the_check_ran_is_not_remembered(
    fresh_project: Path, monkeypatch
) -> None:
    """templates/cur.j2 -> a.j2 at the digest; -> b.j2 while the check reads it; -> a.j2 again
    before the second digest. The bytes of b.j2 are what the digest hashed for b.j2, so the
    check also remembers where cur.j2 led, and the digest's link said a.j2."""
    templates = fresh_project / "templates"
    (templates / "a.j2").write_text("// A\n")
    (templates / "b.j2").write_text("// B\n")
    main = templates / "rmsnorm.wgsl.j2"
    main.write_text(main.read_text() + '{% include "cur.j2" %}\n')
    link = templates / "cur.j2"
    link.symlink_to("b.j2")
    assert run_cli(fresh_project, "generate").exit_code == 0  # generated/ renders B
    link.unlink()
    link.symlink_to("a.j2")  # the tree now is stale (A)
    assert run_cli(fresh_project, "check", "--full").exit_code == 1

    real_plan = outputs.plan

    def retarget_while_planning(project, *args, **kwargs):
        link.unlink()
        link.symlink_to("b.j2")
        try:
            return real_plan(project, *args, **kwargs)
        finally:
            link.unlink()
            link.symlink_to("a.j2")

    monkeypatch.setattr(outputs, "plan", retarget_while_planning)
    assert_race_not_remembered(fresh_project, monkeypatch)  # B compared: clean at the time


@pytest.mark.parametrize("route", ["a chain of 46 links", "a file stepped out of with .."])
def test_output_no_read_can_open_is_not_remembered_when_a_copy_stood_in(
    fresh_project: Path, monkeypatch, route: str
) -> None:
    """generated/rmsnorm.wgsl leads, in the digest's tree, where the kernel opens nothing
    (more than 40 links: ELOOP; ``afile/..``: ENOTDIR), though os.path.realpath resolves both
    to a file with the right bytes. A plain copy stands in while the check reads: that read
    may not be taken for the tree's."""
    output = fresh_project / "generated/rmsnorm.wgsl"
    kept = fresh_project / "kept/rmsnorm.wgsl"
    kept.parent.mkdir()
    data = output.read_bytes()
    kept.write_bytes(data)
    chain = fresh_project / "chain"
    chain.mkdir()
    if route == "a chain of 46 links":
        (chain / "l46").symlink_to(kept)
        for index in range(45, -1, -1):
            (chain / f"l{index}").symlink_to(f"l{index + 1}")
        target = chain / "l0"
    else:
        target = Path("../kept/afile/../rmsnorm.wgsl")
        (fresh_project / "kept/afile").write_text("a file, not a directory\n")
    output.unlink()
    output.symlink_to(target)
    assert run_cli(fresh_project, "check", "--full").exit_code == 2  # no read gets through
    real_compare = outputs.compare

    def copy_while_comparing(*args, **kwargs):
        output.unlink()
        output.write_bytes(data)
        try:
            return real_compare(*args, **kwargs)
        finally:
            output.unlink()
            output.symlink_to(target)

    monkeypatch.setattr(outputs, "compare", copy_while_comparing)
    assert_race_not_remembered(fresh_project, monkeypatch, code=2)


@pytest.mark.parametrize("where", ["generated", "generated/doppler"])
def test_a_directory_of_outputs_that_cannot_be_listed_is_one_error_line(
    fresh_project: Path, monkeypatch, where: str
) -> None:
    """generated/ or generated/doppler/ searchable but not listable (mode 111 for a user; root
    reads anything, so the refusal is simulated) once ended `check` in a traceback (exit 3)."""
    refused = fresh_project / where
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self == refused:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    result = run_cli(fresh_project, "check", "--full")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line == f"error: {where}: cannot list: Permission denied", line


def test_a_tree_mixed_by_one_walk_is_not_confirmed_from_the_memo(
    fresh_project: Path, monkeypatch
) -> None:
    """The memo's walk read templates/ before a template was edited and generated/ after a
    hand edit there was reverted: a tree stale throughout hashed as the clean one. The
    snapshot below stands in for that walk; the second walk sees the edit."""
    assert run_cli(fresh_project, "check").exit_code == 0
    clean = check_memo.snapshot(fresh_project)
    edit(fresh_project / LIB_FILE, LIB_ANCHOR, "// causal mask")
    real_snapshot = check_memo.snapshot
    walks = []

    def mixed_then_real(root):
        walks.append(root)
        return clean if len(walks) == 1 else real_snapshot(root)

    monkeypatch.setattr(check_memo, "snapshot", mixed_then_real)
    assert_not_up_to_date(fresh_project)
    assert len(walks) >= 2


def test_a_link_out_of_the_project_that_turned_into_a_file_is_seen(
    fresh_project: Path, tmp_path: Path
) -> None:
    """generated/extra.wgsl -> a directory outside the project: the check found no orphan
    there (a directory is not an output), and the memo, which never looks outside, took that
    for a fact of the tree. Then the directory became a copy of a kernel."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (fresh_project / "generated/extra.wgsl").symlink_to(outside)
    assert run_cli(fresh_project, "check").exit_code == 0
    assert not memo_file(fresh_project).exists()  # what lay outside was never in the digest
    outside.rmdir()
    shutil.copy(fresh_project / "generated/attention.wgsl", outside)
    assert_not_up_to_date(fresh_project)
    assert "orphaned: generated/extra.wgsl" in run_cli(fresh_project, "check").stdout


def test_unchanged_tree_during_check_is_remembered(fresh_project: Path) -> None:
    assert run_cli(fresh_project, "check").exit_code == 0
    assert memo_file(fresh_project).is_file()
    assert_confirmed_from_memo(fresh_project)


def test_failing_full_check_deletes_the_memo(fresh_project: Path, monkeypatch) -> None:
    assert run_cli(fresh_project, "check", "--full").exit_code == 0
    assert memo_file(fresh_project).is_file()
    # the renderer's output changes without any hashed file changing (as an environment
    # variable read by a template once could): the full check fails...
    monkeypatch.setattr(render, "_wgsl_u32", lambda value: f"{value}u + 0u")
    assert run_cli(fresh_project, "check", "--full").exit_code == 1
    assert not memo_file(fresh_project).exists()
    # ...so the next plain check renders again instead of trusting the old memo
    assert run_cli(fresh_project, "check").exit_code == 1


def test_config_error_during_full_check_deletes_the_memo(fresh_project: Path) -> None:
    assert run_cli(fresh_project, "check").exit_code == 0
    edit(fresh_project / "templates/attention.wgsl.j2", "fn is_masked(", "{{ nope }}fn is_masked(")
    assert run_cli(fresh_project, "check").exit_code == 2
    assert not memo_file(fresh_project).exists()


# -- 3. code that changes under the same version ---------------------------------------------------


def test_filter_change_is_seen_though_jinja_folds_it_at_compile_time(
    fresh_project: Path, monkeypatch
) -> None:
    """`{{ 1.44 | wgsl_float }}` is computed when the template compiles; no cache of compiled
    templates may outlive a change of the filter."""
    edit(
        fresh_project / "templates/attention.wgsl.j2",
        "fn is_masked(",
        "const LOG2E: f32 = {{ 1.4426950408889634 | wgsl_float }};\nfn is_masked(",
    )
    assert run_cli(fresh_project, "generate").exit_code == 0
    assert run_cli(fresh_project, "check", "--full").exit_code == 0
    monkeypatch.setattr(render, "_wgsl_float", lambda value: f"{float(value):.3f}")
    result = run_cli(fresh_project, "check", "--full")
    assert result.exit_code == 1, result.output
    assert "+const LOG2E: f32 = 1.443;" in result.stdout
    assert run_cli(fresh_project, "generate").exit_code == 0
    kernel = (fresh_project / "generated/attention.wgsl").read_text(encoding="utf-8")
    assert "const LOG2E: f32 = 1.443;" in kernel


@pytest.mark.parametrize("package", check_memo.CODE_PACKAGES)
def test_memo_is_keyed_on_the_code_not_on_versions(
    fresh_project: Path, tmp_path: Path, monkeypatch, package: str
) -> None:
    """An edit of any file of doppler-gen, Jinja or MarkupSafe, with the same version string,
    changes the digest: the code that runs is hashed, not its package metadata."""
    copy = _package_copy(tmp_path, monkeypatch, package)
    assert (copy / "__init__.py").is_file()
    before = check_memo.tree_digest(fresh_project)
    source = sorted(copy.glob("*.py"))[-1]
    source.write_bytes(source.read_bytes() + b"\n# an edit that keeps the version\n")
    assert check_memo.tree_digest(fresh_project) != before


def _package_copy(tmp_path: Path, monkeypatch, package: str = "doppler_gen") -> Path:
    """A copy of ``package`` that the digest hashes in its place."""
    real = check_memo._package_dir(package)
    assert real is not None
    copy = Path(shutil.copytree(real, tmp_path / "code" / package))
    _hash_package_at(monkeypatch, package, copy)
    return copy


def _hash_package_at(monkeypatch, package: str, directory: Path) -> None:
    """The digest takes ``package`` to be imported from ``directory``."""
    monkeypatch.setattr(
        check_memo,
        "_package_dir",
        lambda name, real_dir=check_memo._package_dir: (
            directory if name == package else real_dir(name)
        ),
    )


def test_a_subpackage_behind_a_symlink_is_hashed(
    fresh_project: Path, tmp_path: Path, monkeypatch
) -> None:
    """src/doppler_gen/families as a link to the real directory: Python imports through it,
    and the digest walked past it."""
    copy = _package_copy(tmp_path, monkeypatch)
    real = copy.parent / "families_real"
    (copy / "families").rename(real)
    (copy / "families").symlink_to(real)
    before = check_memo.tree_digest(fresh_project)
    module = real / "rmsnorm.py"
    module.write_bytes(module.read_bytes() + b"\n# an edit behind the link\n")
    assert check_memo.tree_digest(fresh_project) != before


def test_a_link_back_up_a_package_is_walked_once(
    fresh_project: Path, tmp_path: Path, monkeypatch
) -> None:
    copy = _package_copy(tmp_path, monkeypatch)
    (copy / "families" / "loop").symlink_to(copy)
    first = check_memo.tree_digest(fresh_project)
    assert check_memo.tree_digest(fresh_project) == first  # ends, and the same every time
    module = copy / "render.py"
    module.write_bytes(module.read_bytes() + b"\n# an edit\n")
    assert check_memo.tree_digest(fresh_project) != first


def test_a_compile_time_warning_is_not_taken_for_stale_bytecode(
    tmp_path: Path, monkeypatch
) -> None:
    """Under -W error, compiling a source with an invalid escape raises SyntaxError, which
    read as "no longer compiles": a sound cache was refused."""
    import warnings

    from doppler_gen import bytecode

    _stale_module(tmp_path, monkeypatch, "warning_pkg", "PATTERN = '\\d'\n", edit=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bytecode.running_code_is_on_disk(("warning_pkg",))


def test_a_package_walk_neither_blocks_on_a_fifo_nor_walks_a_huge_tree(
    fresh_project: Path, tmp_path: Path, monkeypatch
) -> None:
    """Following links, the package walk could open a FIFO (a read that never ends) or walk
    all of / through a link. A FIFO is recorded by its kind; a tree too large for a package
    gets a digest of its own every time, so no memo is confirmed with it."""
    copy = _package_copy(tmp_path, monkeypatch)
    os.mkfifo(copy / "families" / "pipe.py")
    first = check_memo.tree_digest(fresh_project)
    assert check_memo.tree_digest(fresh_project) == first
    monkeypatch.setattr(check_memo, "_PACKAGE_ENTRIES_MAX", 10)
    assert check_memo.tree_digest(fresh_project) != check_memo.tree_digest(fresh_project)


def test_a_module_without_source_beside_the_sources_is_hashed(
    fresh_project: Path, tmp_path: Path, monkeypatch
) -> None:
    """``render.pyc`` with no ``render.py`` (``compileall -b``) is what Python imports; the
    walk skipped every ``.pyc``."""
    copy = _package_copy(tmp_path, monkeypatch)
    sourceless = copy / "legacy.pyc"
    sourceless.write_bytes(b"one build")
    before = check_memo.tree_digest(fresh_project)
    sourceless.write_bytes(b"another build")
    assert check_memo.tree_digest(fresh_project) != before


def test_a_package_imported_from_a_zip_never_confirms_a_memo(
    fresh_project: Path, tmp_path: Path, monkeypatch
) -> None:
    """A zip file's inside cannot be walked: its digest once stayed the same whatever the zip
    held."""
    (tmp_path / "code.zip").write_bytes(b"PK")
    _hash_package_at(monkeypatch, "doppler_gen", tmp_path / "code.zip" / "doppler_gen")
    assert check_memo.tree_digest(fresh_project) != check_memo.tree_digest(fresh_project)


def test_the_interpreter_settings_that_change_rendering_are_in_the_digest(
    fresh_project: Path,
) -> None:
    """Jinja's `int` filter falls back to a float past the int-to-str digit limit, and -O
    strips its asserts: both change what renders without any hashed file changing."""
    import sys

    before = check_memo.tree_digest(fresh_project)
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0 if limit else 4300)
    try:
        assert check_memo.tree_digest(fresh_project) != before
    finally:
        sys.set_int_max_str_digits(limit)
    assert check_memo.tree_digest(fresh_project) == before


@pytest.mark.parametrize(
    ("call", "why"),
    [
        ("{{ [0, 1] | random }}", "random"),
        ("{{ lipsum(1, false, 5, 6) }}", "lipsum"),
        # the order of a set follows the hash seed: another under every PYTHONHASHSEED (one
        # that sorts is rendered sorted: test_a_set_difference_renders_sorted_under_any_seed)
        ('{% for k in {"a": 1, 2: 3}.keys() - [] %}{{ k }} {% endfor %}', "set difference"),
        ("{{ fail }}", "memory address"),  # a function's repr: another address every run
        ("{{ joiner() }}", "memory address"),
        ("{{ 'x' ~ cycler(1) }}", "memory address"),
    ],
)
def test_templates_cannot_render_another_text_every_time(
    fresh_project: Path, call: str, why: str
) -> None:
    """`random` and `lipsum` made a file differ from one render to the next, and a check that
    matched by luck was remembered as clean; so did a set's order and an object's address."""
    edit(
        fresh_project / "templates/rmsnorm.wgsl.j2",
        "// RMSNorm Kernel (",
        f"// {call}\n// RMSNorm Kernel (",
    )
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert why in line, line
    assert line.startswith("error: templates/rmsnorm.wgsl.j2:"), line
    assert not memo_file(fresh_project).exists()


@pytest.mark.parametrize(
    ("call", "code"),
    [
        ('{{ "\\r" }}', "U+000D"),  # a line break to WGSL, none to the file's line count
        ('{{ "\\x0b" }}', "U+000B"),
        ('{{ "\\u2028" }}', "U+2028"),
        ('{{ "\\ufeff" }}', "U+FEFF"),  # not blankspace in WGSL: the kernel fails to compile
        ('{{ "\\x1b" }}[2J', "U+001B"),  # an escape sequence for whoever prints the file
    ],
)
def test_templates_cannot_write_control_characters(
    fresh_project: Path, call: str, code: str
) -> None:
    """They were written as they came, breaking the file's LF-only line ends."""
    before = snapshot(fresh_project / "generated")
    edit(
        fresh_project / "templates/rmsnorm.wgsl.j2",
        "// RMSNorm Kernel (",
        f"// {call}\n// RMSNorm Kernel (",
    )
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert f"holds {code}" in line and "(variant rmsnorm" in line, line
        assert line.startswith("error: templates/rmsnorm.wgsl.j2:"), line
    assert snapshot(fresh_project / "generated") == before


def test_a_template_with_a_byte_order_mark_is_refused(fresh_project: Path) -> None:
    """`generate` wrote the BOM into the kernel (line 5, after the header) and `check` said up
    to date; the kernel did not compile."""
    path = fresh_project / "templates/rmsnorm.wgsl.j2"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert line.startswith("error: templates/rmsnorm.wgsl.j2:1: starts with a UTF-8 byte-order")
    assert not memo_file(fresh_project).exists()


def test_a_set_difference_renders_sorted_under_any_seed(fresh_project: Path) -> None:
    """`keys() - [...]` iterated in the hash seed's order: `check` then failed under another
    PYTHONHASHSEED, after a memo had recorded the tree clean under the first."""
    import subprocess

    from conftest import doppler_gen_command

    edit(
        fresh_project / "templates/rmsnorm.wgsl.j2",
        "// RMSNorm Kernel (",
        "// {% for k in {'alpha': 1, 'beta': 2, 'gamma': 3, 'delta': 4, 'eps': 5}.keys() - ['x'] %}"
        "{{ k }} {% endfor %}\n// RMSNorm Kernel (",
    )
    outputs = []
    for seed in ("1", "2", "3"):
        environment = {**os.environ, "PYTHONHASHSEED": seed}
        command = [*doppler_gen_command(), "--root", str(fresh_project), "show", "rmsnorm"]
        shown = subprocess.run(command, capture_output=True, text=True, env=environment)
        assert shown.returncode == 0, shown.stderr
        outputs.append(shown.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    assert "alpha beta delta eps gamma" in outputs[0]


def test_template_forms_that_name_templates_by_literals_still_render(fresh_project: Path) -> None:
    """The refusal of templates named by expressions must not refuse literal names with more
    whitespace, a tag over several lines, a reference inside {% raw %}, nor WGSL text from a
    macro that says "at 0x..."."""
    main = fresh_project / "templates/attention.wgsl.j2"
    edit(main, '{% import "lib/attention_common', '{% import  "lib/attention_common')
    edit(
        main,
        "fn is_masked(",
        '{% from\n    "lib/attention_common.wgsl.j2" import gqa_head_map as spare %}\n'
        "// {% raw %}{% include some_name %}{% endraw %} (raw text)\nfn is_masked(",
    )
    edit(  # printed through {{ common.gqa_head_map() }}: a macro's output is a printed value
        fresh_project / LIB_FILE,
        "{% macro gqa_head_map() %}\n",
        "{% macro gqa_head_map() %}\n// f16 NaN is the bit pattern at 0x7e00 (not an address)\n",
    )
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.output
    assert "at 0x7e00" in (fresh_project / "generated/attention.wgsl").read_text()
    assert run_cli(fresh_project, "check", "--full").exit_code == 0


def test_crlf_templates_render_the_same_bytes(fresh_project: Path) -> None:
    """A checkout with CRLF line ends (core.autocrlf) rendered the same kernels, but hashed the
    raw template text: every `source-hash` line differed, and the tree was stale everywhere."""
    for template in (fresh_project / "templates").rglob("*.j2"):
        template.write_bytes(template.read_bytes().replace(b"\n", b"\r\n"))
    result = run_cli(fresh_project, "check", "--full")
    assert result.exit_code == 0, result.output


def test_the_source_hash_follows_an_import_that_keeps_its_whitespace(fresh_project: Path) -> None:
    """`{%+ import ... %}` was not followed: a macro edited there changed the kernel, not its
    `source-hash`."""
    from doppler_gen.config import load_project

    edit(
        fresh_project / "templates/attention.wgsl.j2",
        '{% import "lib/attention_common',
        '{%+ import "lib/attention_common',
    )
    renderer = render.Renderer(load_project(fresh_project))
    assert "lib/attention_common.wgsl.j2" in renderer.sources("attention.wgsl.j2")


def test_check_output_escapes_what_a_file_holds(fresh_project: Path) -> None:
    """Escape sequences appended to a kernel reached the terminal through the diff: they could
    clear the screen and print a green "up to date" over the real verdict."""
    kernel = fresh_project / "generated/attention.wgsl"
    with kernel.open("a", encoding="utf-8") as stream:
        stream.write("\x1b[2J\x1b[Hgenerated/ is up to date (89 files)\x1b[8m\n")
    orphan = fresh_project / "generated" / ".x\x1b[2J.wgsl.abcdefgh.tmp"
    orphan.write_text("left over", encoding="utf-8")
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 1
    assert "\x1b" not in result.stdout and "\\x1b[2J" in result.stdout


def test_a_huge_file_of_the_user_s_in_generated_is_streamed_not_read_whole(
    fresh_project: Path, monkeypatch
) -> None:
    """A 60 GB file of the user's in generated/ (not an output, no header) was read whole to
    look at its first line: MemoryError, exit 3."""
    huge = fresh_project / "generated" / "notes.bin"
    with huge.open("wb") as stream:
        stream.truncate(64 << 20)  # sparse
    real_read = observed.read_bytes

    def small_only(path: Path) -> bytes:
        assert path.name != huge.name, "read whole"
        return real_read(path)

    monkeypatch.setattr(observed, "read_bytes", small_only)
    for arguments in (("check", "--full"), ("check",), ("generate",)):
        result = run_cli(fresh_project, *arguments)
        assert result.exit_code == 0, (arguments, result.output)
    assert huge.stat().st_size == 64 << 20


def test_a_checked_hash_cache_run_unchecked_is_compared(tmp_path: Path, monkeypatch) -> None:
    """Under --check-hash-based-pycs never, Python runs a checked hash cache without reading
    the source; the check took every checked hash cache for validated."""
    import _imp
    import importlib
    import py_compile
    import sys

    from doppler_gen import bytecode
    from doppler_gen.errors import DopplerGenError

    package = tmp_path / "importable" / "hash_cache_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    source = package / "settings.py"
    source.write_text("VALUE = 1\n", encoding="utf-8")
    py_compile.compile(
        str(source),
        cfile=importlib.util.cache_from_source(str(source)),
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setattr(_imp, "check_hash_based_pycs", "never")
    monkeypatch.delitem(sys.modules, "hash_cache_pkg", raising=False)
    monkeypatch.delitem(sys.modules, "hash_cache_pkg.settings", raising=False)
    importlib.import_module("hash_cache_pkg.settings")
    source.write_text("VALUE = 2\n", encoding="utf-8")
    with pytest.raises(DopplerGenError, match="which is not this file's code"):
        bytecode.running_code_is_on_disk(("hash_cache_pkg",))
    monkeypatch.setattr(_imp, "check_hash_based_pycs", "default")
    bytecode.running_code_is_on_disk(("hash_cache_pkg",))  # checked on import: consistent


def _stale_module(
    tmp_path: Path, monkeypatch, name: str, text: str = "VALUE = 1\n", *, edit: bool = True
) -> Path:
    """Package ``name`` whose module ``text`` Python runs from its cache: compiled and
    imported, then (``edit``) changed at the same size with its time put back (as `touch -r`
    does), so that the cache holds other code than the source."""
    import importlib
    import py_compile
    import sys
    import warnings

    package = tmp_path / "importable" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    source = package / "settings.py"
    source.write_text(text, encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delitem(sys.modules, f"{name}.settings", raising=False)
    importlib.import_module(f"{name}.settings")
    if not edit:
        return source
    assert sys.modules[f"{name}.settings"].VALUE == 1
    times = source.stat()
    source.write_text("VALUE = 2\n", encoding="utf-8")
    os.utime(source, ns=(times.st_atime_ns, times.st_mtime_ns))
    return source


def test_bytecode_of_other_code_than_its_source_is_refused(tmp_path: Path, monkeypatch) -> None:
    from doppler_gen import bytecode
    from doppler_gen.errors import DopplerGenError

    source = _stale_module(tmp_path, monkeypatch, "stale_code_pkg")
    with pytest.raises(DopplerGenError) as error:
        bytecode.running_code_is_on_disk(("stale_code_pkg",))
    assert error.value.location == str(source)
    assert "delete that cache" in str(error.value)
    bytecode.running_code_is_on_disk(("doppler_gen",))  # the real package runs its sources


def test_bytecode_python_did_not_accept_is_not_held_against_it(tmp_path: Path, monkeypatch) -> None:
    """A source whose size or time no longer matches its cache was compiled afresh on
    import (the stale cache stays when bytecode is not written): nothing to refuse."""
    from doppler_gen import bytecode

    source = _stale_module(tmp_path, monkeypatch, "recompiled_pkg")
    source.write_text("VALUE = 22\n", encoding="utf-8")  # another size
    bytecode.running_code_is_on_disk(("recompiled_pkg",))


def test_check_and_generate_refuse_to_run_on_bytecode_of_other_code(
    fresh_project: Path, tmp_path: Path, monkeypatch
) -> None:
    """The first check on such bytecode found the tree clean by the old code, and the memo
    kept that verdict under the new sources' digest."""
    _stale_module(tmp_path, monkeypatch, "stale_render_pkg")
    monkeypatch.setattr(outputs, "EDITED_PACKAGES", ("doppler_gen", "stale_render_pkg"))
    for command in ("check", "generate"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, result.output
        assert "settings.py: Python ran" in assert_one_line_error(result.stderr)
    assert not memo_file(fresh_project).exists()


def test_show_refuses_to_print_what_bytecode_of_other_code_renders(
    fresh_project: Path, tmp_path: Path, monkeypatch
) -> None:
    from doppler_gen import bytecode

    _stale_module(tmp_path, monkeypatch, "stale_show_pkg")
    monkeypatch.setattr(bytecode, "EDITED_PACKAGES", ("doppler_gen", "stale_show_pkg"))
    result = run_cli(fresh_project, "show", "rmsnorm")
    assert result.exit_code == 2, result.output
    assert "settings.py: Python ran" in assert_one_line_error(result.stderr)
    assert result.stdout == ""


def test_memo_lives_in_the_project(fresh_project: Path, tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    assert run_cli(fresh_project, "check").exit_code == 0
    assert memo_file(fresh_project).is_file()
    assert (fresh_project / ".doppler-gen/.gitignore").read_text().splitlines()[-1] == "*"
    assert not home.exists()  # nothing written outside the project


# -- 4. templates are sandboxed --------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        '{{ cycler.__init__.__globals__.os.popen("touch PWNED").read() }}',
        '{{ fail.__globals__["os"].system("touch PWNED") }}',
        '{{ "".__class__.__mro__[1].__subclasses__() }}',
        "{{ self._TemplateReference__context.environment }}",
        '{{ range.__self__.__import__("os").environ["HOME"] }}',
        '{{ QUANT_BITS.update({"int4": 2}) }}',  # no state shared between variants
    ],
)
def test_templates_cannot_reach_python(fresh_project: Path, monkeypatch, expression: str) -> None:
    monkeypatch.chdir(fresh_project)
    template = fresh_project / "templates/attention.wgsl.j2"
    edit(template, "fn is_masked(", f"// {expression}\nfn is_masked(")
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert line.startswith("error: templates/attention.wgsl.j2:"), line
    assert not (fresh_project / "PWNED").exists()


@pytest.mark.parametrize("name", ["../variants.toml", "/etc/passwd", "lib/../../variants.toml"])
def test_templates_cannot_include_files_outside_templates(fresh_project: Path, name: str) -> None:
    edit(
        fresh_project / "templates/attention.wgsl.j2",
        "fn is_masked(",
        f'{{% include "{name}" %}}\nfn is_masked(',
    )
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert "not found in templates/" in line, line
