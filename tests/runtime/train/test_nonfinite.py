"""The non-finite step guard's decisions and sentences (every job asks it once per optimizer step)."""

from __future__ import annotations

import pytest

from gdnctl.runtime.train import nonfinite
from gdnctl.runtime.train.nonfinite import NonFiniteGuard, NonFiniteStep, StepVerdict, describe_documents

PARAMS = [
    "embedding.word_embeddings.weight",
    "decoder.layers.7.self_attention.linear_qkv.weight",
    "decoder.layers.7.self_attention.k_layernorm.weight",
]


def verdict(step: int, *, loss: bool = True, grad: bool = True, applied: bool | None = None) -> StepVerdict:
    return StepVerdict(
        step=step,
        applied=loss and grad if applied is None else applied,
        loss_finite=loss,
        grad_finite=grad,
        inputs="documents 3, 17 of the synthetic data",
        bad_parameters=[] if grad else PARAMS,
        parameter_count=600,
    )


def test_a_finite_step_passes_silently():
    assert NonFiniteGuard(0).after_step(verdict(1)) is None


def test_the_first_non_finite_step_stops_the_job_naming_step_inputs_and_where_the_gradients_went_bad():
    with pytest.raises(NonFiniteStep) as stopped:
        NonFiniteGuard(0).after_step(verdict(2, grad=False))
    sentence = str(stopped.value)
    assert sentence.startswith("Stopped at step 2: the gradients of 3 of 600 parameters")
    # The backward pass starts at the output: the last bad parameter in model order is named first.
    assert "nearest the output: decoder.layers.7.self_attention.k_layernorm.weight" in sentence
    assert "documents 3, 17 of the synthetic data" in sentence
    assert "`latest` is the last good checkpoint" in sentence and "train.skip_nonfinite_steps is 0" in sentence


def test_a_non_finite_loss_is_named_as_the_loss():
    with pytest.raises(NonFiniteStep, match="Stopped at step 5: the loss was not finite"):
        NonFiniteGuard(0).after_step(verdict(5, loss=False))


def test_the_allowance_skips_that_many_steps_then_stops():
    guard = NonFiniteGuard(2)
    assert "update skipped (1 of 2 allowed" in guard.after_step(verdict(3, grad=False))
    assert guard.after_step(verdict(4)) is None
    assert "update skipped (2 of 2 allowed" in guard.after_step(verdict(5, loss=False))
    with pytest.raises(
        NonFiniteStep,
        match=r"3 steps were not finite \(3, 5, 7\), more than "
        r"train.skip_nonfinite_steps 2",
    ):
        guard.after_step(verdict(7, grad=False))


def test_a_non_finite_step_that_was_applied_is_reported_as_a_bug():
    with pytest.raises(NonFiniteStep, match="applied an update although the loss was not finite; this is a bug"):
        NonFiniteGuard(5).after_step(verdict(1, loss=False, applied=True))


def test_documents_are_listed_once_in_order_and_cut_after_a_few():
    assert describe_documents([9, 3, 9], "data.jsonl") == "documents 3, 9 of train.data_path (0-based, in file order)"
    assert describe_documents(range(20), None, limit=3) == "documents 0, 1, 2 and 17 more of the synthetic data"


def test_a_step_that_raises_on_diverged_weights_stops_with_a_sentence_and_other_errors_stay_as_they_are():
    """What the trainer raises when a step's forward or backward fails: the diverged-weights sentence (step, weights,
    lr, inputs, the error's first line, the fix) where the weights have left a trained model's range, else nothing
    (the original error goes on)."""
    error = RuntimeError("split_with_sizes expects split_sizes to sum exactly to 16384\nmore detail")
    stopped = nonfinite.diverged_step(2, error, 3.2e29, "documents 4, 9 of the synthetic data", 1e30)
    assert isinstance(stopped, nonfinite.NonFiniteStep)
    sentence = str(stopped)
    assert sentence.startswith("Stopped at step 2: the weights the step before left (as large as 3.2e+29 at lr 1e+30)")
    assert "documents 4, 9 of the synthetic data" in sentence and "RuntimeError: split_with_sizes" in sentence
    assert "more detail" not in sentence and "`latest` is the last good checkpoint" in sentence
    assert "not finite" in str(nonfinite.diverged_step(5, error, float("nan"), "documents 1", None))
    assert nonfinite.diverged_step(2, error, 3.5, "documents 4", 1e-5) is None
