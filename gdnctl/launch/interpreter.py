"""Which Python runs the job, and whether it can.

A preset that does not set launch.python runs the job with the interpreter gdnctl itself runs in: the one a user
installed gdnctl into. The first `python3` on PATH was another Python as often as not (`…/venv/bin/gdnctl launch`
without activating the venv), and the job then died on `No module named 'torch'` in a line from torchrun.

Before a local launch writes anything, the interpreter is asked whether it has the runtime's packages (found,
not imported: importing torch takes seconds), so a venv without the `runtime` extra gets a sentence that names
the extra and `gdnctl doctor`, and no run dir is left behind. A Slurm job's interpreter is on the compute node,
which this host cannot ask: doctor checks it there.
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
PROBE_TIMEOUT_S = 60


class RuntimeMissing(GdnctlError):
    pass


def job_python(preset) -> str:
    """The interpreter the job runs with (validate's trainer_python: the rules and doctor judge the same one)."""
    return trainer_python(preset)


def _missing_here() -> list[str]:
    return [name for name in RUNTIME_MODULES if importlib.util.find_spec(name) is None]


def _missing_in(python: str) -> list[str] | None:
    """The modules `python` cannot find; None when it does not start at all."""
    probe = ("import importlib.util, sys\n"
             f"print(' '.join(n for n in {RUNTIME_MODULES!r} if importlib.util.find_spec(n) is None))")
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.split()


def check(python: str, preset_name: str) -> None:
    """Raise RuntimeMissing, with the fix, when `python` cannot run gdnctl's runtime."""
    own = python == sys.executable
    missing = _missing_here() if own else _missing_in(python)
    doctor = f"`gdnctl doctor {shlex.quote(preset_name)}` then checks the rest of this machine"
    if missing is None:
        raise RuntimeMissing(f"launch.python {python} does not start here; set launch.python to the interpreter "
                             f"of the environment that has gdnctl's runtime (or leave it out to use gdnctl's own, "
                             f"{sys.executable}); {doctor}.")
    if not missing:
        return
    where = "gdnctl's own interpreter" if own else f"launch.python {python}"
    install = (f"{shlex.quote(python)} -m pip install 'gdnctl[runtime]'" if "gdnctl" not in missing
               else f"install gdnctl with its runtime extra there ({shlex.quote(python)} -m pip install "
                    "'gdnctl[runtime]', or -e '.[runtime]' from a clone)")
    raise RuntimeMissing(f"{where} cannot run the job: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                         f"not installed there (gdnctl's `runtime` extra); {install}, or point launch.python at an "
                         f"environment that has it. {doctor[0].upper()}{doctor[1:]}. Nothing was written.")
