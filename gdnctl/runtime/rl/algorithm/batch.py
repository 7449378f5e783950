"""From rollout samples to training rows: padded prompt+response rows, masks aligned with next-token log-probs,
and the split over data-parallel ranks and micro-batches.

Row layout (padded, BSHD): row i is prompt_i + response_i, right-padded with `pad_id`. Log-probs are per next
token, so the tensors that go with them have T - 1 columns: column t scores tokens[:, t + 1] from the logits at
t. A response token at row position p is therefore column p - 1; the prompt's tokens and padding are masked out.
Right padding never reaches a real token's logits (the model is causal). A sample that takes no loss
(`Sample.trained` False) keeps its row, with an empty response mask.

A multi-turn sample's response holds the environment's tokens between the model's turns (rollout/episodes.py):
its `loss_mask` says which response tokens the model sampled, and only those are in `response_mask`, so the
environment's tokens take no loss (their rollout log-probs are placeholders, never read).

A sample of an image prompt carries its prompt's patches (`PromptPixels`); a batch holds every row's, in row order,
which is the order the vision-language class assigns images to the rows' image tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Turn:
    """One turn of a multi-turn sample: who wrote response tokens [start, stop)."""

    role: str  # "assistant" for the model's turns; the environment's messages' role(s) otherwise
    start: int
    stop: int


@dataclass(frozen=True)
class PromptPixels:
    """An image prompt's images as its image processor cut them (runtime/data/images.py's tensors)."""

    pixel_values: torch.Tensor  # float32 [patches, channels x temporal x patch x patch]
    image_grid_thw: torch.Tensor  # int64 [images, 3]: frames, patch rows, patch columns


@dataclass(frozen=True)
class Sample:
    """One rollout response to one prompt."""

    group: int  # index of its prompt in the step's batch; a group's samples share the prompt
    prompt: tuple[int, ...]
    response: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]  # the rollout engine's log-prob of each response token
    finish_reason: str
    reward: float
    advantage: float = 0.0
    # The weight version that generated each response token (the policy after that many updates); one version
    # unless a partial rollout continued the response across a weight update. Empty: not recorded.
    versions: tuple[int, ...] = ()
    # False: the sample is in the batch but takes no loss (a truncated response under grpo.overlong.mask_truncated,
    # a group dynamic sampling kept only to fill the batch): none of its tokens is in the loss or its means.
    trained: bool = True
    # Multi-turn only (None: every response token is the model's): per response token, whether the model sampled
    # it and so takes the loss, and the turns the response is made of.
    loss_mask: tuple[bool, ...] | None = None
    turns: tuple[Turn, ...] | None = None
    # An image prompt's images (None: a text prompt). The group's samples share the one object.
    images: PromptPixels | None = None

    @property
    def version(self) -> int | None:
        """The oldest weight version among its tokens: what its staleness is measured by."""
        return min(self.versions) if self.versions else None


@dataclass(frozen=True)
class RlBatch:
    tokens: torch.Tensor  # long [N, T]
    attention_mask: torch.Tensor  # long [N, T], 1 on real tokens
    response_mask: torch.Tensor  # bool [N, T - 1]
    rollout_logprobs: torch.Tensor  # float [N, T - 1], 0 outside the response
    advantages: torch.Tensor  # float [N]
    images: PromptPixels | None = None  # every image of the rows, in row order (None: no row has one)

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum())

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def build_batch(samples: Sequence[Sample], pad_id: int, multiple: int = 1) -> RlBatch:
    """Rows of `samples`, padded to the longest row rounded up to `multiple` (sequence parallelism splits the
    row length over tensor-parallel ranks)."""
    if not samples:
        raise ValueError("build_batch needs at least one sample.")
    width = max(len(s.prompt) + len(s.response) for s in samples)
    width = -(-width // multiple) * multiple
    if width < 2:
        raise ValueError("every row needs at least two tokens (a prompt token and a response token).")
    rows = len(samples)
    tokens = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    response_mask = torch.zeros((rows, width - 1), dtype=torch.bool)
    rollout_logprobs = torch.zeros((rows, width - 1), dtype=torch.float32)
    for row, sample in enumerate(samples):
        prompt, response = len(sample.prompt), len(sample.response)
        if prompt == 0:
            raise ValueError(f"sample {row} has an empty prompt; every response needs a prompt token before it.")
        if len(sample.rollout_logprobs) != response:
            raise ValueError(
                f"sample {row} has {response} response tokens but {len(sample.rollout_logprobs)} rollout log-probs."
            )
        if sample.loss_mask is not None and len(sample.loss_mask) != response:
            raise ValueError(
                f"sample {row} has {response} response tokens but {len(sample.loss_mask)} loss-mask entries."
            )
        tokens[row, : prompt + response] = torch.tensor(sample.prompt + sample.response, dtype=torch.long)
        attention[row, : prompt + response] = 1
        if not sample.trained:
            trained: bool | torch.Tensor = False
        else:
            trained = True if sample.loss_mask is None else torch.tensor(sample.loss_mask, dtype=torch.bool)
        response_mask[row, prompt - 1 : prompt - 1 + response] = trained
        rollout_logprobs[row, prompt - 1 : prompt - 1 + response] = torch.tensor(sample.rollout_logprobs)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    pictured = [s.images for s in samples if s.images is not None]
    images = (
        PromptPixels(torch.cat([p.pixel_values for p in pictured]), torch.cat([p.image_grid_thw for p in pictured]))
        if pictured
        else None
    )
    return RlBatch(tokens, attention, response_mask, rollout_logprobs, advantages, images)


def rank_share(samples: Sequence[Sample], rank: int, world_size: int) -> list[Sample]:
    """This data-parallel rank's contiguous slice of the step's samples (the count divides evenly: validate
    checks that global_batch_size is a multiple of the data-parallel size)."""
    if len(samples) % world_size:
        raise ValueError(f"{len(samples)} samples cannot be split evenly over {world_size} ranks.")
    share = len(samples) // world_size
    return list(samples[rank * share : (rank + 1) * share])


def micro_batches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    return [list(samples[start : start + size]) for start in range(0, len(samples), size)]
