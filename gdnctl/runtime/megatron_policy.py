"""The rl job's policy on GPUs: the sft trainer's Megatron-Core model and optimizer, stepped on the GRPO loss.

The model, HF weight loading, resume, DDP, optimizer and GDN kernel warm-up are the Trainer's (trainer.py); this
module adds what rl needs on top: per-token log-probs of given rows, one optimizer step on the clipped policy
loss, and the HF export the rollout reloads.

Log-probs come from GPTModel's own loss path: with labels it returns the per-token cross entropy, computed
vocab-parallel over tensor-parallel ranks, which is -log p(label). The loss uses Megatron's per-token mode
(calculate_per_token_loss): each micro-batch returns the sum of its per-token (or per-sequence) losses and how
many tokens (sequences) that is, and Megatron divides the gradients by the count summed over micro-batches and
data-parallel ranks: exactly the token-mean (or sequence-mean) over the whole step's batch.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.engine_config import EngineConfig
from gdnctl.errors import GdnctlError
from gdnctl.runtime import checkpoint, grpo
from gdnctl.runtime.rl_batch import RlBatch


class MegatronPolicy:
    def __init__(self, config: EngineConfig, config_path: Path, comm_policy) -> None:
        from gdnctl.runtime.trainer import Trainer

        if config.grpo.kl_coef > 0:
            raise GdnctlError("grpo.kl_coef > 0 needs a reference model, which the GPU rl policy does not keep in "
                              "this version; set grpo.kl_coef: 0 (or run the CPU policy).")
        self.config = config
        self.trainer = Trainer(config, config_path, comm_policy)
        self.trainer.setup()
        self.trainer.warm_up_kernel()
        self.hf_config = checkpoint.hf_text_config(config.model)
        ps = self.trainer.ps
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        # Steps already taken: the Trainer resumed from train.save_dir/latest when there is one.
        self.step = self.trainer.iteration
        self.optimizer = self.trainer.optimizer

    # --- log-probs ---------------------------------------------------------------------------------------
    def _token_losses(self, model, tokens: torch.Tensor) -> torch.Tensor:
        """-log p(tokens[:, t + 1]) at every t: `[B, T]`, the last column meaningless (no next token)."""
        rows, width = tokens.shape
        labels = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
        positions = torch.arange(width, device=tokens.device).expand(rows, width)
        return model(tokens, positions, None, labels=labels)

    @torch.no_grad()
    def probe_logprobs(self, tokens: list[int]) -> list[float]:
        """log p of tokens[1:] given their prefix (every rank takes part: the forward is collective)."""
        self.trainer.model.eval()
        losses = self._token_losses(self.trainer.model, torch.tensor([tokens], device="cuda"))
        self.trainer.model.train()
        return (-losses[0, :-1].float()).tolist()

    # --- one step ----------------------------------------------------------------------------------------
    def train_step(self, micro_batches: list[RlBatch], settings) -> dict[str, float]:
        """One optimizer step over this data-parallel rank's micro-batches -> stats over the whole step (the
        same on every rank): loss, grad_norm, rollout_logprob_abs_diff, tokens."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        trainer = self.trainer
        trainer.model.zero_grad_buffer()
        self.optimizer.zero_grad()

        def forward_step(data_iterator, model):
            batch = next(data_iterator)
            return self._token_losses(model, batch.tokens.cuda()), partial(_grpo_loss, batch, settings)

        reports = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[trainer.model],
            num_microbatches=len(micro_batches), seq_length=max(b.tokens.shape[1] for b in micro_batches),
            micro_batch_size=max(b.tokens.shape[0] for b in micro_batches), forward_only=False)
        _, grad_norm, _ = self.optimizer.step()
        # [loss sum, loss count, |logp diff| sum, response tokens, tokens] over this rank's micro-batches.
        totals = torch.zeros(5, dtype=torch.float64, device="cuda")
        if trainer.ps.is_pipeline_last_stage():
            for report in reports:
                totals[:4] += report["rl"].double()
        totals[4] = sum(b.num_tokens for b in micro_batches)
        dist.all_reduce(totals, group=trainer.ps.get_data_parallel_group())
        return {"loss": float(totals[0] / totals[1].clamp(min=1)), "grad_norm": float(grad_norm or 0.0),
                "rollout_logprob_abs_diff": float(totals[2] / totals[3].clamp(min=1)), "tokens": int(totals[4])}

    # --- weights -----------------------------------------------------------------------------------------
    def export(self, directory: Path) -> dict[str, torch.Tensor] | None:
        """Every rank: gather to HF tensors and write them (writer ranks); rank 0 returns them as written,
        read back from the files (for the sync checksums)."""
        trainer = self.trainer
        checkpoint.save_hf(trainer.model, self.config.model, trainer.place, trainer.groups, directory,
                           self.hf_config)
        dist.barrier()
        if dist.get_rank() != 0:
            return None
        reader = checkpoint.HFReader(directory)
        return {name: reader.get(name) for name in reader.locations}

    def save(self, save_dir: Path, step: int) -> None:
        self.trainer.iteration = step
        self.trainer.save(save_dir)


def _grpo_loss(batch: RlBatch, settings, token_losses: torch.Tensor):
    """Megatron's per-token loss contract: (sum of losses, count, report). The count is response tokens for
    "token-mean" and sequences for "seq-mean-token-mean", so Megatron's division gives the batch mean."""
    mask = batch.response_mask.cuda()
    logprobs = -token_losses[:, :-1].float()
    advantages = grpo.token_advantages(batch.advantages.cuda(), mask)
    # One update per rollout batch: the sampling policy is the current one (ratio 1; see torch_policy).
    loss, _ = grpo.policy_loss(logprobs, logprobs.detach(), advantages, mask, clip_low=settings.clip_low,
                               clip_high=settings.clip_high, aggregation=settings.aggregation)
    tokens = mask.sum()
    count = tokens if settings.aggregation == "token-mean" else torch.tensor(mask.shape[0], device=mask.device)
    total = loss * count
    gap = ((logprobs.detach() - batch.rollout_logprobs.cuda()).abs() * mask).sum()
    report = torch.stack([total.detach().double(), count.double(), gap.double(), tokens.double()])
    return total, count.to(torch.int), {"rl": report}
