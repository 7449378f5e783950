"""Context parallel on the megatron-bridge trainer (packed sequences, Megatron-Core 0.19's GDN all-to-all).

- the positions gdnctl hands each CP rank (runtime/data/context_parallel.py) are the ones Transformer Engine's
  THD attention reads (`thd_get_partitioned_indices`) and the ones Megatron-Core's GDN all-to-all puts back in
  order (`_build_thd_cp_a2a_perm`);
- CP=2 on two GPUs trains the CP=1 loss curve over 20 steps.

Needs the staged `gdn` and `te` profiles (megatron-core 0.19.2, Transformer Engine, megatron-bridge, FLA); the
training test needs two GPUs.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gdnctl.runtime.data.context_parallel import context_parallel_positions
from tests.gpu.test_trainer_gpu import STEPS, _finish_all, _patterned_data, _record, _start

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None, reason="needs Transformer Engine"),
    pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None, reason="needs megatron-bridge"),
]
# bf16 over 20 steps: CP=2 sums attention and the GDN recurrence's inputs in another order (chunked attention,
# all-to-all); measured on 2 GPUs, see benchmarks/results/trains-right-2026-11-24.md.
CP_TOLERANCE = 0.02  # max |cp2 - cp1| / cp1 per step


def _lengths(cp: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 2 * cp * torch.randint(1, 40, (7,), generator=generator)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_positions_are_transformer_engines_thd_partition(cp):
    import transformer_engine.pytorch  # noqa: F401  (loads the extension; the wheel keeps it in wheel_lib/)
    import transformer_engine_torch as tex

    lengths = _lengths(cp, seed=cp)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).int()]).cuda()
    total = int(lengths.sum())
    for rank in range(cp):
        theirs = tex.thd_get_partitioned_indices(cu_seqlens, total, cp, rank).cpu().long()
        assert torch.equal(context_parallel_positions(lengths, cp, rank), theirs), rank


@pytest.mark.parametrize("cp", [2, 4])
def test_megatron_gdn_all_to_all_restores_the_natural_order(cp):
    from megatron.core.ssm.gated_delta_net.common import _build_thd_cp_a2a_perm

    lengths = _lengths(cp, seed=10 + cp)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    total = int(lengths.sum())
    # After the all-to-all each rank holds every CP rank's local tokens, rank after rank; Megatron indexes them
    # back into the sequence order.
    gathered = torch.cat([context_parallel_positions(lengths, cp, rank) for rank in range(cp)])
    index, _ = _build_thd_cp_a2a_perm(cu_seqlens, cp, total)
    assert torch.equal(gathered.index_select(0, index), torch.arange(total))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for cp 2")
def test_cp2_trains_the_cp1_loss_curve(tmp_path):
    # Positions a multiple of 2 x cp: CP=2 pads nothing, so both runs train the same rows step for step.
    data = _patterned_data(tmp_path / "progressions.jsonl", positions_multiple=4)
    common = ["kernels.gdn_backend=fla", f"train.data_path={data}", f"train.train_iters={STEPS}"]
    runs = _finish_all(
        {
            "cp1": _start(tmp_path / "cp1", *common, builder="megatron-bridge"),
            "cp2": _start(
                tmp_path / "cp2", *common, "cluster.gpus_per_node=2", "parallel.cp=2", builder="megatron-bridge"
            ),
        }
    )
    cp1, cp2 = runs["cp1"], runs["cp2"]
    one, two = ([step["loss"] for step in run] for run in (cp1, cp2))
    worst = max(abs(b - a) / a for a, b in zip(one, two, strict=True))
    _record(
        "bridge_cp2_vs_cp1",
        {
            "cp1": one,
            "cp2": two,
            "max_relative_difference": worst,
            "tokens": [[a["tokens"], b["tokens"]] for a, b in zip(cp1, cp2, strict=True)],
        },
    )
    # Both ranks train each row once: the same tokens per step as CP=1, and the same falling curve.
    assert [step["tokens"] for step in cp2] == [step["tokens"] for step in cp1]
    assert two[-1] < 0.5 * two[0], two
    assert worst < CP_TOLERANCE, list(zip(one, two, strict=True))
