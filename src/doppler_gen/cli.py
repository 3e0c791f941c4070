"""The `doppler-gen` command line.

Exit codes: 0 ok; 1 a check or validation failed; 2 usage, config, template or environment
error. Every expected error prints one line (``error: location: message``) and no traceback.
Heavy modules (numpy, wgpu) are imported inside the commands that need them, so `check` and
`generate` stay fast enough for a pre-commit hook.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from doppler_gen import __version__
from doppler_gen.config import Project, find_root, load_project
from doppler_gen.errors import DopplerGenError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _fail(error: DopplerGenError) -> None:
    click.echo(f"error: {error}", err=True)
    sys.exit(error.exit_code)


def handle_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn DopplerGenError into one line on stderr and its exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except DopplerGenError as error:
            _fail(error)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


class State:
    """Lazily loaded project shared by the subcommands."""

    def __init__(self, root: Path | None) -> None:
        self._root = root
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


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="doppler-gen")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Project directory (holding variants.toml). Default: found from the current directory.",
)
@click.pass_context
def cli(ctx: click.Context, root: Path | None) -> None:
    """Generate, check and validate Doppler's WGSL attention kernels.

    Templates under templates/ expand into every variant declared in variants.toml; the results
    live in generated/ together with generated/manifest.json (bindings, uniform layout, overrides
    and host metadata of every variant).
    """
    ctx.obj = State(root)


@cli.command()
@click.argument("names", nargs=-1)
@pass_state
@handle_errors
def generate(state: State, names: tuple[str, ...]) -> None:
    """Render all variants (or NAMES / globs) and update generated/.

    Nothing is written unless every variant renders and passes its interface check. Files are
    replaced atomically and only when changed; a file in generated/ that no variant produces is
    removed only if it carries doppler-gen's generated header.
    """
    from doppler_gen.outputs import plan, write

    outcome = plan(state.project, names)
    result = write(outcome)
    for path in result.written:
        click.echo(f"wrote     {path}")
    for path in result.removed:
        click.echo(f"removed   {path}")
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
@pass_state
@handle_errors
def check(state: State, as_json: bool, full: bool) -> None:
    """Exit 0 if generated/ is exactly what `generate` would write, else 1 with the differences.

    An unchanged tree (same variants.toml, templates/, generated/, doppler-gen and Jinja) that a
    full check already found clean is confirmed from a digest without re-rendering; --full
    re-renders regardless.
    """
    from doppler_gen import check_memo

    project = state.project  # a config error is reported the same way with or without the memo
    digest = check_memo.tree_digest(project.root)  # taken before comparing anything
    fix = "doppler-gen generate"
    if not full and check_memo.is_known_clean(project.root, digest):
        if as_json:
            click.echo(
                json.dumps({**_check_json(None, fix), "memo": True}, indent=2, sort_keys=True)
            )
        else:
            click.echo(
                "generated/ is up to date (inputs and outputs unchanged since the last full check)"
            )
        return
    from doppler_gen.outputs import compare, plan

    status = compare(plan(project))
    if status.clean:
        check_memo.remember_clean(project.root, digest)
    if as_json:
        click.echo(json.dumps(_check_json(status, fix), indent=2, sort_keys=True))
        sys.exit(0 if status.clean else 1)
    if status.clean:
        click.echo(f"generated/ is up to date ({len(status.unchanged)} files)")
        return
    for path, diff in sorted(status.stale.items()):
        click.echo(f"stale:    {path}")
        click.echo(diff, nl=False)
    for path in status.missing:
        click.echo(f"missing:  {path}")
    for path in status.orphaned:
        click.echo(f"orphaned: {path} (no variant produces it)")
    problems = len(status.stale) + len(status.missing) + len(status.orphaned)
    click.echo(f"generated/ is out of date ({problems} file(s)); fix with: {fix}", err=True)
    sys.exit(1)


def _check_json(status: Any, fix: str) -> dict[str, Any]:
    """The --json report of `check`; ``status`` None means clean (confirmed by the memo)."""
    clean = status is None or status.clean
    return {
        "ok": clean,
        "stale": sorted(status.stale) if status else [],
        "missing": status.missing if status else [],
        "orphaned": status.orphaned if status else [],
        "diffs": status.stale if status else {},
        "fix": None if clean else fix,
    }


@cli.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable listing on stdout.")
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
@click.argument("name")
@click.option("--raw", is_flag=True, help="Print the WGSL exactly, without line numbers.")
@click.option("--origins", is_flag=True, help="Show the template line behind each generated line.")
@pass_state
@handle_errors
def show(state: State, name: str, raw: bool, origins: bool) -> None:
    """Print the rendered WGSL of variant NAME (with line numbers unless --raw)."""
    from doppler_gen.render import Renderer

    variant = state.project.variant(name)
    kernel = Renderer(state.project).render(variant, with_origins=origins)
    if raw:
        click.echo(kernel.text, nl=False)
        return
    lines = kernel.text.split("\n")[:-1]
    width = len(str(len(lines)))
    wheres = [""] * len(lines)
    if origins:
        if kernel.origins is None:
            click.echo("note: no source map for this variant; showing lines only", err=True)
        wheres = [_where(kernel.origin(n)) for n in range(1, len(lines) + 1)]
    where_width = max(map(len, wheres))
    for number, (line, where) in enumerate(zip(lines, wheres, strict=True), start=1):
        margin = f" {where:<{where_width}}" if where_width else ""
        click.echo(f"{number:>{width}}{margin} | {line}".rstrip())


def _where(origin: tuple[str, int] | None) -> str:
    return f"{origin[0]}:{origin[1]}" if origin else ""


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="doppler-gen")


# WebGPU implementations kernels are validated on (backends.BACKENDS); "all" compares them.
BACKEND_CHOICES = ("wgpu", "dawn", "all")  # validate.ALL_BACKENDS + "all" (kept here: no numpy)

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


def seed_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--seed",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help=f"Seed of the {what}.",
    )


@cli.command()
@click.argument("names", nargs=-1)
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
@click.option("--quick", is_flag=True, help="A subset of the cases (for the test suite).")
@click.option(
    "--tier",
    type=click.Choice(["quick", "default", "large"]),
    default=None,
    help="Case tier: quick (a subset), default (the full matrix) or large (more and longer "
    "random cases). --quick is --tier quick.",
)
@seed_option("case generator")
@storage_overrun_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@pass_state
@handle_errors
def validate(
    state: State,
    names: tuple[str, ...],
    backend: str,
    adapter: str | None,
    limits: str,
    quick: bool,
    tier: str | None,
    seed: int,
    storage_overrun: bool,
    as_json: bool,
) -> None:
    """Compile every variant (or NAMES / globs) on WebGPU and check it against float64 numpy.

    Outputs are NaN-poisoned before every dispatch; tolerances are per output dtype (README).
    Exit 0 only if every variant that ran passed and at least one ran (with --backend all: on
    every backend, and the backends' outputs agreed); 1 on any failure.
    """
    from doppler_gen.validate import backend_names, format_report, validate_all
    from doppler_gen.validate import validate as validate_one

    backends = backend_names(backend)
    show_bar = sys.stderr.isatty() and not as_json
    bar = None
    if show_bar:
        from doppler_gen.validate import case_count

        total = case_count(state.project, names, quick=quick, tier=tier, seed=seed)
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
@handle_errors
def doctor(backend: str, as_json: bool) -> None:
    """Adapters, features and limits that matter, and a live f16 kernel probe, per backend.

    The JSON form is ``{"backends": [report, ...]}``; a backend that cannot be loaded (pydawn
    not installed) has ``"available": false`` and its one-line ``"error"``.
    """
    from doppler_gen.validate import backend_names

    reports = [_doctor_report(name) for name in backend_names(backend)]
    if as_json:
        click.echo(json.dumps({"backends": reports}, indent=2, sort_keys=True, default=str))
    else:
        click.echo("\n\n".join(_format_doctor(report) for report in reports))


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
            type=click.IntRange(min=20),
            default=30,
            show_default=True,
            help="Timed dispatches per measurement (median and p10-p90 of these; at least 20).",
        ),
        click.option(
            "--warmup",
            type=click.IntRange(min=0),
            default=5,
            show_default=True,
            help="Untimed dispatches before the timed ones.",
        ),
        seed_option("input data"),
        storage_overrun_option,
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
    """Print the report (or JSON) and write the JSON file; a bad --output path is one line."""
    document = json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False)
    if output is not None:
        try:
            output.write_text(document + "\n", encoding="utf-8")
        except OSError as error:
            reason = error.strerror or error
            raise DopplerGenError(f"--output {output}: cannot write: {reason}") from None
    click.echo(document if as_json else text)


def _progress(command: str) -> Callable[[str, int], None]:
    """Progress lines on stderr, so that --json on stdout stays parseable."""
    return lambda message, _cases: click.echo(f"{command}: {message}", err=True)


class ShapesCommand(click.Command):
    """A command whose help ends with the --shape syntax of every registered family.

    The kinds come from the family registry when help is shown, so the CLI names none itself.
    """

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from doppler_gen.shapes import describe_kinds

        formatter.write_paragraph()
        formatter.write_text(
            "Shapes (--shape KIND[:key=value,...], repeatable; omitted keys take the defaults "
            "shown):"
        )
        with formatter.indentation():
            for line in describe_kinds():
                formatter.write_text(line)
        formatter.write_text("A shape a variant cannot run is reported n/a (reason).")


@cli.command(cls=ShapesCommand)
@click.argument("names", nargs=-1)
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
    help="Device profile for % of peak: H200, 'H100 PCIe', 'H100 NVL', H100 or none. "
    "Default: matched from the adapter name.",
)
@click.option("--no-sdpa", is_flag=True, help="Do not time torch SDPA even if torch+CUDA works.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG chart to FILE (needs matplotlib: pip install 'doppler-gen[plot]').",
)
@_timing_options
@pass_state
@handle_errors
def bench(
    state: State,
    names: tuple[str, ...],
    shape_texts: tuple[str, ...],
    copy_mib: int,
    profile: str | None,
    no_sdpa: bool,
    plot: Path | None,
    backend: str,
    adapter: str | None,
    limits: str,
    allow_cpu: bool,
    repeats: int,
    warmup: int,
    seed: int,
    storage_overrun: bool,
    as_json: bool,
    output: Path | None,
) -> None:
    """GPU time per dispatch of every variant (or NAMES / globs) on each shape of its family.

    Median and p10-p90 of GPU-timestamped dispatches, effective GB/s and TFLOP/s, % of the
    device profile's peak bandwidth (or of a measured copy), and the ratio to torch SDPA when
    torch with CUDA is importable. Refuses a CPU adapter unless --allow-cpu. Exit 1 if a
    variant left NaN/Inf in its output.
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

    if plot is not None:
        require_matplotlib()
    request = BenchRequest(
        patterns=names,
        shapes=tuple(parse_shapes(shape_texts)),
        backend=backend,
        adapter=adapter,
        limits=limits,
        allow_cpu=allow_cpu,
        copy_mib=copy_mib,
        profile=profile,
        sdpa=not no_sdpa,
        settings=Settings(repeats, warmup, seed, storage_overrun),
    )
    run = run_bench(state.project, request, progress=_progress("bench"))
    if plot is not None:
        write_plot(run, plot)
    _emit(run.as_dict(), format_report(run), as_json, output)
    sys.exit(0 if run.ok else 1)


@cli.command(cls=ShapesCommand)
@click.argument("name")
@click.option(
    "--shape",
    "shape_text",
    default=None,
    metavar="KIND:k=v,...",
    help="The shape candidates are timed on. Default: the family's default bench shape.",
)
@click.option(
    "--max-candidates",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Run at most this many candidates, nearest to the current configuration first.",
)
@click.option(
    "--write",
    is_flag=True,
    help="Record the winner in variants.toml (params / overrides) and regenerate generated/. "
    "The winner must pass the full validation matrix and beat the current configuration's p10.",
)
@click.option(
    "--accept-contract-change",
    is_flag=True,
    help="Let --write record a winner that changes the variant's host metadata (e.g. a smaller "
    "max_head_dim).",
)
@_timing_options
@pass_state
@handle_errors
def tune(
    state: State,
    name: str,
    shape_text: str | None,
    max_candidates: int,
    write: bool,
    accept_contract_change: bool,
    backend: str,
    adapter: str | None,
    limits: str,
    allow_cpu: bool,
    repeats: int,
    warmup: int,
    seed: int,
    storage_overrun: bool,
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

    request = TuneRequest(
        name=name,
        shape=parse_shape(shape_text) if shape_text else None,
        backend=backend,
        adapter=adapter,
        limits=limits,
        allow_cpu=allow_cpu,
        max_candidates=max_candidates,
        settings=Settings(repeats, warmup, seed, storage_overrun),
    )
    run = run_tune(state.project, request, progress=_progress("tune"))
    if write:
        run.written = write_winner(
            state.project, run, accept_contract_change=accept_contract_change
        )
    _emit(run.as_dict(), format_report(run), as_json, output)
    sys.exit(0 if run.winner is not None else 1)
