"""The rl job's policy on device cpu: transformers' Qwen3.5 text class trained with plain torch (DDP on gloo).

Megatron-Core cannot run here (its GDN layer needs the CUDA kernels of FLA or FlashQLA); transformers'
Qwen3_5ForCausalLM has a pure-torch GDN path, so on CPU the same HF architecture, weights and names train with
torch instead. The parameters are fp32 (AdamW on bf16 weights loses most small updates); the rollout gets bf16
copies, as it would from Megatron's bf16 model.

Optimizer settings are the Megatron trainer's (AdamW, betas 0.9/0.95, weight decay 0.01, grad clip 1.0, constant
LR), so an rl preset means the same thing on both devices.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.engine_config import EngineConfig
from gdnctl.runtime import checkpoint, grpo
from gdnctl.runtime.rl_batch import RlBatch
from gdnctl.runtime.trainer import ADAM_BETAS, CLIP_GRAD, WEIGHT_DECAY


def _hf_classes(moe: bool):
    if moe:
        from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

        return Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5TextConfig, Qwen3_5ForCausalLM


class TorchPolicy:
    def __init__(self, config: EngineConfig, weights: Path | None) -> None:
        """Build the model from the architecture (random init from train.seed), then load `weights` (an HF
        checkpoint directory) when given."""
        config_class, model_class = _hf_classes(config.model.is_moe)
        self.hf_config = checkpoint.hf_text_config(config.model)
        torch.manual_seed(config.train.seed)
        model = model_class(config_class(**self.hf_config)).float()
        if weights is not None:
            _load(model, weights)
        self.module = model
        self.model = (torch.nn.parallel.DistributedDataParallel(model) if dist.get_world_size() > 1 else model)
        self.tied = config.model.tie_word_embeddings
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, betas=ADAM_BETAS,
                                           weight_decay=WEIGHT_DECAY)
        self.reference = None
        if config.grpo.kl_coef > 0:
            # The KL anchor is the policy as the job started (or resumed): a frozen copy.
            self.reference = model_class(config_class(**self.hf_config)).float()
            self.reference.load_state_dict(model.state_dict())
            self.reference.requires_grad_(False)

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights under their HF names; a tied LM head is the embedding, so it is not sent twice."""
        for name, tensor in self.module.state_dict().items():
            if self.tied and name == "lm_head.weight":
                continue
            yield name, tensor

    def logprobs(self, model: torch.nn.Module, batch: RlBatch) -> torch.Tensor:
        """log p of each next token `[N, T - 1]` under `model`."""
        logits = model(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits
        return grpo.logprobs_from_logits(logits[:, :-1].float(), batch.tokens[:, 1:])

    @torch.no_grad()
    def probe_logprobs(self, tokens: list[int]) -> list[float]:
        """log p of tokens[1:] given their prefix, as the rollout's prompt log-probs score them."""
        ids = torch.tensor([tokens])
        logits = self.module(input_ids=ids).logits
        return grpo.logprobs_from_logits(logits[:, :-1].float(), ids[:, 1:])[0].tolist()

    def train_step(self, micro_batches: list[RlBatch], settings, weights: list[float]) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches -> this rank's stats.

        `weights[i]` scales micro-batch i's loss so that the weighted losses of every micro-batch on every rank
        add up to the loss of the whole global batch; the backward multiplies by the world size because DDP
        averages gradients over ranks. stats: loss (this rank's weighted sum), and micro-batch means of
        rollout_logprob_abs_diff (trainer vs rollout log-probs of the sampled tokens) and kl when it is on."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        world = dist.get_world_size()
        loss_sum, means = 0.0, {}
        for index, (batch, weight) in enumerate(zip(micro_batches, weights, strict=True)):
            # Gradients are reduced once, on the last micro-batch.
            last = index == len(micro_batches) - 1
            with nullcontext() if last or world == 1 else self.model.no_sync():
                logprobs = self.logprobs(self.model, batch)
                ref = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref = self.logprobs(self.reference, batch)
                advantages = grpo.token_advantages(batch.advantages, batch.response_mask)
                # One update per rollout batch: the sampling policy is the current one, so old log-probs are
                # these, detached (ratio 1; the clip matters only once a batch is reused).
                loss, stats = grpo.grpo_loss(
                    logprobs, logprobs.detach(), advantages, batch.response_mask, ref_logprobs=ref,
                    kl_coef=settings.kl_coef, kl_kind=settings.kl_kind, clip_low=settings.clip_low,
                    clip_high=settings.clip_high, aggregation=settings.aggregation)
                (loss * weight * world).backward()
            loss_sum += float(loss.detach()) * weight
            mismatch = grpo.masked_mean((logprobs.detach() - batch.rollout_logprobs).abs(), batch.response_mask)
            values = {"rollout_logprob_abs_diff": float(mismatch)}
            if "kl" in stats:
                values["kl"] = float(stats["kl"])
            for name, value in values.items():
                means[name] = means.get(name, 0.0) + value / len(micro_batches)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), CLIP_GRAD)
        self.optimizer.step()
        return {"loss": loss_sum, "grad_norm": float(grad_norm), **means}

    def save(self, directory: Path) -> None:
        """HF weights + config.json (rank 0) and each rank's optimizer state, in the Megatron trainer's layout."""
        if dist.get_rank() == 0:
            from gdnctl.runtime.weight_sync import write_weights

            write_weights(self.hf_tensors(), directory, dtype=torch.float32, config=self.hf_config)

    def load_optimizer(self, directory: Path) -> None:
        checkpoint.load_training_state(directory, self.optimizer, device="cpu")


def _load(model: torch.nn.Module, directory: Path) -> None:
    reader = checkpoint.HFReader(directory)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(reader.get(name).to(param.dtype))
