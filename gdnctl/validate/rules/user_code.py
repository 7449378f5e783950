"""The user's code a preset makes the job run (grpo.reward.function, rollout.environment.class): named in a note,
there, defined, callable as the job calls it, and out of other users' reach. validate reads the files and parses
them (gdnctl/validate/user_code.py); it never imports or runs them."""

from __future__ import annotations

import ast
import sys

from gdnctl.files import UnreadableFile
from gdnctl.schema import RewardFunctionSpec
from gdnctl.validate.filesystem import replaceable_by_others, trainer_python
from gdnctl.validate.findings import Issue, Severity, rule
from gdnctl.validate.user_code import (
    environment_problems,
    parse,
    preset_code,
    reward_signature_problem,
    source_file,
    top_level,
)


def _runs_here(preset) -> bool:
    """Whether the job runs on this machine with this interpreter, so what this interpreter cannot import, the job
    cannot either."""
    return preset.launch.executor == "local" and trainer_python(preset) == sys.executable


def _where(named) -> str:
    reference = named.reference
    return reference.file if reference.file is not None else f"module {reference.module}"


def _parsed(named):
    """(file, tree) of code that validate can read; None where USR002 reports why not (or nothing can be known)."""
    path = source_file(named.reference)
    if path is None:
        return None
    try:
        return path, parse(path)
    except (UnreadableFile, SyntaxError, ValueError):
        return None


@rule("USR001", Severity.INFO, "The code of yours the job runs")
def user_code_runs(run):
    """
    What it checks: nothing; it names each file of the user's code an rl preset makes the job run: the file of
    grpo.reward.function (run in grpo.reward_workers worker processes beside trainer rank 0) and of
    rollout.environment.class (run in the trainer's processes: each makes the episodes' opening prompts, rank 0
    runs the episodes). A module's file is the one this interpreter
    would import.

    Why: user code runs only where the preset names it, and with your account and the job's allocation; this says
    which files that is before anything runs, so a review of the preset sees them. validate itself only reads and
    parses them (Python's ast), never imports them: importing a module runs it.

    Source: gdnctl's runtime: runtime/rl/user_code.py imports exactly these (a file by its path, a module by its
    name), runtime/rl/rewards/pool.py runs the reward function's workers, runtime/rl/rollout/episodes.py the
    environment.

    Fix: nothing to fix; read the files it names.
    """
    for named in preset_code(run.preset):
        path = source_file(named.reference)
        if named.reference.file is not None:
            where = named.reference.file
        elif path is not None:
            where = f"module {named.reference.module} ({path} on this interpreter's path)"
        else:
            where = f"module {named.reference.module} (not found on this interpreter's path)"
        yield Issue(
            named.field,
            f"{named.field} runs {named.reference.name} of {where} {named.runs}.",
            "This is your code, run with your account: check it does only what you expect.",
        )


@rule("USR002", Severity.ERROR, "The code a preset names is missing or not Python")
def user_code_missing(run):
    """
    What it checks: the file of grpo.reward.function and rollout.environment.class exists, is a regular file and
    parses as Python; a module (`package.module:name`) is found on this interpreter's path (as a .py file or a
    package's __init__.py, without importing anything). A module this interpreter cannot find is an error when the
    job runs here with it (launch.executor local, launch.python unset), a warning otherwise: the job's own
    interpreter may have it.

    Why: the job imports the code before the trainer builds its model, and stops there if it cannot; found here,
    the mistake costs a second instead of a job's start-up (and on Slurm, its allocation).

    Source: gdnctl's runtime/rl/user_code.py (load: importlib's spec_from_file_location for a file,
    import_module for a module) and Python's ast.parse.

    Fix: point the field at the file (relative to the preset) or at an installed module, and fix the syntax error
    it names.
    """
    preset = run.preset
    for named in preset_code(preset):
        reference = named.reference
        path = source_file(reference)
        if path is None:
            here = _runs_here(preset)
            yield Issue(
                named.field,
                f"{named.field} names module {reference.module}, which is not on this interpreter's path "
                f"({sys.executable})" + ("" if here else "; the job's interpreter may have it") + ".",
                f"Install the package into the trainer's environment, or name the file instead "
                f"(path/to/file.py:{reference.name}).",
                None if here else Severity.WARNING,
            )
            continue
        try:
            parse(path)
        except UnreadableFile as error:
            yield Issue(
                named.field,
                f"{named.field}: {error}.",
                f"Point {named.field} at your .py file (a relative path is relative to the preset).",
            )
        except (SyntaxError, ValueError) as error:
            line = f":{error.lineno}" if isinstance(error, SyntaxError) and error.lineno else ""
            reason = error.msg if isinstance(error, SyntaxError) else str(error)
            yield Issue(
                named.field,
                f"{named.field}: {path}{line} is not valid Python ({reason}).",
                "Fix the syntax error; the job would stop at it when it imports the file.",
            )


@rule("USR003", Severity.ERROR, "The name a preset's code reference gives is not defined there")
def user_code_name_missing(run):
    """
    What it checks: the file (or the module's file) binds the name after the colon at its top level: a def, a
    class, an assignment or an import (a star import, or a binding inside an if or try, counts as binding it).

    Why: the job takes the name from the imported module (getattr) and stops when it is not there; a misspelt
    name is found here without running the module.

    Source: gdnctl's runtime/rl/user_code.py (load: getattr on the imported module); Python's ast.

    Fix: name a function or class the file defines at its top level, or define it.
    """
    for named in preset_code(run.preset):
        parsed = _parsed(named)
        if parsed is None:
            continue
        path, tree = parsed
        if top_level(tree, named.reference.name) is None:
            defined = [
                n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            ]
            shown = ", ".join(defined[:8]) + (" and more" if len(defined) > 8 else "") if defined else "none"
            yield Issue(
                named.field,
                f"{path} defines no {named.reference.name} at its top level (its defs and classes: {shown}).",
                f"Name one it defines after the colon ({_where(named)}:NAME), or define {named.reference.name}.",
            )


@rule("USR004", Severity.ERROR, "The function or class cannot be called as the job calls it")
def user_code_signature(run):
    """
    What it checks: a def that grpo.reward.function names takes the keywords prompt, response, response_ids and
    record (or **kwargs) and needs no other argument; a class that rollout.environment.class names can be made
    as Env(record) and has start() and step(response). Only a def or class written in the file without a
    decorator is checked (a decorator may change what it takes); methods a base from another file may bring are
    not required.

    Why: the job calls score(prompt=..., response=..., response_ids=..., record=...) for every sample and makes
    every episode's environment as Env(record); a function or class that cannot take them fails each call, the
    reward worker's or the episode's, after the model was built.

    Source: gdnctl's runtime/rl/rewards/results.py (RewardRequest.payload, the keywords), runtime/rl/rewards/
    worker.py (the call) and runtime/rl/rollout/episodes.py (Env(record), start(), step(response));
    runtime/rl/environments/contract.py is the contract.

    Fix: give the function those parameters (or **kwargs) and defaults for any other; give the class
    __init__(self, record), start(self) and step(self, response), or subclass
    gdnctl.runtime.rl.environments.Environment.
    """
    for named in preset_code(run.preset):
        parsed = _parsed(named)
        if parsed is None:
            continue
        path, tree = parsed
        node = top_level(tree, named.reference.name)
        if node is None or node is True:
            continue
        if named.what == "function":
            problem = reward_signature_problem(node)
            problems = [] if problem is None else [problem]
        else:
            problems = environment_problems(node)
        for problem in problems:
            yield Issue(
                named.field,
                f"{named.field}: in {path}, {problem}.",
                'Define the function as score(prompt, response, response_ids, record) (docs/rl.md, "A reward '
                'function").'
                if named.what == "function"
                else "Give the class __init__(self, record), start(self) and step(self, response) (docs/rl.md, "
                '"An environment").',
            )


@rule("USR005", Severity.ERROR, "Code another user could replace")
def user_code_replaceable(run):
    """
    What it checks: the file of each piece of the user's code the preset names (a module's file as this
    interpreter would import it) is judged as LCH006 judges an interpreter: no directory on the way to it, nor the
    file, is owned by a user other than you or root, and none is writable by every user unless it is sticky and
    the next entry on the way exists. Symbolic links are followed, and the path as written is checked too.

    Why: the job imports and runs this file as you, with your files, credentials and allocation. One under a
    directory another user controls (`/tmp/rewards.py`, or a world-writable project directory) could be swapped
    for their code between validate and the job's start.

    Source: the sticky bit's rule (unlink(2) and rename(2), EPERM: in a sticky directory only an entry's owner,
    the directory's owner or a privileged process may remove or rename it; path_resolution(7));
    gdnctl/validate/filesystem.py, LCH006's judgement, applied to these files.

    Fix: keep the file in a directory only you (or root) can write, such as your project beside the preset, and
    point the field at it there.
    """
    for named in preset_code(run.preset):
        path = source_file(named.reference)
        if path is None:
            continue
        problem = replaceable_by_others(str(path))
        if problem is not None:
            yield Issue(
                named.field,
                f"{named.field} names {path}, which another user could replace: {problem}.",
                "Keep the file in a directory only you (or root) can write, such as your project beside the "
                f"preset, and point {named.field} at it there.",
            )


@rule("USR006", Severity.WARNING, "A reward setting the job does not use")
def unused_reward_settings(run):
    """
    What it checks: an rl preset sets grpo.reward or grpo.reward_workers beside rollout.environment, or
    grpo.reward_workers with a grpo.reward that is not a function.

    Why: an environment ends each episode with its reward (step() returns it), and that is the sample's reward:
    grpo.reward is not used, and a reward function it names is not started. grpo.reward_workers sizes a reward
    function's worker pool; a shipped reward runs inline and a server has grpo.reward.concurrency.

    Source: gdnctl's runtime/rl/job.py (the scorer is made only without rollout.environment),
    runtime/rl/rollout/episodes.py (each sample's reward is its episode's) and runtime/rl/rewards/scoring.py
    (make_scorer: only a function's pool has workers).

    Fix: remove the setting; with an environment, score in its step() (a helper of yours that both use can live
    beside the environment's file).
    """
    preset = run.preset
    if preset.job != "rl" or preset.rollout is None:
        return
    grpo = preset.grpo
    if preset.rollout.environment is not None:
        for field in ("reward", "reward_workers"):
            if field in grpo.model_fields_set:
                yield Issue(
                    f"grpo.{field}",
                    f"grpo.{field} is set, but rollout.environment scores its own episodes, so it is not used.",
                    f"Remove grpo.{field}; the environment's step() returns each episode's reward.",
                )
    elif "reward_workers" in grpo.model_fields_set and not isinstance(grpo.reward, RewardFunctionSpec):
        yield Issue(
            "grpo.reward_workers",
            "grpo.reward_workers sizes a reward function's worker pool, and grpo.reward names no function.",
            "Remove grpo.reward_workers (a server's requests in flight are grpo.reward.concurrency).",
        )
