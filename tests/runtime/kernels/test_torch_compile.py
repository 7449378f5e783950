"""kernels.torch_compile in the trainer process: off, torch.compile'd functions (as Megatron-Core's jit_fuser makes
them) run eagerly with nothing traced; on, they are traced as before."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from gdnctl.runtime.kernels import apply_torch_compile


@pytest.fixture(autouse=True)
def default_stance():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch.compiler.set_stance("default")
    torch._dynamo.reset()


def _fused(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * x


def test_off_runs_an_already_decorated_function_eagerly_with_nothing_traced():
    compiled = torch.compile(_fused, backend="eager")  # decorated first, as at Megatron-Core's import
    sentence = apply_torch_compile(False, "set in the preset (kernels.torch_compile: false)")
    x = torch.randn(8)
    assert torch.equal(compiled(x), _fused(x))
    compiled(torch.randn(5))  # a new length: would recompile
    assert not counters["frames"], dict(counters["frames"])
    assert sentence.startswith("torch.compile: off (set in the preset (kernels.torch_compile: false)): ")


def test_on_leaves_torch_compile_tracing():
    compiled = torch.compile(_fused, backend="eager")
    sentence = apply_torch_compile(True)
    compiled(torch.randn(8))
    assert counters["frames"]["ok"] >= 1
    assert sentence.startswith("torch.compile: on")
