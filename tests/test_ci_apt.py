"""`.ci/apt-backports`: the bookworm-backports source comes from the mirror the machine's apt
sources already use for bookworm, in either format (one-line sources.list, deb822 *.sources)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / ".ci" / "apt-backports"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

DEB822 = f"""\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.lan:3142/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: {KEYRING}

Types: deb
URIs: http://mirror.lan:3142/debian-security
Suites: bookworm-security
Components: main
Signed-By: {KEYRING}
"""

ONE_LINE = """\
# deb http://commented.example/debian bookworm main
deb cdrom:[Debian GNU/Linux 12]/ bookworm main
deb http://proxy.lan/debian-security bookworm-security main
deb [ arch=amd64 signed-by=/etc/apt/keyrings/local.gpg ] http://proxy.lan/debian bookworm main contrib
"""


def derive(apt_dir: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("bash") is None or shutil.which("awk") is None:
        pytest.skip("bash and awk are needed to run .ci/apt-backports")
    return subprocess.run(
        ["bash", str(SCRIPT), str(apt_dir)], capture_output=True, text=True, timeout=30
    )


def apt_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "apt"
    (root / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_deb822_sources(tmp_path: Path) -> None:
    result = derive(apt_tree(tmp_path, {"sources.list.d/debian.sources": DEB822}))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"deb [signed-by={KEYRING}] http://mirror.lan:3142/debian bookworm-backports main\n"
    )


def test_one_line_sources_list(tmp_path: Path) -> None:
    result = derive(apt_tree(tmp_path, {"sources.list": ONE_LINE}))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/local.gpg] http://proxy.lan/debian "
        "bookworm-backports main\n"
    )


def test_disabled_stanzas_other_suites_and_own_output_are_skipped(tmp_path: Path) -> None:
    disabled = "Enabled: no\nTypes: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\n"
    source_only = "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n"
    root = apt_tree(
        tmp_path,
        {
            "sources.list.d/a-disabled.sources": disabled,
            "sources.list.d/b-src.sources": f"{source_only}\n",
            # what .ci/setup wrote on a previous run: never the source of the derivation
            "sources.list.d/bookworm-backports.list": "deb http://old.example/debian bookworm\n",
            "sources.list.d/c-ignored.sources.disabled": "Types: deb\nURIs: http://x/\n",
            "sources.list.d/d-debian.sources": "Types: deb\nURIs: http://right.example/debian\n"
            "Suites: bookworm\nComponents: main\nArchitectures: amd64 arm64\nTrusted: yes\n",
        },
    )
    result = derive(root)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "deb [arch=amd64,arm64 trusted=yes] http://right.example/debian bookworm-backports main\n"
    )


def test_sources_list_comes_before_sources_list_d(tmp_path: Path) -> None:
    root = apt_tree(
        tmp_path,
        {"sources.list": "deb http://first.example/debian bookworm main\n"}
        | {"sources.list.d/debian.sources": DEB822},
    )
    assert derive(root).stdout == "deb http://first.example/debian bookworm-backports main\n"


def test_no_bookworm_source_is_an_error(tmp_path: Path) -> None:
    root = apt_tree(tmp_path, {"sources.list": "deb http://deb.debian.org/debian trixie main\n"})
    result = derive(root)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: no apt source for bookworm in ")


def test_this_machines_apt_sources() -> None:
    """Read-only, on the real /etc/apt: a Debian 12 machine yields its own bookworm mirror."""
    etc = Path("/etc/apt")
    release = Path("/etc/os-release")
    if not release.is_file() or "VERSION_CODENAME=bookworm" not in release.read_text():
        pytest.skip("not a Debian 12 (bookworm) machine")
    result = derive(etc)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("deb ") and line.endswith(" bookworm-backports main"), line
    uri = line.split()[-3]
    texts = [p.read_text(errors="replace") for p in etc.glob("sources.list*") if p.is_file()]
    texts += [
        p.read_text(errors="replace")
        for p in sorted((etc / "sources.list.d").glob("*"))
        if p.suffix in (".list", ".sources") and p.name != "bookworm-backports.list"
    ]
    assert any(uri in text for text in texts), uri  # the machine's own mirror, no other host


def test_sources_as_apt_reads_them_symlinks_enabled_false_and_folded_fields(
    tmp_path: Path,
) -> None:
    """apt reads a symlinked *.sources, skips a stanza with `Enabled: false` (any of apt's
    false words) and folds multi-line fields; .ci/apt-backports skipped the first (no bookworm
    source: setup failed), took the second's mirror and missed the third's suites."""
    disabled = (
        "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\nEnabled: false\n"
    )
    folded = (
        "Types: deb\nURIs:\n http://folded.example/debian\nSuites:\n bookworm\n bookworm-updates\n"
        "Components: main\nArchitectures: amd64\n arm64\n"
    )
    root = apt_tree(tmp_path, {"sources.list.d/a-disabled.sources": disabled})
    (tmp_path / "folded.sources").write_text(folded, encoding="utf-8")
    (root / "sources.list.d" / "b-folded.sources").symlink_to(tmp_path / "folded.sources")
    result = derive(root)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "deb [arch=amd64,arm64] http://folded.example/debian bookworm-backports main\n"
    )


def configured(apt_dir: Path) -> subprocess.CompletedProcess[str]:
    derive(apt_dir)  # skips where bash or awk is missing
    return subprocess.run(
        ["bash", str(SCRIPT), "--configured", str(apt_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_configured_finds_a_backports_entry_the_machine_already_has(tmp_path: Path) -> None:
    """.ci/setup writes no second bookworm-backports entry: one with another signed-by than the
    machine's own makes apt refuse every source ("Conflicting values set for option
    Signed-By")."""
    theirs = DEB822.replace("bookworm bookworm-updates", "bookworm-backports")
    root = apt_tree(
        tmp_path,
        {"sources.list": ONE_LINE, "sources.list.d/backports.sources": theirs},
    )
    result = configured(root)
    assert result.returncode == 0, result.stderr
    assert "http://mirror.lan:3142/debian bookworm-backports main" in result.stdout
    one_line = apt_tree(
        tmp_path / "b",
        {"sources.list": ONE_LINE + "deb http://proxy.lan/debian bookworm-backports main\n"},
    )
    assert configured(one_line).returncode == 0


def test_configured_is_silent_when_only_setup_wrote_one_or_none_is_enabled(
    tmp_path: Path,
) -> None:
    disabled = DEB822.replace("bookworm bookworm-updates", "bookworm-backports").replace(
        "Types: deb\n# http", "Types: deb\nEnabled: no\n# http", 1
    )
    root = apt_tree(
        tmp_path,
        {
            "sources.list": ONE_LINE,
            "sources.list.d/bookworm-backports.list": "deb http://x/debian bookworm-backports main\n",
            "sources.list.d/off.sources": disabled,
        },
    )
    result = configured(root)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", "")
    # the plain form still derives the line from the bookworm entry
    assert derive(root).stdout == (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/local.gpg] http://proxy.lan/debian "
        "bookworm-backports main\n"
    )
