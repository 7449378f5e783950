"""The rl job's policy on GPUs: the sft trainer's Megatron-Core model and optimizer, stepped on the GRPO loss.

The model, HF weight loading, resume, DDP, optimizer and GDN kernel warm-up are the Trainer's (trainer.py); this
module adds what rl needs on top: per-token log-probs of given rows, one optimizer step on the clipped policy
loss, and the HF export the rollout reloads.

Log-probs come from GPTModel's own loss path: with labels it returns the per-token cross entropy, computed
vocab-parallel over tensor-parallel ranks, which is -log p(label). At a sampling temperature T other than 1 the output
layer's logits are divided by T on their way to that cross entropy (a forward hook, `_tempered`), so the samples are
scored under softmax(logits / T), the distribution vLLM sampled and reports processed log-probs of (the torch policy
divides its logits the same way); the weight-sync probe scores at T = 1 on both sides. The loss uses Megatron's
per-token mode (calculate_per_token_loss): each micro-batch returns the sum of its per-token (or per-sequence) losses
and how many tokens (sequences) that is, and Megatron divides the gradients by the count summed over micro-batches
and data-parallel ranks: exactly the token-mean (or sequence-mean) over the whole step's batch.

The KL reference (grpo.kl_coef > 0) is the policy as the job first started: model.path, else the seeded random
init, also after a resume. It is kept as a copy of this rank's parameters in pinned host memory, not as a second
model on the GPU; its log-probs come from a forward-only pass with those weights copied in, and the current
weights copied back after (slime swaps its reference the same way). That costs two host-device copies of the
rank's parameters per step instead of a second model's GPU memory. With train.lora the policy is megatron-bridge's
LoRA on a frozen base (runtime/model/lora_wrap.py), and the reference is that base: the adapters are switched off
for the reference's forward instead (nothing is copied).

With train.lora the rollout still gets whole HF weights, with the adapters merged in: the builder's export is
megatron-bridge's export_hf_weights, whose merge_adapter_weights defaults to True (megatron-bridge 0.6.2
models/conversion/auto_bridge.py lines 631-696, model_bridge.py stream_weights_megatron_to_hf lines 1323-1405),
and the merge adds (alpha / rank) B A to a copy of the base tensor (peft_bridge.py _merge_single_adapter_weight,
peft/lora_merge.py LoRAMerge.merge returns base + delta), so every export merges once and never changes the model.
The disk, CUDA IPC and broadcast transports all send that export (`export`, `hf_tensors`), so their per-parameter
checksums and the probe check the merged weights as they check full ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.rl.algorithm import RlBatch, grpo
from gdnctl.runtime.train import set_lr
from gdnctl.schema import EngineConfig


class MegatronPolicy:
    def __init__(self, config: EngineConfig, config_path: Path, comm_policy) -> None:
        from gdnctl.runtime.train import Trainer

        self.config = config
        lora = config.train.lora is not None
        # A LoRA policy's reference is its frozen base, reached by switching the adapters off (_reference_weights):
        # no copy of the weights is kept.
        self.trainer = Trainer(
            config, config_path, comm_policy, keep_initial_weights=config.grpo.kl_coef > 0 and not lora
        )
        self.trainer.setup()
        self.trainer.warm_up_kernel()
        self.has_reference = config.grpo.kl_coef > 0
        self.reference = self.trainer.initial_weights  # None with train.lora
        # Where the current weights wait while the reference's are in the model (allocated once).
        self._parked = (
            None
            if self.reference is None
            else {name: torch.empty_like(tensor, pin_memory=True) for name, tensor in self.reference.items()}
        )
        # What the rollout serves (the text-only class, or Qwen3.5's vision-language one on vLLM < 0.27): its
        # weights carry nothing over from model.path.
        self.rollout_source = checkpoint.rollout_source(config.model, config.rollout.vision_language_class)
        ps = self.trainer.ps
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        # Steps already taken: the Trainer resumed from train.save_dir/latest when there is one.
        self.step = self.trainer.iteration
        self.optimizer = self.trainer.optimizer
        self.temperature = config.rollout.temperature

    # --- log-probs ---------------------------------------------------------------------------------------
    def _token_losses(self, model, tokens: torch.Tensor, temperature: float | None = None) -> torch.Tensor:
        """-log p(tokens[:, t + 1]) at every t under softmax(logits / temperature) (None: the rollout's): `[B, T]`,
        the last column meaningless (no next token)."""
        rows, width = tokens.shape
        labels = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
        positions = torch.arange(width, device=tokens.device).expand(rows, width)
        with _tempered(model, self.temperature if temperature is None else temperature):
            return model(tokens, positions, None, labels=labels)

    @torch.no_grad()
    def probe_logprobs(self, tokens: list[int], images=None) -> list[float]:
        """log p of tokens[1:] given their prefix at temperature 1, as vLLM's prompt log-probs score them (every
        rank takes part: the forward is collective). Never an image prompt's: images on GPUs are refused by
        validate (IMG004), so `images` is always None here."""
        self.trainer.model.eval()
        losses = self._token_losses(self.trainer.model, torch.tensor([tokens], device="cuda"), temperature=1.0)
        self.trainer.model.train()
        return (-losses[0, :-1].float()).tolist()

    # --- the KL reference --------------------------------------------------------------------------------
    @contextmanager
    def _reference_weights(self) -> Iterator[None]:
        """The reference's weights in the model for the duration; the current ones parked in host memory.

        The copies are queued on the current stream, so the GPU runs them in order with the forward between
        them; the parked buffers are pinned, so the device-to-host copies do not block the host either."""
        if self.reference is None:  # train.lora: the base is the reference
            with _adapters_off(self.trainer.model.module):
                yield
            return
        params = dict(self.trainer.model.module.named_parameters())
        with torch.no_grad():
            for name, reference in self.reference.items():
                self._parked[name].copy_(params[name], non_blocking=True)
                params[name].copy_(reference, non_blocking=True)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, parked in self._parked.items():
                    params[name].copy_(parked, non_blocking=True)

    def _forward_token_losses(self, micro_batches: list[RlBatch], forward_backward) -> list[torch.Tensor | None]:
        """-log p of every next token, per micro-batch, under the weights the model holds now, forward only (None
        on ranks before the last pipeline stage)."""

        def forward_step(data_iterator, model):
            batch = next(data_iterator)
            return self._token_losses(model, batch.tokens.cuda()), _keep_token_losses

        self.trainer.model.eval()
        reports = forward_backward(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[self.trainer.model],
            num_microbatches=len(micro_batches),
            seq_length=max(b.tokens.shape[1] for b in micro_batches),
            micro_batch_size=max(b.tokens.shape[0] for b in micro_batches),
            forward_only=True,
        )
        self.trainer.model.train()
        if not self.trainer.ps.is_pipeline_last_stage():
            return [None] * len(micro_batches)
        return [report["token_losses"] for report in reports]

    def _reference_token_losses(self, micro_batches: list[RlBatch], forward_backward) -> list[torch.Tensor | None]:
        """-log p_ref of every next token, per micro-batch (None on ranks before the last pipeline stage)."""
        with self._reference_weights():
            return self._forward_token_losses(micro_batches, forward_backward)

    def logprobs(self, micro_batches: list[RlBatch]) -> list[torch.Tensor | None]:
        """log p of every next token `[N, T - 1]` per micro-batch under the current weights (forward only): the
        behaviour policy's, before a rollout batch's first update; None on ranks before the last pipeline stage."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        losses = self._forward_token_losses(micro_batches, get_forward_backward_func())
        return [None if loss is None else -loss[:, :-1].float() for loss in losses]

    # --- one step ----------------------------------------------------------------------------------------
    def train_step(
        self,
        micro_batches: list[RlBatch],
        settings,
        *,
        lr: float | None = None,
        old_logprobs: list[torch.Tensor | None] | None = None,
    ) -> dict[str, float]:
        """One optimizer step at `lr` (None: the optimizer's current lr) over this data-parallel rank's
        micro-batches, the ratio against `old_logprobs` (None: the current weights sampled) -> stats over the whole
        step (the same on every rank): loss, grad_norm, rollout_logprob_abs_diff, tokens, response_tokens,
        clip_fraction, approx_kl, ratio_min, ratio_max, and kl / tis_mean when on."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        trainer = self.trainer
        forward_backward = get_forward_backward_func()
        if lr is not None:
            set_lr(self.optimizer, lr)
        references = [None] * len(micro_batches)
        if self.has_reference:
            references = self._reference_token_losses(micro_batches, forward_backward)
        olds = old_logprobs if old_logprobs is not None else [None] * len(micro_batches)
        trainer.model.zero_grad_buffer()
        self.optimizer.zero_grad()

        def forward_step(data_iterator, model):
            batch, reference, old = next(data_iterator)
            return (
                self._token_losses(model, batch.tokens.cuda()),
                partial(_grpo_loss, batch, reference, old, settings),
            )

        reports = forward_backward(
            forward_step_func=forward_step,
            data_iterator=zip(micro_batches, references, olds, strict=True),
            model=[trainer.model],
            num_microbatches=len(micro_batches),
            seq_length=max(b.tokens.shape[1] for b in micro_batches),
            micro_batch_size=max(b.tokens.shape[0] for b in micro_batches),
            forward_only=False,
        )
        # [loss sum, loss count, |logp diff| sum, response tokens, kl sum, clipped tokens, approx-kl sum,
        #  tis weight sum, capped tokens, tokens] over this rank's micro-batches.
        totals = torch.zeros(10, dtype=torch.float64, device="cuda")
        extremes = torch.full((2,), -torch.inf, dtype=torch.float64, device="cuda")  # [-ratio min, ratio max]
        if trainer.ps.is_pipeline_last_stage():
            for report in reports:
                totals[:9] += report["rl"][:9].double()
                extremes = torch.maximum(extremes, report["rl"][9:].double())
        totals[9] = sum(b.num_tokens for b in micro_batches)
        dist.all_reduce(totals, group=trainer.ps.get_data_parallel_group())
        # Only the last pipeline stage has losses (the others add zeros): every stage must take the same branch below.
        dist.all_reduce(totals[:9], group=trainer.ps.get_pipeline_model_parallel_group())
        for group in (trainer.ps.get_data_parallel_group(), trainer.ps.get_pipeline_model_parallel_group()):
            dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
        # Checked before the step: a non-finite loss is never applied. Megatron's optimizer refuses non-finite
        # gradients itself (its loss scale of 1.0: runtime/train/nonfinite.py).
        loss_finite = bool(torch.isfinite(totals[0]))
        updated, grad_norm = False, None
        if loss_finite:
            updated, grad_norm, _ = self.optimizer.step()
            # Free the optimizer's fp32 copies of bf16 gradients now: the rollout generates next, on this memory.
            self.optimizer.zero_grad()
        grad_finite = updated or not loss_finite
        stats = {
            "loss": float(totals[0] / totals[1].clamp(min=1)),
            "grad_norm": float("nan") if grad_norm is None else float(grad_norm),
            "loss_finite": loss_finite,
            "grad_finite": grad_finite,
            "applied": updated,
            "bad_parameters": [] if grad_finite else _nonfinite_main_gradients(trainer.model),
            "parameter_count": sum(1 for _ in trainer.model.parameters()),
            "rollout_logprob_abs_diff": float(totals[2] / totals[3].clamp(min=1)),
            "tokens": int(totals[9]),
            "response_tokens": int(totals[3]),
            "clip_fraction": float(totals[5] / totals[3].clamp(min=1)),
            "approx_kl": float(totals[6] / totals[3].clamp(min=1)),
            "ratio_min": float(-extremes[0]),
            "ratio_max": float(extremes[1]),
        }
        if settings.rollout_correction:
            stats["tis_mean"] = float(totals[7] / totals[3].clamp(min=1))
            stats["tis_capped_fraction"] = float(totals[8] / totals[3].clamp(min=1))
        if self.has_reference:
            # kl sums are count-weighted like the loss, so this is the batch's KL, aggregated like the loss.
            stats["kl"] = float(totals[4] / totals[1].clamp(min=1))
        return stats

    # --- weights -----------------------------------------------------------------------------------------
    def export(self, directory: Path) -> dict[str, torch.Tensor] | None:
        """Every rank: gather to HF tensors and write them (writer ranks); rank 0 returns them as written,
        read back from the files (for the sync checksums)."""
        trainer = self.trainer
        trainer.builder.save(trainer.model, directory, self.rollout_source, durable=False)
        dist.barrier()
        if dist.get_rank() != 0:
            return None
        reader = checkpoint.HFReader(directory)
        return {name: reader.get(name) for name in reader.locations}

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every HF tensor on this rank's GPU, under the text model's names (collective: all ranks iterate)."""
        return self.trainer.builder.hf_tensors(self.trainer.model)

    def save(self, save_dir: Path, step: int) -> None:
        self.trainer.iteration = step
        self.trainer.save(save_dir)


def _output_layer(model):
    """The output layer of this pipeline stage's model chunk (under Megatron's DDP and fp16 wrappers), or None on a
    stage before the last, which has none."""
    while not hasattr(model, "output_layer") and hasattr(model, "module"):
        model = model.module
    return getattr(model, "output_layer", None)


@contextmanager
def _tempered(model, temperature: float) -> Iterator[None]:
    """For the duration, the model's output layer returns logits / temperature, so its own loss path (Megatron's
    vocab-parallel or fused cross entropy on the output layer's logits) scores tokens under softmax(logits / T).
    A forward that never reached the output layer on the last stage (a fused path past it) would score the untempered
    distribution, so that is an error, not a silent mismatch."""
    layer = _output_layer(model)
    if temperature == 1.0 or layer is None:
        yield
        return
    reached: list[bool] = []

    def divide(module, inputs, output):
        reached.append(True)
        if isinstance(output, tuple):  # ColumnParallelLinear: (output, bias)
            return (output[0] / temperature, *output[1:])
        return output / temperature

    handle = layer.register_forward_hook(divide)
    try:
        yield
    finally:
        handle.remove()
    if not reached:
        raise RuntimeError(
            "the model's forward did not go through its output layer, so its log-probs would ignore "
            f"rollout.temperature {temperature:g}; turn off the fused cross-entropy path that skips the layer "
            "or sample at rollout.temperature 1."
        )


@contextmanager
def _adapters_off(model) -> Iterator[None]:
    """megatron-bridge's LoRA wrappers compute their base linear alone for the duration: LoRALinear.forward returns
    the wrapped linear's output untouched while its adapter is disabled (megatron-bridge 0.6.2
    peft/lora_layers.py lines 65-86, peft/adapter_wrapper.py lines 105-111; PEFT.disable_adapter, peft/base.py
    lines 143-175, walks the model the same way). That is exactly the base the LoRA policy started from, its lora_B
    having been zero (peft/lora.py: lora_B_init_method "zero")."""
    wrappers = [module for module in model.modules() if callable(getattr(module, "disable_adapter_layers", None))]
    if not wrappers:
        raise RuntimeError(
            "train.lora is set but the policy's model has no LoRA wrapper to switch off, so the KL "
            "reference would be the trained policy itself; build it through the megatron-bridge "
            "builder (runtime.transformer_engine)."
        )
    for module in wrappers:
        module.disable_adapter_layers()
    try:
        yield
    finally:
        for module in wrappers:
            module.enable_adapter_layers()


def _keep_token_losses(token_losses: torch.Tensor):
    """Forward-only loss function: nothing to reduce, the per-token losses kept for the caller."""
    zero = token_losses.new_zeros(())
    return zero, torch.ones((), dtype=torch.int, device=token_losses.device), {"token_losses": token_losses.detach()}


def _grpo_loss(
    batch: RlBatch, reference: torch.Tensor | None, old: torch.Tensor | None, settings, token_losses: torch.Tensor
):
    """Megatron's per-token loss contract: (sum of losses, count, report). The count is response tokens for
    "token-mean" and sequences for "seq-mean-token-mean", so Megatron's division gives the batch mean.
    `reference`: the reference model's per-token losses for these rows, when the KL term is on; `old`: the
    behaviour policy's log-probs (runtime/rl/algorithm/updates.py), None when this is the rollout batch's only
    update."""
    device = token_losses.device
    mask = batch.response_mask.to(device)
    logprobs = -token_losses[:, :-1].float()
    ref_logprobs = None if reference is None else -reference[:, :-1].float()
    advantages = grpo.token_advantages(batch.advantages.to(device), mask)
    old = logprobs.detach() if old is None else old
    rollout = batch.rollout_logprobs.to(device)
    loss, stats = grpo.grpo_loss(
        logprobs,
        old,
        advantages,
        mask,
        ref_logprobs=ref_logprobs,
        kl_coef=settings.kl_coef,
        kl_kind=settings.kl_kind,
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
        aggregation=settings.aggregation,
        rollout_logprobs=rollout,
        tis_cap=settings.rollout_correction_cap if settings.rollout_correction else None,
    )
    tokens = mask.sum()
    count = tokens if settings.aggregation == "token-mean" else torch.tensor(mask.shape[0], device=mask.device)
    total = loss * count
    gap = ((old - rollout).abs() * mask).sum()
    zero = torch.zeros((), device=mask.device)
    kl = stats["kl"].detach() * count if "kl" in stats else zero
    # Token-weighted sums of the per-token means, so the step's values are means over all its response tokens.
    report = torch.stack(
        [
            total.detach().double(),
            count.double(),
            gap.double(),
            tokens.double(),
            kl.double(),
            (stats["clip_fraction"] * tokens).double(),
            (stats["approx_kl"] * tokens).double(),
            (stats.get("tis_mean", zero) * tokens).double(),
            (stats.get("tis_capped_fraction", zero) * tokens).double(),
            -stats["ratio_min"].double()
            if tokens
            else torch.tensor(-torch.inf, device=mask.device, dtype=torch.float64),
            stats["ratio_max"].double()
            if tokens
            else torch.tensor(-torch.inf, device=mask.device, dtype=torch.float64),
        ]
    )
    return total, count.to(torch.int), {"rl": report}


def _nonfinite_main_gradients(model) -> list[str]:
    """Names of the parameters whose main gradient holds a non-finite value, in the model's order."""
    return [
        name.removeprefix("module.")
        for name, param in model.named_parameters()
        if getattr(param, "main_grad", None) is not None and not bool(torch.isfinite(param.main_grad).all())
    ]
