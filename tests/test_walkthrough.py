"""A new user's first hour: README.md's commands, top to bottom, as printed, on this CPU machine and the local
Slurm; then what the README leaves to the user's curiosity (doctor, a mistyped name, render's hint). Each step runs
the real `gdnctl` in a fresh directory (the clone's examples/ beside it, as in a clone) and must exit as the README
says, with no traceback and no "internal error" on the way.

The README is the script: the commands are read from its bash blocks, so a step added there runs here, and a step
that fails on a fresh clone fails this test. A command exits 0 unless its comment starts with "exit N:"; `runs/NAME`
is the run dir of the launch before it. Lines that are not gdnctl (pip, `bash tools/test.sh`) are what set up the
environment this test runs in.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import slurm_env

CPU_PRESET = "selftest-cpu"
ROOT = Path(__file__).resolve().parents[1]
EXPECTED_EXIT = re.compile(r"#\s*exit (\d+):")


def _gdnctl_command() -> list[str]:
    """The `gdnctl` script a user types, beside this interpreter (as pip installs it); else gdnctl's module."""
    script = Path(sys.executable).parent / "gdnctl"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gdnctl"]


class User:
    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home, self.env = home, env

    def run(self, *args: str, expect: int = 0, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [*_gdnctl_command(), *args], capture_output=True, text=True, cwd=self.home, env=self.env, timeout=timeout
        )
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


def readme_commands(text: str) -> list[tuple[list[str], int]]:
    """(gdnctl's arguments, the exit code the README gives) of each gdnctl command in the bash blocks, in order."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        for line in block.splitlines():
            found = EXPECTED_EXIT.search(line)
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            command: list[str] = []
            for token in [*lexer, ";"]:
                if token in (";", "&&"):
                    if command[:1] == ["gdnctl"]:
                        commands.append((command[1:], int(found.group(1)) if found else 0))
                    command = []
                else:
                    command.append(token)
    return commands


def test_the_readme_parse_finds_its_commands():
    commands = readme_commands((ROOT / "README.md").read_text())
    verbs = {args[0] for args, _ in commands}
    assert {
        "validate",
        "explain",
        "rules",
        "presets",
        "render",
        "launch",
        "resume",
        "runs",
        "status",
        "logs",
        "cancel",
    } <= verbs
    assert (["validate", "qwen3.5-35b-a3b-grpo", "--set", "parallel.tp=3", "--json"], 1) in commands
    assert (["launch", CPU_PRESET], 0) in commands and (["validate", "my.yaml", "--strict"], 1) in commands


# What a step prints besides its exit code, keyed by the README's words for it.
SAYS = {
    f"launch {CPU_PRESET}": "selftest: passed",
    f"render {CPU_PRESET} -o runs/first": "run it: gdnctl launch selftest-cpu --run-dir {home}/runs/first",
    f"launch {CPU_PRESET} --run-dir runs/first": "selftest: passed",
    "resume runs/first": "selftest: passed",
    f"launch {CPU_PRESET} --slurm --wait": "selftest: passed",
    f"launch {CPU_PRESET} --slurm": "follow it: gdnctl status",
    "runs": "(Slurm job",
    "logs runs/NAME --follow": "selftest: passed",
    "cancel runs/NAME": "nothing to cancel",
}


@pytest.mark.slurm
def test_the_readme_top_to_bottom(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    if shutil.which("sbatch", path=env.get("PATH")) is None:
        pytest.skip("the local Slurm's sbatch is not on PATH")
    home = tmp_path / "clone"
    home.mkdir()
    shutil.copytree(ROOT / "examples", home / "examples")
    user = User(home, env)
    latest = None  # the run dir of the latest launch: the README's runs/NAME
    ran = []
    for args, expect in readme_commands((ROOT / "README.md").read_text()):
        words = " ".join(args)
        if "runs/NAME" in words:
            assert latest is not None, f"gdnctl {words}: no launch before it to take NAME from"
            args = [arg.replace("runs/NAME", latest) for arg in args]
        proc = user.run(*args, expect=expect, timeout=600)
        said = proc.stdout + proc.stderr
        if words in SAYS:
            assert SAYS[words].format(home=home) in said, f"gdnctl {words}:\n{said}"
        rendered = re.search(r"^gdnctl: rendered (\S+)$", proc.stderr, re.MULTILINE)
        if args[0] == "launch" and rendered:
            latest = rendered.group(1)
        ran.append(words)
    assert set(SAYS) <= set(ran), f"README steps this test checks are gone: {sorted(set(SAYS) - set(ran))}"
