"""Turn a validated preset into a run dir: engine.yaml, launch scripts, manifest.

Every `{{ expression }}` in a template is shell-quoted by the environment's finalize hook, so a preset value
can only reach a script as literal data; templates mark trusted values (integers the compiler computed,
names it validated) with `| raw`, and `#SBATCH` values go through `| sbatch`, which refuses anything outside
a safe alphabet (sbatch reads those lines itself, not bash). The run dir is written to a temporary sibling
and renamed into place, so a failed render leaves nothing half-written; `--force` on a run dir gdnctl rendered
replaces only the files its manifest lists (run_dir.py says what it refuses and why).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from gdnctl import __version__
from gdnctl.errors import GdnctlError
from gdnctl.files import write_text
from gdnctl.launch import run_dir as run_dirs
from gdnctl.launch import submit
from gdnctl.launch.interpreter import job_python
from gdnctl.launch.run_dir import RunDirNotEmpty
from gdnctl.plan import DEFAULT_KERNEL_CACHE, compile_engine_config
from gdnctl.resources import templates_dir
from gdnctl.schema import SBATCH_SAFE, SBATCH_SAFE_TEXT
from gdnctl.validate import PresetHasErrors, ValidationResult, preset_code, validate

TEMPLATES = {"launch_local.sh": "launch_local.sh.j2", "launch_slurm.sbatch": "launch_slurm.sbatch.j2"}


class TemplateError(GdnctlError):
    pass


class _Raw(str):
    """A value the template author vouches for: written as is."""


def _finalize(value: object) -> str:
    if isinstance(value, _Raw):
        return str(value)
    return shlex.quote(str(value))


def _raw(value: object) -> _Raw:
    return _Raw(value)


def _sbatch(value: object) -> _Raw:
    text = str(value)
    if not SBATCH_SAFE.fullmatch(text):  # the whole value: a trailing newline would end the #SBATCH line
        raise TemplateError(f"'{text}' cannot be written into an #SBATCH line: {SBATCH_SAFE_TEXT}.")
    return _Raw(text)


def _comment(value: object) -> _Raw:
    """Text for a `# ...` line: kept on one line (a newline would end the comment and start a command)."""
    return _Raw(str(value).encode("unicode_escape").decode("ascii"))


def template_environment(directory: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        # bash uses `{#` (`${#array[@]}`), so Jinja comments get a delimiter bash never writes.
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["raw"] = _raw
    env.filters["sbatch"] = _sbatch
    env.filters["comment"] = _comment
    return env


def slurm_job_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64] or "gdnctl"


@dataclass
class RenderedRun:
    run_dir: Path
    files: dict[str, str]  # name -> content
    env_table: list[tuple[str, str, str]]  # name, value shown, source
    result: ValidationResult
    manifest: dict
    kept: list[str] = field(default_factory=list)  # what --force left in the run dir: not gdnctl's to replace


def _env_table(run, kernel_cache_dir: str) -> list[tuple[str, str, str]]:
    rows = [(name, value, reason) for name, value, reason in run.environment]
    rows += run.kernel_cache_environment(kernel_cache_dir)
    compiler_names = {row[0] for row in rows}
    for name, value in run.preset.launch.env.items():
        source = "launch.env (overrides the compiler)" if name in compiler_names else "launch.env"
        rows = [row for row in rows if row[0] != name] + [(name, value, source)]
    for name in run.preset.launch.pass_env:
        rows.append((name, "(from the submitting shell)", "launch.pass_env: passed by name, never written"))
    return rows


def _rollout_step(run) -> dict | None:
    rollout = run.preset.rollout
    if run.preset.job != "rl" or rollout is None or rollout.colocate:
        return None
    return {
        "nodes": run.rollout_gpus.value // run.preset.cluster.gpus_per_node,
        "python": rollout.python or job_python(run.preset),
        "container_image": rollout.container_image,
    }


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build(result: ValidationResult, run_dir: Path, templates: Path | None = None) -> RenderedRun:
    """Render every file in memory. Raises PresetHasErrors when the preset has errors."""
    if not result.ok or result.run is None:
        raise PresetHasErrors(result, "nothing was rendered")
    run = result.run
    preset = run.preset
    kernel_cache_dir = os.path.expanduser(preset.launch.kernel_cache_dir or DEFAULT_KERNEL_CACHE)
    engine = compile_engine_config(run, kernel_cache_dir=kernel_cache_dir)
    engine_yaml = engine.to_yaml()
    env = sorted(engine.env.items())
    rollout_step = _rollout_step(run)
    trainer_nodes = preset.cluster.nodes - (rollout_step["nodes"] if rollout_step else 0)
    context = {
        "name": preset.name,
        "job_name": slurm_job_name(preset.name),
        "gdnctl_version": __version__,
        "preset_path": Path(result.loaded.source).name,
        "python": job_python(preset),
        "env": env,
        "pass_env": preset.launch.pass_env,
        "nodes": preset.cluster.nodes,
        "gpus_per_node": preset.cluster.gpus_per_node if run.gpu.sm is not None else None,
        # A separate single-node rollout keeps some of this node's GPUs: the trainer starts fewer ranks.
        "procs_per_node": run.world_size.value // trainer_nodes,
        "trainer_nodes": trainer_nodes,
        "rollout_step": rollout_step,
        "slurm": preset.launch.slurm.model_dump(),
        # The files of the user's code the job imports (USR001 names them): the scripts check they are there.
        "user_code": [(named.field, named.reference.file) for named in preset_code(preset) if named.reference.file],
    }
    jinja = template_environment(templates or templates_dir())
    files = {"engine.yaml": engine_yaml}
    for output, template in TEMPLATES.items():
        try:
            files[output] = jinja.get_template(template).render(**context)
        except jinja2.TemplateNotFound:
            raise TemplateError(
                f"template {template} is missing from {templates or templates_dir()}; copy it "
                "from gdnctl's templates/ folder."
            ) from None
        except jinja2.TemplateError as err:
            raise TemplateError(f"template {template} failed to render: {err}.") from None
    manifest = {
        "gdnctl_version": __version__,
        "preset": {
            "path": result.loaded.source,
            "files": [{"path": path, "sha256": result.loaded.sha256[path]} for path in result.loaded.chain],
            "overrides": [],
            "resolved_sha256": _sha256(json.dumps(preset.model_dump(mode="json"), sort_keys=True)),
        },
        "engine_config_sha256": _sha256(engine_yaml),
        "resolved": result.resolved(),
        "findings": [f.to_json() for f in result.findings],
        "commands": {"local": "bash launch_local.sh", "slurm": "sbatch launch_slurm.sbatch"},
        # How `gdnctl launch` runs it (resume, status and logs read these back): launch.executor, and the Slurm job
        # name its log files are named after (logs/JOB_NAME-JOBID.out).
        "launch": {"executor": preset.launch.executor, "job_name": slurm_job_name(preset.name)},
        # What gdnctl wrote into the run dir, the only files `render --force` replaces (run_dir.py).
        "files": run_dirs.manifest_files(files),
    }
    return RenderedRun(run_dir, files, _env_table(run, kernel_cache_dir), result, manifest)


def _stage(rendered: RenderedRun, staging: Path) -> None:
    """Write every rendered file into `staging`, a directory just made for it (so nothing there is a link)."""
    for name, content in rendered.files.items():
        write_text(staging / name, content)
    write_text(staging / run_dirs.MANIFEST, json.dumps(rendered.manifest, indent=2) + "\n")
    for script in TEMPLATES:
        (staging / script).chmod(0o755)


def _create(rendered: RenderedRun) -> None:
    """A new (or empty) run dir: staged beside it and renamed into place whole."""
    run_dir = rendered.run_dir
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.rendering-", dir=run_dir.parent))
    try:
        _stage(rendered, staging)
        (staging / run_dirs.LOGS).mkdir()
        try:
            staging.rename(run_dir)  # replaces an empty directory; fails on one that has filled meanwhile
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            raise run_dirs.RunDirTaken(
                f"{run_dir} was created by someone else while gdnctl rendered it; choose another run dir."
            ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _replace(rendered: RenderedRun, manifest: dict) -> list[str]:
    """--force on a run dir gdnctl rendered: replace the files its manifest lists, under the run dir's lock and
    only when no Slurm job submitted from it is still queued or running; returns what was kept."""
    run_dir = rendered.run_dir
    listed = run_dirs.listed_files(manifest)
    with run_dirs.hold(run_dir):
        recorded = run_dirs.recorded_slurm_jobs(run_dir)
        unfinished = submit.unfinished_jobs(recorded) if recorded else []
        if unfinished:
            jobs = ", ".join(f"{job_id} ({state})" for job_id, state in unfinished)
            raise run_dirs.RunDirInUse(
                f"{run_dir} belongs to Slurm job {jobs}, which would run with the new "
                f"engine.yaml; scancel {' '.join(job for job, _ in unfinished)} or wait "
                "for it to end, or choose another run dir."
            )
        edited = run_dirs.edited_files(run_dir, listed, rendered.files)
        if edited:
            raise RunDirNotEmpty(
                f"{', '.join(str(run_dir / name) for name in edited)} changed since gdnctl rendered "
                "it, so --force will not replace it; move your copy out of the run dir (or delete "
                "it) and run again."
            )
        kept = run_dirs.kept_entries(run_dir, listed)
        # Staged inside the run dir, so that each file is renamed over its old copy on one file system.
        staging = Path(tempfile.mkdtemp(prefix=".gdnctl-rendering-", dir=run_dir))
        try:
            _stage(rendered, staging)
            for name in listed.keys() - rendered.files.keys() - {run_dirs.MANIFEST}:
                (run_dir / name).unlink(missing_ok=True)
            # manifest.json last: until it moves, the old one still describes the files of the old render.
            for name in [*rendered.files, run_dirs.MANIFEST]:
                os.replace(staging / name, run_dir / name)  # replaces a link at that name, never its target
            if not os.path.lexists(run_dir / run_dirs.LOGS):
                (run_dir / run_dirs.LOGS).mkdir()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return kept


def _use_as_rendered(rendered: RenderedRun) -> None:
    """`launch --run-dir DIR` on a run dir that `render` wrote and no job has used: run it as it is, when it holds
    exactly what this launch renders. A run dir a job has used (its outputs, its lock, a Slurm job) is resumed
    with `gdnctl resume`, which says what it does; nothing here replaces a file of it."""
    run_dir = rendered.run_dir
    manifest = run_dirs.read_manifest(run_dir)
    if manifest is None:
        raise RunDirNotEmpty(
            f"{run_dir} is not empty and not a gdnctl run dir (no manifest.json of gdnctl's in it); "
            "choose another run dir."
        )
    listed = run_dirs.listed_files(manifest)
    used = run_dirs.job_traces(run_dir, listed)
    if used:
        raise RunDirNotEmpty(
            f"{run_dir} has been run already (it holds {', '.join(used)}); continue it with "
            f"`gdnctl resume {shlex.quote(str(run_dir))}` (from its latest checkpoint, with the "
            "engine.yaml it has), or launch into a new run dir (leave out --run-dir)."
        )
    differ = [
        name
        for name, text in rendered.files.items()
        if not (run_dir / name).is_file()
        or (run_dir / name).is_symlink()
        or run_dirs.sha256((run_dir / name).read_bytes()) != run_dirs.sha256(text.encode())
    ]
    if differ:
        verb = "differs" if len(differ) == 1 else "differ"
        raise RunDirNotEmpty(
            f"{run_dir} was rendered from another preset, other --set values or another gdnctl "
            f"({', '.join(differ)} {verb} from what this launch renders); pass the same preset and "
            "--set values as `render` had, or --force to render this launch over it (it holds "
            "nothing but gdnctl's files), or leave out --run-dir."
        )


def next_step(rendered: RenderedRun, preset: str, overrides: list[str], templates: Path | None) -> str:
    """The command that runs what `render` just wrote, as render prints it. A run dir that holds only what gdnctl
    rendered: `launch --run-dir` with the same preset, --set values and templates, which uses it as it is
    (write's as_is). One --force rendered over a job's outputs, which `launch --run-dir` refuses: `resume`."""
    run_dir = rendered.run_dir
    if run_dirs.job_traces(run_dir, run_dirs.listed_files(rendered.manifest)):
        return shlex.join(["gdnctl", "resume", str(run_dir)])
    return shlex.join(
        [
            "gdnctl",
            "launch",
            preset,
            *(f"--set={item}" for item in overrides),
            *(["--templates", str(templates)] if templates is not None else []),
            "--run-dir",
            str(run_dir),
        ]
    )


def write(rendered: RenderedRun, force: bool = False, exclusive: bool = False, as_is: bool = False) -> list[str]:
    """Write the run dir: a new one whole, or with `force` the files of one gdnctl rendered. `exclusive`: the
    run dir must not exist at all (a default name). `as_is` (launch): a run dir gdnctl rendered that holds just
    what this render would write is used as it is. Returns the entries --force kept."""
    run_dir = rendered.run_dir
    run_dirs.refuse_link(run_dir)
    if exclusive and os.path.lexists(run_dir):
        raise run_dirs.RunDirTaken(f"{run_dir} exists; choose another run dir.")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirNotEmpty(f"{run_dir} exists and is not a directory; choose another run dir.")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if as_is and not force:
            _use_as_rendered(rendered)
            return []
        if not force:
            raise RunDirNotEmpty(
                f"{run_dir} is not empty; pass --force to replace the files gdnctl rendered "
                "there, or choose another run dir."
            )
        # Only a directory gdnctl rendered, and in it only what gdnctl wrote: `-o .` in a source tree must never
        # take the tree with it, and a job's checkpoints, logs and W&B runs stay where they are.
        manifest = run_dirs.read_manifest(run_dir)
        if manifest is None:
            raise RunDirNotEmpty(
                f"{run_dir} is not a gdnctl run dir (no manifest.json of gdnctl's in it), so "
                "--force will not write into it; choose another run dir, or empty it yourself."
            )
        return _replace(rendered, manifest)
    _create(rendered)
    return []


def _absolute(path: Path) -> Path:
    """`path` made absolute with its parent resolved and its last component as given, so that a link there is
    refused rather than followed."""
    path = Path(os.path.abspath(path))
    return path.parent.resolve() / path.name if path.name else path


# Draws of a default run dir name before giving up: each collides only with a launch in the same second that
# drew the same four hex digits.
DEFAULT_NAME_DRAWS = 5


def render(
    preset: str,
    run_dir: Path | None,
    overrides: list[str] | None = None,
    force: bool = False,
    templates: Path | None = None,
    dry_run: bool = False,
    before_write: Callable[[RenderedRun], None] | None = None,
    as_is: bool = False,
) -> RenderedRun:
    """Validate, render and (unless `dry_run`) write the run dir; `run_dir` None: a new one under runs/.
    `before_write` sees the rendered run before anything is written (launch's checks: a refusal writes nothing)."""
    result = validate(preset, overrides)
    default = run_dir is None
    name = result.run.preset.name if result.run is not None else "run"  # build refuses a preset without a run
    rendered = build(result, _absolute(run_dir or submit.default_run_dir(name)), templates)
    rendered.manifest["preset"]["overrides"] = list(overrides or [])
    if before_write is not None:
        before_write(rendered)
    draws = 1
    while not dry_run:
        try:
            rendered.kept = write(rendered, force=force and not default, exclusive=default, as_is=as_is)
            break
        except run_dirs.RunDirTaken:
            if not default or draws == DEFAULT_NAME_DRAWS:
                raise
            draws += 1
            rendered.run_dir = _absolute(submit.default_run_dir(name))
    return rendered
