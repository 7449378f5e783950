"""The static attention mask the CUDA graphs are captured with, built where it is used: the same values as
megatron-core 0.19.2's host-memory construction (transformer/transformer_layer.py `get_layer_static_inputs`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gdnctl.runtime.train.cuda_graphs import causal_static_mask  # noqa: E402


def _megatron_core_mask(rows: int, columns: int, micro_batch_size: int):
    """megatron-core 0.19.2's expression, as written there."""
    return ~(torch.tril(torch.ones((rows, columns))).bool()).reshape(1, 1, rows, columns).tile(
        micro_batch_size, 1, 1, 1
    )


@pytest.mark.parametrize(
    ("rows", "columns", "micro_batch_size"),
    [(64, 64, 1), (32, 64, 2), (16, 64, 3)],  # one CP rank's rows of a whole row: seq_length / cp x seq_length
)
def test_the_mask_is_megatron_cores_mask(rows, columns, micro_batch_size):
    built = causal_static_mask(rows, columns, micro_batch_size, "cpu")
    expected = _megatron_core_mask(rows, columns, micro_batch_size)
    assert built.dtype == torch.bool and built.shape == expected.shape == (micro_batch_size, 1, rows, columns)
    assert torch.equal(built, expected)
