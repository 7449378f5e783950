"""The rl job's policy on device cpu: transformers' Qwen3.5 text class trained with plain torch (DDP on gloo).

Megatron-Core cannot run here (its GDN layer needs the CUDA kernels of FLA or FlashQLA); transformers'
Qwen3_5ForCausalLM has a pure-torch GDN path, so on CPU the same HF architecture, weights and names train with
torch instead. The parameters are fp32 (AdamW on bf16 weights loses most small updates); the rollout gets bf16
copies, as it would from Megatron's bf16 model.

Optimizer settings are the Megatron trainer's (AdamW, betas 0.9/0.95, weight decay 0.01, grad clip 1.0, the lr
schedule of runtime/train/lr_schedule.py, set by the job each step), so an rl preset means the same thing on both
devices. The interface is MegatronPolicy's: probe_logprobs, logprobs, train_step, export, save, and `step` (steps
already taken, after a resume from train.save_dir/latest).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.rl.algorithm import RlBatch, grpo
from gdnctl.runtime.rl.weights import sync as weight_sync
from gdnctl.runtime.train import ADAM_BETAS, CLIP_GRAD, WEIGHT_DECAY, set_lr
from gdnctl.schema import EngineConfig


def hf_model_classes(arch):
    """(config class, model class) of transformers' text-only class for this architecture (its family's)."""
    import transformers

    family = arch.family
    return getattr(transformers, family.text_config_class), getattr(transformers, family.text_class)


class TorchPolicy:
    def __init__(self, config: EngineConfig, device: str = "cpu") -> None:
        """Build the model from the architecture (random init from train.seed); load the weights of the latest
        checkpoint in train.save_dir (with its optimizer state and step), else of model.path, when there is one."""
        self.device = torch.device(device)
        model = self._new_model(config)
        initial = Path(config.model.path) if config.model.path else None
        if initial is not None:
            self._load_weights(model, initial)
        self.reference = None
        if config.grpo.kl_coef > 0:
            # The KL anchor is the policy as the job first started (model.path, else the seeded init), also
            # after a resume: a frozen copy taken before the checkpoint's weights are loaded.
            self.reference = copy.deepcopy(model).to(self.device).requires_grad_(False)
        checkpoint.check_source_outside_save_dir(config.model.path, config.train.save_dir)
        resume = checkpoint.latest_checkpoint(Path(config.train.save_dir)) if config.train.save_dir else None
        self.reads = (initial, resume)  # the checkpoints its weights come from, which no save may replace
        if resume is not None:
            self._load_weights(model, resume)
        # What every save carries over (the MTP head, a vision tower) and the names and config.json it keeps.
        self.source = self._save_source(config, resume or initial)
        # What the rollout serves: the text-only class, or Qwen3.5's vision-language one (on vLLM < 0.27, or with
        # its tower for image prompts).
        self.rollout_source = checkpoint.rollout_source(
            config.model, config.rollout.vision_language_class, images=config.train.images is not None
        )
        self.module = model.to(self.device)
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        self.model = (
            torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=self.unused_parameters)
            if self.dp_size > 1
            else model
        )
        self.tied = config.model.tie_word_embeddings
        # The rollout samples softmax(logits / T): the samples' log-probs are scored under that distribution, as
        # vLLM's processed log-probs are (rollout/server.py engine_kwargs). The probe is scored at T = 1 on both sides
        # (vLLM's prompt log-probs are never tempered).
        self.temperature = config.rollout.temperature
        self.optimizer = torch.optim.AdamW(
            [param for param in model.parameters() if param.requires_grad],
            lr=config.train.lr,
            betas=ADAM_BETAS,
            weight_decay=WEIGHT_DECAY,
        )
        self.step = 0
        if resume is not None:
            self.step = checkpoint.read_training_state(resume, self.dp_size)["iteration"]
            checkpoint.load_training_state(resume, self.optimizer, device=str(self.device))

    # Whether a step may leave parameters without a gradient (DDP must then look for them).
    unused_parameters = False

    def _new_model(self, config: EngineConfig) -> torch.nn.Module:
        """transformers' text class of the architecture, random init from train.seed."""
        config_class, model_class = hf_model_classes(config.model)
        torch.manual_seed(config.train.seed)
        return model_class(config_class(**checkpoint.hf_text_config(config.model))).float()

    def _load_weights(self, model: torch.nn.Module, directory: Path) -> None:
        _load(model, directory)

    def _save_source(self, config: EngineConfig, directory: Path | None):
        return checkpoint.run_source(config.model, directory)

    def _forward(self, model: torch.nn.Module, tokens: torch.Tensor, attention_mask, images) -> torch.Tensor:
        """The logits of `tokens` (`images`: a text policy has none)."""
        return model(input_ids=tokens, attention_mask=attention_mask).logits

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights under their checkpoint names (per-expert, see per_expert); a tied LM head is the
        embedding, so it is not sent twice."""
        for name, tensor in self.module.state_dict().items():
            if self.tied and name == "lm_head.weight":
                continue
            yield from per_expert(name, tensor)

    def _logprobs(self, model: torch.nn.Module, batch: RlBatch) -> torch.Tensor:
        """log p of each next token `[N, T - 1]` under `model`, at the rollout's sampling temperature."""
        tokens = batch.tokens.to(self.device)
        logits = self._forward(model, tokens, batch.attention_mask.to(self.device), batch.images)
        return grpo.logprobs_from_logits(
            self._sampled_logits(logits[:, :-1].float()), tokens[:, 1:], temperature=self.temperature
        )

    def _sampled_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits the engine samples from, before its temperature (a text policy's: the model's)."""
        return logits

    @torch.no_grad()
    def probe_logprobs(self, tokens: list[int], images=None) -> list[float]:
        """log p of tokens[1:] given their prefix (an image prompt's with its `images`), as the rollout's prompt
        log-probs score them (temperature 1)."""
        ids = torch.tensor([tokens], device=self.device)
        logits = self._forward(self.module, ids, None, images)
        return grpo.logprobs_from_logits(logits[:, :-1].float(), ids[:, 1:])[0].tolist()

    @torch.no_grad()
    def logprobs(self, micro_batches: list[RlBatch]) -> list[torch.Tensor]:
        """log p of every next token `[N, T - 1]` per micro-batch under the current weights, without grad: the
        behaviour policy's log-probs, taken before a rollout batch's first update (runtime/rl/algorithm/updates.py)."""
        return [self._logprobs(self.module, batch) for batch in micro_batches]

    def train_step(
        self,
        micro_batches: list[RlBatch],
        settings,
        *,
        lr: float | None = None,
        old_logprobs: list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """One optimizer step at `lr` over this rank's micro-batches -> stats over the whole step (the same on
        every rank): loss, grad_norm, rollout_logprob_abs_diff (behaviour policy vs rollout log-probs of the
        sampled tokens), tokens, response_tokens, clip_fraction, approx_kl, ratio_min, ratio_max, and kl when it
        is on. `old_logprobs`: the behaviour policy's, per micro-batch (None: this is the batch's only update, so
        the current weights are the behaviour policy and their log-probs, detached, serve).

        Each micro-batch's mean loss is weighted by its share of the step's response tokens ("token-mean") or
        sequences, counted over every rank, so the weighted losses add up to the loss of the whole batch; the
        backward multiplies by the world size because DDP averages gradients over ranks."""
        self.model.train()
        if lr is not None:  # None: the optimizer keeps the lr it has (train.lr, or the last one set)
            set_lr(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        tis_cap = settings.rollout_correction_cap if settings.rollout_correction else None
        local = torch.tensor([[b.num_response_tokens, b.tokens.shape[0]] for b in micro_batches], dtype=torch.float64)
        totals = local.sum(dim=0)
        dist.all_reduce(totals)
        column = 0 if settings.aggregation == "token-mean" else 1
        weights = (local[:, column] / totals[column].clamp(min=1)).tolist()
        # [weighted loss, |logp diff| sum, response tokens, weighted kl, tokens, weighted clip fraction,
        #  weighted approx kl, weighted tis mean, weighted tis capped fraction] on this rank
        sums = torch.zeros(9, dtype=torch.float64)
        # [-ratio min, ratio max]: one MAX reduction gives both extremes
        extremes = torch.full((2,), -torch.inf, dtype=torch.float64)
        for index, (batch, weight) in enumerate(zip(micro_batches, weights, strict=True)):
            # Gradients are reduced once, on the last micro-batch.
            last = index == len(micro_batches) - 1
            with nullcontext() if last or self.dp_size == 1 else self.model.no_sync():
                logprobs = self._logprobs(self.model, batch)
                ref = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref = self._logprobs(self.reference, batch)
                mask = batch.response_mask.to(self.device)
                advantages = grpo.token_advantages(batch.advantages.to(self.device), mask)
                old = logprobs.detach() if old_logprobs is None else old_logprobs[index].to(self.device)
                rollout = batch.rollout_logprobs.to(self.device)
                loss, stats = grpo.grpo_loss(
                    logprobs,
                    old,
                    advantages,
                    mask,
                    ref_logprobs=ref,
                    kl_coef=settings.kl_coef,
                    kl_kind=settings.kl_kind,
                    clip_low=settings.clip_low,
                    clip_high=settings.clip_high,
                    aggregation=settings.aggregation,
                    rollout_logprobs=rollout,
                    tis_cap=tis_cap,
                )
                (loss * weight * self.dp_size).backward()
            gap = ((old - rollout).abs() * mask).sum()
            sums += torch.tensor(
                [
                    float(loss.detach()) * weight,
                    float(gap),
                    batch.num_response_tokens,
                    float(stats.get("kl", 0.0)) * weight,
                    batch.num_tokens,
                    float(stats["clip_fraction"]) * weight,
                    float(stats["approx_kl"]) * weight,
                    float(stats.get("tis_mean", 0.0)) * weight,
                    float(stats.get("tis_capped_fraction", 0.0)) * weight,
                ],
                dtype=torch.float64,
            )
            if batch.num_response_tokens:
                extremes = torch.maximum(
                    extremes, torch.tensor([-float(stats["ratio_min"]), float(stats["ratio_max"])], dtype=torch.float64)
                )
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), CLIP_GRAD)
        dist.all_reduce(sums)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
        # Every rank sees the same norm (DDP averaged the gradients) and the same sums, so all skip together.
        loss_finite, grad_finite = bool(torch.isfinite(sums[0])), bool(torch.isfinite(grad_norm))
        if loss_finite and grad_finite:
            self.optimizer.step()
        stats = {
            "loss": float(sums[0]),
            "grad_norm": float(grad_norm),
            "loss_finite": loss_finite,
            "grad_finite": grad_finite,
            "applied": loss_finite and grad_finite,
            "bad_parameters": [] if grad_finite else _nonfinite_gradients(self.module),
            "parameter_count": sum(1 for _ in self.module.parameters()),
            "rollout_logprob_abs_diff": float(sums[1] / sums[2].clamp(min=1)),
            "tokens": int(sums[4]),
            "response_tokens": int(sums[2]),
            "clip_fraction": float(sums[5]),
            "approx_kl": float(sums[6]),
            "ratio_min": float(-extremes[0]),
            "ratio_max": float(extremes[1]),
        }
        if tis_cap is not None:
            stats["tis_mean"], stats["tis_capped_fraction"] = float(sums[7]), float(sums[8])
        if self.reference is not None:
            # Weighted like the loss: the KL of the whole step's batch, aggregated as grpo.aggregation says.
            stats["kl"] = float(sums[3])
        return stats

    def export(self, directory: Path) -> dict[str, torch.Tensor] | None:
        """Rank 0 writes the bf16 HF weights the rollout reloads and returns them as written; None elsewhere
        (every rank holds the same weights)."""
        if dist.get_rank() != 0:
            return None
        rollout = self.rollout_source
        return weight_sync.write_weights(
            ((rollout.stored_name(name), tensor) for name, tensor in self.hf_tensors()),
            directory,
            config=rollout.config,
            files=self._rollout_files(),
        )

    def _rollout_files(self) -> dict[str, str]:
        """Files the rollout's engine reads beside the weights (a text policy's: none)."""
        return {}

    def _saved_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What a save writes (the rest it carries over from its source)."""
        return self.hf_tensors()

    def _save_extras(self, directory: Path) -> dict:
        """Files a save writes beside the weights, as save_training_state's `written` entries (a text policy's:
        none)."""
        return {}

    def save(self, save_dir: Path, step: int) -> None:
        """A checkpoint in the Megatron trainer's layout (HF weights in fp32 with what they carry over from the
        source checkpoint, each rank's optimizer state, trainer_state.json); `latest` moves to it once every rank
        has written."""
        directory = save_dir / checkpoint.checkpoint_name(step)
        checkpoint.refuse_overwriting_source(directory, self.reads)
        written = {}
        if dist.get_rank() == 0:
            written = checkpoint.save_tensors(self._saved_tensors(), directory, self.source)
            written.update(self._save_extras(directory))
        checkpoint.save_training_state(directory, self.optimizer, {"iteration": step}, written)
        dist.barrier()
        if dist.get_rank() == 0:
            checkpoint.mark_latest(save_dir, directory.name)
        # No rank goes on before `latest` has moved: a rank that died in the next save could otherwise take the
        # job down while rank 0 was still marking this complete checkpoint, and the resume would miss it.
        dist.barrier()


# transformers 5 keeps a MoE layer's experts fused in memory (experts.gate_up_proj [E, 2I, H] with each expert's
# gate rows before its up rows, experts.down_proj [E, H, I]); checkpoints, Megatron's HF writer and vLLM's
# loader name them per expert (experts.{e}.gate_proj / up_proj / down_proj.weight).
_FUSED_EXPERTS = re.compile(r"(.+\.experts)\.(gate_up_proj|down_proj)")


def per_expert(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """One in-memory tensor under its checkpoint name(s): a fused expert tensor as one tensor per expert."""
    match = _FUSED_EXPERTS.fullmatch(name)
    if match is None:
        yield name, tensor
        return
    prefix, kind = match.groups()
    for expert, weights in enumerate(tensor):
        if kind == "down_proj":
            yield f"{prefix}.{expert}.down_proj.weight", weights
        else:
            gate, up = weights.chunk(2, 0)
            yield f"{prefix}.{expert}.gate_proj.weight", gate
            yield f"{prefix}.{expert}.up_proj.weight", up


def _read(reader: checkpoint.HFReader, name: str, param: torch.Tensor) -> torch.Tensor:
    """The checkpoint's tensor for one in-memory parameter, fused from per-expert tensors where needed."""
    match = _FUSED_EXPERTS.fullmatch(name)
    if match is None:
        return reader.get(name)
    prefix, kind = match.groups()
    if kind == "down_proj":
        return torch.stack([reader.get(f"{prefix}.{e}.down_proj.weight") for e in range(param.shape[0])])
    return torch.stack(
        [
            torch.cat([reader.get(f"{prefix}.{e}.gate_proj.weight"), reader.get(f"{prefix}.{e}.up_proj.weight")], 0)
            for e in range(param.shape[0])
        ]
    )


def _load(model: torch.nn.Module, directory: Path) -> None:
    reader = checkpoint.HFReader(directory)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_read(reader, name, param).to(param.dtype))


def _nonfinite_gradients(module) -> list[str]:
    """Names of the parameters whose gradient holds a non-finite value, in the model's order."""
    return [
        name
        for name, param in module.named_parameters()
        if param.grad is not None and not bool(torch.isfinite(param.grad).all())
    ]
