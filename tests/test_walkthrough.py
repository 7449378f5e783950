"""A new user's first hour, command by command: the install check, the shipped presets, validate, explain, render,
launching the CPU preset here and on the local Slurm, and following the runs. Each step runs the real `gdnctl`
in a fresh directory and must exit as it promises, with no traceback and no "internal error" on the way.

Written over the commands rather than over the README's code blocks, so it holds whatever the README's layout;
a README step that is not here is one this test should grow.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import slurm_env

CPU_PRESET = "selftest-cpu"


def _gdnctl_command() -> list[str]:
    """The `gdnctl` script a user types, beside this interpreter (as pip installs it); else gdnctl's module."""
    script = Path(sys.executable).parent / "gdnctl"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gdnctl"]


class User:
    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home, self.env = home, env

    def run(self, *args: str, expect: int = 0, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run([*_gdnctl_command(), *args], capture_output=True, text=True, cwd=self.home,
                              env=self.env, timeout=timeout)
        said = proc.stdout + proc.stderr
        assert proc.returncode == expect, f"gdnctl {' '.join(args)} exited {proc.returncode}:\n{said}"
        assert "Traceback" not in said and "internal error" not in said, f"gdnctl {' '.join(args)}:\n{said}"
        return proc


@pytest.fixture
def user(tmp_path) -> User:
    home = tmp_path / "first-hour"
    home.mkdir()
    return User(home)


def test_first_hour_on_this_machine(user):
    assert user.run("--version").stdout.startswith("gdnctl ")
    user.run("--help")
    doctor = user.run("doctor", CPU_PRESET, timeout=600)
    assert "0 failed" in doctor.stdout
    listed = user.run("presets", "list").stdout
    assert CPU_PRESET in listed
    assert "did you mean" in user.run("validate", CPU_PRESET[:-1], expect=2).stderr.lower()
    assert "valid" in user.run("validate", CPU_PRESET).stdout
    user.run("validate", CPU_PRESET, "--strict")
    assert "derived values" in user.run("explain", CPU_PRESET).stdout
    rendered = user.run("render", CPU_PRESET, "-o", "my-run").stdout
    hint = next(line for line in rendered.splitlines() if line.startswith("run it: gdnctl "))
    # render's hint, as printed: it launches the rendered run dir as it is
    launched = user.run(*hint.removeprefix("run it: gdnctl ").split("   (or:")[0].split())
    assert "selftest: passed" in launched.stdout
    assert "selftest: passed" in user.run("launch", CPU_PRESET).stdout  # the default run dir, under runs/
    runs = user.run("runs").stdout.splitlines()
    assert len(runs) == 1 and f"{CPU_PRESET} (selftest, local) ended" in runs[0]
    run_dir = runs[0].split(":")[0]
    assert "ended" in user.run("status", run_dir).stdout
    assert "selftest: passed" in user.run("logs", run_dir).stdout
    assert "selftest: passed" in user.run("logs", "my-run").stdout
    assert "gdnctl resume" in user.run("launch", CPU_PRESET, "--run-dir", "my-run", expect=2).stderr
    user.run("resume", "my-run")


@pytest.mark.slurm
def test_first_hour_on_slurm(tmp_path, local_slurm):
    if shutil.which("sbatch", path=slurm_env(local_slurm).get("PATH")) is None:
        pytest.skip("the local Slurm's sbatch is not on PATH")
    home = tmp_path / "first-hour"
    home.mkdir()
    user = User(home, slurm_env(local_slurm))
    submitted = user.run("launch", CPU_PRESET, "--slurm").stdout
    assert "submitted job" in submitted and "follow it: gdnctl status" in submitted
    (run_dir,) = [str(path) for path in (home / "runs").iterdir()]
    assert "selftest: passed" in user.run("logs", run_dir, "--follow").stdout
    assert "COMPLETED" in user.run("status", run_dir).stdout
    assert "(Slurm job" in user.run("runs").stdout
    assert "nothing to cancel" in user.run("cancel", run_dir).stdout
