"""A real training run's comm profile counts the collectives megatron-core makes through the names it bound from
torch.distributed at import: tiny-qwen3.5-sft on one GPU (distributed optimizer at DP 1, TE-free, FLA).

Megatron-Core's grad buffer reduce-scatters the gradients and all-gathers the parameters every step, even at
DP 1, through distributed/param_and_grad_buffer.py's dist_reduce_scatter_func and dist_all_gather_func inside
its _coalescing_manager. The trainer installs the guard after `import megatron.core`, so those names reach the
guard only through install's rebinding (gdnctl/runtime/comm/guard.py MEGATRON_BINDINGS).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from tests.gpu.test_trainer_gpu import _launch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
]

STEPS = 3


def test_the_profile_counts_megatrons_gradient_reduce_scatter_every_step(tmp_path):
    run_dir = tmp_path / "run"
    steps = _launch(run_dir, "kernels.gdn_backend=fla", f"train.train_iters={STEPS}", "comm.profile=true")
    assert len(steps) == STEPS
    ops = json.loads((run_dir / "comm_profile" / "comm_profile_rank0.json").read_text())["ops"]
    for op in ("reduce_scatter_tensor", "all_gather_into_tensor"):
        assert op in ops, sorted(ops)
        # The same buckets every step; both ops are in the default skip set, so counted and never checked.
        assert ops[op]["calls"] >= STEPS and ops[op]["calls"] % STEPS == 0, (op, ops[op])
        assert ops[op]["checks"] == 0, (op, ops[op])
    # _coalescing_manager got the real group, so torch's coalesced collective at its exit is not a second count
    # (it was the only count while the grad buffer's names held torch's own functions).
    assert not {"reduce_scatter_tensor_coalesced", "allgather_into_tensor_coalesced"} & set(ops), sorted(ops)
