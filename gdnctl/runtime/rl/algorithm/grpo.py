"""GRPO math in pure torch: group-relative advantages, the clipped policy loss, KL estimators, token log-probs.

Shapes. Per-token tensors (log-probs, masks, token advantages) come in one of two layouts:
- padded rows `[B, T]`: one sequence per row, `response_mask` zero on prompt and padding tokens;
- THD-packed `[1, T]` or `[T]`: all sequences in one row; `cu_seqlens` (int `[N + 1]`, the segment offsets in
  the packed row, i.e. `ThdBatch.cu_seqlens_padded`) says where each sequence starts. Only functions that need
  to know which token belongs to which sequence take it.
Masks are bool or 0/1 tensors of the per-token shape; they alone decide which tokens count, so prompt tokens,
padding and packed neighbours need no special handling. In the functions that take a mask, values at masked-out
positions may be anything, even inf or nan: they are replaced before any arithmetic, so they reach neither the
loss nor the gradients.

Low-precision inputs (fp16/bf16) are computed in fp32; fp32 and fp64 stay as they are.

The objective, per response token t of response i with ratio r = exp(logprob - old_logprob):

    loss_t = max(-A_i r, -A_i clip(r, 1 - clip_low, 1 + clip_high))    (+ kl_coef * KL_t)

aggregated over the response tokens ("token-mean") or per sequence first ("seq-mean-token-mean").

Rollout correction (truncated importance sampling, `tis_cap`): the rollout engine samples from its own numerics
(vLLM's bf16 kernels), not exactly from the trainer's behaviour policy, so the samples are slightly off-policy
even on the first update. With w_t = min(exp(old_logprob_t - rollout_logprob_t), tis_cap), detached, each token's
loss_t above is multiplied by w_t: the trainer's estimate of its probability over the rollout's, capped so one
token the rollout found far likelier than the trainer cannot dominate. slime's policy loss does the same
(THUDM/slime, slime/backends/megatron_utils/loss.py: tis = exp(old_log_probs - rollout_log_probs), clamped to
[tis_clip_low, tis_clip], pg_loss * tis_clip; --tis-clip 2.0 by default), as does verl's rollout importance
sampling at token level (volcengine/verl, verl/trainer/ppo/core_algos.py; docs/advance/rollout_is.md).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

Aggregation = Literal["token-mean", "seq-mean-token-mean"]
KlKind = Literal["k1", "k2", "k3"]

AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean")
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")

# Log-ratios are clamped here before exp(): a ratio of e^20 (~5e8) already carries no useful gradient, and the
# bound keeps one wild token (fp32 exp() overflows past 88) from turning the whole loss into inf/nan.
MAX_LOG_RATIO = 20.0


def _compute_dtype(tensor: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 (exp, log_softmax and means lose too much in 8-10 mantissa bits); others unchanged."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def _check_same_shape(reference: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor.shape != reference.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but the per-token tensors here have shape "
                f"{tuple(reference.shape)}; pass tensors of one layout ([B, T] or packed [1, T])."
            )


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set (all dims, or `dim`). Masked-out entries are dropped, not multiplied
    by zero, so an inf/nan there does not leak into the sum or its gradient."""
    kept = torch.where(mask.bool(), _compute_dtype(values), 0)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over the masked-in entries; 0 where there are none (a micro-batch or CP chunk without
    response tokens contributes nothing instead of nan)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def sequence_ids(
    shape: torch.Size | tuple[int, ...],
    cu_seqlens: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """int64 tensor of `shape` holding the index of the sequence each token belongs to.

    Without `cu_seqlens` the layout is padded rows `[B, T]` and the sequence is the row. With it, the tokens are
    one packed row (`[T]` or `[1, T]`) and sequence i covers `cu_seqlens[i]:cu_seqlens[i + 1]`.
    """
    if cu_seqlens is None:
        if len(shape) != 2:
            raise ValueError(
                f"Per-token tensors of shape {tuple(shape)} need cu_seqlens to say where each "
                "sequence starts; only padded [B, T] rows can do without."
            )
        return torch.arange(shape[0], device=device).unsqueeze(1).expand(shape)
    total = int(torch.Size(shape).numel())
    if len(shape) > 2 or (len(shape) == 2 and shape[0] != 1) or int(cu_seqlens[-1]) != total:
        raise ValueError(
            f"cu_seqlens ending at {int(cu_seqlens[-1])} does not describe one packed row of shape "
            f"{tuple(shape)}; pass the packed tokens as [T] or [1, T] with cu_seqlens[-1] == T."
        )
    lengths = cu_seqlens.diff().to(device=device, dtype=torch.long)
    ids = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
    return ids.reshape(shape)


def masked_mean_per_sequence(
    values: torch.Tensor, mask: torch.Tensor, cu_seqlens: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence mean over masked-in tokens -> (means `[N]`, has_tokens bool `[N]`).

    A sequence without masked-in tokens gets mean 0 and has_tokens False, so the caller can leave it out of a
    mean over sequences instead of counting it as a zero.
    """
    ids = sequence_ids(values.shape, cu_seqlens, device=values.device).reshape(-1)
    num_sequences = values.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    keep = mask.bool().reshape(-1)
    flat = torch.where(keep, _compute_dtype(values).reshape(-1), 0)
    sums = flat.new_zeros(num_sequences).index_add(0, ids, flat)
    counts = torch.zeros(num_sequences, dtype=torch.long, device=values.device).index_add(0, ids, keep.long())
    return sums / counts.clamp(min=1), counts > 0


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation = "token-mean",
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    "token-mean": every response token weighs the same, so long responses weigh more (DAPO's choice: repetition
    or gibberish in a long response is not diluted by its length). "seq-mean-token-mean": mean within each
    response, then over responses that have tokens (the GRPO paper's 1/G sum_i 1/|o_i| sum_t).
    """
    if aggregation == "token-mean":
        return masked_mean(values, mask)
    if aggregation == "seq-mean-token-mean":
        means, has_tokens = masked_mean_per_sequence(values, mask, cu_seqlens)
        return masked_mean(means, has_tokens)
    raise ValueError(f"Unknown aggregation {aggregation!r}; use one of {', '.join(AGGREGATIONS)}.")


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantages: `rewards` `[num_prompts * group_size]`, the samples of one prompt contiguous.

    A_i = (r_i - mean(group)) / (std(group) + eps), std unbiased (torch.std) as verl and slime compute it; with
    `normalize_std=False` only the mean is subtracted (Dr. GRPO, which drops the std because it up-weights
    near-uniform groups). A group whose rewards are all equal gets exactly zero advantages: every sample did
    equally well, so there is nothing to prefer (and in fp32, mean([0.3] * 6) != 0.3: dividing that rounding
    error by an equally tiny std would hand such a group advantages of ~0.03).
    group_size 1 therefore gives all zeros. Returns a tensor of the rewards' shape (fp32 for integer/bool
    rewards), without grad.
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards of shape {tuple(rewards.shape)} cannot be split into groups of {group_size}; "
            "pass a 1-D tensor of num_prompts * group_size rewards, each prompt's samples together."
        )
    with torch.no_grad():
        groups = rewards.reshape(-1, group_size)
        groups = groups.float() if not groups.is_floating_point() else _compute_dtype(groups)
        centered = groups - groups.mean(dim=1, keepdim=True)
        if normalize_std and group_size > 1:
            centered = centered / (groups.std(dim=1, keepdim=True) + eps)
        uniform = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)
        return torch.where(uniform, 0, centered).reshape(rewards.shape)


def token_advantages(
    advantages: torch.Tensor, response_mask: torch.Tensor, cu_seqlens: torch.Tensor | None = None
) -> torch.Tensor:
    """Broadcast per-sequence advantages `[N]` onto their response tokens (outcome reward: every token of a
    response gets the response's advantage); 0 on tokens outside `response_mask`. Layout as `response_mask`:
    padded `[N, T]`, or packed `[T]` / `[1, T]` with `cu_seqlens` (N + 1 offsets)."""
    num_sequences = response_mask.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    if advantages.shape != (num_sequences,):
        raise ValueError(
            f"advantages of shape {tuple(advantages.shape)} do not match the {num_sequences} sequences "
            f"of a response mask of shape {tuple(response_mask.shape)}; pass one per sequence."
        )
    ids = sequence_ids(response_mask.shape, cu_seqlens, device=advantages.device)
    return torch.where(response_mask.bool(), advantages[ids], 0)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """log p(tokens) under softmax(logits / temperature): logits `[..., V]`, tokens int `[...]` -> `[...]`.

    `tokens[..., t]` must be the token that `logits[..., t, :]` predicts (the next token: shift the input ids by
    one, as `TokenSequence.labels` already are). Works for `[B, T, V]` and packed `[1, T, V]` alike. Divide by the
    rollout's sampling temperature so the log-probs are those of the distribution vLLM sampled from.
    log_softmax subtracts the max before exponentiating, so large logits neither overflow nor lose the token's
    probability to rounding; bf16/fp16 logits are upcast first.
    """
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(
            f"tokens of shape {tuple(tokens.shape)} do not match logits of shape "
            f"{tuple(logits.shape)}; tokens need the logits' shape without the vocab dimension."
        )
    if temperature <= 0:
        raise ValueError(
            f"temperature must be positive (got {temperature}); greedy rollouts have no log-probs to train on."
        )
    logits = _compute_dtype(logits)
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = F.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KlKind = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from tokens sampled from pi (Schulman, "Approximating KL divergence").

    With d = ref_logprobs - logprobs:
    - k1 = -d: unbiased, high variance, can be negative;
    - k2 = d^2 / 2: biased, low variance, >= 0;
    - k3 = exp(d) - d - 1: unbiased and low variance, >= 0 (GRPO's choice). d is clamped to +-MAX_LOG_RATIO
      first so exp() cannot overflow.
    All are 0 where the two log-probs are equal. Same shape as the inputs; no masking (use masked_mean/aggregate).
    """
    _check_same_shape(logprobs, ref_logprobs=ref_logprobs)
    delta = _compute_dtype(ref_logprobs) - _compute_dtype(logprobs)
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta.square()
    if kind == "k3":
        delta = delta.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        return torch.expm1(delta) - delta
    raise ValueError(f"Unknown KL estimator {kind!r}; use one of {', '.join(KL_KINDS)}.")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
    cu_seqlens: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip surrogate as GRPO uses it -> (scalar loss to minimise, stats).

    logprobs: current policy, with grad; old_logprobs: the policy that sampled (no grad needed); advantages:
    per token (see token_advantages), or `[B, 1]` for padded rows; all per-token tensors of one layout.
    `clip_high > clip_low` is DAPO's "clip-higher": it lets low-probability tokens with positive advantage grow
    further before the clip stops them, which keeps entropy from collapsing.

    The clip only ever removes gradient: a token is clipped when the ratio has already moved past 1 + clip_high
    with A > 0, or below 1 - clip_low with A < 0; moves in the harmful direction stay unclipped (pessimistic
    bound). `cu_seqlens` is needed only for "seq-mean-token-mean" on packed rows.

    stats (detached 0-d tensors, over response tokens): clip_fraction, clip_fraction_high (A > 0 side),
    clip_fraction_low (A < 0 side), approx_kl (k3 estimate of KL(old || current)), ratio_mean, ratio_min,
    ratio_max; with `tis_cap`, tis_mean (the mean weight) and tis_capped_fraction (tokens whose weight the cap cut).

    `tis_cap` (with `rollout_logprobs`, the rollout engine's log-probs of the same tokens): the rollout correction
    of the module docstring; None: off.
    """
    _check_same_shape(logprobs, old_logprobs=old_logprobs, response_mask=response_mask)
    if tis_cap is not None and rollout_logprobs is None:
        raise ValueError(
            "tis_cap is set but no rollout_logprobs were given; pass the rollout's log-probs of the "
            "sampled tokens, or tis_cap=None."
        )
    if advantages.dim() != logprobs.dim():
        raise ValueError(
            f"advantages of shape {tuple(advantages.shape)} do not line up with log-probs of shape "
            f"{tuple(logprobs.shape)}; pass per-token advantages (token_advantages) or [B, 1]."
        )
    mask = response_mask.bool()
    # Zero the log-ratio outside the mask before exp(): padding may hold -inf/nan log-probs, and only finite
    # values should reach exp(), maximum() and their backward, not rely on being dropped afterwards.
    log_ratio = torch.where(mask, _compute_dtype(logprobs) - _compute_dtype(old_logprobs), 0)
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = log_ratio.exp()
    advantages = torch.where(mask, _compute_dtype(advantages), 0)

    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    weights = None
    if tis_cap is not None:
        _check_same_shape(logprobs, rollout_logprobs=rollout_logprobs)
        with torch.no_grad():
            behaviour_gap = torch.where(mask, _compute_dtype(old_logprobs) - _compute_dtype(rollout_logprobs), 0)
            raw = behaviour_gap.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
            weights = raw.clamp(max=tis_cap)
        per_token = per_token * weights
    loss = aggregate(per_token, mask, aggregation, cu_seqlens)

    with torch.no_grad():
        is_clipped = clipped > unclipped
        stats = {
            "clip_fraction": masked_mean(is_clipped.float(), mask),
            "clip_fraction_high": masked_mean((is_clipped & (advantages > 0)).float(), mask),
            "clip_fraction_low": masked_mean((is_clipped & (advantages < 0)).float(), mask),
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_min": torch.where(mask, ratio, torch.inf).min() if mask.any() else ratio.new_zeros(()),
            "ratio_max": torch.where(mask, ratio, 0).max() if mask.any() else ratio.new_zeros(()),
        }
        if weights is not None:
            stats["tis_mean"] = masked_mean(weights, mask)
            stats["tis_capped_fraction"] = masked_mean((raw > tis_cap).float(), mask)
    return loss, stats


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KlKind = "k3",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
    cu_seqlens: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """policy_loss + kl_coef * KL(current || ref), the KL aggregated like the policy loss -> (loss, stats).

    The KL is a loss term (GRPO), not a reward penalty, so it regularises every token directly. With
    kl_coef == 0 no reference log-probs are needed. stats: policy_loss's plus policy_loss and, with a KL term,
    kl (the aggregated estimate, before kl_coef).
    """
    pg_loss, stats = policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        response_mask,
        clip_low=clip_low,
        clip_high=clip_high,
        aggregation=aggregation,
        cu_seqlens=cu_seqlens,
        rollout_logprobs=rollout_logprobs,
        tis_cap=tis_cap,
    )
    stats["policy_loss"] = pg_loss.detach()
    if kl_coef == 0.0:
        return pg_loss, stats
    if ref_logprobs is None:
        raise ValueError(
            f"kl_coef is {kl_coef} but no ref_logprobs were given; pass the reference model's "
            "log-probs or set kl_coef to 0."
        )
    mask = response_mask.bool()
    # Same reason as in policy_loss: padding log-probs (possibly -inf in both) must not reach exp() or its grad.
    per_token = kl_penalty(torch.where(mask, logprobs, 0), torch.where(mask, ref_logprobs, 0), kl_kind)
    kl = aggregate(per_token, mask, aggregation, cu_seqlens)
    stats["kl"] = kl.detach()
    return pg_loss + kl_coef * kl, stats
