"""The user's code a preset makes the job run, as validate sees it: which files, and whether the function or class
each field names is there and takes what the job passes, found without running any of it.

validate never imports the user's code (that would run it, on the machine that validates, before anyone asked):
it reads each file and parses it with Python's `ast`. A module (`package.module:name`) is looked for along this
interpreter's sys.path as the import system's path finder would find its source (`package/module.py` or
`package/module/__init__.py` beneath a directory of `package`), its packages' `__init__` files not run. What
`ast` can tell is checked: that the module defines the name at its top level (a def, a class, an assignment or an
import binding it), and for a def or a class written there, its parameters. A name bound otherwise (an
assignment, an import, a decorated def) is left to the job, which imports the code before the model is built and
stops with a sentence if it is not what the field needs.
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gdnctl.files import read_text
from gdnctl.schema import CodeReference, parse_code_reference

# Larger than any reward or environment file is written by hand.
MAX_SOURCE_BYTES = 8 * 1024**2
# What the job passes a reward function, as keywords (runtime/rl/rewards/results.py RewardRequest.payload).
REWARD_KEYWORDS = ("prompt", "response", "response_ids", "record")
# Bases an environment class may name and still be checked whole: it inherits nothing the job calls, or only the
# contract's defaults (runtime/rl/environments/contract.py Environment: __init__(record) and limit_reward).
PLAIN_BASES = frozenset({"object"})
CONTRACT_BASES = frozenset({"Environment", "contract.Environment", "environments.Environment"})


@dataclass(frozen=True)
class NamedCode:
    field: str  # the preset's field
    reference: CodeReference
    what: str  # "function" or "class": what the field needs
    runs: str  # where the job runs it, for the note


def preset_code(preset) -> list[NamedCode]:
    """The user's code an rl preset names, field by field."""
    if preset.job != "rl" or preset.rollout is None:
        return []
    named = []
    reward = preset.grpo.reward
    if preset.rollout.environment is None and not isinstance(reward, str) and hasattr(reward, "function"):
        named.append(
            NamedCode(
                "grpo.reward.function",
                parse_code_reference(reward.function),
                "function",
                f"in {preset.grpo.reward_workers} worker process(es) beside trainer rank 0, once per sample",
            )
        )
    if preset.rollout.environment is not None:
        named.append(
            NamedCode(
                "rollout.environment.class",
                parse_code_reference(preset.rollout.environment.class_),
                "class",
                "in the trainer's processes (each makes the episodes' openings; rank 0 runs the episodes), one "
                "instance per episode",
            )
        )
    return named


def locate_module(module: str, search: list[str] | None = None) -> Path | None:
    """The source file `module` would be imported from along `search` (sys.path), found without importing it."""
    parts = module.split(".")
    for entry in search if search is not None else sys.path:
        base = Path(entry or os.getcwd())
        directory = base.joinpath(*parts[:-1])
        if not directory.is_dir():
            continue
        for candidate in (directory / f"{parts[-1]}.py", directory / parts[-1] / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def source_file(reference: CodeReference) -> Path | None:
    """The file the reference's code is in (a module located along sys.path); None when it is not found here."""
    if reference.file is not None:
        return Path(reference.file)
    assert reference.module is not None
    return locate_module(reference.module)


def parse(path: Path) -> ast.Module:
    """The file's syntax tree; gdnctl.files.UnreadableFile, or SyntaxError, when it has none."""
    return ast.parse(read_text(path, MAX_SOURCE_BYTES), filename=str(path))


def top_level(tree: ast.Module, name: str) -> ast.AST | Literal[True] | None:
    """The def or class statement that binds `name` at the module's top level; True when something else binds it
    (an assignment, an import, a star import), so its kind is unknown; None when nothing does."""
    found: ast.AST | Literal[True] | None = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = True if node.decorator_list else node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if bound == name or alias.name == "*":
                    found = True
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets: list[ast.expr] = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(target, ast.Name) and target.id == name for target in _names(targets)):
                found = True
        elif isinstance(node, (ast.If, ast.Try, ast.With)) and _binds_somewhere(node, name):
            found = True  # bound on a branch: which one runs is the import's business
    return found


def _names(targets: list[ast.expr]) -> list[ast.expr]:
    out: list[ast.expr] = []
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            out += _names(list(target.elts))
        else:
            out.append(target)
    return out


def _binds_somewhere(node: ast.AST, name: str) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and inner.name == name:
            return True
        if isinstance(inner, ast.Name) and inner.id == name and isinstance(inner.ctx, ast.Store):
            return True
        if isinstance(inner, (ast.Import, ast.ImportFrom)) and any(
            (alias.asname or alias.name.split(".")[0]) == name for alias in inner.names
        ):
            return True
    return False


def _required(arguments: ast.arguments) -> tuple[list[str], list[str], list[str]]:
    """(positional-only names without a default, positional-or-keyword names without one, keyword-only names
    without one)."""
    positional = arguments.posonlyargs + arguments.args
    defaults = len(arguments.defaults)
    undefaulted = positional[: len(positional) - defaults] if defaults else positional
    posonly = [a.arg for a in undefaulted if a in arguments.posonlyargs]
    plain = [a.arg for a in undefaulted if a in arguments.args]
    kwonly = [a.arg for a, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if default is None]
    return posonly, plain, kwonly


def reward_signature_problem(node: ast.AST) -> str | None:
    """Why the job's call score(prompt=..., response=..., response_ids=..., record=...) would fail, or None."""
    if isinstance(node, ast.ClassDef):
        return f"{node.name} is a class; grpo.reward.function names a function the job calls once per sample"
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    arguments = node.args
    accepted = {a.arg for a in arguments.args + arguments.kwonlyargs}
    posonly, plain, kwonly = _required(arguments)
    if posonly:
        return f"{node.name} takes {', '.join(posonly)} by position only, and the job passes every argument by keyword"
    if arguments.kwarg is None:
        missing = [keyword for keyword in REWARD_KEYWORDS if keyword not in accepted]
        if missing:
            return (
                f"{node.name} takes no {', '.join(missing)}, which the job passes (it calls "
                f"{node.name}({', '.join(f'{k}=...' for k in REWARD_KEYWORDS)}); add them or **kwargs"
            )
    extra = [name for name in plain + kwonly if name not in REWARD_KEYWORDS]
    if extra:
        return f"{node.name} needs {', '.join(extra)}, which the job does not pass; give them defaults"
    return None


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _takes_positional(method: ast.FunctionDef | ast.AsyncFunctionDef, count: int) -> bool:
    """Whether the method can be called with `count` positional arguments after self."""
    arguments = method.args
    positional = (arguments.posonlyargs + arguments.args)[1:]  # self
    required = len(positional) - len(arguments.defaults)
    _, _, kwonly = _required(arguments)
    fits = arguments.vararg is not None or len(positional) >= count
    return fits and required <= count and not kwonly


def environment_problems(node: ast.AST) -> list[str]:
    """Why the job cannot use the class as an environment: Env(record), .start(), .step(response)."""
    if not isinstance(node, ast.ClassDef):
        return [
            f"{getattr(node, 'name', 'it')} is a function; rollout.environment.class names a class, one instance "
            "per episode"
        ]
    bases = {ast.unparse(base) for base in node.bases}
    # A base this file cannot show may bring any method; the contract's base brings __init__(record) only.
    whole = bases <= PLAIN_BASES | CONTRACT_BASES and not node.keywords
    problems = []
    calls = (("__init__", 1, "Env(record)"), ("start", 0, "start()"), ("step", 1, "step(response)"))
    for name, count, call in calls:
        method = _method(node, name)
        if method is None:
            if not whole or (name == "__init__" and bases & CONTRACT_BASES):
                continue
            problems.append(
                f"{node.name} has no {name}{'(self, record)' if name == '__init__' else ''}, and the job calls {call}"
            )
        elif not method.decorator_list and not _takes_positional(method, count):
            problems.append(f"{node.name}.{name} cannot be called as {call}")
    return problems
