"""The `gdnctl` command line: parse, call one function, print. No logic lives here."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from gdnctl import __version__
from gdnctl.errors import GdnctlError
from gdnctl.files import os_error_sentence

# sysexits' EX_SOFTWARE: a bug in gdnctl. Never 1 (the preset has errors) or 2 (unreadable input, bad arguments),
# so a script can tell a crash from an invalid preset.
INTERNAL_ERROR_EXIT = 70
# What a shell reports for a program killed by SIGPIPE (128 + 13): the status `yes | head` leaves `yes` with.
BROKEN_PIPE_EXIT = 141


def _wants_json(ctx) -> bool:
    """Whether the command line asked for --json (also when the subcommand's own parsing failed)."""
    return "--json" in ctx.meta.get("gdnctl.argv", ())


class _Group(TyperGroup):
    """Turns a GdnctlError (bad input, not a bug) into one line on stderr and its exit code, and so an OSError
    the machine caused (a full disk, a read-only filesystem: files.os_error_sentence); any other exception (a
    bug) into a traceback, a request for a bug report and INTERNAL_ERROR_EXIT. With --json, stdout carries one
    JSON object for every outcome. A reader of stdout that went away ends the command quietly."""

    def parse_args(self, ctx, args):
        ctx.meta.setdefault("gdnctl.argv", tuple(args))  # the outermost group sees the whole command line
        with _quiet_on_broken_pipe():  # --help
            return super().parse_args(ctx, args)

    def invoke(self, ctx):
        with _quiet_on_broken_pipe():
            return self._invoke_reporting(ctx)

    def _invoke_reporting(self, ctx):
        try:
            return super().invoke(ctx)
        except GdnctlError as err:
            _report_error(err, _wants_json(ctx))
            raise typer.Exit(err.exit_code) from None
        except typer.TyperException as err:  # a usage error: click's usage text goes to stderr as always
            if _wants_json(ctx):
                _emit_json({"ok": False, "error": err.format_message(), "exit_code": err.exit_code})
            raise
        except (typer.Exit, typer.Abort, BrokenPipeError):
            raise
        except OSError as err:
            sentence = os_error_sentence(err)
            if sentence is None:
                _report_crash(err, _wants_json(ctx))
                raise typer.Exit(INTERNAL_ERROR_EXIT) from None
            error = GdnctlError(sentence)
            _report_error(error, _wants_json(ctx))
            raise typer.Exit(error.exit_code) from None
        except Exception as err:  # whatever it is, it is a bug: report it as one
            _report_crash(err, _wants_json(ctx))
            raise typer.Exit(INTERNAL_ERROR_EXIT) from None


@contextlib.contextmanager
def _quiet_on_broken_pipe():
    """`gdnctl explain | head`: when the reader of stdout (or stderr) has gone, stop as other programs do, with no
    traceback and no word, and with BROKEN_PIPE_EXIT. The streams are pointed at /dev/null first, so flushing
    what is still buffered at exit cannot fail again."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError):  # a stream without a descriptor (an in-memory one in tests)
                continue
        os.close(devnull)
        raise typer.Exit(BROKEN_PIPE_EXIT) from None


def _report_error(err: GdnctlError, as_json: bool) -> None:
    result = getattr(err, "result", None)  # PresetHasErrors: the findings are the answer
    if result is not None and not as_json:
        from gdnctl.validate import format_findings

        typer.echo(format_findings(result.findings, False), err=True)
    typer.echo(f"gdnctl: {err}", err=True)
    if as_json:
        data = result.to_json() if result is not None else {"ok": False}
        _emit_json({**data, "ok": False, "error": str(err), "exit_code": err.exit_code})


def _report_crash(err: Exception, as_json: bool) -> None:
    traceback.print_exception(err, file=sys.stderr)
    message = (
        f"internal error ({type(err).__name__}): this is a bug in gdnctl {__version__}, not a problem with "
        "your preset. Please report it with the command you ran and the traceback above."
    )
    typer.echo(f"gdnctl: {message}", err=True)
    if as_json:
        _emit_json({"ok": False, "error": message, "internal_error": True, "exit_code": INTERNAL_ERROR_EXIT})


app = typer.Typer(
    cls=_Group,
    name="gdnctl",
    help="Validate, render and launch Qwen3.5 / Qwen3-Next Gated-DeltaNet training and RL jobs on Megatron + vLLM.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
presets_app = typer.Typer(cls=_Group, help="List, show and copy the shipped presets.", no_args_is_help=True)
app.add_typer(presets_app, name="presets")


def _complete_preset(incomplete: str) -> list[str]:
    """The shipped presets' names that start with what was typed. None for what reads as a path: the shell's
    completion script then completes file names (typer's bash script registers with `-o default`)."""
    from gdnctl.resources import presets_dir

    if "/" in incomplete or incomplete.startswith((".", "~")):
        return []
    return sorted(path.stem for path in presets_dir().glob("*.yaml") if path.stem.startswith(incomplete))


PresetArg = Annotated[
    str, typer.Argument(help="Preset YAML file, or the name of a shipped preset.", autocompletion=_complete_preset)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a preset field; the value parses as YAML (e.g. --set parallel.tp=2). Repeatable.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


def _colour() -> bool:
    return sys.stdout.isatty()


@contextlib.contextmanager
def _stdout_to_stderr(active: bool):
    """Send file descriptor 1 to stderr for the duration (catches output of C extensions too)."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _emit_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _fail(message: str, code: int = 2) -> None:
    """Stop with a sentence (and, under --json, the JSON error object) and `code`."""
    error = GdnctlError(message)
    error.exit_code = code
    raise error


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"gdnctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


@app.command()
def validate(
    preset: PresetArg,
    set_: SetOpt = None,
    json_output: JsonOpt = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
) -> None:
    """Check a preset before any GPU is spent. Exit 0: valid, 1: errors (or warnings with --strict),
    2: the file cannot be read or the arguments are wrong."""
    from gdnctl.validate import Severity, format_findings, summary_line
    from gdnctl.validate import validate as run_validation

    result = run_validation(preset, set_ or [])
    failed = not result.ok or (strict and result.count(Severity.WARNING) > 0)
    if json_output:
        data = result.to_json()
        data["ok"] = not failed
        _emit_json(data)
    else:
        text = format_findings(result.findings, _colour())
        if text:
            typer.echo(text)
        typer.echo(
            summary_line(
                result.loaded.source,
                result.count(Severity.ERROR),
                result.count(Severity.WARNING),
                result.count(Severity.INFO),
                _colour(),
                strict=strict,
            )
        )
    raise typer.Exit(1 if failed else 0)


@app.command()
def explain(preset: PresetArg, set_: SetOpt = None, json_output: JsonOpt = False) -> None:
    """Show the resolved config: every derived value with the reason for it, and the memory table."""
    from gdnctl.plan import derived_values, memory, memory_table
    from gdnctl.validate import format_derived, format_findings, format_memory
    from gdnctl.validate import validate as run_validation

    result = run_validation(preset, set_ or [])
    run = result.run
    derived = derived_values(run) if run is not None else []
    estimate = memory_table(run) if run is not None else None
    rollout_phase = memory.estimate_rollout_phase(run) if run is not None else None
    if json_output:
        _emit_json(
            {
                **result.to_json(),
                "derived": [{"name": d.name, "value": d.value, "reason": d.reason} for d in derived],
                "memory": _memory_json(estimate),
                "memory_rollout_phase": _memory_json(rollout_phase),
            }
        )
        raise typer.Exit(0 if result.ok else 1)
    typer.echo(
        f"{result.loaded.source}"
        + (f" (built on {', '.join(result.loaded.chain[:-1])})" if len(result.loaded.chain) > 1 else "")
    )
    if derived:
        typer.echo("\nderived values:")
        typer.echo(format_derived(derived))
    if estimate is not None:
        typer.echo("\nmemory per GPU (estimate)" + (", training phase (vLLM asleep):" if rollout_phase else ":"))
        typer.echo(format_memory(estimate))
    if rollout_phase is not None:
        typer.echo("\nmemory per GPU (estimate), rollout phase (vLLM awake beside the trainer's model):")
        typer.echo(format_memory(rollout_phase))
    if result.findings:
        typer.echo("\nfindings:")
        typer.echo(format_findings(result.findings, _colour()))
    raise typer.Exit(0 if result.ok else 1)


def _memory_json(estimate) -> dict | None:
    if estimate is None:
        return None
    return {
        "rows": [{"name": r.name, "gib": round(r.gib, 3), "note": r.note} for r in estimate.rows],
        "total_gib": round(estimate.total_gib, 3),
        "capacity_gib": estimate.capacity_gib,
        "usage": round(estimate.usage, 4),
    }


@app.command()
def rules(
    code: Annotated[str | None, typer.Argument(help="A rule code, e.g. HEAD002.")] = None,
    json_output: JsonOpt = False,
    markdown: Annotated[
        bool,
        typer.Option("--markdown", help="Print the README's rule table (code, severity, checks, source) in Markdown."),
    ] = False,
) -> None:
    """List every rule, or print one rule's documentation."""
    from gdnctl.validate import (  # importing registers every code
        RULES,
        codes,
        format_rule_doc,
        format_rule_list,
        format_rule_table,
    )

    if markdown and (code is not None or json_output):
        _fail("--markdown prints the table of every rule; leave out CODE and --json.")
    ordered = sorted(RULES.values(), key=lambda r: r.code)
    if code is None:
        if markdown:
            typer.echo(format_rule_table(ordered))
        elif json_output:
            _emit_json(
                [
                    {
                        "code": r.code,
                        "name": r.name,
                        "severity": r.severity.value,
                        "concern": r.concern,
                        "summary": r.summary,
                        "source": r.source,
                    }
                    for r in ordered
                ]
            )
        else:
            typer.echo(format_rule_list(sorted(ordered, key=lambda r: (r.concern, r.code))))
        return
    info = RULES.get(code.upper())
    if info is None and code.upper() in codes.RETIRED:
        typer.echo(f"{code.upper()} is retired: {codes.RETIRED[code.upper()]}")
        return
    if info is None:
        import difflib

        close = difflib.get_close_matches(code.upper(), list(RULES), n=1)
        _fail(f"no rule {code}." + (f" Did you mean {close[0]}?" if close else "") + " `gdnctl rules` lists them.")
    if json_output:
        _emit_json(
            {
                "code": info.code,
                "name": info.name,
                "severity": info.severity.value,
                "summary": info.summary,
                "source": info.source,
                "doc": info.doc,
            }
        )
    else:
        typer.echo(format_rule_doc(info))


@app.command()
def schema() -> None:
    """Print the JSON Schema of presets (for editor completion and validation)."""
    from gdnctl.schema import Preset

    data = Preset.model_json_schema()
    data["properties"]["base"] = {
        "type": "string",
        "description": "Preset this one builds on (path or shipped preset name)",
    }
    _emit_json(data)


RunDirOpt = Annotated[
    Path | None,
    typer.Option("--run-dir", "-o", help="Run dir to write (default: runs/NAME-TIMESTAMP-XXXX, a new one)."),
]
TemplatesOpt = Annotated[
    Path | None, typer.Option("--templates", help="Directory with your own copies of gdnctl's templates.")
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace the files gdnctl rendered into a non-empty run "
        "dir; what else is there stays. Refused while a job uses the run dir.",
    ),
]


def _render(
    preset: str,
    run_dir: Path | None,
    overrides: list[str],
    force: bool,
    templates: Path | None,
    dry_run: bool = False,
    before_write=None,
    as_is: bool = False,
):
    from gdnctl.launch import render

    rendered = render(
        preset,
        run_dir,
        overrides,
        force=force,
        templates=templates,
        dry_run=dry_run,
        before_write=before_write,
        as_is=as_is,
    )
    if rendered.kept:
        typer.echo(
            f"gdnctl: --force replaced only the files gdnctl rendered and kept what it did not write, as it "
            f"was: {', '.join(rendered.kept)}",
            err=True,
        )
    return rendered


def _print_dry_run(rendered) -> None:
    for name in ("launch_local.sh", "launch_slurm.sbatch"):
        typer.echo(f"===== {name} =====")
        typer.echo(rendered.files[name], nl=False)
    typer.echo("===== environment =====")
    width = max(len(row[0]) for row in rendered.env_table)
    for name, value, source in rendered.env_table:
        typer.echo(f"{name:<{width}}  {value}  ({source})")


@app.command()
def render(
    preset: PresetArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Run dir to write.")],
    set_: SetOpt = None,
    force: ForceOpt = False,
    templates: TemplatesOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Write the run dir: engine.yaml, launch_local.sh, launch_slurm.sbatch, manifest.json.
    Refuses a preset with errors (exit 1)."""
    from gdnctl.launch import next_step

    rendered = _render(preset, output, set_ or [], force, templates)
    if json_output:
        _emit_json(
            {
                "run_dir": str(rendered.run_dir),
                "files": sorted([*rendered.files, "manifest.json"]),
                "kept": rendered.kept,
                "manifest": rendered.manifest,
            }
        )
        return
    typer.echo(f"rendered {rendered.run_dir}")
    for name in sorted([*rendered.files, "manifest.json"]):
        typer.echo(f"  {name}")
    command = next_step(rendered, preset, set_ or [], templates)
    typer.echo(f"run it: {command}   (or: bash {shlex.quote(str(rendered.run_dir / 'launch_local.sh'))})")


SmokeOpt = Annotated[
    bool,
    typer.Option(
        "--smoke",
        help="Run the job's smoke run instead of the job: the preset's real parallel layout and shapes for 2 "
        "optimizer steps, one checkpoint saved and loaded back and, for rl, the checked weight syncs, all "
        "in RUN_DIR/smoke (the job's checkpoints and metrics are not touched). Prints a verdict per "
        "check, with the measured step time and peak memory against explain's estimate, and writes "
        "RUN_DIR/smoke.json. Exit 0 when no check failed, 1 otherwise.",
    ),
]
ThenRunOpt = Annotated[
    bool,
    typer.Option(
        "--then-run",
        help="With --smoke: start the job after a green smoke run, in the same launch (on Slurm: in the "
        "same allocation, as the step after the smoke's). After a failed smoke the job is not "
        "started; the exit code is then 1, else the job's.",
    ),
]


@app.command()
def launch(
    preset: PresetArg,
    set_: SetOpt = None,
    slurm: Annotated[
        bool | None,
        typer.Option(
            "--slurm/--local", help="Submit with sbatch, or run here (default: the preset's launch.executor)."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Render and print the scripts and the environment; run nothing.")
    ] = False,
    run_dir: RunDirOpt = None,
    force: ForceOpt = False,
    templates: TemplatesOpt = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="With --slurm: follow the job, tail its log and exit with its exit code.")
    ] = False,
    smoke: SmokeOpt = False,
    then_run: ThenRunOpt = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object instead of text: the "
            "run dir, the smoke's verdicts and the job's exit code (or "
            "Slurm job id); the runs' own output goes to stderr.",
        ),
    ] = False,
) -> None:
    """Render the preset and run it: locally (torchrun on this host) or on Slurm (sbatch); with --smoke, its smoke
    run first. The preset's warnings are printed before it starts.

    The job runs with gdnctl's own Python unless the preset sets launch.python; a local launch first checks that
    this interpreter has gdnctl's `runtime` extra (torch), that the tokenizer and data files the preset names are
    on this machine and, for rl, that the rollout's interpreter has vLLM and gdnctl's runtime; it writes nothing
    when they are not.

    --run-dir DIR of a run dir `gdnctl render` wrote launches it as it is (the same preset and --set values); a run
    dir that has run already is continued with `gdnctl resume DIR`. Follow a job with `gdnctl status`, `gdnctl
    logs` and `gdnctl cancel`."""
    from gdnctl.launch import interpreter, local_inputs, submit

    if then_run and not smoke:
        _fail(
            "--then-run starts the job after a green smoke run: add --smoke, or drop --then-run to start the job "
            "directly."
        )
    overrides = list(set_ or [])
    if slurm is not None:
        overrides.append(f"launch.executor={'slurm' if slurm else 'local'}")

    def check(rendered) -> None:  # before anything is written: a refusal leaves no run dir behind
        run = rendered.result.run
        if run.preset.launch.executor == "local":
            interpreter.check(interpreter.job_python(run.preset), preset)
            local_inputs.check(rendered.result)
            interpreter.check_rollout(run.preset, preset)
        else:
            submit.check_sbatch()

    rendered = _render(
        preset,
        run_dir,
        overrides,
        force,
        templates,
        dry_run=dry_run,
        before_write=None if dry_run else check,
        as_is=run_dir is not None,
    )
    if dry_run:
        if json_output:
            _emit_json(
                {
                    "run_dir": str(rendered.run_dir),
                    "scripts": {name: rendered.files[name] for name in ("launch_local.sh", "launch_slurm.sbatch")},
                    "environment": [{"name": n, "value": v, "source": s} for n, v, s in rendered.env_table],
                }
            )
        else:
            _print_dry_run(rendered)
        return
    _say_findings(rendered.result)
    _say(f"rendered {rendered.run_dir}")
    _start(
        rendered.run_dir,
        rendered.result.run.preset.launch.executor,
        smoke=smoke,
        then_run=then_run,
        wait=wait,
        json_output=json_output,
    )


def _say(text: str) -> None:
    typer.echo(f"gdnctl: {text}", err=True)


def _say_findings(result) -> None:
    """The preset's warnings (and notes), on stderr before the job starts: a launch never hides what validate says."""
    from gdnctl.validate import Severity, format_findings

    shown = [f for f in result.findings if f.severity != Severity.ERROR]
    if shown:
        typer.echo(format_findings(shown, sys.stderr.isatty()), err=True)


def _start(
    run_dir: Path, executor: str, *, smoke: bool, then_run: bool, wait: bool, json_output: bool, resumed: bool = False
) -> None:
    """Run a run dir as it is: here, or submitted to Slurm (launch and resume)."""
    from gdnctl.launch import runs
    from gdnctl.launch import smoke as smoke_run
    from gdnctl.launch import submit as launcher

    if executor == "local":
        result = smoke_run.launch_local(
            run_dir, smoke=smoke, then_run=then_run, say=_say, stdout=sys.stderr if json_output else None
        )
        if json_output:
            _emit_json({**result.to_json(), "run_dir": str(run_dir), "executor": "local"})
        raise typer.Exit(result.exit_code)
    mode = smoke_run.SMOKE_THEN_RUN_ARGS if then_run else smoke_run.SMOKE_ARGS if smoke else ()
    job = launcher.submit(run_dir, mode)
    job_name = runs.launch_facts(run_dir)[1]
    log = runs.slurm_log(run_dir, job_name, job.job_id)
    what = " (the smoke run, then the job after a green smoke)" if then_run else " (the smoke run)" if smoke else ""
    data = {
        "ok": True,
        "run_dir": str(run_dir),
        "executor": "slurm",
        "job_id": job.job_id,
        "log": str(log),
        "smoke": None,
    }
    if not json_output:
        typer.echo(f"submitted job {job.job_id}{what}{' to resume the run' if resumed else ''}; log: {log}")
    exit_code = 0
    if wait:
        job = launcher.follow(
            run_dir, job, job_name, (lambda text: typer.echo(text, err=True)) if json_output else typer.echo
        )
        failed = launcher.first_failure(log) if job.state != "COMPLETED" else None
        _say(
            f"job {job.job_id} ended {job.state} with exit code {job.exit_code}"
            + (f"; the first failure its log names: {failed}" if failed else "")
        )
        exit_code = job.exit_code
        if smoke:
            outcome = smoke_run.read_outcome(run_dir, None)
            _say(outcome.verdict())
            data["smoke"] = outcome.to_json()
            if not outcome.green:
                exit_code = exit_code or 1
        data.update(ok=exit_code == 0, state=job.state, exit_code=exit_code)
    elif not json_output:
        quoted = shlex.quote(str(run_dir))
        typer.echo(
            f"follow it: gdnctl status {quoted}; gdnctl logs {quoted} --follow; stop it: gdnctl cancel "
            f"{quoted} (or scancel {job.job_id})"
        )
    if json_output:
        _emit_json(data)
    raise typer.Exit(exit_code)


RunDirArg = Annotated[
    Path, typer.Argument(help="A run dir that `gdnctl render` or `gdnctl launch` wrote.", show_default=False)
]


@app.command()
def resume(
    run_dir: RunDirArg,
    slurm: Annotated[
        bool | None,
        typer.Option("--slurm/--local", help="Submit with sbatch, or run here (default: how it was launched)."),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="With --slurm: follow the job, tail its log and exit with its exit code.")
    ] = False,
    json_output: JsonOpt = False,
) -> None:
    """Run a run dir again as it is, continuing from its latest checkpoint (train.save_dir): the engine.yaml and
    scripts it holds are not re-rendered, and nothing in it is replaced. Refused while its job still runs."""
    from gdnctl.launch import interpreter, runs
    from gdnctl.launch import submit as launcher

    current = runs.status(run_dir)
    if current.state == "running" or (current.job_ids and launcher.unfinished_jobs(current.job_ids)):
        _fail(
            f"{run_dir} still has a job running ({current.line()}); follow it with `gdnctl status "
            f"{shlex.quote(str(run_dir))}`, or stop it with `gdnctl cancel {shlex.quote(str(run_dir))}` first."
        )
    executor = ("slurm" if slurm else "local") if slurm is not None else current.executor
    if executor == "local":
        python = _script_python(run_dir)
        if python is not None:
            interpreter.check(python, str(run_dir))
    _say(f"resuming {run_dir} ({executor}) from its latest checkpoint, if it has one")
    _start(run_dir.resolve(), executor, smoke=False, then_run=False, wait=wait, json_output=json_output, resumed=True)


def _script_python(run_dir: Path) -> str | None:
    """The interpreter launch_local.sh runs (its `exec PYTHON -m ...` line), to check before resuming."""
    import re

    try:
        text = (run_dir / "launch_local.sh").read_text()
    except OSError:
        return None
    found = re.search(r"^exec (.+?) -m gdnctl\.runtime\.launcher\.torchrun ", text, re.MULTILINE)
    if found is None:
        return None
    parts = shlex.split(found.group(1))
    return parts[0] if len(parts) == 1 else None


@app.command()
def status(run_dir: RunDirArg, json_output: JsonOpt = False) -> None:
    """Where a run dir's job is: rendered (never launched), running or ended (local: succeeded, failed or stopped,
    with the exit code and the signal that ended it, as `gdnctl launch` recorded them), or its Slurm job's state
    and exit code (from scontrol). Exit 0 unless the run dir cannot be read."""
    from gdnctl.launch import runs

    found = runs.status(run_dir)
    if json_output:
        _emit_json(found.to_json())
        return
    typer.echo(found.line())
    if found.log is not None:
        typer.echo(f"  log: {found.log}")
    if found.note:
        typer.echo(f"  {found.note}")


@app.command()
def logs(
    run_dir: RunDirArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing as the log grows, until the job ends.")
    ] = False,
) -> None:
    """Print the log of a run dir's latest job: its Slurm job's logs/NAME-JOBID.out, or a local run's
    logs/local-*.out."""
    import time

    from gdnctl.launch import runs
    from gdnctl.launch import submit as launcher

    if follow:  # a queued Slurm job has no log yet: wait for it to start (or end) rather than give up
        while True:
            found = runs.status(run_dir)
            if (
                (found.log is not None and found.log.is_file())
                or not found.job_ids
                or found.state in ("unknown", *launcher.TERMINAL_STATES)
            ):
                break
            time.sleep(launcher.POLL_SECONDS)
    path = runs.log_path(run_dir)
    offset = 0
    while True:
        with path.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
        offset += len(chunk)
        if chunk:
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        if not follow:
            return
        if runs.status(run_dir).state in ("ended", "unknown", *launcher.TERMINAL_STATES):
            with path.open("rb") as handle:  # what the job wrote between the last read and its end
                handle.seek(offset)
                sys.stdout.write(handle.read().decode(errors="replace"))
            return
        time.sleep(launcher.POLL_SECONDS)


@app.command()
def cancel(run_dir: RunDirArg) -> None:
    """Cancel the Slurm job(s) submitted from a run dir that have not ended (scancel). A local job stops with the
    gdnctl that launched it (Ctrl-C there)."""
    from gdnctl.launch import runs

    cancelled = runs.cancel(run_dir)
    if cancelled:
        typer.echo(f"cancelled Slurm job {', '.join(cancelled)} of {run_dir}")
    else:
        typer.echo(f"no job of {run_dir} was still queued or running; nothing to cancel")


@app.command("runs")
def runs_command(
    root: Annotated[Path, typer.Argument(help="Directory that holds run dirs.")] = Path("runs"),
    json_output: JsonOpt = False,
) -> None:
    """List the run dirs under runs/ (where `gdnctl launch` writes them), oldest first, with each job's state."""
    from gdnctl.launch import runs

    found = [runs.status(path) for path in runs.find_runs(root)]
    if json_output:
        _emit_json([item.to_json() for item in found])
        return
    if not found:
        typer.echo(f"no run dirs under {root}; `gdnctl launch PRESET` makes one there")
    for item in found:
        typer.echo(item.line())


@app.command()
def doctor(
    preset: Annotated[str | None, typer.Argument(help="Also check this preset against the machine.")] = None,
    set_: SetOpt = None,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object instead of text: the "
            "checks, and the machine facts as --save-facts writes them "
            "(credential-like values redacted); progress goes to "
            "stderr.",
        ),
    ] = False,
    kernels: Annotated[
        bool,
        typer.Option(
            "--kernels",
            help="Run every GDN kernel backend and an fp32 "
            "reference at the preset's per-rank GDN shapes and compare "
            "(GPU).",
        ),
    ] = False,
    bench: Annotated[
        bool,
        typer.Option(
            "--bench", help="Time the GDN kernel backends at those shapes, each against the default one (GPU)."
        ),
    ] = False,
    chart: Annotated[Path | None, typer.Option("--chart", help="With --bench: save a PNG chart.")] = None,
    facts_file: Annotated[
        Path | None,
        typer.Option("--facts", help="Judge facts saved with --save-facts instead of probing this machine."),
    ] = None,
    save_facts: Annotated[
        Path | None,
        typer.Option(
            "--save-facts",
            help="Write the probed machine "
            "facts as JSON (to share or replay): the versions, "
            "GPUs and kernel cache, and only the environment "
            "variables listed above, a credential-like name's "
            "value replaced by <redacted>.",
        ),
    ] = None,
) -> None:
    """Can this machine run the preset? One line per check (OK/WARN/FAIL/SKIP); exit 1 on any FAIL.

    The machine facts (--json, --save-facts) are: the Python, torch and CUDA versions, the GPUs, the driver,
    NCCL and cuDNN versions, the installed versions of the kernel, training and rollout packages, why torch
    or flash_qla fails to import, the kernel cache directory, rollout.python's vLLM, and these environment
    variables only: NCCL_*, TORCH_NCCL_*, CUDA_DEVICE_MAX_CONNECTIONS, PYTORCH_CUDA_ALLOC_CONF, FLA_FLASH_QLA,
    FLA_DISABLE_BACKEND_DISPATCH, TILELANG_CACHE_DIR, CUDA_VISIBLE_DEVICES. A variable whose name contains
    TOKEN, KEY, SECRET, PASSWORD, PASSWD, CREDENTIAL or AUTH (any case) is recorded by name with the value
    <redacted>, in the text report too.

    --kernels and --bench run FlashQLA, which TileLang compiles on first use (minutes per shape from a cold
    cache; gdnctl prewarm PRESET does it once ahead of the job); the compiler's own output goes to
    gdnctl-compile.log in the kernel cache directory.
    """
    from gdnctl.doctor import doctor_report

    # Kernel libraries (TileLang) log to stdout; with --json, stdout must carry the one JSON object only.
    with _stdout_to_stderr(json_output and (kernels or bench)):
        result = doctor_report(
            preset,
            set_ or [],
            facts_file=facts_file,
            save_facts=save_facts,
            kernels=kernels,
            bench=bench,
            chart=chart,
            progress=(lambda text: typer.echo(text, err=True)) if json_output else typer.echo,
        )
    if json_output:
        _emit_json(result.to_json())
    else:
        typer.echo(result.text(_colour()))
    raise typer.Exit(1 if result.failed else 0)


# --backend's values are the kernel backends' table (gdnctl/knowledge/gdn_backends.py), read only when the option is
# given or completed: importing gdnctl.knowledge (pydantic) would slow every `gdnctl --help` and completion.
def _known_gdn_backend(value: str | None) -> str | None:
    if value is None:
        return None
    from gdnctl.knowledge import GDN_BACKENDS

    if value not in GDN_BACKENDS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(map(repr, GDN_BACKENDS))}.")
    return value


def _complete_gdn_backend(incomplete: str) -> list[str]:
    from gdnctl.knowledge import GDN_BACKENDS

    return [name for name in GDN_BACKENDS if name.startswith(incomplete)]


@app.command()
def prewarm(
    preset: PresetArg,
    set_: SetOpt = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Kernel cache to fill (default: the preset's launch.kernel_cache_dir)."),
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Time a first call in a fresh process afterwards.")
    ] = True,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            metavar="<name>",
            callback=_known_gdn_backend,
            autocompletion=_complete_gdn_backend,
            help="GDN kernel to compile, a kernels.gdn_backend value (default: the preset's).",
        ),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Compile the GDN kernels for every per-rank shape of the preset into the shared kernel cache.

    FlashQLA (TileLang) goes into the kernel cache directory, FLA (Triton) into its triton/ folder, where the
    rendered scripts point TILELANG_CACHE_DIR and TRITON_CACHE_DIR. For FlashQLA it says up front what the compile
    will cost (minutes per shape from a cold cache), prints a line per kernel while TileLang compiles, and appends
    the compiler's own output to gdnctl-compile.log in the cache. With --json the progress goes to stderr."""
    from gdnctl.launch import prewarm as warmer
    from gdnctl.plan import DEFAULT_KERNEL_CACHE
    from gdnctl.validate import validate as run_validation

    result = run_validation(preset, set_ or [])
    if result.run is None or not result.ok:
        from gdnctl.validate import PresetHasErrors

        raise PresetHasErrors(result, "nothing was compiled")
    directory = cache_dir or Path(result.run.preset.launch.kernel_cache_dir or DEFAULT_KERNEL_CACHE)
    # Kernel libraries print to stdout while they compile; with --json, stdout must carry the one JSON object only.
    with _stdout_to_stderr(json_output):
        report = warmer.prewarm(
            result.run,
            directory,
            verify=verify,
            backend=backend,
            progress=(lambda text: typer.echo(text, err=True)) if json_output else typer.echo,
        )
    if json_output:
        _emit_json(report)
        return
    typer.echo(f"{report['backend']} kernel cache: {report['compiler_cache']}")
    for timing in report.get("fresh_process", []):
        ratio = report["first_over_warm"][timing["shape"]]
        typer.echo(
            f"  {timing['shape']}: first call in a fresh process {timing['first_call_s'] * 1000:.1f} ms, "
            f"warm {timing['warm_call_s'] * 1000:.1f} ms ({ratio:.2f}x)"
        )


@app.command("comm-report")
def comm_report(
    run_dir: Annotated[Path, typer.Argument(help="Run dir of a job that ran with comm.profile: true.")],
    threshold_mib: Annotated[
        float,
        typer.Option(
            "--threshold-mib", help="Largest steady-state memory change (MiB) for an op to count as skip-safe."
        ),
    ] = 64,
    json_output: JsonOpt = False,
) -> None:
    """Merge the per-rank communication profiles into slime PR #1947's table and recommend a skip set."""
    from gdnctl.launch import comm_report as reports

    report = reports.build_report(run_dir, threshold_mib)
    if json_output:
        _emit_json(reports.report_as_dict(report))
    else:
        typer.echo(reports.format_table(report))


def _shipped(name: str) -> Path:
    from gdnctl.resources import presets_dir
    from gdnctl.validate import resolve_preset_path

    path = resolve_preset_path(name)
    if not path.is_file():
        import difflib

        names = sorted(p.stem for p in presets_dir().glob("*.yaml"))
        close = difflib.get_close_matches(name.removesuffix(".yaml"), names, n=3, cutoff=0.6)
        _fail(
            f"no shipped preset '{name}'."
            + (f" Did you mean {' or '.join(close)}?" if close else "")
            + f" Shipped: {', '.join(names)}."
        )
    return path


@presets_app.command("list")
def presets_list(json_output: JsonOpt = False) -> None:
    """List the shipped presets with their job, model and cluster."""
    import yaml

    from gdnctl.resources import presets_dir
    from gdnctl.validate import load_preset

    rows = []
    for path in sorted(presets_dir().glob("*.yaml")):
        loaded = load_preset(path)
        p = loaded.preset
        description = (yaml.safe_load(path.read_text()) or {}).get("description") or (p.description if p else "")
        rows.append(
            {
                "name": path.stem,
                "job": p.job if p else "?",
                "model": (p.model.id or p.model.path) if p else "?",
                "cluster": f"{p.cluster.nodes}x{p.cluster.gpus_per_node} {p.cluster.gpu}" if p else "?",
                "description": description or "",
            }
        )
    if json_output:
        _emit_json(rows)
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        typer.echo(f"{r['name']:<{width}}  {r['job']:<8} {r['model']:<26} {r['cluster']:<11} {r['description']}")


@presets_app.command("show")
def presets_show(
    name: Annotated[str, typer.Argument(help="Shipped preset name.", autocompletion=_complete_preset)],
) -> None:
    """Print a shipped preset."""
    typer.echo(_shipped(name).read_text(), nl=False)


@presets_app.command("cp")
def presets_cp(
    name: Annotated[str, typer.Argument(help="Shipped preset name.", autocompletion=_complete_preset)],
    dest: Annotated[Path, typer.Argument(help="File or directory to copy it to.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Copy a shipped preset to edit it (or better: write `base: NAME` in your own)."""
    from gdnctl.launch import portable_text

    source = _shipped(name)
    target = dest / source.name if dest.is_dir() else dest
    if target.exists() and not force:
        _fail(f"{target} exists; pass --force to overwrite it.")
    text, changed = portable_text(source)
    target.write_text(text)
    typer.echo(f"copied {source.name} to {target}")
    if changed:
        typer.echo(
            f"  {', '.join(changed)} now name the shipped example files by their absolute paths, so the "
            "copy runs from any directory."
        )


def main() -> None:
    app()
