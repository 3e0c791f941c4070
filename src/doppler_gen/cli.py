"""The `doppler-gen` command line.

Exit codes: 0 ok; 1 a check or validation failed; 2 usage, config, template or environment
error; 3 an internal error (a bug in doppler-gen); 130 interrupted (Ctrl-C); 143 SIGTERM while
worker processes ran (they are stopped first). Every error prints one line
(``error: location: message``) and no traceback; ``--debug`` adds the traceback of an internal
error. With ``--json`` an error is also a JSON object on stdout. Heavy modules (numpy, wgpu)
are imported inside the commands that need them, so `check` and `generate` stay fast enough
for a pre-commit hook.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import stat
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from doppler_gen import __version__
from doppler_gen.config import Project, find_root, load_project
from doppler_gen.errors import DopplerGenError, Terminated, file_kind, printable

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
EXIT_INTERNAL = 3  # an unexpected exception: a bug, distinct from 1 (stale / failed)
ROOT_KEY = "doppler_gen.root"  # ctx.meta key of a subcommand's --root (shell completion reads it)


def error_document(kind: str, message: str, location: str | None, exit_code: int) -> str:
    """The JSON error object ``--json`` commands print on stdout instead of their report."""
    error = {"type": kind, "message": message, "location": location, "exit_code": exit_code}
    return json.dumps({"ok": False, "error": error}, indent=2, sort_keys=True)


def _fail(error: DopplerGenError, as_json: bool = False) -> None:
    if as_json:
        click.echo(
            error_document(type(error).__name__, error.message, error.location, error.exit_code)
        )
    click.echo(f"error: {error}", err=True)
    sys.exit(error.exit_code)


def _internal_error(error: Exception, as_json: bool) -> None:
    """One line (the traceback too with --debug) and exit 3: CI must tell a crash from a stale
    tree, and a bug must not look like the user's fault."""
    first = (str(error).strip().splitlines() or [""])[0]
    message = f"{type(error).__name__}: {printable(first)}" if first else type(error).__name__
    culprit = "doppler-gen"
    location = _family_code_at(error)
    if location is not None:  # a family module raised it: name the module and line
        culprit = f"family code, {printable(location)}"
    if as_json:
        click.echo(error_document("InternalError", message, location, EXIT_INTERNAL))
    state = _current_state()
    debug = state.debug if state is not None else "--debug" in sys.argv[1:]
    if debug:
        traceback.print_exc(file=sys.stderr)
        hint = ""
    else:
        hint = "; rerun with --debug for the traceback"
    click.echo(f"error: internal error (a bug in {culprit}): {message}{hint}", err=True)
    sys.exit(EXIT_INTERNAL)


def _family_code_at(error: BaseException) -> str | None:
    """Where family code raised ``error`` (``families.family_code_at``); None when that cannot
    be told (finding it must never hide the error itself)."""
    try:
        from doppler_gen.families import family_code_at

        return family_code_at(error)
    except Exception:
        return None


def _quiet_broken_pipe() -> None:
    """The reader closed stdout (``show | head``): stop quietly with 0, as Unix tools do."""
    _stdout_to_devnull()
    sys.exit(0)


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail again
    (and print a second error)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test runner)
        pass


def _current_state() -> State | None:
    context = click.get_current_context(silent=True)
    return context.find_object(State) if context is not None else None


def handle_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn DopplerGenError into one line on stderr and its exit code, anything unexpected
    into exit 3, and a closed stdout pipe into a quiet exit 0."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return command(*args, **kwargs)
        except DopplerGenError as error:
            _fail(error, as_json)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except KeyboardInterrupt as stop:  # Terminated (SIGTERM) included
            said, code = (
                ("terminated", Terminated.exit_code)
                if isinstance(stop, Terminated)
                else ("interrupted", 130)
            )
            if as_json:  # stdout is never empty under --json
                _quietly(lambda: click.echo(error_document("Interrupted", said, None, code)))
            click.echo(said, err=True)
            sys.exit(code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own control flow (usage errors, ctx.exit)
        except OSError as error:
            if not _stdout_failed(error):
                _internal_error(error, as_json)
            reason = error.strerror or str(error)
            _stdout_to_devnull()
            click.echo(f"error: cannot write to standard output: {reason}", err=True)
            sys.exit(2)
        except Exception as error:
            _internal_error(error, as_json)

    return wrapper


def _quietly(write: Callable[[], Any]) -> None:
    """A write to stdout that may fail (a closed pipe) without adding a second error."""
    with contextlib.suppress(OSError):
        write()


def _stdout_failed(error: OSError) -> bool:
    """Whether ``error`` is standard output refusing its bytes (a full disk, /dev/full, an I/O
    error): an environment error to report in one line, not a bug. Told by where it was
    raised: writing or flushing (click's ``echo``) a stream on stdout's file descriptor."""
    if isinstance(error, BrokenPipeError) or sys.stdout is None:
        return False
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    stream = trace.tb_frame.f_locals.get("file") if trace is not None else None
    try:
        return stream is not None and stream.fileno() == sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test runner)
        return False


def _refuse_closed_stdout() -> None:
    """A command run with stdout closed (``>&-``) printed nothing and exited 0: Python sets
    ``sys.stdout`` to None and click drops what it is given."""
    if sys.stdout is None:
        if sys.stderr is not None:
            sys.stderr.write("error: standard output is closed; nothing could be printed\n")
        sys.exit(2)


class State:
    """Lazily loaded project shared by the subcommands."""

    def __init__(self, root: Path | None = None, debug: bool = False) -> None:
        self._root = root
        self.debug = debug
        self._project: Project | None = None

    @property
    def root(self) -> Path:
        return self._root if self._root is not None else find_root(Path.cwd())

    @property
    def project(self) -> Project:
        if self._project is None:
            self._project = load_project(self.root)
        return self._project


pass_state = click.make_pass_decorator(State)

ROOT_HELP = "Project directory (holding variants.toml). Default: found from the current directory."
DEBUG_HELP = "Show the Python traceback of an internal error (exit 3)."


def _set_root(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.meta[ROOT_KEY] = value
        ctx.ensure_object(State)._root = value


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(State).debug = True


def common_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--root and --debug on a subcommand too (``doppler-gen check --root kernels``), so that a
    pre-commit hook's ``args`` can pass them; the one given after the subcommand wins."""
    command = click.option(
        "--debug", is_flag=True, expose_value=False, callback=_set_debug, help=DEBUG_HELP
    )(command)
    return click.option(
        "--root",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        expose_value=False,
        callback=_set_root,
        help=ROOT_HELP,
    )(command)


class OneLineUsageError(click.UsageError):
    """A click usage error shown as one ``error:`` line, like every other error (click's own
    form is four lines: usage, a hint, a blank line and the message)."""

    def show(self, file: Any = None) -> None:
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"error: {printable(self.format_message())}{hint}", file=file, err=True)


class DopplerGenGroup(click.Group):
    """Usage errors as one line, plus a JSON error object on stdout for those of a ``--json``
    command; a malformed shell-completion request is one line too."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["doppler_gen.args"] = list(args)  # the words given, before click consumes them
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            raise _one_line(ctx, error) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as error:
            raise _one_line(ctx, error) from None

    def _main_shell_completion(
        self, ctx_args: Any, prog_name: str, complete_var: str | None = None
    ) -> None:
        try:
            super()._main_shell_completion(ctx_args, prog_name, complete_var)
        except ValueError as error:  # COMP_CWORD that is not a number, set by hand
            click.echo(f"error: shell completion: {printable(str(error))}", err=True)
            sys.exit(2)


def _one_line(ctx: click.Context, error: click.UsageError) -> click.UsageError:
    """``error`` as a OneLineUsageError (help shown for a missing command stays help); with
    ``--json`` among the words, the JSON error object goes to stdout first."""
    if isinstance(error, click.exceptions.NoArgsIsHelpError | OneLineUsageError):
        return error
    message = error.format_message()
    if "--json" in ctx.meta.get("doppler_gen.args", ()):
        click.echo(error_document("UsageError", message, None, error.exit_code))
    return OneLineUsageError(message, error.ctx or ctx)


def complete_variants(
    ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Variant names of the project, for shell completion (nothing if it cannot be loaded)."""
    from click.shell_completion import CompletionItem

    root = ctx.meta.get(ROOT_KEY) or ctx.find_root().params.get("root")
    try:
        project = load_project(Path(root) if root else find_root(Path.cwd()))
    except Exception:  # a broken project must not break the user's shell: offer nothing
        return []
    return [
        CompletionItem(v.name, help=v.description or None)
        for v in project.variants
        if v.name.startswith(incomplete)
    ]


@click.group(cls=DopplerGenGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="doppler-gen")
@click.option(
    "--root", type=click.Path(file_okay=False, path_type=Path), default=None, help=ROOT_HELP
)
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
@click.pass_context
def cli(ctx: click.Context, root: Path | None, debug: bool) -> None:
    """Generate, check and validate Doppler's WGSL kernels.

    Templates under templates/ expand into every variant declared in variants.toml; the results
    live in generated/ together with generated/manifest.json (bindings, uniform layout, overrides
    and host metadata of every variant).

    Exit codes: 0 ok, 1 a check or validation failed, 2 usage, config, template or environment
    error, 3 internal error (a bug; --debug shows the traceback).
    """
    ctx.obj = State(root, debug)


@cli.command()
@click.argument("names", nargs=-1, shell_complete=complete_variants)
@common_options
@pass_state
@handle_errors
def generate(state: State, names: tuple[str, ...]) -> None:
    """Render all variants (or NAMES / globs) and update generated/.

    Nothing is written unless every variant renders and passes its interface check. Changed
    files are replaced in one transaction under a project lock: on any failure the old tree is
    restored. A file in generated/ that no variant produces is removed only if it is a kernel
    doppler-gen wrote there, unchanged (the manifest records its sha256); a hand-edited file
    with the generated header makes generate refuse. NAMES update only their own manifest
    entries.
    """
    from doppler_gen.outputs import plan, write

    outcome = plan(state.project, names)
    result = write(outcome)
    for path in result.written:
        click.echo(f"wrote     {path}")
    for path in result.removed:  # names found on disk: escaped (``printable``)
        click.echo(f"removed   {printable(path)}")
    for path in result.cleaned:
        click.echo(f"removed   {printable(path)} (temporary file of an interrupted generate)")
    click.echo(
        f"{len(result.written)} written, {len(result.unchanged)} unchanged, "
        f"{len(result.removed)} removed"
    )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@click.option(
    "--full",
    is_flag=True,
    help="Always re-render, even when every input and output is byte-identical to a tree a "
    "previous full check found clean.",
)
@common_options
@pass_state
@handle_errors
def check(state: State, as_json: bool, full: bool) -> None:
    """Exit 0 if generated/ is exactly what `generate` would write, else 1 with the differences.

    An unchanged tree (same variants.toml, templates/, generated/, doppler-gen and Jinja) that a
    full check already found clean is confirmed from a digest without re-rendering; --full
    re-renders regardless.
    """
    from doppler_gen import check_memo, observed

    root = state.root
    # the digest comes first, before variants.toml is even read: a save made while the check
    # runs then differs from it, or from what the check read, and is never recorded as clean
    before = check_memo.snapshot(root)
    fix = "doppler-gen generate"
    with observed.recording() as reads:
        # a config error is reported the same way with or without the memo
        project = load_project(root)
        if not full and check_memo.is_known_clean(root, before):
            if as_json:
                click.echo(json.dumps(_check_json(None, fix, memo=True), indent=2, sort_keys=True))
            else:
                click.echo(
                    "generated/ is up to date (inputs and outputs unchanged since the last full "
                    "check)"
                )
            return
        from doppler_gen.outputs import compare, plan

        check_memo.forget(root)  # whatever this full check finds, the old memo is void
        status = compare(plan(project), diffs=True)
    if status.clean:  # remembered only if the check read exactly the tree ``before`` describes
        check_memo.remember_clean(root, before, reads)
    if as_json:
        click.echo(json.dumps(_check_json(status, fix), indent=2, sort_keys=True))
        sys.exit(0 if status.clean else 1)
    if status.clean:
        click.echo(f"generated/ is up to date ({len(status.unchanged)} files)")
        return
    # names found on disk are shown escaped, as the diffs are (``printable_lines``)
    for path, diff in sorted(status.stale.items()):
        click.echo(f"stale:    {printable(path)}")
        click.echo(diff, nl=False)
    for path in status.missing:
        click.echo(f"missing:  {printable(path)}")
    for path in status.orphaned:
        why = "; not as doppler-gen wrote it: move or delete it" if path in status.foreign else ""
        click.echo(f"orphaned: {printable(path)} (no variant produces it{why})")
    for path in status.leftovers:
        click.echo(f"leftover: {printable(path)} (temporary file of an interrupted generate)")
    from doppler_gen.shipped import out_of_date

    problems = len(status.stale) + len(status.missing) + len(status.orphaned)
    problems += len(status.leftovers)
    click.echo(out_of_date(problems), err=True)
    sys.exit(1)


def _check_json(status: Any, fix: str, memo: bool = False) -> dict[str, Any]:
    """The --json report of `check`; ``status`` None means clean (confirmed by the memo).

    Stable schema: every key is always present. ``memo`` says whether the digest memo confirmed
    the tree (true) or it was re-rendered and compared (false).
    """
    clean = status is None or status.clean
    return {
        "memo": memo,
        "ok": clean,
        "stale": sorted(status.stale) if status else [],
        "missing": status.missing if status else [],
        "orphaned": [*status.orphaned, *status.leftovers] if status else [],
        "diffs": status.stale if status else {},
        "fix": None if clean else fix,
    }


@cli.command()
@click.option(
    "--check-against",
    "against",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="Compare with DIR/registry.json and DIR/digests.json (a Doppler checkout's kernel "
    "registry and digest table) and list every difference; exit 1 if there is any.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@common_options
@pass_state
@handle_errors
def export(state: State, against: Path | None, as_json: bool) -> None:
    """Show the Doppler export (generated/doppler/), or compare it with a Doppler registry.

    The export is rendered from variants.toml and templates/, exactly what `generate` writes:
    a kernel-registry fragment (one entry per doppler_id) and the content digests of the kernels
    it references. With --check-against, every missing or extra variant, layout mismatch and
    stale digest is one line; exit 0 when there is none, 1 otherwise, 2 on unreadable input.
    """
    from doppler_gen.export import (
        DIGESTS_PATH,
        REGISTRY_PATH,
        differences,
        load_doppler_dir,
    )
    from doppler_gen.outputs import plan

    theirs = load_doppler_dir(against) if against is not None else None
    outcome = plan(state.project)
    registry = json.loads(outcome.files[REGISTRY_PATH])
    digests = json.loads(outcome.files[DIGESTS_PATH])
    if theirs is None:
        if as_json:
            click.echo(json.dumps({"registry": registry, "digests": digests}, indent=2))
            return
        for op, schema in sorted(registry["operations"].items()):
            for vid, entry in sorted(schema["variants"].items()):
                tier = entry["variantMetadata"].get("tier")
                passes = entry.get("passes") or [entry]
                kernels = " -> ".join(f"{p['wgsl']}#{p['entryPoint']}" for p in passes)
                click.echo(f"{op}.{vid}: {kernels}" + (f" (tier {tier})" if tier else ""))
        for name in registry["notExported"]:
            click.echo(f"not exported: {name} (no doppler_id in variants.toml)")
        return
    generated = [r.output for kernel in outcome.kernels.values() for r in kernel.passes]
    lines = differences(registry, digests, theirs[0], theirs[1], generated)
    if as_json:
        click.echo(json.dumps({"ok": not lines, "differences": lines}, indent=2))
    else:
        # ids and digest keys come from the checkout's files: escaped, one difference a line
        for line in lines:
            click.echo(printable(line))
        count = sum(len(s["variants"]) for s in registry["operations"].values())
        if lines:
            click.echo(f"{len(lines)} difference(s) from {printable(str(against))}", err=True)
        else:
            click.echo(f"{printable(str(against))} matches the export ({count} variants)")
    sys.exit(1 if lines else 0)


@cli.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable listing on stdout.")
@common_options
@pass_state
@handle_errors
def list_(state: State, as_json: bool) -> None:
    """List variants: template, output, dtypes, features, workgroup storage."""
    from doppler_gen.listing import format_listing, listing_rows

    rows = listing_rows(state.project)
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
    else:
        click.echo(format_listing(rows))


@cli.command()
@click.argument("name", shell_complete=complete_variants)
@click.option("--raw", is_flag=True, help="Print the WGSL exactly, without line numbers.")
@click.option("--origins", is_flag=True, help="Show the template line behind each generated line.")
@click.option(
    "--pass",
    "pass_name",
    default=None,
    help="Only this pass of a multi-pass variant (--raw of a multi-pass variant needs it).",
)
@common_options
@pass_state
@handle_errors
def show(state: State, name: str, raw: bool, origins: bool, pass_name: str | None) -> None:
    """Print the rendered WGSL of variant NAME (with line numbers unless --raw).

    A multi-pass variant prints each pass after a `// == pass NAME (FILE)` line.
    """
    from doppler_gen.bytecode import EDITED_PACKAGES, running_code_is_on_disk
    from doppler_gen.render import Renderer

    variant = state.project.variant(name)
    kernel = Renderer(state.project).render(variant, with_origins=origins)
    running_code_is_on_disk(EDITED_PACKAGES)  # what it prints is what the sources render
    passes = [r for r in kernel.passes if pass_name in (None, r.spec.name)]
    if not passes:
        known = ", ".join(r.spec.name for r in kernel.passes)
        raise DopplerGenError(f"variant {name} has no pass {pass_name!r} (passes: {known})")
    if raw:
        if len(passes) > 1:
            raise DopplerGenError(
                f"variant {name} has {len(passes)} passes; --raw prints one: add --pass NAME"
            )
        click.echo(passes[0].text, nl=False)
        return
    for rendered in passes:
        if len(kernel.passes) > 1:
            click.echo(f"// == pass {rendered.spec.name} ({rendered.output})")
        _show_numbered(rendered, origins)


def _show_numbered(rendered: Any, origins: bool) -> None:
    """One pass's text with line numbers (and template origins)."""
    lines = rendered.text.split("\n")[:-1]
    width = len(str(len(lines)))
    wheres = [""] * len(lines)
    if origins:
        if rendered.origins is None:
            click.echo("note: no source map for this variant; showing lines only", err=True)
        wheres = [_where(rendered.origin(n)) for n in range(1, len(lines) + 1)]
    where_width = max(map(len, wheres))
    for number, (line, where) in enumerate(zip(lines, wheres, strict=True), start=1):
        margin = f" {where:<{where_width}}" if where_width else ""
        click.echo(f"{number:>{width}}{margin} | {line}".rstrip())


def _where(origin: tuple[str, int] | None) -> str:
    return f"{origin[0]}:{origin[1]}" if origin else ""


def main() -> None:
    """Console-script entry point.

    Commands handle their own errors (handle_errors); this catches what escapes outside any
    command (option callbacks, completion), so no traceback ever reaches a user without --debug.
    """
    _refuse_closed_stdout()
    try:
        cli.main(prog_name="doppler-gen")
    except SystemExit as done:
        # after an abandoned GPU wait, the interpreter's exit would hang on the device
        base = sys.modules.get("doppler_gen.backends.base")
        if base is not None:
            base.leave_if_spent(done.code if isinstance(done.code, int) else 1)
        raise
    except BrokenPipeError:
        _quiet_broken_pipe()
    except Exception as error:
        _internal_error(error, as_json=False)


# WebGPU implementations kernels are validated on (backends.BACKENDS); "all" compares them.
BACKEND_CHOICES = ("wgpu", "dawn", "all")  # validate.ALL_BACKENDS + "all" (kept here: no numpy)

# bench.MAX_REPEATS / MAX_WARMUP (kept here: no numpy); tests check that they agree.
MAX_REPEATS = 10_000
MAX_WARMUP = 1_000
DEFAULT_WARMUP_MS = 500.0
MAX_WARMUP_MS = 5_000.0

# Options validate, bench and tune share, defined once.
adapter_option = click.option(
    "--adapter", default=None, help="Adapter by index, type (gpu/cpu), backend or name."
)
limits_option = click.option(
    "--limits",
    type=click.Choice(["adapter", "webgpu-default"]),
    default="adapter",
    show_default=True,
    help="Device limits: the adapter's maxima, or WebGPU's defaults (what a browser grants).",
)
storage_overrun_option = click.option(
    "--storage-overrun",
    is_flag=True,
    help="Run variants whose static workgroup storage exceeds the device limit instead of skipping "
    "them (lavapipe runs 48 KiB tiles correctly while advertising 32 KiB); flagged in the report.",
)

from_templates_option = click.option(
    "--from-templates",
    is_flag=True,
    help="Run a fresh render of templates/ instead of the committed generated/ kernels (which "
    "are otherwise first proven equal to a fresh render: a stale tree exits 1).",
)


def seed_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--seed",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help=f"Seed of the {what}.",
    )


@cli.command()
@click.argument("names", nargs=-1, shell_complete=complete_variants)
@click.option(
    "--backend",
    type=click.Choice(BACKEND_CHOICES),
    default="wgpu",
    show_default=True,
    help="WebGPU implementation: wgpu (naga, as in Firefox), dawn (Tint, as in Chrome; needs the "
    "[dawn] extra), or all: both, and every case's two outputs must agree within its tolerance.",
)
@adapter_option
@limits_option
@click.option("--quick", is_flag=True, help="CI smoke tier: a subset of the feature cases.")
@click.option(
    "--large",
    is_flag=True,
    help="GPU tier: size cases at real model lengths (8k keys, 1k queries; tiered cold tier up to "
    "MAX_KV_LEN). Default: the CI tier (2k keys, 300 queries, offsets past 4096, 64 heads).",
)
@click.option(
    "--tier",
    type=click.Choice(["quick", "default", "large"]),
    default=None,
    help="Case tier by name (each family defines its tiers): --quick is --tier quick, --large "
    "is --tier large.",
)
@seed_option("case generator")
@storage_overrun_option
@from_templates_option
@click.option("--fail-fast", is_flag=True, help="Stop each variant at its first failing case.")
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Validate in this many worker processes, each with its own device: on a CPU adapter "
    "(lavapipe compiles a pipeline on one core) use the machine's cores. Same report.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@common_options
@pass_state
@handle_errors
def validate(
    state: State,
    names: tuple[str, ...],
    backend: str,
    adapter: str | None,
    limits: str,
    quick: bool,
    large: bool,
    tier: str | None,
    seed: int,
    storage_overrun: bool,
    from_templates: bool,
    fail_fast: bool,
    jobs: int,
    as_json: bool,
) -> None:
    """Compile every variant (or NAMES / globs) on WebGPU and check it against float64 numpy.

    Runs the committed generated/ kernels after proving generated/ equals a fresh render (a stale
    tree exits 1 with check's verdict; --from-templates runs a fresh render instead). Outputs are
    NaN-poisoned before every dispatch; tolerances are per output dtype (README); large outputs
    are compared on sampled (query, head) rows, NaN/Inf everywhere.
    Exit 0 only if every variant that ran passed and at least one ran (with --backend all: on
    every backend, and the backends' outputs agreed); 1 on any failure.
    """
    from doppler_gen.validate import backend_names, format_report, validate_all
    from doppler_gen.validate import validate as validate_one

    asked = {name for name, on in (("quick", quick), ("large", large), (tier, tier)) if on}
    if len(asked) > 1:  # --tier once won silently over --quick / --large
        raise click.UsageError(f"tiers {' and '.join(sorted(asked))} asked at once: pick one")
    _check_gpu_wait()
    backends = backend_names(backend)
    show_bar = sys.stderr.isatty() and not as_json
    bar = None
    if show_bar:
        from doppler_gen.validate import case_count

        total = case_count(state.project, names, quick=quick, tier=tier, seed=seed, large=large)
        total *= len(backends)
        bar = click.progressbar(length=total, label="validating", file=sys.stderr)
        bar.__enter__()

    def progress(name: str, step: int) -> None:
        if bar is not None:
            bar.label = f"{name:<36}"
            bar.update(step)

    options: dict[str, Any] = {
        "adapter": adapter,
        "limits": limits,
        "quick": quick,
        "tier": tier,
        "seed": seed,
        "storage_overrun": storage_overrun,
        "progress": progress,
        "large": large,
        "from_templates": from_templates,
        "fail_fast": fail_fast,
        "jobs": jobs,
    }
    try:
        if len(backends) > 1:
            run = validate_all(state.project, names, backends=backends, **options)
        else:
            run = validate_one(state.project, names, backend_name=backend, **options)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if as_json:
        click.echo(json.dumps(run.as_dict(), indent=2, sort_keys=True))
    else:
        click.echo(format_report(run))
    sys.exit(0 if run.ok else 1)


@cli.command()
@click.option(
    "--backend",
    type=click.Choice(BACKEND_CHOICES),
    default="all",
    show_default=True,
    help="Which WebGPU implementation(s) to examine; a missing one is reported, not fatal.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@common_options
@handle_errors
def doctor(backend: str, as_json: bool) -> None:
    """Adapters, features and limits that matter, and a live f16 kernel probe, per backend.

    The JSON form is ``{"backends": [report, ...], "ok": bool}``; a backend that cannot be
    loaded (pydawn not installed) has ``"available": false`` and its one-line ``"error"``.
    Exit 2 when no examined backend has any adapter (nothing could validate a kernel here).
    """
    from doppler_gen.validate import backend_names

    reports = [_doctor_report(name) for name in backend_names(backend)]
    usable = any(report.get("adapters") for report in reports if report["available"])
    if as_json:
        document = {"backends": reports, "ok": usable}
        click.echo(json.dumps(document, indent=2, sort_keys=True, default=str))
    else:
        click.echo("\n\n".join(_format_doctor(report) for report in reports))
    if not usable:
        # nothing could validate a kernel here: an environment error, not a report to file away
        click.echo(_doctor_failure(backend, reports), err=True)
        sys.exit(2)


def _check_gpu_wait() -> None:
    """A bad ``$DOPPLER_GEN_GPU_TIMEOUT`` is one line before anything runs, not every
    variant's FAIL when its first wait reads it."""
    from doppler_gen.backends.base import gpu_wait_seconds

    gpu_wait_seconds()


def _doctor_failure(backend: str, reports: list[dict[str, Any]]) -> str:
    """Why no examined backend can validate: none loaded (their reasons), or no adapter."""
    if not any(report["available"] for report in reports):
        reasons = "; ".join(f"{r['backend']}: {r['error']}" for r in reports)
        return f"error: no WebGPU backend could be loaded ({reasons})"
    return (
        f"error: no WebGPU adapter found (backend {backend}); install a Vulkan driver such as "
        "Mesa lavapipe (see .ci/setup) or run on a GPU machine"
    )


def _doctor_report(name: str) -> dict[str, Any]:
    """doctor_report of backend ``name``, or why it is unavailable (never raises for that)."""
    from doppler_gen.backends import get_backend
    from doppler_gen.doctor import doctor_report

    try:
        report = doctor_report(get_backend(name))
    except DopplerGenError as error:
        return {"backend": name, "available": False, "error": str(error)}
    return {"available": True, **report}


def _format_doctor(report: dict[str, Any]) -> str:
    from doppler_gen.doctor import format_doctor

    if not report["available"]:
        return f"backend: {report['backend']} — unavailable: {report['error']}"
    return format_doctor(report)


def _one_shape(texts: tuple[str, ...]) -> str:
    """tune's --shape: one (a second one was once taken silently instead of the first)."""
    if len(texts) > 1:
        raise click.UsageError(
            f"--shape given {len(texts)} times: tune times its candidates on one shape"
        )
    return texts[0]


def _finite(value: float | None) -> float | None:
    """A float option's value, refusing nan and inf (click's ranges let nan through)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value:g} is not a finite number.")
    return value


def _timing_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Options bench and tune share: where to run, how to time, where the results go."""
    options = [
        click.option(
            "--backend",
            type=click.Choice(BACKEND_CHOICES[:-1]),
            default="wgpu",
            show_default=True,
            help="WebGPU implementation.",
        ),
        adapter_option,
        limits_option,
        click.option(
            "--allow-cpu",
            is_flag=True,
            help="Run on a CPU adapter (lavapipe) anyway; every result is labelled CPU.",
        ),
        click.option(
            "--repeats",
            type=click.IntRange(min=20, max=MAX_REPEATS),
            default=30,
            show_default=True,
            help=f"Timed dispatches per measurement (median and p10-p90 of these; 20 to "
            f"{MAX_REPEATS}).",
        ),
        click.option(
            "--warmup",
            type=click.IntRange(min=0, max=MAX_WARMUP),
            default=5,
            show_default=True,
            help=f"Untimed dispatches before the timed ones (at most {MAX_WARMUP}).",
        ),
        click.option(
            "--warmup-ms",
            type=click.FloatRange(min=0, max=MAX_WARMUP_MS),
            default=DEFAULT_WARMUP_MS,
            show_default=True,
            help="GPU milliseconds of untimed runs before each measurement (kernels and torch "
            "alike), then more while they still speed up, so that an idle GPU reaches its busy "
            "clocks; 0 turns the ramp off.",
        ),
        seed_option("input data"),
        storage_overrun_option,
        from_templates_option,
        click.option("--json", "as_json", is_flag=True, help="Machine-readable results on stdout."),
        click.option(
            "--output",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Also write the JSON results to FILE.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _emit(result: dict[str, Any], text: str, as_json: bool, output: Path | None) -> None:
    """Print the report (or JSON) and write the JSON file.

    The path was checked before measuring (``_check_writable``); should the write still fail,
    the report is printed all the same (minutes of measurements must not vanish), then the
    error line, and the exit status is 2.
    """
    from doppler_gen.outputs import atomic_write

    document = json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False)
    failure = None
    if output is not None:
        try:  # atomic: a failure or Ctrl-C leaves the old file, never half a document
            # through a symlink to the file it names: the link stays a link (_unwritable)
            target = Path(os.path.realpath(output))
            atomic_write(target, document + "\n", make_parent=False)  # a report's directory
            # is the user's: one gone since it was checked is an error, not made again
        except OSError as error:
            failure = DopplerGenError(f"--output {output}: cannot write: {error.strerror or error}")
    click.echo(document if as_json else text)
    if failure is not None:
        _late_error(failure)


def _late_error(error: DopplerGenError) -> None:
    """An error after the report is printed: one line on stderr and its exit status (no JSON
    error object, which would be a second document on stdout)."""
    click.echo(f"error: {error}", err=True)
    sys.exit(error.exit_code)


def _check_writable(
    option: str, path: Path | None, root: Path | None = None, *, replaced: bool = True
) -> None:
    """Refuse an --output or --plot FILE that cannot be written before anything is measured or
    changed: a bench or tune run takes minutes, and its report would be lost at the end. Also
    one of the project's own files (``root``): a report written over variants.toml, a template
    or a generated kernel would destroy it. ``replaced``: the file is written beside the
    target and renamed over it (``--output``); else written in place (``--plot``, through
    matplotlib, which may write to /dev/null or a pipe)."""
    if path is None:
        return
    check = _unwritable if replaced else _unwritable_in_place
    reason = (_projects_own(path, root) if root is not None else None) or check(path)
    if reason is not None:
        raise DopplerGenError(f"{option} {path}: cannot write: {reason}")


def _projects_own(path: Path, root: Path) -> str | None:
    """Why ``path`` is one of the project's inputs, outputs or state (None: it is not)."""
    from doppler_gen.config import CONFIG_NAME, GENERATED_DIR, TEMPLATES_DIR
    from doppler_gen.state import STATE_DIR

    target = Path(os.path.realpath(path))
    for name in (CONFIG_NAME, TEMPLATES_DIR, GENERATED_DIR, STATE_DIR):
        own = Path(os.path.realpath(root / name))
        if target == own or own in target.parents:
            return f"it is the project's own {name}{'' if target == own else '/ file'}"
    return None


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file (None: it can, as far as can be told).

    A report is written to a temporary file beside the target and renamed over it
    (``outputs.atomic_write``), so what matters is the file the path leads to and its
    directory: a symlink is followed (the report goes to the file it names, the link stays),
    a device, FIFO, socket or directory there is refused (the rename would replace a device
    node by a regular file), and a file must really be creatable in the directory (an
    immutable or read-only one passes every permission bit and fails only at the rename).
    """
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        return error.strerror or str(error)
    if mode is not None and not stat.S_ISREG(mode):
        return f"it is {file_kind(mode)}, not a regular file"
    if mode is not None and not os.access(target, os.W_OK):
        return "permission denied"
    parent = target.parent
    if not parent.is_dir():  # named as given, unless a symlink led elsewhere
        return f"no directory {parent if path.is_symlink() else path.parent}"
    return _cannot_create_in(parent)


def _unwritable_in_place(path: Path) -> str | None:
    """Why ``path`` cannot be opened for writing (None: it can, as far as can be told)."""
    if path.is_dir():
        return "is a directory"
    if path.exists():
        return None if os.access(path, os.W_OK) else "permission denied"
    parent = path.parent
    if not parent.is_dir():
        return f"no directory {parent}"
    return _cannot_create_in(parent)


def _cannot_create_in(directory: Path) -> str | None:
    """Why no file can be created in ``directory`` (None: one was created and removed). A
    probe, not a permission check: root passes every permission check, an immutable
    directory (``chattr +i``) or a read-only mount refuses only the creation itself."""
    import tempfile

    try:
        handle, probe = tempfile.mkstemp(prefix=".doppler-gen-probe.", dir=directory)
    except OSError as error:
        return f"cannot create a file in {directory}: {error.strerror or error}"
    os.close(handle)
    os.unlink(probe)
    return None


def _progress(command: str) -> Callable[[str, int], None]:
    """Progress lines on stderr, so that --json on stdout stays parseable."""
    return lambda message, _cases: click.echo(f"{command}: {message}", err=True)


class ShapesCommand(click.Command):
    """A command whose help ends with the --shape syntax of every registered family.

    The kinds come from the family registry when help is shown, so the CLI names none itself.
    """

    shapes_repeatable = True

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from doppler_gen.shapes import describe_kinds

        once = "repeatable" if self.shapes_repeatable else "once"
        formatter.write_paragraph()
        formatter.write_text(
            f"Shapes (--shape KIND[:key=value,...], {once}; omitted keys take the defaults shown):"
        )
        with formatter.indentation():
            for line in describe_kinds():
                formatter.write_text(line)
        formatter.write_text("A shape a variant cannot run is reported n/a (reason).")


class OneShapeCommand(ShapesCommand):
    """The same help for a command that takes one --shape."""

    shapes_repeatable = False


@cli.command(cls=ShapesCommand)
@click.argument("names", nargs=-1, shell_complete=complete_variants)
@click.option(
    "--shape",
    "shape_texts",
    multiple=True,
    metavar="KIND:k=v,...",
    help="Problem shape (repeatable): a kind its family registers; syntax below.",
)
@click.option(
    "--copy-mib",
    type=click.IntRange(min=0),
    default=256,
    show_default=True,
    help="Size of the copy whose bandwidth is measured as a reference (0: skip).",
)
@click.option(
    "--profile",
    default=None,
    help="Device profile for % of peak: 'H200 NVL', H200, 'H100 PCIe', 'H100 NVL', H100 or "
    "none. Default: matched from the adapter name's words.",
)
@click.option(
    "--no-baseline",
    "--no-sdpa",
    "no_baseline",
    is_flag=True,
    help="Do not time the families' torch baselines (SDPA for attention) even if torch+CUDA works.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG chart to FILE (needs matplotlib: pip install 'doppler-gen[plot]').",
)
@click.option(
    "--against",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A/B in this run: also time the same variants rendered fresh from the project in DIR "
    "(an older checkout, a copy with one knob changed), in alternating rounds.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 20),
    default=None,
    help="Rounds of the --against A/B, each timing both sides. A verdict needs every round of "
    "one side to beat every round of the other: by chance alone 2.9 % of the time with 4 "
    "rounds, 10 % with 3; fewer get none.  [default: 4]",
)
@_timing_options
@common_options
@pass_state
@handle_errors
def bench(
    state: State,
    names: tuple[str, ...],
    shape_texts: tuple[str, ...],
    copy_mib: int,
    profile: str | None,
    no_baseline: bool,
    plot: Path | None,
    against: Path | None,
    rounds: int | None,
    backend: str,
    adapter: str | None,
    limits: str,
    allow_cpu: bool,
    repeats: int,
    warmup: int,
    warmup_ms: float,
    seed: int,
    storage_overrun: bool,
    from_templates: bool,
    as_json: bool,
    output: Path | None,
) -> None:
    """GPU time per dispatch of every variant (or NAMES / globs) on each shape of its family.

    Median and p10-p90 of GPU-timestamped dispatches, effective GB/s and TFLOP/s, % of the
    device profile's peak bandwidth (or of a measured copy), and the ratio to the family's torch
    baseline (SDPA for attention) when torch with CUDA is importable. Refuses a CPU adapter
    unless --allow-cpu. Each output is judged before timing (NaN/Inf anywhere, sampled rows
    against float64): a wrong one is FAIL, not timed, and the exit status is 1; so it is when
    nothing was timed (every row n/a). With --against DIR, the same variants rendered fresh
    from DIR's templates are timed too, in rounds alternating which side goes first, and an
    A/B table gives each side's round medians and calls a difference only where they do not
    overlap.
    """
    from doppler_gen.bench import (
        BenchRequest,
        Settings,
        format_report,
        require_matplotlib,
        run_bench,
    )
    from doppler_gen.bench import plot as write_plot
    from doppler_gen.shapes import parse_shapes

    _check_gpu_wait()
    _check_writable("--output", output, state.root)
    _check_writable("--plot", plot, state.root, replaced=False)
    if plot is not None:
        require_matplotlib()
    if rounds is not None and against is None:
        raise click.UsageError("--rounds is the number of --against A/B rounds; give --against")
    request = BenchRequest(
        patterns=names,
        shapes=tuple(parse_shapes(shape_texts)),
        backend=backend,
        adapter=adapter,
        limits=limits,
        allow_cpu=allow_cpu,
        copy_mib=copy_mib,
        profile=profile,
        baseline=not no_baseline,
        settings=Settings(repeats, warmup, seed, storage_overrun, warmup_ms),
        from_templates=from_templates,
        shapes_given=bool(shape_texts),
        against=against,
        rounds=4 if rounds is None else rounds,
    )
    run = run_bench(state.project, request, progress=_progress("bench"))
    plot_error: DopplerGenError | None = None
    if plot is not None:
        try:
            write_plot(run, plot)
        except DopplerGenError as error:  # the measurements are printed first
            plot_error = error
    _emit(run.as_dict(), format_report(run), as_json, output)
    if plot_error is not None:
        _late_error(plot_error)
    sys.exit(0 if run.ok else 1)


@cli.command(cls=OneShapeCommand)
@click.argument("name", shell_complete=complete_variants)
@click.option(
    "--shape",
    "shape_texts",
    multiple=True,  # so that a second --shape is refused, not silently taken instead
    metavar="KIND:k=v,...",
    help="The shape candidates are timed on (one). Default: the first of the family's default "
    "bench shapes the current configuration can run on the device.",
)
@click.option(
    "--max-candidates",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Run at most this many candidates, nearest to the current configuration first.",
)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0, min_open=True),
    callback=lambda _ctx, _param, value: _finite(value),
    default=None,
    metavar="SECONDS",
    help="Start no candidate after SECONDS (the current configuration always runs); the report, "
    "the winner and --write then cover the candidates that ran.",
)
@click.option(
    "--write",
    is_flag=True,
    help="Record the winner in variants.toml (params / overrides) and regenerate generated/. "
    "The winner must pass the full validation matrix and beat the current configuration's p10.",
)
@click.option(
    "--space",
    "space",
    multiple=True,
    metavar="NAME=V1,V2,...",
    help="Sweep only the knobs named (repeatable), over these values; the others keep their "
    "current values. NAME is a tunable template parameter or an override constant.",
)
@click.option(
    "--accept-contract-change",
    is_flag=True,
    help="Let --write record a winner that changes the variant's host metadata (e.g. a smaller "
    "max_head_dim).",
)
@_timing_options
@common_options
@pass_state
@handle_errors
def tune(
    state: State,
    name: str,
    shape_texts: tuple[str, ...],
    max_candidates: int,
    time_limit: float | None,
    space: tuple[str, ...],
    write: bool,
    accept_contract_change: bool,
    backend: str,
    adapter: str | None,
    limits: str,
    allow_cpu: bool,
    repeats: int,
    warmup: int,
    warmup_ms: float,
    seed: int,
    storage_overrun: bool,
    from_templates: bool,
    as_json: bool,
    output: Path | None,
) -> None:
    """Sweep variant NAME's override constants and tunable template parameters; time them.

    Each candidate is quick-validated first; one that fails is reported invalid with the
    reason and not timed. The winner must beat the current configuration's p10 (else the
    current one stays) and pass the full validation matrix. Prints the table and the winner;
    --write records the winner in variants.toml, keeping its comments and layout, and
    regenerates generated/. Refuses a CPU
    adapter unless --allow-cpu. Exit 1 if no candidate passed.
    """
    from doppler_gen.runtime.measure import Settings
    from doppler_gen.shapes import parse_shape
    from doppler_gen.tune import TuneRequest, format_report, run_tune, write_winner

    _check_gpu_wait()

    _check_writable(
        "--output", output, state.root
    )  # before measuring, and before --write changes files
    request = TuneRequest(
        name=name,
        shape=parse_shape(_one_shape(shape_texts)) if shape_texts else None,
        backend=backend,
        adapter=adapter,
        limits=limits,
        allow_cpu=allow_cpu,
        max_candidates=max_candidates,
        time_limit=time_limit,
        settings=Settings(repeats, warmup, seed, storage_overrun, warmup_ms),
        space=space,
        from_templates=from_templates,
    )
    run = run_tune(state.project, request, progress=_progress("tune"))
    refused: DopplerGenError | None = None
    if write:
        try:
            run.written = write_winner(
                state.project, run, accept_contract_change=accept_contract_change
            )
        except DopplerGenError as error:
            # minutes of measurement must not vanish with the refusal: report, then fail
            refused = error
            run.written = {"changed": False, "refused": True, "message": str(error)}
    _emit(run.as_dict(), format_report(run), as_json, output)
    if refused is not None:
        _late_error(refused)
    sys.exit(0 if run.winner is not None else 1)
