"""The real doctor on this machine (CPU in CI) and replayed facts, through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FACTS = Path(__file__).parent / "facts"


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", "doctor", *args], capture_output=True, text=True, timeout=300
    )


def test_real_doctor_json_on_this_machine(tmp_path):
    proc = doctor("--json", "--save-facts", str(tmp_path / "facts.json"))
    data = json.loads(proc.stdout)
    names = {c["name"] for c in data["checks"]}
    assert {
        "python",
        "torch",
        "gpus",
        "driver",
        "nccl",
        "cudnn",
        "flash_qla",
        "tilelang",
        "fla",
        "megatron_core",
        "megatron_bridge",
        "transformer_engine",
        "vllm",
        "env",
        "kernel_cache",
    } <= names
    assert set(data["summary"]) == {"passed", "warnings", "failed", "skipped"}
    assert sum(data["summary"].values()) == len(data["checks"])
    assert proc.returncode == (1 if data["summary"]["failed"] else 0)
    assert "Traceback" not in proc.stderr
    assert json.loads((tmp_path / "facts.json").read_text())["python_version"]


def test_real_doctor_passes_the_cpu_selftest_preset():
    proc = doctor("selftest-cpu")
    assert proc.returncode == 0, proc.stdout
    assert " 0 failed, " in proc.stdout.rstrip().splitlines()[-1]


def test_replayed_a100_facts_fail_a_flashqla_preset():
    proc = doctor("qwen3.5-35b-a3b-grpo", "--set", "kernels.gdn_backend=flashqla", "--facts", str(FACTS / "a100.json"))
    assert proc.returncode == 1
    assert (
        "FAIL  preset.cluster.gpu  preset says h100 (SM90), this machine has NVIDIA A100-SXM4-80GB (SM80)"
        in proc.stdout
    )


def test_kernels_on_cpu_skip_cleanly():
    proc = doctor("qwen3.5-35b-a3b-grpo", "--kernels", "--json")
    kernels = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "kernels"]
    assert kernels == [
        {"name": "kernels", "status": "SKIP", "found": "no CUDA GPU: kernel parity needs one", "fix": ""}
    ]


def test_bench_without_gpu_is_a_clear_error():
    proc = doctor("qwen3.5-35b-a3b-grpo", "--bench")
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_facts_file(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    proc = doctor("--facts", str(bad))
    assert proc.returncode == 2 and "not a facts file" in proc.stderr


def test_real_doctor_checks_the_rl_preset_and_its_rollout_environment():
    import os

    vllm_python = os.environ.get("GDNCTL_TEST_VLLM_PYTHON", sys.executable)
    proc = doctor("tiny-qwen3.5-rl-cpu", "--set", f"rollout.python={vllm_python}", "--json")
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    # A CPU rl job needs no Megatron: never FAIL (SKIP without megatron-core, OK where the test extra installed
    # it for the config-agreement property test).
    assert checks["megatron_core"]["status"] in ("SKIP", "OK") and checks["rl_policy"]["status"] == "OK"
    assert f"rollout.python {vllm_python}" in checks["vllm"]["found"]
    if "GDNCTL_TEST_VLLM_PYTHON" in os.environ:
        assert checks["vllm"]["status"] == "OK" and proc.returncode == 0, proc.stdout
    else:  # this interpreter has no vLLM: the doctor says so and exits 1
        assert checks["vllm"]["status"] == "FAIL" and proc.returncode == 1
