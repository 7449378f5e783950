"""The interface the rl job trains through, so the loop does not care which policy runs.

`TorchPolicy` (device cpu: transformers' text class, plain torch) and `MegatronPolicy` (GPUs: the sft trainer's
Megatron model and optimizer) both implement it; `make_policy` picks one from the engine config's device.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from gdnctl.runtime.rl.algorithm import RlBatch
    from gdnctl.schema import EngineConfig


@runtime_checkable
class Policy(Protocol):
    step: int  # rollout steps already taken (after a resume: the checkpoint's)
    dp_rank: int
    dp_size: int

    def probe_logprobs(self, tokens: list[int]) -> list[float]:
        """log p of tokens[1:] given their prefix: what the weight-sync probe compares with the rollout's."""

    def logprobs(self, micro_batches: list[RlBatch]) -> list[torch.Tensor | None]:
        """log p of every next token per micro-batch under the current weights, without grad (the behaviour
        policy's, before a rollout batch's first update; None where a rank computes none, e.g. a pipeline stage
        before the last)."""

    def train_step(
        self,
        micro_batches: list[RlBatch],
        settings,
        *,
        lr: float | None = None,
        old_logprobs: list[torch.Tensor | None] | None = None,
    ) -> dict[str, float]:
        """One GRPO optimizer step at `lr` (None: the optimizer's current lr) over this rank's micro-batches,
        the ratio against `old_logprobs` (None: the current weights sampled); returns the step's statistics: loss,
        grad_norm, rollout_logprob_abs_diff, tokens, response_tokens, clip_fraction, approx_kl, ratio_min,
        ratio_max (and kl, tis_mean, tis_capped_fraction when on), and the finiteness verdict the job's
        NonFiniteGuard reads: loss_finite, grad_finite, applied (False: the update was not applied),
        bad_parameters (names of the parameters whose gradient is not finite) and parameter_count."""

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every HF tensor of the policy under the text model's names, on this rank's device (collective on
        GPUs): what the in-memory weight sync shares."""

    def export(self, directory: Path) -> dict[str, torch.Tensor] | None:
        """Write the HF safetensors the rollout reloads; rank 0 returns the tensors it wrote (checksums)."""

    def save(self, save_dir: Path, step: int) -> None:
        """A resumable checkpoint (HF weights plus optimizer state) for `step`."""


def make_policy(config: EngineConfig, config_path: Path, comm_policy) -> Policy:
    if config.device == "cpu":
        from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

        return TorchPolicy(config)
    from gdnctl.runtime.rl.policy.megatron_policy import MegatronPolicy

    return MegatronPolicy(config, config_path, comm_policy)
