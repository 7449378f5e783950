"""The user's code that an rl job runs where its preset names it (grpo.reward.function, rollout.environment.class):
importing it, and reading the numbers it gives back. Standard library only: the reward pool's worker processes
import this and nothing heavier.

A file (`path/to/file.py:name`) is imported under a module name of its own, with its directory appended to
sys.path (appended, so a file there cannot shadow an installed module) for the helpers beside it; a module
(`package.module:name`) is imported from the trainer's interpreter's path.

A score is a number (bool counts as 0 or 1), or a mapping with a number under `score` and other numbers beside
it, which the job reports as metrics (`reward/NAME`, the step's mean). Every number must be finite.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any

from gdnctl.errors import GdnctlError

# The module name a file's code is imported under: never an installed module's.
_FILE_MODULE_PREFIX = "gdnctl_user_code_"


class UserCodeError(GdnctlError):
    """The code a preset names cannot be imported, is not what the field needs, or failed."""

    exit_code = 1


class ScoreError(ValueError):
    """What the user's code returned is not a finite score (the sentence says why)."""


def describe(code) -> str:
    """`FIELD FILE:NAME`, how messages name the code (`code` is an EngineUserCode or its dict)."""
    fields = code if isinstance(code, Mapping) else code.model_dump()
    return f"{fields['field']} {fields['file'] or fields['module']}:{fields['name']}"


def load(code) -> Any:
    """The object `code` (an EngineUserCode, or its model_dump in a worker process) names, its module imported;
    UserCodeError with a sentence when that fails."""
    fields = code if isinstance(code, Mapping) else code.model_dump()
    who = describe(fields)
    if fields["file"]:
        module = _import_file(fields["file"], who)
    else:
        try:
            module = importlib.import_module(fields["module"])
        except ModuleNotFoundError as error:
            if error.name and fields["module"].startswith(error.name):
                raise UserCodeError(
                    f"{who}: no module {error.name} on the trainer's Python path; install the package into the "
                    "trainer's environment, or name the file instead (path/to/file.py:name)."
                ) from None
            raise UserCodeError(f"{who}: importing it failed: {raised(error)}; fix the import.") from None
        except Exception as error:  # noqa: BLE001 - the user's module body may raise anything
            raise UserCodeError(f"{who}: importing it failed: {raised(error)}; fix the module.") from None
    try:
        return getattr(module, fields["name"])
    except AttributeError:
        raise UserCodeError(
            f"{who}: the module defines no {fields['name']}; define it at the module's top level, or name one "
            "it defines."
        ) from None


def _import_file(path: str, who: str):
    if not os.path.isfile(path):
        raise UserCodeError(f"{who}: {path} is not a file here; point the field at the file.")
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.append(directory)
    name = _FILE_MODULE_PREFIX + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{who}: {path} cannot be imported as Python; name a .py file.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a class's module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise UserCodeError(f"{who}: {path}:{error.lineno}: {error.msg}; fix the syntax.") from None
    except Exception as error:  # noqa: BLE001 - the user's module body may raise anything
        raise UserCodeError(f"{who}: importing {path} failed: {raised(error)}; fix the module.") from None
    return module


def raised(error: BaseException) -> str:
    """`TypeError: message (file.py:12)`: the exception and the innermost frame it came from."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def read_score(value: Any) -> tuple[float, dict[str, float]]:
    """(score, extra metrics) from what a reward function or an environment returned; ScoreError otherwise."""
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ScoreError(f"it returned a mapping without a 'score' (keys: {', '.join(map(str, value)) or 'none'})")
        extras = {}
        for key, number in value.items():
            if key != "score":
                extras[str(key)] = _finite(number, f"its '{key}'")
        return _finite(value["score"], "its score"), extras
    return _finite(value, "it"), {}


def _finite(value: Any, what: str) -> float:
    if not isinstance(value, numbers.Real):
        raise ScoreError(f"{what} is {type(value).__name__} {_short(value)}, not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ScoreError(f"{what} is {number}, not a finite number")
    return number


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
