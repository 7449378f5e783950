"""GRPO math on CPU with real tensors: advantages, PPO-clip, aggregation, KL estimators, log-probs, a toy run."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdnctl.runtime.rl.algorithm import grpo

LOG = math.log


# --- advantages -------------------------------------------------------------------------------------------------


def test_group_advantages_known_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    unbiased_std = math.sqrt(1 / 3)  # of [1, 0, 0, 1]
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / (unbiased_std + 1e-6)
    torch.testing.assert_close(grpo.group_advantages(rewards, 4), expected)
    torch.testing.assert_close(
        grpo.group_advantages(rewards, 4, normalize_std=False), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    )


@pytest.mark.parametrize(
    "rewards, group_size",
    [
        # In fp32, mean([0.3] * 6) != 0.3 and the std is rounding noise of the same size: without the explicit
        # zeroing these groups would get advantages of about 0.03 and -0.007.
        ([0.3] * 6 + [0.7] * 6, 6),
        ([0.1] * 8, 8),
        ([3.0, -1.0, 2.0], 1),
        ([1, 1, 0, 0], 2),  # integer rewards
    ],
)
def test_uniform_groups_get_exact_zeros(rewards, group_size):
    advantages = grpo.group_advantages(torch.tensor(rewards), group_size)
    assert advantages.dtype == torch.float32
    assert torch.equal(advantages, torch.zeros(len(rewards)))


@pytest.mark.parametrize("rewards, group_size", [(torch.zeros(7), 4), (torch.zeros(2, 4), 4), (torch.zeros(4), 0)])
def test_group_advantages_rejects_ungroupable_rewards(rewards, group_size):
    with pytest.raises(ValueError, match="groups of"):
        grpo.group_advantages(rewards, group_size)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(2, 8), st.data())
def test_group_advantages_are_centered_and_scaled_per_group(num_prompts, group_size, data):
    values = data.draw(
        st.lists(
            st.sampled_from([0.0, 0.25, 1.0, -2.0]),
            min_size=num_prompts * group_size,
            max_size=num_prompts * group_size,
        )
    )
    rewards = torch.tensor(values, dtype=torch.float64)
    groups = grpo.group_advantages(rewards, group_size).reshape(num_prompts, group_size)
    torch.testing.assert_close(groups.mean(dim=1), torch.zeros(num_prompts, dtype=torch.float64))
    spread = rewards.reshape(num_prompts, group_size).std(dim=1)
    expected_std = torch.where(spread > 0, spread / (spread + 1e-6), 0)
    torch.testing.assert_close(groups.std(dim=1), expected_std)


def test_token_advantages_padded_and_packed_agree():
    advantages = torch.tensor([2.0, -1.0])
    padded_mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    torch.testing.assert_close(
        grpo.token_advantages(advantages, padded_mask), torch.tensor([[0.0, 2, 2, 0], [0, 0, -1, -1]])
    )
    packed_mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1]])  # lengths 3 and 4, packed
    cu_seqlens = torch.tensor([0, 3, 7], dtype=torch.int32)
    torch.testing.assert_close(
        grpo.token_advantages(advantages, packed_mask, cu_seqlens), torch.tensor([[0.0, 2, 2, 0, 0, -1, -1]])
    )
    with pytest.raises(ValueError, match="one per sequence"):
        grpo.token_advantages(torch.tensor([1.0]), padded_mask)
    with pytest.raises(ValueError, match="cu_seqlens"):
        grpo.token_advantages(advantages, packed_mask, torch.tensor([0, 3, 6]))


# --- policy loss ------------------------------------------------------------------------------------------------


def test_unit_ratio_gives_minus_mean_advantage_and_no_clipping():
    logprobs = torch.log(torch.tensor([[0.3, 0.5, 0.9], [0.2, 0.6, 0.1]]))
    advantages = torch.tensor([[1.5, 1.5, 1.5], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, stats = grpo.policy_loss(logprobs, logprobs.clone(), advantages, mask)
    assert loss.item() == pytest.approx(-(1.5 * 2 - 0.5 * 3) / 5)
    assert stats["clip_fraction"].item() == 0.0
    assert stats["approx_kl"].item() == 0.0
    assert stats["ratio_mean"].item() == stats["ratio_max"].item() == 1.0


@pytest.mark.parametrize(
    "advantage, ratio, clipped",
    [
        (1.0, 1.28 - 1e-3, False),
        (1.0, 1.28 + 1e-3, True),  # A > 0 clips only above 1 + clip_high
        (1.0, 1.21, False),  # past a symmetric 0.2, inside clip-higher's 0.28
        (1.0, 0.5, False),  # A > 0 moving down: pessimistic, never clipped
        (-1.0, 0.8 + 1e-3, False),
        (-1.0, 0.8 - 1e-3, True),  # A < 0 clips only below 1 - clip_low
        (-1.0, 1.5, False),  # A < 0 moving up: never clipped
    ],
)
def test_clipping_starts_exactly_past_the_asymmetric_bounds(advantage, ratio, clipped):
    old = torch.tensor([[LOG(0.4)]])
    logprobs = (old + LOG(ratio)).requires_grad_()
    loss, stats = grpo.policy_loss(
        logprobs, old, torch.tensor([[advantage]]), torch.ones(1, 1), clip_low=0.2, clip_high=0.28
    )
    loss.backward()
    bound = (1.28 if advantage > 0 else 0.8) if clipped else ratio
    assert loss.item() == pytest.approx(-advantage * bound, rel=1e-5)
    assert stats["clip_fraction"].item() == float(clipped)
    side = "clip_fraction_high" if advantage > 0 else "clip_fraction_low"
    assert stats[side].item() == float(clipped)
    # d(-A r)/d logprob = -A r where the clip is not binding; exactly 0 where it is.
    expected_grad = 0.0 if clipped else -advantage * ratio
    assert logprobs.grad.item() == pytest.approx(expected_grad, rel=1e-5)


def test_gradients_flow_only_through_masked_tokens():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)
    # Padding holds the garbage real batches have: -inf log-probs, nan old log-probs and advantages.
    logprobs = torch.where(mask, torch.rand(2, 4).log(), -torch.inf).requires_grad_()
    old = torch.where(mask, logprobs.detach() + 0.05 * torch.randn(2, 4), torch.nan)
    advantages = torch.where(mask, torch.tensor([[1.0], [-2.0]]), torch.nan)
    ref = torch.where(mask, logprobs.detach() - 0.1, -torch.inf)
    for aggregation in grpo.AGGREGATIONS:
        logprobs.grad = None
        loss, stats = grpo.grpo_loss(
            logprobs, old, advantages, mask, ref_logprobs=ref, kl_coef=0.1, aggregation=aggregation
        )
        loss.backward()
        assert torch.isfinite(loss) and all(torch.isfinite(value) for value in stats.values())
        assert torch.equal(logprobs.grad[~mask], torch.zeros(int((~mask).sum())))
        assert bool((logprobs.grad[mask] != 0).all())


def test_token_mean_and_seq_mean_on_a_hand_computed_example():
    # ratio 1, so each token's loss is -A: one 1-token response with A = -1 and one 3-token response with A = +1.
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    advantages = grpo.token_advantages(torch.tensor([-1.0, 1.0]), mask)
    logprobs = torch.full((2, 3), LOG(0.5))
    token_mean, _ = grpo.policy_loss(logprobs, logprobs, advantages, mask, aggregation="token-mean")
    seq_mean, _ = grpo.policy_loss(logprobs, logprobs, advantages, mask, aggregation="seq-mean-token-mean")
    assert token_mean.item() == pytest.approx((1 - 3) / 4)  # every token counts once
    assert seq_mean.item() == pytest.approx((1 + -1) / 2)  # every response counts once
    # The same batch packed into one THD row (segments 0:3 and 3:6) gives the same numbers.
    packed_mask = mask.reshape(1, 6)
    cu_seqlens = torch.tensor([0, 3, 6])
    packed_adv = grpo.token_advantages(torch.tensor([-1.0, 1.0]), packed_mask, cu_seqlens)
    packed_lp = logprobs.reshape(1, 6)
    for aggregation, expected in (("token-mean", token_mean), ("seq-mean-token-mean", seq_mean)):
        packed, _ = grpo.policy_loss(
            packed_lp, packed_lp, packed_adv, packed_mask, aggregation=aggregation, cu_seqlens=cu_seqlens
        )
        assert packed.item() == pytest.approx(expected.item())


def test_seq_mean_skips_sequences_without_response_tokens():
    values = torch.tensor([[2.0, 4.0], [9.0, 9.0], [1.0, 1.0]])
    mask = torch.tensor([[1, 1], [0, 0], [1, 0]])
    assert grpo.aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((3.0 + 1.0) / 2)
    assert grpo.aggregate(values, torch.zeros(3, 2), "token-mean").item() == 0.0
    with pytest.raises(ValueError, match="aggregation"):
        grpo.aggregate(values, mask, "sum")  # type: ignore[arg-type]


def test_policy_loss_rejects_per_sequence_advantages_on_token_rows():
    logprobs = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="per-token advantages"):
        grpo.policy_loss(logprobs, logprobs, torch.ones(2), torch.ones(2, 3))


# --- KL ---------------------------------------------------------------------------------------------------------


def test_kl_estimators_known_values():
    logprobs, ref = torch.tensor([LOG(0.5)]), torch.tensor([LOG(0.25)])
    assert grpo.kl_penalty(logprobs, ref, "k1").item() == pytest.approx(LOG(2))
    assert grpo.kl_penalty(logprobs, ref, "k2").item() == pytest.approx(0.5 * LOG(2) ** 2)
    assert grpo.kl_penalty(logprobs, ref, "k3").item() == pytest.approx(0.5 + LOG(2) - 1)
    for kind in grpo.KL_KINDS:
        assert torch.equal(grpo.kl_penalty(ref, ref.clone(), kind), torch.zeros(1))
    with pytest.raises(ValueError, match="KL estimator"):
        grpo.kl_penalty(logprobs, ref, "k4")  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-30, 0), min_size=1, max_size=16), st.lists(st.floats(-30, 0), min_size=16, max_size=16))
def test_k3_is_nonnegative(logprobs, ref):
    values = grpo.kl_penalty(torch.tensor(logprobs), torch.tensor(ref[: len(logprobs)]), "k3")
    assert bool((values >= 0).all()) and bool(torch.isfinite(values).all())


def test_k1_and_k3_are_unbiased_estimates_of_the_true_kl():
    generator = torch.Generator().manual_seed(0)
    policy = torch.tensor([0.5, 0.3, 0.15, 0.05])
    ref = torch.tensor([0.25, 0.25, 0.25, 0.25])
    true_kl = (policy * (policy / ref).log()).sum()
    samples = torch.multinomial(policy, 200_000, replacement=True, generator=generator)
    for kind in ("k1", "k3"):
        estimate = grpo.kl_penalty(policy.log()[samples], ref.log()[samples], kind).mean()
        assert estimate.item() == pytest.approx(true_kl.item(), abs=3e-3)


def test_grpo_loss_adds_the_masked_kl_term():
    logprobs = torch.log(torch.tensor([[0.5, 0.2], [0.4, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.2], [0.5, 0.1]]))
    mask = torch.tensor([[1, 1], [1, 0]])
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    pg_loss, _ = grpo.policy_loss(logprobs, logprobs, advantages, mask)
    loss, stats = grpo.grpo_loss(logprobs, logprobs, advantages, mask, ref_logprobs=ref, kl_coef=0.5)
    expected_kl = grpo.masked_mean(grpo.kl_penalty(logprobs, ref, "k3"), mask)
    assert stats["kl"].item() == pytest.approx(expected_kl.item())
    assert loss.item() == pytest.approx(pg_loss.item() + 0.5 * expected_kl.item())
    no_kl, stats = grpo.grpo_loss(logprobs, logprobs, advantages, mask)
    assert no_kl.item() == pg_loss.item() and "kl" not in stats
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo.grpo_loss(logprobs, logprobs, advantages, mask, kl_coef=0.1)


# --- log-probs --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 5, 11), (1, 17, 11)])  # padded [B, T, V] and packed THD [1, T, V]
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_categorical(shape, temperature):
    generator = torch.Generator().manual_seed(1)
    logits = 4 * torch.randn(shape, generator=generator, dtype=torch.float64)
    tokens = torch.randint(0, shape[-1], shape[:-1], generator=generator)
    expected = torch.distributions.Categorical(logits=logits / temperature).log_prob(tokens)
    torch.testing.assert_close(grpo.logprobs_from_logits(logits, tokens, temperature=temperature), expected)


def test_logprobs_are_stable_for_huge_logits_and_upcast_bf16():
    logits = torch.tensor([[[1e4, 1e4 - 1.0, -1e4]]])
    result = grpo.logprobs_from_logits(logits, torch.tensor([[1]]))
    assert result.item() == pytest.approx(-1.0 - math.log1p(math.exp(-1.0)))
    bf16 = grpo.logprobs_from_logits(logits.bfloat16(), torch.tensor([[0]]))
    assert bf16.dtype == torch.float32 and torch.isfinite(bf16).all()
    with pytest.raises(ValueError, match="vocab dimension"):
        grpo.logprobs_from_logits(logits, torch.tensor([1]))
    with pytest.raises(ValueError, match="temperature"):
        grpo.logprobs_from_logits(logits, torch.tensor([[1]]), temperature=0.0)


# --- end to end -------------------------------------------------------------------------------------------------


def test_toy_policy_learns_the_rewarded_answer():
    """A 4-answer categorical policy, GRPO with two PPO epochs per rollout: the rewarded answer takes over."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.Adam([logits], lr=0.05)
    num_prompts, group_size, pad = 8, 8, 3
    mask = torch.tensor([[1, 0]]).expand(num_prompts * group_size, 2)  # answer token + a padding token

    def expected_reward() -> float:
        return torch.softmax(logits.detach(), dim=0)[2].item()

    start = expected_reward()
    largest_ratio = 0.0
    for _ in range(50):
        with torch.no_grad():
            answers = torch.multinomial(
                torch.softmax(logits, 0), num_prompts * group_size, replacement=True, generator=generator
            )
            tokens = torch.stack([answers, torch.full_like(answers, pad)], dim=1)
            old = grpo.logprobs_from_logits(logits.expand(*tokens.shape, 4), tokens)
            rewards = (answers == 2).float()
            advantages = grpo.token_advantages(grpo.group_advantages(rewards, group_size), mask)
        for _ in range(2):
            logprobs = grpo.logprobs_from_logits(logits.expand(*tokens.shape, 4), tokens)
            loss, stats = grpo.policy_loss(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.28)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            largest_ratio = max(largest_ratio, stats["ratio_max"].item())
    assert start == pytest.approx(0.25)
    assert expected_reward() > 0.9
    assert largest_ratio > 1.0  # the second PPO epoch ran off-policy, through the ratio and clip


def test_rollout_correction_weights_each_token_by_the_capped_trainer_over_rollout_probability():
    """Per token: loss x min(exp(old - rollout), cap), the weight without grad (slime's and verl's TIS)."""
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = logprobs.detach().clone()
    rollout = torch.tensor([[-1.0, -2.5, -1.0]])  # weights exp(0) = 1, exp(0.5) = 1.65, exp(-2) = 0.135
    mask = torch.ones(1, 3, dtype=torch.bool)
    advantages = torch.ones(1, 3)
    loss, stats = grpo.policy_loss(logprobs, old, advantages, mask, rollout_logprobs=rollout, tis_cap=1.5)
    weights = torch.tensor([1.0, 1.5, math.exp(-2.0)])
    assert float(loss.detach()) == pytest.approx(float(-(weights.mean())), rel=1e-6)  # ratio 1: -A_t x w_t
    loss.backward()
    assert torch.allclose(logprobs.grad, -weights / 3)
    assert float(stats["tis_capped_fraction"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        grpo.policy_loss(logprobs, old, advantages, mask, tis_cap=2.0)
