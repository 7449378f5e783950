"""What both rl policies promise the loop (policy/interface.py), where it runs on CPU: samples scored at the rollout's
temperature (the torch policy here; the Megatron policy's tempered output layer and its loss function on Megatron-Core's
own CPU-capable layers), the probe at temperature 1, and one loss for both."""

from __future__ import annotations

import pytest
import torch

from gdnctl.runtime.rl.algorithm import batch as rl_batch
from gdnctl.runtime.rl.algorithm import grpo
from gdnctl.runtime.rl.algorithm.batch import Sample

TEMPERATURE = 0.7


def _samples() -> list[Sample]:
    rows = [((81, 58, 32), (49, 50, 256)), ((81, 58), (55, 56, 57, 58)), ((70, 71), (48, 49)), ((70, 72), (50,))]
    return [
        Sample(i // 2, prompt, response, tuple(-5.5 for _ in response), "stop", 0.0, [1.0, -1.0, 0.5, -0.5][i])
        for i, (prompt, response) in enumerate(rows)
    ]


def _tempered(engine, temperature: float):
    return engine.model_copy(update={"rollout": engine.rollout.model_copy(update={"temperature": temperature})})


def test_the_torch_policy_scores_samples_at_the_rollouts_temperature_and_the_probe_at_1(engine, gloo):
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    batch = rl_batch.build_batch(_samples(), pad_id=0)
    plain, tempered = TorchPolicy(_tempered(engine, 1.0)), TorchPolicy(_tempered(engine, TEMPERATURE))
    with torch.no_grad():  # the same seeded init: the same logits
        logits = plain.module(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits[:, :-1].float()
    labels = batch.tokens[:, 1:]
    untempered = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    cooled = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    mask = batch.response_mask
    assert torch.allclose(plain.logprobs([batch])[0][mask], untempered[mask], atol=1e-5)  # T = 1: as it always was
    assert torch.allclose(tempered.logprobs([batch])[0][mask], cooled[mask], atol=1e-5)
    assert (cooled - untempered)[mask].abs().mean() > 0.01  # the temperature moves them
    probe = [81, 58, 32, 49]
    assert tempered.probe_logprobs(probe) == pytest.approx(plain.probe_logprobs(probe), abs=1e-6)


@pytest.fixture
def megatron_tp1(gloo):
    """Megatron-Core's model-parallel state on the one-rank gloo group (tensor parallel 1)."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()


class _OutputHead(torch.nn.Module):
    """GPTModel's postprocess in miniature, on Megatron-Core's own layers: the output layer's (vocab-parallel) logits
    into its vocab-parallel cross entropy, the per-token loss GPTModel returns with labels."""

    def __init__(self, hidden: int, vocab: int) -> None:
        from megatron.core.tensor_parallel import ColumnParallelLinear
        from megatron.core.transformer import TransformerConfig

        super().__init__()
        config = TransformerConfig(
            num_layers=1,
            hidden_size=hidden,
            num_attention_heads=1,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
        )
        self.output_layer = ColumnParallelLinear(
            hidden, vocab, config=config, init_method=torch.nn.init.normal_, bias=False, gather_output=False
        )

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        logits, _ = self.output_layer(hidden)
        return vocab_parallel_cross_entropy(logits.float(), labels)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output_layer(hidden)[0]


def test_the_megatron_policys_output_layer_is_tempered_on_its_way_to_megatrons_cross_entropy(megatron_tp1):
    """The Megatron policy divides the output layer's logits by the temperature (a hook) before GPTModel's own loss
    path takes them, so its token losses are the torch policy's -log softmax(logits / T); untouched at T = 1, and
    an error rather than silence when a forward never reaches the layer."""
    from gdnctl.runtime.rl.policy.megatron_policy import _tempered

    torch.manual_seed(0)
    head = _OutputHead(hidden=16, vocab=64)
    wrapped = torch.nn.Module()  # under Megatron's DDP wrapper: found through .module
    wrapped.module = head
    hidden, labels = torch.randn(5, 2, 16), torch.randint(0, 64, (5, 2))
    with torch.no_grad():
        logits = head.logits(hidden)
        with _tempered(wrapped, TEMPERATURE):
            tempered = head(hidden, labels)
        with _tempered(wrapped, 1.0):
            plain = head(hidden, labels)
    assert torch.allclose(-tempered, grpo.logprobs_from_logits(logits, labels, temperature=TEMPERATURE), atol=1e-5)
    assert torch.allclose(-plain, grpo.logprobs_from_logits(logits, labels), atol=1e-5)
    with pytest.raises(RuntimeError, match="rollout.temperature"), _tempered(wrapped, TEMPERATURE):
        pass  # no forward went through the output layer


def test_the_megatron_policys_loss_is_the_torch_policys_grpo_loss(engine):
    """The Megatron policy's per-micro-batch loss function (Megatron's per-token contract: sum, count, report) holds
    the GRPO loss the torch policy minimises, with the decoupled objective's importance weight against the engine's
    log-probs: its sum over its count is grpo_loss's token mean."""
    from gdnctl.runtime.rl.policy.megatron_policy import _grpo_loss

    batch = rl_batch.build_batch(_samples(), pad_id=0)
    torch.manual_seed(1)
    token_losses = torch.rand(batch.tokens.shape) * 4  # -log p of every next token, the last column unused
    old = -token_losses[:, :-1] + 0.05 * torch.randn(batch.response_mask.shape)  # the proximal policy
    settings = engine.grpo.model_copy(update={"rollout_correction": True, "mini_batches": 2})
    total, count, report = _grpo_loss(batch, None, old, settings, token_losses)
    expected, stats = grpo.grpo_loss(
        -token_losses[:, :-1],
        old,
        grpo.token_advantages(batch.advantages, batch.response_mask),
        batch.response_mask,
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
        rollout_logprobs=batch.rollout_logprobs,
        tis_cap=settings.rollout_correction_cap,
    )
    assert int(count) == batch.num_response_tokens
    assert float(total / count) == pytest.approx(float(expected), rel=1e-6)
    assert float(report["rl"][7] / report["rl"][3]) == pytest.approx(float(stats["tis_mean"]), rel=1e-6)
