"""What decides a rollout sample's draw and its worth before any gradient: its seed, DAPO's over-long penalty, the
dynamic-sampling filter and the staleness bound. Pure functions, stdlib only.

Seeds. Each sample is its own request with a seed of its own, a hash of (train.seed, step, round, the prompt's slot
in the step, the sample's index in its group): two samples of a step never share their noise (vLLM seeds a request
of n samples with seed + j, so with a seed per prompt, sample j of prompt i drew what sample j - 1 of prompt i + 1
drew), and the draw is still a function of (seed, step), whatever the number of engines and wherever a request runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# vLLM hands a request's seed to torch.Generator.manual_seed (it takes < 2**64); 62 bits stay clear of every signed
# 64-bit conversion on the way.
SEED_BITS = 62


def sample_seed(seed: int, *parts: int) -> int:
    """A seed for one request, a function of the job's seed and the request's coordinates (step, round, slot,
    sample; or whatever names one draw), independent across different coordinates."""
    text = ":".join(str(part) for part in ("gdnctl-sample", seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)


def overlong_penalty(length: int, max_tokens: int, buffer_tokens: int, penalty: float) -> float:
    """DAPO's soft over-long punishment (arXiv 2503.14476, eq. 13), added to a response's reward: 0 up to
    max_tokens - buffer_tokens tokens, then falling linearly to -penalty at max_tokens (and -penalty past it)."""
    free = max_tokens - buffer_tokens
    if length <= free:
        return 0.0
    if length >= max_tokens:
        return -penalty
    return -penalty * (length - free) / buffer_tokens


def uniform(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards are all equal, so every advantage in it is 0 (dynamic sampling drops it)."""
    return max(rewards) == min(rewards)


def staleness(step: int, version: int) -> int:
    """How many weight versions a sample generated (its oldest token) under `version` lags the policy of `step`
    (the policy that trains step s has taken s updates: version s)."""
    return step - version


def too_stale(step: int, version: int, max_staleness: int) -> bool:
    return staleness(step, version) > max_staleness
