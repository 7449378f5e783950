"""Failures users of slime, verl, NeMo-RL and Megatron-Bridge reported, at the version boundaries where upstream
fixed them (below, at and above each threshold of gdnctl/knowledge/stack.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gdnctl.knowledge import FLASHQLA_SMS, GPUS, stack
from gdnctl.plan import memory
from gdnctl.validate.findings import Severity
from tests.validate.helpers import codes, run_of

CPU_RL = "tiny-qwen3.5-rl-cpu"


def _severity(found: dict, code: str) -> Severity | None:
    """The one finding of `code`, by severity; None when the rule stayed quiet."""
    if code not in found:
        return None
    assert len(found[code]) == 1, found[code]
    return found[code][0].severity


# --- KRN007: FLA's gated GDN backward on Hopper with Triton 3.4-3.7.0 (fla #640, #983) ---------------------------
@pytest.mark.parametrize(
    ("triton", "expected"),
    [
        ("3.3.1", None),
        ("3.4.0", Severity.ERROR),
        ("3.6.0", Severity.ERROR),
        ("3.7.0", Severity.ERROR),
        ("3.7.1", None),
        ("3.8.0", None),
    ],
)
def test_hopper_triton_window(triton, expected):
    found = codes({"runtime": {"triton": triton, "fla": "0.4.1", "flash_qla": "none"}})
    assert _severity(found, "KRN007") == expected


@pytest.mark.parametrize(
    ("fla", "flash_qla", "expected", "says"),
    [
        ("0.4.1", "none", Severity.ERROR, "wrong db and dg"),
        ("0.4.2", "none", Severity.WARNING, "no guard"),
        ("0.5.0", "none", Severity.WARNING, "RuntimeError"),
        ("0.6.0", "none", Severity.WARNING, "RuntimeError"),
        ("0.6.0", "0.1.3", Severity.INFO, "TileLang"),
    ],
)
def test_hopper_triton_by_fla_release(fla, flash_qla, expected, says):
    finding = codes({"runtime": {"triton": "3.6.0", "fla": fla, "flash_qla": flash_qla}})["KRN007"][0]
    assert finding.severity is expected and says in finding.message and finding.path == "runtime.triton"


@pytest.mark.parametrize(
    "changes",
    [
        {"runtime": {"fla": "0.4.1"}},  # runtime.triton unknown
        {"runtime": {"triton": "3.6.0", "fla": "0.4.1"}, "cluster": {"gpu": "a100"}},  # not Hopper
        {"runtime": {"triton": "3.6.0", "fla": "0.4.1"}, "kernels": {"gdn_backend": "flashqla"}},
        {"runtime": {"triton": "3.6.0", "fla": "0.4.1"}, "job": "selftest", "rollout": None},  # no backward
    ],
)
def test_hopper_triton_quiet(changes):
    assert "KRN007" not in codes(changes)


def test_hopper_triton_on_every_hopper_gpu():
    for gpu in ("h100", "h200", "h800", "h20", "gh200"):
        found = codes({"cluster": {"gpu": gpu}, "runtime": {"triton": "3.6.0", "fla": "0.4.1"}})
        assert "KRN007" in found, gpu


# --- KRN008: FLA's GDN backward on Blackwell before 0.5.2 (fla #913, #999, PR #1000) ------------------------------
@pytest.mark.parametrize(
    ("fla", "trips"), [("0.4.2", True), ("0.5.0", True), ("0.5.1", True), ("0.5.2", False), ("0.6.0", False)]
)
def test_blackwell_backward_by_fla_release(fla, trips):
    assert ("KRN008" in codes({"cluster": {"gpu": "b200"}, "runtime": {"fla": fla}})) is trips


@pytest.mark.parametrize(
    ("gpu", "trips"), [("b200", True), ("b300", True), ("rtx-pro-6000", True), ("h100", False), ("a100", False)]
)
def test_blackwell_backward_by_gpu(gpu, trips):
    assert ("KRN008" in codes({"cluster": {"gpu": gpu}, "runtime": {"fla": "0.5.1"}})) is trips


def test_blackwell_backward_only_for_fla_training():
    assert "KRN008" not in codes(
        {"cluster": {"gpu": "b200"}, "runtime": {"fla": "0.5.1"}, "kernels": {"gdn_backend": "flashqla"}}
    )
    assert "KRN008" not in codes(
        {"cluster": {"gpu": "b200"}, "runtime": {"fla": "0.5.1"}, "job": "selftest", "rollout": None}
    )


# --- KRN009: the flash-qla release must have kernels for the GPU (QwenLM/FlashQLA tags) ----------------------------
@pytest.mark.parametrize(
    ("gpu", "flash_qla", "trips"),
    [
        ("h100", "0.1.1", False),
        ("b200", "0.1.1", False),
        ("rtx-pro-6000", "0.1.1", True),
        ("rtx-pro-6000", "0.1.2", False),
        ("b300", "0.1.2", True),
        ("b300", "0.1.3", False),
        ("gb10", "0.1.2", True),
        ("gb10", "0.1.3", False),
        ("gb10", "0.2.0", False),
    ],
)
def test_flashqla_release_by_gpu(gpu, flash_qla, trips):
    found = codes(
        {"kernels": {"gdn_backend": "flashqla"}, "cluster": {"gpu": gpu}, "runtime": {"flash_qla": flash_qla}}
    )
    assert ("KRN009" in found) is trips


def test_flashqla_release_table_covers_the_supported_gpus():
    assert set(stack.FLASHQLA_FORWARD_SINCE) == set(FLASHQLA_SMS)
    # Every release on PyPI (0.1.1 on) has the Hopper and B200 kernels: nothing to say there.
    assert not codes({"kernels": {"gdn_backend": "flashqla"}, "runtime": {"flash_qla": "0.1.1"}}).get("KRN009")


def test_flashqla_release_leaves_unsupported_gpus_to_krn001():
    found = codes(
        {"kernels": {"gdn_backend": "flashqla"}, "cluster": {"gpu": "a100"}, "runtime": {"flash_qla": "0.1.1"}}
    )
    assert "KRN001" in found and "KRN009" not in found


@pytest.mark.parametrize(("flash_qla", "refused"), [("0.1.2", True), ("0.1.3", False)])
def test_sm120_training_is_refused_only_before_the_0_1_3_backward(flash_qla, refused):
    """flash-qla 0.1.3's wheel has blackwell_sm120/fused_bwd.py; 0.1.2 raised NotImplementedError in backward."""
    found = codes(
        {
            "kernels": {"gdn_backend": "flashqla"},
            "cluster": {"gpu": "rtx-pro-6000"},
            "runtime": {"flash_qla": flash_qla},
        }
    )
    assert ("KRN002" in found) == refused
    if refused:
        assert "only a forward kernel" in found["KRN002"][0].message


# --- RLT004: FlashInfer GDN prefill on Hopper, by the FlashInfer vLLM pins (flashinfer #3477 in 0.6.14) ------------
@pytest.mark.parametrize(
    ("vllm", "backend", "expected"),
    [
        ("0.17.0", None, None),  # no --gdn-prefill-backend, no FlashInfer GDN prefill to choose
        ("0.18.0", None, Severity.WARNING),
        ("0.25.1", "flashinfer", Severity.WARNING),
        ("0.26.0", None, Severity.INFO),
        ("0.26.0", "flashinfer", Severity.INFO),
        ("0.33.0", "auto", Severity.INFO),
        ("0.25.1", "triton", None),
        ("0.33.0", "triton", None),
    ],
)
def test_prefill_hang_by_vllm_release(vllm, backend, expected):
    found = codes({"runtime": {"vllm": vllm}, "rollout": {"gdn_prefill_backend": backend}})
    assert _severity(found, "RLT004") == expected


def test_prefill_hang_only_on_hopper():
    assert "RLT004" not in codes(
        {"cluster": {"gpu": "b200"}, "runtime": {"vllm": "0.25.1"}, "rollout": {"gdn_prefill_backend": None}}
    )


# --- TRN003: the trainer's transformers must know the model type (verl #5937) ------------------------------------
@pytest.mark.parametrize(
    ("model", "transformers", "trips"),
    [
        ("gdnctl/tiny-qwen3.5-bytes", "4.57.6", True),
        ("gdnctl/tiny-qwen3.5-bytes", "5.1.0", True),
        ("gdnctl/tiny-qwen3.5-bytes", "5.2.0", False),
        ("gdnctl/tiny-qwen3.5-bytes", "5.23.0", False),
        ("gdnctl/tiny-qwen3.5-moe-bytes", "5.1.0", True),
        ("gdnctl/tiny-qwen3.5-moe-bytes", "5.2.0", False),
        ("gdnctl/tiny-qwen3-next-bytes", "4.56.2", True),
        ("gdnctl/tiny-qwen3-next-bytes", "4.57.0", False),
        ("gdnctl/tiny-qwen3-next-bytes", "5.1.0", False),
    ],
)
def test_transformers_by_model_type(model, transformers, trips):
    found = codes({"model": {"id": model}, "runtime": {"transformers": transformers}}, base=CPU_RL)
    assert ("TRN003" in found) is trips
    if trips:
        assert found["TRN003"][0].path == "runtime.transformers"


def test_transformers_matters_only_for_the_cpu_policy():
    assert "TRN003" not in codes({"runtime": {"transformers": "4.40.0"}})  # rl on GPUs: Megatron, no transformers
    assert "TRN003" not in codes({}, base=CPU_RL)  # runtime.transformers unknown
    assert "TRN003" not in codes(
        {"job": "selftest", "rollout": None, "runtime": {"transformers": "4.40.0"}}, base=CPU_RL
    )


def test_new_runtime_versions_are_checked_and_default_to_unknown():
    run = run_of()
    assert run.stack["triton"] is None and run.stack["transformers"] is None
    with pytest.raises(ValidationError):
        run_of({"runtime": {"triton": "three"}})
    assert run_of({"runtime": {"triton": "3.7.1", "transformers": "5.23.0"}}).stack["triton"] == "3.7.1"


# --- the rl log-prob row of the memory estimate (NeMo-RL #2668, SkyRL #1610) -----------------------------------
def _rows(run) -> dict[str, float]:
    return {row.name: row.gib for row in memory.estimate_training(run).rows}


def test_rl_estimate_has_the_fp32_logprob_row():
    run = run_of()  # 35B-A3B GRPO: micro batch 1, 8192 tokens, tp 2, vocab 248320
    rows = _rows(run)
    shard = run.model.vocab_size / run.preset.parallel.tp
    assert rows["rl log-probs"] == pytest.approx(1 * 8192 * shard * 4 / memory.GIB)
    assert rows["logits"] == pytest.approx(1 * 8192 * shard * 2 / memory.GIB)


def test_rl_logprob_row_follows_the_rollout_context_and_tp():
    base = _rows(run_of())["rl log-probs"]
    assert _rows(run_of({"rollout": {"max_model_len": 32768}}))["rl log-probs"] == pytest.approx(4 * base)
    assert _rows(run_of({"parallel": {"tp": 1}}))["rl log-probs"] == pytest.approx(2 * base)
    assert _rows(run_of({"train": {"micro_batch_size": 2}}))["rl log-probs"] == pytest.approx(2 * base)


def test_rl_logprob_row_is_not_counted_twice():
    """At the training length an rl job's logits and log-prob rows add up to the sft job's logits row with
    Megatron-Core's own cross entropy (bf16 logits and their fp32 copy)."""
    rl = _rows(run_of())
    sft = _rows(run_of({"job": "sft", "rollout": None, "speed": {"cross_entropy": "native"}}))
    assert "rl log-probs" not in sft
    assert rl["logits"] + rl["rl log-probs"] == pytest.approx(sft["logits"])


def test_long_rl_context_can_tip_the_fit():
    """The 248k vocabulary makes long rl rows expensive: 128k tokens of fp32 logits at tp 2 are ~61 GiB."""
    changes = {"rollout": {"max_model_len": 131072, "max_response_tokens": 1024}}
    rows = _rows(run_of(changes))
    assert rows["rl log-probs"] > 0.7 * GPUS["h100"].memory_gib
    assert any(f.severity is Severity.ERROR for f in codes(changes)["MEM001"])


def test_optimizer_state_is_in_the_estimate_from_the_start():
    """MoE jobs that OOM only at iteration 2 do so when Adam's state appears: the estimate already holds it."""
    rows = _rows(run_of({"train": {"optimizer_cpu_offload": False}}))
    offloaded = _rows(run_of())
    assert rows["optimizer"] > 0 and offloaded["optimizer"] == 0


# --- a fixed vLLM KV cache (rollout.kv_cache_gib: vLLM's kv_cache_memory_bytes) ----------------------------------
def test_a_fixed_kv_cache_is_what_vllm_holds_in_the_rollout_phase():
    run = run_of({"rollout": {"kv_cache_gib": 12}})
    share = memory.rollout_share(run)
    assert share.gib == pytest.approx(memory.rollout_weights_gib(run) + 12)
    phase = {row.name: row.gib for row in memory.estimate_rollout_phase(run).rows}
    assert phase["vLLM"] == pytest.approx(share.gib)
    profiled = run_of()
    assert memory.rollout_share(profiled).gib == pytest.approx(
        profiled.preset.rollout.gpu_memory_utilization * profiled.gpu.memory_gib
    )


def test_a_kv_cache_larger_than_the_gpu_is_refused_at_its_field():
    found = codes({"rollout": {"kv_cache_gib": 90}})
    (mem002,) = found["MEM002"]
    assert mem002.severity is Severity.ERROR and mem002.path == "rollout.kv_cache_gib"
    assert "Lower rollout.kv_cache_gib" in mem002.hint
    assert {f.path for f in found["MEM003"]} == {"rollout.kv_cache_gib"}
    assert "MEM002" not in codes({"rollout": {"kv_cache_gib": 8}})


def test_a_fixed_kv_cache_still_needs_gpu_memory_utilization_free_when_vllm_starts():
    """vLLM's request_memory: gpu_memory_utilization of the GPU must be free at start-up, KV cache fixed or not;
    beside the 35B-A3B trainer's resident state 0.8 of an H100 is not."""
    found = codes({"rollout": {"kv_cache_gib": 4, "gpu_memory_utilization": 0.8}})
    (start,) = [f for f in found["MEM003"] if f.path == "rollout.gpu_memory_utilization"]
    assert start.severity is Severity.ERROR and "when it starts" in start.message
    assert "MEM003" not in codes({"rollout": {"kv_cache_gib": 4, "gpu_memory_utilization": 0.3}})


def test_kv_cache_gib_must_be_positive():
    with pytest.raises(ValidationError):
        run_of({"rollout": {"kv_cache_gib": 0}})


# --- TP above the KV heads: the gathered QKV projection (megatron/core/transformer/attention.py) -----------------
def test_tp_above_the_kv_heads_keeps_the_whole_gathered_qkv_on_every_rank(monkeypatch):
    """35B-A3B (16 query heads of 256, 2 KV heads, 10 attention layers of 40) at tp 4 without recompute: each rank
    keeps the all-gathered q, gate, k and v of every attention layer, (2 x 16 + 2 x 2) x 256 bf16 values a token,
    on top of its own share; at tp 2 nothing is gathered."""
    run = run_of({"parallel": {"tp": 4}, "train": {"recompute": "none"}})
    with_gather = _rows(run)
    note = next(row.note for row in memory.estimate_training(run).rows if row.name == "activations")
    monkeypatch.setattr(memory, "_gathered_qkv_bytes_per_token", lambda model, tp: 0.0)
    extra = with_gather["activations"] - _rows(run)["activations"]
    assert extra == pytest.approx(8192 * 10 * (2 * 16 + 2 * 2) * 256 * 2 / memory.GIB)  # 1.41 GiB
    assert "each rank keeps the whole gathered QKV" in note
    monkeypatch.undo()
    assert memory._gathered_qkv_bytes_per_token(run_of({"parallel": {"tp": 2}}).model, 2) == 0.0
