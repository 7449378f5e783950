"""GDN kernel selection, adapter and reference, on CPU.

The Megatron-Core tests import the real megatron-core (0.16-0.19 run on CPU torch as far as import and
attribute binding go) and are skipped where it is not installed (megatron-core 0.17+ needs Python 3.12).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from gdnctl.knowledge import FLA
from gdnctl.runtime.kernels import backends as gdn_kernels
from gdnctl.runtime.kernels.backends import (
    GdnBackendUnavailable,
    GdnInjectionError,
    GdnKernel,
    RuntimeFacts,
    find_backend_problem,
    megatron_kernel_modules,
    resolve_backend,
)
from gdnctl.runtime.kernels.reference import gated_delta_rule_reference

# --- Recorded runtime facts -----------------------------------------------------------------------------------

H100 = RuntimeFacts(
    torch_version="2.11.0+cu130",
    cuda_version="13.0",
    cuda_available=True,
    capability=(9, 0),
    device_name="NVIDIA H100 80GB HBM3",
    package_versions={
        "flash-qla": "0.1.3",
        "tilelang": "0.1.15",
        "fla-core": "0.6.0",
        "flash-linear-attention": None,
        "triton": "3.6.0",
    },
)
A100 = dataclasses.replace(H100, capability=(8, 0), device_name="NVIDIA A100-SXM4-80GB")
RTX_PRO_6000 = dataclasses.replace(H100, capability=(12, 0), device_name="NVIDIA RTX PRO 6000 Blackwell")
CPU_ONLY = RuntimeFacts(
    "2.13.0+cpu", None, False, None, None, {"flash-qla": None, "tilelang": None, "fla-core": None, "triton": None}
)


def _with_packages(facts: RuntimeFacts, **changes: str | None) -> RuntimeFacts:
    versions = dict(facts.package_versions)
    versions.update({name.replace("_", "-"): version for name, version in changes.items()})
    return dataclasses.replace(facts, package_versions=versions)


def _assert_one_sentence(message: str) -> None:
    assert message.endswith(".") and "\n" not in message and ". " not in message, message


@pytest.mark.parametrize("backend", ["fla", "flashqla"])
def test_h100_with_the_pinned_stack_has_no_problem(backend):
    assert find_backend_problem(backend, H100) is None


def test_flashqla_on_a100_names_sm80_and_the_way_out():
    message = find_backend_problem("flashqla", A100)
    _assert_one_sentence(message)
    assert "SM80" in message and "A100" in message and "kernels.gdn_backend to fla" in message


def test_fla_runs_on_a100():
    assert find_backend_problem("fla", A100) is None


def test_flashqla_on_sm120_trains_from_0_1_3_and_runs_forward_before():
    """flash-qla 0.1.3's wheel ships blackwell_sm120/fused_bwd.py; 0.1.2 had no SM120 backward."""
    assert find_backend_problem("flashqla", RTX_PRO_6000, training=True) is None
    old = dataclasses.replace(RTX_PRO_6000, package_versions={**RTX_PRO_6000.package_versions, "flash-qla": "0.1.2"})
    message = find_backend_problem("flashqla", old, training=True)
    _assert_one_sentence(message)
    assert "SM120" in message and "only a forward kernel" in message and "flash-qla>=0.1.3" in message
    assert find_backend_problem("flashqla", old, training=False) is None


def test_flashqla_needs_torch_2_8():
    message = find_backend_problem("flashqla", dataclasses.replace(H100, torch_version="2.7.1+cu128"))
    _assert_one_sentence(message)
    assert "torch>=2.8" in message and "2.7.1" in message


def test_flashqla_needs_torch_built_for_cuda_12_8():
    message = find_backend_problem("flashqla", dataclasses.replace(H100, cuda_version="12.4"))
    _assert_one_sentence(message)
    assert "CUDA>=12.8" in message and "CUDA 12.4" in message


def test_missing_flash_qla_says_what_to_install():
    message = find_backend_problem("flashqla", _with_packages(H100, flash_qla=None))
    _assert_one_sentence(message)
    assert "pip install 'flash-qla>=0.1.3'" in message


def test_flash_qla_0_1_2_is_refused_for_training_only():
    old = _with_packages(H100, flash_qla="0.1.2")
    message = find_backend_problem("flashqla", old, training=True)
    _assert_one_sentence(message)
    assert "dg" in message and "flash-qla>=0.1.3" in message
    assert find_backend_problem("flashqla", old, training=False) is None


@pytest.mark.parametrize("tilelang", [None, "0.1.11"])
def test_flashqla_needs_tilelang_0_1_12(tilelang):
    message = find_backend_problem("flashqla", _with_packages(H100, tilelang=tilelang))
    _assert_one_sentence(message)
    assert "tilelang>=0.1.12" in message


def test_fla_without_a_gpu_says_it_needs_one():
    message = find_backend_problem("fla", CPU_ONLY)
    _assert_one_sentence(message)
    assert "Triton" in message and "CUDA GPU" in message


def test_fla_missing_says_what_to_install():
    message = find_backend_problem("fla", _with_packages(H100, fla_core=None))
    _assert_one_sentence(message)
    assert "pip install flash-linear-attention" in message


def test_unknown_backend_lists_the_choices():
    message = find_backend_problem("mamba", H100)
    _assert_one_sentence(message)
    assert "fla" in message and "flashqla" in message


# --- resolve_backend on this machine ---------------------------------------------------------------------------

no_gpu_here = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without GPU")


@no_gpu_here
@pytest.mark.parametrize("backend", ["fla", "flashqla"])
def test_resolve_backend_without_gpu_raises_a_sentence_before_importing(backend):
    with pytest.raises(GdnBackendUnavailable) as raised:
        resolve_backend(backend)
    _assert_one_sentence(str(raised.value))
    assert "CUDA GPU" in str(raised.value)
    assert isinstance(raised.value, RuntimeError)
    assert "flash_qla" not in sys.modules


def test_a_kernel_package_that_raises_valueerror_at_import_becomes_a_sentence(tmp_path, monkeypatch):
    # The same failure `import flash_qla` shows on an unsupported GPU: ValueError at import time.
    (tmp_path / "crashing_kernel.py").write_text("raise ValueError('FlashQLA now support sm90 only.\\nmore')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(GdnBackendUnavailable) as raised:
        gdn_kernels._import_chunk_kernel("crashing_kernel", "flashqla")
    message = str(raised.value)
    assert message.startswith("Importing crashing_kernel failed (ValueError: FlashQLA now support sm90 only.)")
    assert "\n" not in message and "kernels.gdn_backend to fla" in message


# --- The adapter -------------------------------------------------------------------------------------------------


class _RecordingKernel:
    """Records how it was called; returns (o, final_state) like the kernels."""

    def __init__(self):
        self.calls = []

    def record(self, args, kwargs):
        self.calls.append((args, kwargs))
        return args[2], None


def _flash_qla_stand_in(recorder):
    """A plain function with flash_qla.chunk_gated_delta_rule's exact 0.1.3 signature (no **kwargs)."""

    def chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        scale: float = None,
        initial_state=None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        cu_seqlens=None,
        head_first: bool = False,
        state_v_first: bool = False,
        auto_cp: bool = True,
        enable_fwd_cp_cache: bool = True,
        cp_context=None,
        force_intra_cp: bool = False,
    ):
        return recorder.record(
            (q, k, v, g, beta),
            dict(
                scale=scale,
                initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                cu_seqlens=cu_seqlens,
            ),
        )

    return chunk_gated_delta_rule


def _inputs(batch=1, length=12, heads=2, value_heads=4, dim=8):
    torch.manual_seed(0)
    q = torch.randn(batch, length, heads, dim)
    k = F.normalize(torch.randn(batch, length, heads, dim), dim=-1)
    v = torch.randn(batch, length, value_heads, dim)
    g = F.logsigmoid(torch.randn(batch, length, value_heads))
    beta = torch.rand(batch, length, value_heads)
    return q, k, v, g, beta


def test_adapter_passes_flash_qla_every_option_by_keyword_and_copies_only_strided_tensors():
    recorder = _RecordingKernel()
    kernel = GdnKernel("flashqla", _flash_qla_stand_in(recorder))
    q, k, v, g, beta = _inputs()
    strided_v = v.transpose(2, 3).contiguous().transpose(2, 3)  # same values, non-contiguous
    assert not strided_v.is_contiguous()
    cu_seqlens = torch.tensor([0, 5, 12], dtype=torch.int32)
    state = torch.zeros(2, 4, 8, 8)

    kernel(
        q,
        k,
        strided_v,
        g=g,
        beta=beta,
        scale=0.5,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu_seqlens,
    )

    ((args, kwargs),) = recorder.calls
    assert args[0] is q and args[1] is k and args[3] is g and args[4] is beta
    assert args[2].is_contiguous() and torch.equal(args[2], v)
    assert kwargs == dict(
        scale=0.5, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens
    )


def test_adapter_drops_an_option_the_kernel_lacks_only_while_it_is_at_its_default():
    calls = []

    def kernel_without_l2norm_option(
        q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
    ):
        calls.append(scale)
        return v, None

    kernel = GdnKernel("narrow", kernel_without_l2norm_option)
    q, k, v, g, beta = _inputs()
    kernel(q, k, v, g, beta, scale=0.25)
    assert calls == [0.25]
    with pytest.raises(TypeError, match="use_qk_l2norm_in_kernel"):
        kernel(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)


def test_adapter_forwards_every_option_to_a_kernel_with_var_kwargs():
    received = {}

    def fla_like(q, k, v, g, beta, scale=None, **kwargs):
        received.update(kwargs, scale=scale)
        return v, None

    GdnKernel("fla", fla_like)(*_inputs(), use_qk_l2norm_in_kernel=True)
    assert received["use_qk_l2norm_in_kernel"] is True and set(received) == set(gdn_kernels._OPTION_DEFAULTS)


def test_fla_adapter_switches_off_flas_flashqla_dispatch_on_every_call(monkeypatch):
    monkeypatch.setenv("FLA_FLASH_QLA", "1")
    seen = []

    def fla_like(q, k, v, g, beta, **kwargs):
        seen.append(os.environ.get("FLA_FLASH_QLA"))
        return v, None

    GdnKernel("fla", fla_like, environment=FLA.environment)(*_inputs())
    assert seen == ["0"]


def test_adapter_around_the_reference_matches_the_reference():
    # The reference has no use_qk_l2norm_in_kernel option: a real signature the adapter must narrow for.
    q, k, v, g, beta = _inputs()
    through_adapter, _ = GdnKernel("reference", gated_delta_rule_reference)(q, k, v, g, beta)
    direct, _ = gated_delta_rule_reference(q, k, v, g, beta)
    assert torch.equal(through_adapter, direct)


# --- The fp32 reference against a per-token recurrence ---------------------------------------------------------


def _recurrence(q, k, v, g, beta, scale, initial_state):
    """Token-by-token gated delta rule in float64, one state per (sequence, value head); q/k heads grouped."""
    group = v.shape[2] // q.shape[2]
    q, k = (x.double().repeat_interleave(group, dim=2) for x in (q, k))
    v, g, beta = v.double(), g.double(), beta.double()
    state = initial_state.double()  # [B, HV, K, V]
    outputs = []
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[..., None, None]
        prediction = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        update = beta[:, t, :, None] * (v[:, t] - prediction)
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], update)
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, dim=1), state


def _leaves(*tensors):
    return [t.clone().requires_grad_(True) for t in tensors]


@pytest.mark.parametrize("chunk_size", [4, 5, 64])
def test_reference_matches_the_recurrence_with_gva_initial_state_and_gradients(chunk_size):
    q, k, v, g, beta = _inputs(batch=2, length=13, heads=2, value_heads=6, dim=5)
    initial_state = torch.randn(2, 6, 5, 5)
    scale = 0.3
    ref_inputs, rec_inputs = _leaves(q, k, v, g, beta, initial_state), _leaves(q, k, v, g, beta, initial_state)

    o, final_state = gated_delta_rule_reference(
        *ref_inputs[:5], scale=scale, initial_state=ref_inputs[5], output_final_state=True, chunk_size=chunk_size
    )
    o_rec, final_rec = _recurrence(*rec_inputs[:5], scale, rec_inputs[5])
    torch.testing.assert_close(o.double(), o_rec, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final_state.double(), final_rec, rtol=1e-5, atol=1e-5)

    weights = torch.randn_like(o_rec)
    ((o * weights).sum() + final_state.sum()).backward()
    ((o_rec * weights).sum() + final_rec.sum()).backward()
    for name, ours, theirs in zip(["q", "k", "v", "g", "beta", "h0"], ref_inputs, rec_inputs, strict=True):
        torch.testing.assert_close(ours.grad.double(), theirs.grad.double(), rtol=1e-4, atol=1e-4, msg=name)


def test_reference_with_cu_seqlens_equals_each_sequence_run_alone():
    q, k, v, g, beta = _inputs(batch=1, length=20, heads=1, value_heads=2, dim=4)
    cu_seqlens = torch.tensor([0, 3, 11, 20], dtype=torch.int32)
    initial_states = torch.randn(3, 2, 4, 4)
    o, final_states = gated_delta_rule_reference(
        q, k, v, g, beta, initial_state=initial_states, output_final_state=True, cu_seqlens=cu_seqlens, chunk_size=4
    )
    bounds = cu_seqlens.tolist()
    for index, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        piece = [x[:, start:end] for x in (q, k, v, g, beta)]
        o_rec, final_rec = _recurrence(*piece, 4**-0.5, initial_states[index : index + 1])
        torch.testing.assert_close(o[:, start:end].double(), o_rec, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(final_states[index : index + 1].double(), final_rec, rtol=1e-5, atol=1e-5)


def test_reference_gva_equals_megatrons_repeat_interleaved_heads():
    q, k, v, g, beta = _inputs(batch=1, length=9, heads=2, value_heads=4, dim=4)
    native, _ = gated_delta_rule_reference(q, k, v, g, beta)
    expanded, _ = gated_delta_rule_reference(q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2), v, g, beta)
    torch.testing.assert_close(native, expanded)


def test_reference_stays_finite_under_strong_decay():
    q, k, v, g, beta = _inputs(length=70)
    o, _ = gated_delta_rule_reference(q, k, v, g * 200, beta)
    assert torch.isfinite(o).all()


# --- Megatron-Core injection -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, modules",
    [
        ("0.16.0", ("megatron.core.ssm.gated_delta_net",)),
        ("0.18.0", ("megatron.core.ssm.gated_delta_net",)),
        (
            "0.19.2",
            (
                "megatron.core.ssm.gated_delta_net.gdn",
                "megatron.core.ssm.gated_delta_net.common",
                "megatron.core.ssm.gated_delta_net",
            ),
        ),
        (
            "0.19.0rc1",
            (
                "megatron.core.ssm.gated_delta_net.gdn",
                "megatron.core.ssm.gated_delta_net.common",
                "megatron.core.ssm.gated_delta_net",
            ),
        ),
    ],
)
def test_kernel_modules_by_megatron_version(version, modules):
    assert megatron_kernel_modules(version) == modules


@pytest.mark.parametrize("version", ["0.15.3", "0.20.0"])
def test_megatron_without_a_known_gdn_hook_is_a_sentence(version):
    with pytest.raises(GdnInjectionError) as raised:
        megatron_kernel_modules(version)
    _assert_one_sentence(str(raised.value))
    assert version in str(raised.value)


# Megatron-Core needs Python 3.12 and is part of the GPU machine's stack, so the tests that import it run in the
# GPU test set (`pytest -m gpu` there); they need no GPU themselves.
@pytest.fixture
def megatron_gdn(monkeypatch):
    """The real megatron-core GDN package, with its kernel globals restored after the test."""
    package = pytest.importorskip("megatron.core.ssm.gated_delta_net")
    version = gdn_kernels.installed_megatron_version()
    for module_name in megatron_kernel_modules(version):
        module = importlib.import_module(module_name)
        monkeypatch.setattr(module, gdn_kernels.KERNEL_GLOBAL, getattr(module, gdn_kernels.KERNEL_GLOBAL))
    return types.SimpleNamespace(package=package, version=version)


def _layer_as_megatron_builds_it(megatron_gdn, deterministic: bool):
    """A real GatedDeltaNet instance with the kernel binding its __init__ makes, without the parallel state
    and FLA kernels a full __init__ needs."""
    layer_class = megatron_gdn.package.GatedDeltaNet
    layer = layer_class.__new__(layer_class)
    torch.nn.Module.__init__(layer)
    layer.config = types.SimpleNamespace(deterministic_mode=deterministic)
    module = sys.modules[layer_class.__module__]
    if hasattr(layer_class, "_setup_variant_attrs"):  # 0.19: the real binding code runs
        layer.num_value_heads = layer.num_key_heads = 2
        layer.qk_dim_local_tp = layer.v_dim_local_tp = 8
        layer.tp_size = layer.cp_size = 1
        layer.num_v_heads_local_tp = 2
        layer._setup_variant_attrs()
    elif megatron_gdn.version.startswith("0.18"):  # 0.18 binds the same way inside __init__
        layer.gated_delta_rule = module.torch_chunk_gated_delta_rule if deterministic else module.chunk_gated_delta_rule
    return layer


@pytest.mark.gpu
def test_patched_global_is_what_a_layer_built_afterwards_calls(megatron_gdn):
    kernel = GdnKernel("flashqla", _flash_qla_stand_in(_RecordingKernel()))
    patched = gdn_kernels.patch_megatron_gdn_kernel(kernel)
    assert patched == [f"{name}.chunk_gated_delta_rule" for name in megatron_kernel_modules(megatron_gdn.version)]
    model = torch.nn.ModuleDict(
        {
            "decoder": torch.nn.ModuleList(
                [_layer_as_megatron_builds_it(megatron_gdn, deterministic=False), torch.nn.Linear(2, 2)]
            )
        }
    )
    assert gdn_kernels.report_layer_kernels(model) == [("decoder.0", "flashqla")]


@pytest.mark.gpu
def test_layers_get_the_kernel_after_build_except_deterministic_ones(megatron_gdn):
    model = torch.nn.Sequential(
        _layer_as_megatron_builds_it(megatron_gdn, deterministic=False),
        _layer_as_megatron_builds_it(megatron_gdn, deterministic=True),
    )
    before = dict(gdn_kernels.report_layer_kernels(model))
    assert before["1"].endswith("torch_chunk_gated_delta_rule")

    kernel = GdnKernel("fla", _flash_qla_stand_in(_RecordingKernel()))
    changed = gdn_kernels.install_kernel_on_layers([model], kernel)
    gdn_kernels.patch_megatron_gdn_kernel(kernel)  # 0.16/0.17 layers read the global on every forward

    report = dict(gdn_kernels.report_layer_kernels(model))
    assert report["0"] == "fla"
    assert report["1"].endswith("torch_chunk_gated_delta_rule")
    expected_changed = ["0"] if hasattr(model[0], "gated_delta_rule") else []
    assert changed == expected_changed
