"""`gdnctl render`: run dir contents, refusal, --force, atomic writes, shellcheck, hostile values, goldens."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.resources import presets_dir, templates_dir
from gdnctl.schema.engine import EngineConfig
from tests.launch.helpers import hostile_values, recorded_calls, recorder, write_preset

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SHIPPED = sorted(p.stem for p in presets_dir().glob("*.yaml"))
SCRIPTS = ("launch_local.sh", "launch_slurm.sbatch")
# Variants that reach the template branches the shipped presets do not.
VARIANTS = {
    "separate-rollout": (
        "qwen3-next-80b-a3b-grpo",
        ["rollout.colocate=false", "rollout.num_gpus=8", "parallel.ep=8", "rollout.container_image=nvcr.io/vllm:0.33"],
    ),
    "slurm-everything": (
        "qwen3.5-35b-a3b-sft",
        [
            "launch.executor=slurm",
            "launch.slurm={partition: gpu, account: team, qos: high, constraint: h100&ib, "
            "mem: 0, cpus_per_task: 64, container_image: 'nvcr.io/nvidia/pytorch:25.01-py3', "
            "extra_sbatch: ['--reservation=big', '--comment=gdnctl']}",
            "launch.pass_env=[WANDB_API_KEY, HF_TOKEN]",
            "launch.env={WANDB_PROJECT: q35}",
        ],
    ),
    "no-requeue": ("selftest-cpu", ["launch.slurm.requeue=false"]),
}


def render(preset: str, out: Path, *overrides: str, force: bool = False):
    args = ["render", preset, "-o", str(out), "--set", "launch.kernel_cache_dir=/shared/tilelang"]
    for item in overrides:
        args += ["--set", item]
    if force:
        args.append("--force")
    return runner.invoke(app, args)


def test_run_dir_contents(tmp_path):
    out = tmp_path / "run"
    result = render("qwen3.5-35b-a3b-grpo", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "engine.yaml",
        "launch_local.sh",
        "launch_slurm.sbatch",
        "logs",
        "manifest.json",
    ]
    engine = EngineConfig.from_file(out / "engine.yaml")
    assert (engine.parallel.dp, engine.layout, engine.kernels.gdn_backend) == (4, "thd", "fla")
    assert engine.env["FLA_FLASH_QLA"] == "0" and engine.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert engine.env["TILELANG_CACHE_DIR"] == "/shared/tilelang"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine_config_sha256"] and manifest["preset"]["files"][0]["sha256"]
    assert manifest["commands"] == {"local": "bash launch_local.sh", "slurm": "sbatch launch_slurm.sbatch"}
    assert manifest["preset"]["overrides"] == ["launch.kernel_cache_dir=/shared/tilelang"]


def test_an_rl_run_keeps_vllms_compile_cache_in_the_kernel_cache_and_other_jobs_name_no_vllm_cache(tmp_path):
    """The rollout's engines compile the model unless rollout.enforce_eager: the next job's engines find that in
    the kernel cache directory, which a cluster keeps, rather than in the node's ~/.cache/vllm."""
    assert render("qwen3.5-35b-a3b-grpo", tmp_path / "rl").exit_code == 0
    rl = EngineConfig.from_file(tmp_path / "rl" / "engine.yaml")
    assert rl.env["VLLM_CACHE_ROOT"] == "/shared/tilelang/vllm"
    assert "export VLLM_CACHE_ROOT=/shared/tilelang/vllm" in (tmp_path / "rl" / "launch_slurm.sbatch").read_text()
    assert render("qwen3.5-35b-a3b-sft", tmp_path / "sft").exit_code == 0
    assert "VLLM_CACHE_ROOT" not in EngineConfig.from_file(tmp_path / "sft" / "engine.yaml").env


def test_refuses_preset_with_errors(tmp_path):
    out = tmp_path / "run"
    result = render("qwen3.5-35b-a3b-grpo", out, "parallel.tp=3")
    assert result.exit_code == 1 and "HEAD002" in result.stderr and "nothing was rendered" in result.stderr
    assert not out.exists()


def test_never_overwrites_without_force(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = render("selftest-cpu", out)
    assert result.exit_code == 2 and "--force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    # not a run dir gdnctl wrote: --force refuses it too (tests/test_cli_outcomes.py has the replace case)
    forced = render("selftest-cpu", out, force=True)
    assert forced.exit_code == 2 and "not a gdnctl run dir" in forced.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_failed_render_leaves_nothing(tmp_path):
    broken = tmp_path / "templates"
    shutil.copytree(templates_dir(), broken)
    (broken / "launch_slurm.sbatch.j2").write_text("{{ undefined_variable }}\n")
    (tmp_path / "runs").mkdir()
    out = tmp_path / "runs" / "run"
    result = runner.invoke(app, ["render", "selftest-cpu", "-o", str(out), "--templates", str(broken)])
    assert result.exit_code == 2 and "failed to render" in result.stderr
    assert not out.exists() and not list((tmp_path / "runs").iterdir())


def test_user_templates_are_used(tmp_path):
    mine = tmp_path / "templates"
    shutil.copytree(templates_dir(), mine)
    local = mine / "launch_local.sh.j2"
    local.write_text(local.read_text().replace("set -euo pipefail", "set -euo pipefail\n# site: my-cluster"))
    out = tmp_path / "run"
    assert runner.invoke(app, ["render", "selftest-cpu", "-o", str(out), "--templates", str(mine)]).exit_code == 0
    assert "# site: my-cluster" in (out / "launch_local.sh").read_text()


def _all_rendered(tmp_path) -> list[Path]:
    dirs = []
    for name in SHIPPED:
        out = tmp_path / name
        assert render(name, out).exit_code == 0
        dirs.append(out)
    for name, (preset, overrides) in VARIANTS.items():
        out = tmp_path / name
        result = render(preset, out, *overrides)
        assert result.exit_code == 0, result.output
        dirs.append(out)
    return dirs


def test_scripts_pass_bash_n_and_shellcheck(tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: the test command installs Debian's shellcheck")
    scripts = [d / s for d in _all_rendered(tmp_path) for s in SCRIPTS]
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
    proc = subprocess.run(["shellcheck", "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_variants_render_their_branches(tmp_path):
    separate = tmp_path / "separate"
    preset, overrides = VARIANTS["separate-rollout"]
    assert render(preset, separate, *overrides).exit_code == 0
    sbatch = (separate / "launch_slurm.sbatch").read_text()
    assert "--role rollout" in sbatch and "--relative=1" in sbatch and "--container-image=nvcr.io/vllm:0.33" in sbatch
    everything = tmp_path / "everything"
    preset, overrides = VARIANTS["slurm-everything"]
    assert render(preset, everything, *overrides).exit_code == 0
    sbatch = (everything / "launch_slurm.sbatch").read_text()
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --account=team",
        "#SBATCH --qos=high",
        "#SBATCH --constraint=h100&ib",
        "#SBATCH --mem=0",
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --reservation=big",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --exclusive",
    ):
        assert line in sbatch
    assert "WANDB_API_KEY" in sbatch and "export WANDB_API_KEY" not in sbatch


@pytest.mark.parametrize(
    "field,value",
    [
        ("launch.slurm.partition", "gpu; rm -rf /"),
        ("launch.slurm.account", "a\nb"),
        ("launch.slurm.extra_sbatch", "['--comment=$(id)']"),
        ("launch.slurm.constraint", "a b"),
    ],
)
def test_unsafe_sbatch_values_are_refused(tmp_path, field, value):
    result = render("selftest-cpu", tmp_path / "run", f"{field}={value}")
    assert result.exit_code == 1 and "PRE002" in result.stderr


def test_hostile_values_arrive_as_literal_data(tmp_path):
    """Every shell metacharacter in preset values reaches the process unchanged, and nothing else runs."""
    canary = tmp_path / "canary"
    values = hostile_values(canary)
    fake_dir = tmp_path / "bin $(touch canary) `x`; 'q'"
    fake = recorder(fake_dir)
    data = yaml.safe_load((presets_dir() / "selftest-cpu.yaml").read_text())
    data["name"] = "$(touch c1)`touch c2`; touch c3 'q' \"d\" x"  # a newline in a name is refused (PRE002)
    data["launch"] = {
        "python": str(fake),
        "env": {f"HOSTILE_{k.upper()}": v for k, v in values.items()},
        "kernel_cache_dir": str(tmp_path / "cache $(touch canary)"),
        "pass_env": ["GDNCTL_TEST_SECRET"],
    }
    preset = write_preset(tmp_path / "hostile.yaml", data)
    out = tmp_path / "run dir; $(touch canary)"
    assert runner.invoke(app, ["render", str(preset), "-o", str(out)]).exit_code == 0
    for script in SCRIPTS:
        assert "s3cr3t" not in (out / script).read_text()
    env = {"PATH": "/usr/bin:/bin", "GDNCTL_TEST_SECRET": "s3cr3t"}
    proc = subprocess.run(["bash", str(out / "launch_local.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (call,) = recorded_calls(fake_dir)
    for key, value in values.items():
        assert call["env"][f"HOSTILE_{key.upper()}"] == value
    assert call["env"]["GDNCTL_JOB_NAME"] == data["name"]
    assert call["env"]["TILELANG_CACHE_DIR"] == str(tmp_path / "cache $(touch canary)")
    assert call["env"]["GDNCTL_TEST_SECRET"] == "s3cr3t"
    assert call["argv"][-1] == str(out.resolve() / "engine.yaml")
    assert not canary.exists() and not (out / "canary").exists() and not (fake_dir / "canary").exists()
    for leftover in ("c1", "c2", "c3", "out"):
        assert not list(tmp_path.rglob(leftover)), leftover


def test_dry_run_prints_scripts_and_env_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "launch",
            "qwen3.5-35b-a3b-grpo",
            "--dry-run",
            "--run-dir",
            str(out),
            "--set",
            "launch.pass_env=[WANDB_API_KEY]",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "===== launch_local.sh =====" in result.stdout and "===== launch_slurm.sbatch =====" in result.stdout
    env_section = result.stdout.split("===== environment =====")[1]
    assert re.search(r"CUDA_DEVICE_MAX_CONNECTIONS\s+1\s+\(TP or CP > 1", env_section)
    assert re.search(r"WANDB_API_KEY\s+\(from the submitting shell\)", env_section)
    assert not out.exists()


def _normalised(text: str) -> str:
    # Hashes in manifest.json cover content with the checkout's absolute path in it (presets with local data
    # paths), so they differ per checkout; the hashed files themselves are compared with paths normalised. A
    # preset's `~/` (the CPU rl preset's rollout.python) is expanded to this user's home, written back as `~/`.
    # A preset without launch.python runs gdnctl's own interpreter, which differs per machine: <gdnctl's python>.
    text = text.replace(sys.executable, "<gdnctl's python>")
    text = text.replace(str(REPO), "<repo>").replace(f"{Path.home()}/", "~/")
    return re.sub(r'"([a-z_]*sha256)": "[0-9a-f]{64}"', r'"\1": "<sha256>"', text)


@pytest.mark.parametrize("name", SHIPPED + sorted(VARIANTS))
def test_golden_files(tmp_path, name, update_golden):
    preset, overrides = VARIANTS.get(name, (name, []))
    out = tmp_path / "run"
    assert render(preset, out, *overrides).exit_code == 0
    golden = GOLDEN / name
    files = ["engine.yaml", *SCRIPTS, "manifest.json"]
    if update_golden:
        golden.mkdir(parents=True, exist_ok=True)
        for file in files:
            (golden / file).write_text(_normalised((out / file).read_text()))
        return
    for file in files:
        expected = golden / file
        assert expected.exists(), f"no golden {expected}: run pytest --update-golden and review the diff"
        assert _normalised((out / file).read_text()) == expected.read_text(), (
            f"{name}/{file} differs from its golden file; if the change is intended, run "
            "pytest tests/launch --update-golden and commit the diff"
        )
