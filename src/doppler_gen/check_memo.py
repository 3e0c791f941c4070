"""A memo of the last clean `check`, so an unchanged tree is confirmed without re-rendering.

`check` runs in pre-commit hooks and CI on trees that are almost always clean. The memo is a
sha256 over *everything* the result depends on:
- what variants.toml, templates/ and generated/ are (file, directory, symlink, missing);
- every directory they lead to inside the project, each walked once, with every entry's name,
  kind and content (an orphan or a hand edit changes it); a symlink by the real path it resolves
  to and what lies there (a file wherever it is, a directory only inside the project). The
  renderer reads only files that resolve inside templates/ (``render``), so this covers all it
  can read;
- the content of the code that renders: doppler-gen's own sources and the Jinja and MarkupSafe
  packages that Python imports (their files, not their version strings), and the Python version.

A clean full check is recorded only for the tree it compared: the digest is taken before
anything is read, every question the check asked of the filesystem (``observed``) must get the
same answer from the tree that digest describes (``Snapshot.lookup``, which resolves a path the
way the kernel would, and says "unknown" outside what was walked), and a second digest
afterwards must equal it (``remember_clean``).

When the digest equals the one stored after the last clean full check, and a second digest
taken after the memo was read equals it too (one walk of a tree being edited can mix two
states), the tree is clean by construction. The full check also refuses to run on bytecode
that is not its source (``bytecode``), so what it found clean was found by the code hashed.
Any difference, or a missing or unreadable memo, means a full check. The memo lives in the
project's ``.doppler-gen/`` (``state``); it is safe to lose, and a full filesystem only
means no memo.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doppler_gen import observed
from doppler_gen.bytecode import CODE_PACKAGES
from doppler_gen.config import CONFIG_NAME, GENERATED_DIR, TEMPLATES_DIR
from doppler_gen.state import ensure_state_dir, read_state_file, state_dir, write_state_file

MEMO_NAME = "check-memo"


# what an entry of the tree is, as the snapshot saw it (``Snapshot.entries``)
FILE, DIRECTORY, LINK, SPECIAL, UNREADABLE, MISSING = (
    "file",
    "directory",
    "link",
    "special",
    "unreadable",
    "missing",
)


@dataclass
class Snapshot:
    """One digest of the tree, with the entries and listings it was made from.

    ``entries`` maps the real path of every entry seen to (kind, detail): a file's sha256, a
    link's resolved real path ("" when it resolves nowhere). ``listings`` maps every directory
    walked to its sorted names; the project root is listed only for the three names doppler-gen
    reads there. `lookup` answers, from these alone, what a path led to when the digest was
    taken, so `remember_clean` can hold each answer the check got against it.
    """

    digest: str
    root: str = ""  # the project root as the check names it (``observed.named``)
    real_root: str = ""
    entries: dict[str, tuple[str, str]] = field(default_factory=dict)
    listings: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def lookup(self, path: str, *, follow: bool = True) -> tuple[str, str, str] | None:
        """(kind, real path, detail) of ``path`` (named, not resolved) in this snapshot, the way
        the kernel would resolve it; None when the snapshot never saw that far (outside the
        project, a directory it did not or could not walk, above the root)."""
        parts = self._parts(path)
        if parts is None:
            return None
        current = self.real_root
        while parts:
            part = parts.pop(0)
            if part == "..":
                if current == self.real_root:
                    return None
                current = os.path.dirname(current)
                continue
            here = os.path.join(current, part)
            names = self.listings.get(current)
            if current == self.real_root and part not in _TOP_NAMES:
                names = None  # the root is listed only for the three names
            if names is not None:
                if part not in names:
                    return (MISSING, here, "")
            elif here not in self.entries:  # an entry seen on its own: a link's target
                return None
            kind, detail = self.entries[here]
            if kind == LINK and (follow or parts):
                if not detail:  # dangling
                    return (MISSING, here, "")
                if detail.startswith("!"):  # a loop, or a file used as a directory
                    return (UNREADABLE, here, detail)
                here = detail
                if here not in self.entries:  # outside the project: never read, never known
                    return None
                kind, detail = self.entries[here]
            if not parts:
                return (kind, here, detail)
            if kind != DIRECTORY:  # a file in the middle of a path: ENOTDIR, no read gets on
                return (UNREADABLE, here, f"!{errno.ENOTDIR}") if kind in (FILE, SPECIAL) else None
            current = here
        return (DIRECTORY, current, "")

    def _parts(self, path: str) -> list[str] | None:
        """The components of ``path`` below the root, or None when it is not below it."""
        # the longer first: a root named through a link may be a prefix of its real path
        for prefix in sorted((self.root, self.real_root), key=len, reverse=True):
            if path == prefix:
                return []
            if path.startswith(prefix.rstrip("/") + "/"):
                rest = path[len(prefix.rstrip("/")) + 1 :]
                return [part for part in rest.split("/") if part not in ("", ".")]
        return None

    def answers(self, question: str, path: str, answer: object) -> bool:
        """Whether this snapshot gives ``answer`` to one question the check asked."""
        found = self.lookup(path, follow=question != observed.LINK)
        if found is None:
            return False
        kind, real, detail = found
        if question == observed.READ:
            if answer == observed.ABSENT:  # what the renderer treats as "no such template"
                return kind in (MISSING, DIRECTORY, SPECIAL)
            return kind == FILE and detail == answer
        if question == observed.RESOLVE:
            return kind == MISSING if answer == observed.ABSENT else real == answer
        if question == observed.LINK:
            return (kind == LINK) == answer
        if answer == observed.ABSENT:  # observed.LIST of a missing or non-directory path
            return kind != DIRECTORY
        if kind != DIRECTORY or real == self.real_root or not isinstance(answer, tuple):
            return False
        if self.listings.get(real) != tuple(sorted(name for name, _ in answer)):
            return False
        for name, is_file in answer:
            entry = self.lookup(os.path.join(real, name))
            # a link out of the project leads where the snapshot never looked: no answer,
            # not "not a file" (what lies there may have been a directory then, a file now)
            if entry is None or (entry[0] == FILE) != is_file:
                return False
        return True


_TOP_NAMES = (CONFIG_NAME, TEMPLATES_DIR, GENERATED_DIR)


@dataclass
class _Walk:
    """One digest in the making: every directory reached from the three top-level names,
    walked once each, without recursion (a chain of links is a queue, not a call stack)."""

    snapshot: Snapshot
    queue: list[str] = field(default_factory=list)
    unlistable: dict[str, str] = field(default_factory=dict)

    def describe(self, real: str) -> tuple[str, str]:
        """(kind, detail) of the entry at ``real`` (its parent resolved), never following a
        link and never blocking; each path is read once however many links lead to it."""
        known = self.snapshot.entries.get(real)
        if known is not None:
            return known
        try:
            mode = os.lstat(real).st_mode
            if stat.S_ISLNK(mode):
                entry = (LINK, self._link_target(real))
            elif stat.S_ISDIR(mode):
                entry = (DIRECTORY, "")
            elif not stat.S_ISREG(mode):  # a FIFO, socket or device: reading it could block
                entry = (SPECIAL, "")
            else:
                entry = (FILE, _file_sha(real))
        except FileNotFoundError:
            entry = (MISSING, "")
        except OSError as exc:  # the full check that follows reports it properly
            entry = (UNREADABLE, str(exc.errno))
        self.snapshot.entries[real] = entry
        target = entry[1]
        if entry[0] == LINK and target and not target.startswith("!") and self._inside(target):
            self.describe(target)  # what the link leads to is part of the tree
        if entry[0] == DIRECTORY and self._walkable(real):
            self.queue.append(real)
        return entry

    @staticmethod
    def _link_target(link: str) -> str:
        """Where a link leads, as a read would find it (``observed.real_path``): its real path,
        "" when it dangles, "!errno" when no read could get through (a loop, ENOTDIR)."""
        try:
            return observed.real_path(link)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            return f"!{exc.errno}"

    def _inside(self, real: str) -> bool:
        """Whether ``real`` lies in the project (the root included). What a link leads to
        outside is neither read nor walked: templates must resolve inside templates/,
        generated/ and generated/doppler/ inside the project, and reading a link to
        /proc/self/pagemap or walking one to ``/`` would never end. A check that reads there
        anyway finds `lookup` unable to answer and saves no memo."""
        root = self.snapshot.real_root
        return real == root or real.startswith(root.rstrip("/") + "/")

    def _walkable(self, real: str) -> bool:
        """Directories inside the project are walked; the root is not (only its three names)."""
        return real != self.snapshot.real_root and self._inside(real)

    def run(self) -> None:
        """Describe the three top-level names, then walk every directory they lead to."""
        root = self.snapshot.real_root
        self.snapshot.listings[root] = tuple(
            name for name in _TOP_NAMES if self.describe(os.path.join(root, name))[0] != MISSING
        )
        while self.queue:
            directory = self.queue.pop(0)
            if directory in self.snapshot.listings or directory in self.unlistable:
                continue
            try:
                names = tuple(sorted(os.listdir(directory)))
            except OSError as exc:  # `lookup` then cannot answer below it: no memo
                self.unlistable[directory] = str(exc.errno)
                continue
            self.snapshot.listings[directory] = names
            for name in names:
                self.describe(os.path.join(directory, name))

    def digest(self, sha: Any) -> None:
        """Feed everything seen into ``sha``, sorted, so the digest is the same on every run."""
        for real, (kind, detail) in sorted(self.snapshot.entries.items()):
            sha.update(_line("entry", real, kind, detail))
        for directory, names in sorted(self.snapshot.listings.items()):
            sha.update(_line("listing", directory, *names))
        for directory, error in sorted(self.unlistable.items()):
            sha.update(_line("unlistable", directory, error))


def _line(*fields: str) -> bytes:
    return "\0".join((*fields, "\n")).encode("utf-8", "surrogateescape")


def _file_sha(path: str) -> str:
    """sha256 of a file, read in chunks (a large file is never held whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# a code package walked past this many entries is not one (a link to / or /usr): its digest is
# made unique, so no memo is ever confirmed with it, and the walk stops
_PACKAGE_ENTRIES_MAX = 20_000


def _hash_package(sha: Any, package: str, directory: Path) -> None:
    """Every file of one code package but its ``__pycache__`` (whose entries `bytecode`
    compares with their sources). A ``.pyc`` beside the sources is a module without source,
    which Python imports: it is hashed like a source.

    A subpackage that is a symlink to a directory is imported like any other, so links are
    followed; a directory reached a second time (a link back up the tree) is walked once, in
    name order, so that the path that reaches it first is the same on every run. What is not a
    regular file (a FIFO, a device) is recorded by its kind and never opened. A package that
    cannot be walked whole (imported from a zip file, a directory Python can read from but
    not list) gets a digest of its own every time, so no memo is ever confirmed with it.
    """
    if not directory.is_dir():  # a zip file's inside, say: os.walk would see nothing
        sha.update(_line(package, "not a directory", os.urandom(16).hex()))
        return
    files: list[tuple[str, str]] = []
    problems: list[str] = []  # directories reached again
    unlisted: list[OSError] = []
    walked: set[str] = set()
    too_large = False
    for parent, dirnames, filenames in os.walk(
        directory, followlinks=True, onerror=unlisted.append
    ):
        real = os.path.realpath(parent)
        if real in walked:
            dirnames[:] = []
            problems.append(f"again {os.path.relpath(parent, directory)} {real}")
            continue
        walked.add(real)
        dirnames[:] = sorted(name for name in dirnames if name != "__pycache__")
        for name in filenames:
            path = os.path.join(parent, name)
            files.append((os.path.relpath(path, directory), path))
        too_large = len(files) + len(walked) > _PACKAGE_ENTRIES_MAX
        if too_large:
            break
    if unlisted or too_large:
        sha.update(_line(package, "not walked whole", os.urandom(16).hex()))
        return
    for name, path in sorted(files):
        sha.update(_line(package, name, _source_content(path)))
    for problem in sorted(problems):
        sha.update(_line(package, problem))


def _source_content(path: str) -> str:
    """sha256 of a package file, or what it is instead (never blocking on a FIFO or device)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return "not a regular file"
        return _file_sha(path)
    except OSError as exc:
        return f"unreadable {exc.errno}"


def _package_dir(name: str) -> Path | None:
    """Directory of the package ``name`` that is (or would be) imported; never imports it."""
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin).parent if origin else None


def snapshot(root: Path) -> Snapshot:
    """The digest of every input of generation and every output, with what it was made from.

    variants.toml, templates/ and generated/ are described by what they are (a file, a
    directory, a symlink with where it leads, missing), then every directory they lead to inside
    the project, then the code packages.
    """
    found = Snapshot("", root=observed.named(root), real_root=os.path.realpath(root))
    walk = _Walk(found)
    walk.run()
    # the interpreter's settings that change what Jinja renders: -O strips its asserts, and
    # the limit on int-to-str digits moves its `int` filter to a float path
    settings = f"{sys.flags!r} {sys.get_int_max_str_digits()} {sys.implementation.cache_tag}"
    sha = hashlib.sha256(f"python {sys.version} {settings}\n".encode())
    walk.digest(sha)
    for package in CODE_PACKAGES:
        directory = _package_dir(package)
        if directory is None:
            sha.update(_line(package, "missing"))
        else:
            _hash_package(sha, package, directory)
    found.digest = sha.hexdigest()
    return found


def tree_digest(root: Path) -> str:
    """sha256 over every input of generation and every output, with their relative names."""
    return snapshot(root).digest


def _memo_path(root: Path) -> Path:
    return state_dir(root) / MEMO_NAME


def is_known_clean(root: Path, before: Snapshot) -> bool:
    """True when the tree is the one a full `check` found clean: ``before`` (taken first) has
    the digest the memo holds, and a second digest taken now is the same.

    One walk is not a snapshot: an edit to a file it had already passed and a revert of one
    it had not yet reached can make a tree that was stale throughout hash as the clean one.
    The second walk reads every entry again after both, so it sees the first edit.
    """
    data = read_state_file(_memo_path(root), limit=256)
    if data is None or data.strip() != before.digest.encode():
        return False
    return snapshot(root).digest == before.digest


def remember_clean(root: Path, before: Snapshot, log: observed.ReadLog) -> bool:
    """Record the tree as clean, if what the check compared is exactly the tree ``before``.

    ``before`` was taken before the check read anything, and ``log`` holds what it read. The
    memo is saved only when
    - every file the check read had, at its real path, the bytes ``before`` hashed there (or
      was absent from it, when the check found it absent), and every directory it listed had
      the names ``before`` saw: a file changed while the check ran and changed back (A, B, A)
      differs here though both digests say A;
    - the tree hashed again now equals ``before``: nothing the check did not read changed.
    So the clean result recorded is about the tree the digest describes. Best effort: returns
    whether a memo was saved.
    """
    if not _read_what_was_hashed(before, log) or snapshot(root).digest != before.digest:
        forget(root)
        return False
    try:
        write_state_file(ensure_state_dir(root) / MEMO_NAME, before.digest + "\n")
    except OSError:
        return False
    return True


def _read_what_was_hashed(before: Snapshot, log: observed.ReadLog) -> bool:
    """Whether the tree ``before`` describes answers every question in ``log`` as the check
    got it (a question it cannot answer, about a place it never saw, counts as a no)."""
    if log.inconsistent:
        return False
    return all(
        before.answers(question, path, answer) for (question, path), answer in log.facts.items()
    )


def forget(root: Path) -> None:
    """Delete the memo (after a failed check: a stale tree must never be confirmed)."""
    with contextlib.suppress(OSError):
        _memo_path(root).unlink(missing_ok=True)
