"""Launch settings: what the chosen executor can run, and what the preset may put into the job's environment."""

from __future__ import annotations

from gdnctl.validate.findings import Issue, Severity, rule


@rule("LCH001", Severity.ERROR, "The local executor runs on one node")
def local_single_node(run):
    """
    What it checks: launch.executor: local with cluster.nodes > 1.

    Why: the local script runs torchrun --standalone on this host; other nodes would never start.

    Source: gdnctl's local script: templates/launch_local.sh.j2 runs torch.distributed.run --standalone --nnodes 1.

    Fix: use the Slurm executor (`gdnctl launch --slurm`, or launch.executor: slurm), or cluster.nodes: 1.
    """
    p = run.preset
    if p.launch.executor == "local" and p.cluster.nodes > 1:
        yield Issue("launch.executor", f"the local executor runs on this host only, but the cluster has "
                                       f"{p.cluster.nodes} nodes.",
                    "Launch with --slurm (or set launch.executor: slurm), or set cluster.nodes: 1.")


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
def obeyed_env_names(run):
    """
    What it checks: launch.env and launch.pass_env name none of the variables that bash, the dynamic loader
    or Python execute or obey: BASH_ENV, ENV, PS0, PS1, PS2, PS4, PROMPT_COMMAND, SHELLOPTS, BASHOPTS, IFS,
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

    Fix: remove the name from launch.env / launch.pass_env, or set it in your own environment outside gdnctl.
    """
    launch = run.preset.launch
    named = [(f"launch.env.{name}", name) for name in launch.env]
    named += [(f"launch.pass_env[{index}]", name) for index, name in enumerate(launch.pass_env)]
    for path, name in named:
        if name in OBEYED_NAMES:
            yield Issue(path, f"{name} is not an environment setting but an instruction: "
                              f"{OBEYED_NAMES[name]}.",
                        f"Remove {name} from the preset, or set it in your own environment outside gdnctl.")


@rule("LCH003", Severity.WARNING, "launch.env replaces PATH, LD_LIBRARY_PATH or PYTHONPATH")
def search_path_override(run):
    """
    What it checks: launch.env sets PATH, LD_LIBRARY_PATH or PYTHONPATH.

    Why: the value replaces the variable for the whole job, on every node: a PATH without the directory of
    torchrun, or an LD_LIBRARY_PATH without CUDA's libraries, fails minutes in, on the cluster, and one that
    puts another directory first makes the job run other programs or libraries than the ones installed.

    Source: bash(1), "Shell Variables" (PATH); ld.so(8), ENVIRONMENT (LD_LIBRARY_PATH); Python's documentation,
    "Command line and environment" (PYTHONPATH).

    Fix: set launch.python to the interpreter of the environment you want, or set the variable in your own
    environment (or the cluster's module system) outside gdnctl.
    """
    for name in run.preset.launch.env:
        if name in SEARCH_PATHS:
            yield Issue(f"launch.env.{name}", f"launch.env replaces {name}, {SEARCH_PATHS[name]}, on every node.",
                        "Set launch.python to the environment's interpreter, or set it in your own environment "
                        "outside gdnctl.")
