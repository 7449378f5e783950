"""The trainer's speed options: what each one is, when `auto` turns it on, and why.

Each option changes how a step is computed, not what it computes (gradients reduced in bf16 are the one that
rounds differently, and jobs that need exact accumulation keep fp32). Each is an `explain` line with its reason,
and benchmarks/results/speed-options-h100-2026-11-25.md and filled-rows-h200-2026-11-26.md show the step time of
the 35B-A3B proxy with each one on and off.

Where the options come from: Megatron-Bridge's MoE performance recipes turn on the same fusions, bf16 gradient
reduction and manual garbage collection (megatron-bridge 0.6.2, `recipes/.../perf_recipes/_common.py`
`_benchmark_common` and the H100 Qwen3 MoE recipe). gdnctl decides them itself from the model builder and the job:
the fusions live in Transformer Engine (fused top-k router, RoPE, cross entropy, weight-gradient accumulation), so
the TE-free builder keeps Megatron-Core's unfused paths.
"""

from __future__ import annotations

from collections.abc import Mapping

from gdnctl.knowledge import GPUS, ModelArch, stack, versions
from gdnctl.plan.decisions import Decision, layout, model_builder, one_row_shape
from gdnctl.schema import Preset

# What a user reads beside each option in `explain` when it is on; the reasons for `off` are built per case.
_WHAT = {
    "router_fusion": "Transformer Engine's fused router (scores, top-k and their softmax in one kernel instead of "
    "about ten per MoE layer and micro-batch; megatron-core moe_router_fusion)",
    "bias_activation_fusion": "the MLPs' SwiGLU (experts and shared expert) in one fused function (megatron-core "
    "fusions/fused_bias_swiglu.py) instead of split, SiLU and multiply",
    "rope_fusion": "Transformer Engine's fused rotary embedding kernel (megatron-core apply_rope_fusion)",
    "cross_entropy": "Transformer Engine's cross entropy on the vocabulary-parallel logits (megatron-core "
    "cross_entropy_fusion_impl te): no fp32 copy of the logits",
    "wgrad_fusion": "Transformer Engine's layers add each weight gradient straight into Megatron's gradient buffer "
    "(fuse_wgrad_accumulation) instead of writing it and adding it in a second pass",
    "grad_reduce": "gradients accumulated and reduced in bf16: half the gradient buffer's memory and traffic "
    "(Megatron-Core DDP's own default)",
    "manual_gc": "Python's garbage collector runs between steps (every {interval} steps and after each save) "
    "instead of pausing a step at random",
    "cuda_graphs": "{what} replayed as Transformer Engine CUDA graphs (megatron-core cuda_graph_modules "
    "{modules}), captured after step {warmup}: {why}",
    "overlap_grad_reduce": "each bucket of gradients reduced across the data-parallel ranks as soon as the backward "
    "pass has filled it, while the rest of the backward pass goes on (megatron-core DDP overlap_grad_reduce)",
    "cutlass_grouped_gemm": "the experts' grouped GEMMs run as one CUTLASS kernel on Hopper instead of cuBLAS "
    "(Transformer Engine's NVTE_USE_CUTLASS_GROUPED_GEMM=1): {measured}",
}
# What CUTLASS's grouped GEMM measured on gdnctl's trainer (benchmarks/results/cutlass-grouped-gemm-h100-2026-11-27.md;
# the pair in step-profile-h200-2026-11-26.md).
CUTLASS_GROUPED_GEMM_MEASURED = (
    "the 35B-A3B proxy's step 0.679 -> 0.641 s in one sequence of launches on a shared H100 (5.6% faster, losses "
    "the same to bf16 rounding; 2% in an earlier pair on two H200s)"
)
# The variable gdnctl's launch scripts export for the option, and the multiple its GEMMs' K must be for CUTLASS.
CUTLASS_GROUPED_GEMM_ENV = "NVTE_USE_CUTLASS_GROUPED_GEMM"
CUTLASS_K_MULTIPLE = 128
# Steps run eagerly before the graphs are captured (megatron-core cuda_graph_warmup_steps): the first compiles and
# autotunes the kernels, so the capture records warm ones.
CUDA_GRAPH_WARMUP_STEPS = 1
MANUAL_GC_INTERVAL = 100
SPEED_OPTIONS = tuple(_WHAT)


def speed_options(
    preset: Preset, model: ModelArch, software: Mapping[str, str | None], dp: int | None
) -> dict[str, Decision]:
    """Every speed option's value (bools, `te`/`native` for cross_entropy, `bf16`/`fp32` for grad_reduce) and
    reason, in the order `explain` lists them. dp: the data-parallel size (None where the layout does not divide)."""
    te_free = model_builder(dict(software)).value == "te-free"
    spec = preset.speed
    decided: dict[str, Decision] = {}
    for name in SPEED_OPTIONS:
        requested = getattr(spec, name)
        if requested != "auto":
            decided[name] = Decision(_value(name, requested), f"set in the preset (speed.{name}: {requested})")
            continue
        if name == "cuda_graphs":
            decided[name] = _auto_cuda_graphs(preset, model, software)
        elif name == "overlap_grad_reduce":
            decided[name] = _auto_overlap_grad_reduce(dp)
        elif name == "cutlass_grouped_gemm":
            decided[name] = _auto_cutlass_grouped_gemm(preset, model, software)
        else:
            decided[name] = _auto(name, preset, model, te_free)
    return decided


def needs_transformer_engine(name: str) -> bool:
    """Options that exist only in Transformer Engine's layers (the TE-free builder has none of them)."""
    return name in ("router_fusion", "rope_fusion", "cross_entropy", "wgrad_fusion", "bias_activation_fusion")


def option_on(name: str, value: object) -> bool:
    """Whether a decided value means the faster path is taken."""
    return value in (True, "te", "bf16")


def _value(name: str, requested: str) -> object:
    if name == "cross_entropy":
        return requested  # te | native
    if name == "grad_reduce":
        return requested  # bf16 | fp32
    return requested == "on"


def _auto(name: str, preset: Preset, model: ModelArch, te_free: bool) -> Decision:
    off_value = {"cross_entropy": "native", "grad_reduce": "fp32"}.get(name, False)
    on_value = {"cross_entropy": "te", "grad_reduce": "bf16"}.get(name, True)
    what = _WHAT[name].format(interval=MANUAL_GC_INTERVAL)
    if needs_transformer_engine(name) and te_free:
        return Decision(off_value, "the TE-free builder has no Transformer Engine layers: Megatron-Core's unfused path")
    if name == "router_fusion" and not model.is_moe:
        return Decision(off_value, "a dense model has no router")
    if name == "manual_gc" and preset.job == "rl":
        return Decision(
            off_value,
            "rl: the rl loop leaves Python's collector as it is (only the sft and pretrain "
            "trainer collects between steps)",
        )
    if name == "cross_entropy" and preset.job == "rl":
        return Decision(
            off_value,
            "rl: the policy loss computes its log-probs from the logits itself "
            "(runtime/rl/policy/megatron_policy.py), not through the model's cross entropy",
        )
    if name == "grad_reduce" and preset.job == "rl":
        return Decision(
            off_value,
            "rl: a policy-gradient step sums many small per-token terms over the "
            "micro-batches, so they are accumulated in fp32",
        )
    return Decision(on_value, what)


def _auto_overlap_grad_reduce(dp: int | None) -> Decision:
    """Off: measured on gdnctl's own trainer, it gained nothing. Two launches of the 35B-A3B proxy at DP2 on two H100s
    of one NVLink host (benchmarks/results/multi-gpu-h100-2026-11-26.md) gave 83,072 tokens/s with the
    overlap against 84,654 without (0.98x): the reduce-scatter of one step's bf16 gradients is short beside its
    backward pass there, and DP2 already reaches 1.98x one GPU. Megatron-Bridge's recipes turn it on (with 128 MiB
    buckets, and the parameter all-gather overlapped too) whenever data parallel > 1 (megatron-bridge 0.6.2
    training/comm_overlap.py `_get_optimizer_overlap_cfgs`); Megatron-Core's DDP keeps it off by default
    (distributed/distributed_data_parallel_config.py, megatron-core 0.19.2). Across hosts, where the reduction is
    slower, `on` is the setting to try."""
    if dp is None or dp == 1:
        return Decision(False, "one data-parallel rank: there is nothing to reduce across ranks")
    return Decision(
        False,
        "gradients reduced after the backward pass, as Megatron-Core's DDP does by default: overlapping the "
        "reduction with the backward pass measured 0.98x at DP2 on one host (speed.overlap_grad_reduce: on turns "
        "it on, as Megatron-Bridge's recipes do for data parallel > 1; try it across hosts)",
    )


def cutlass_grouped_gemm_blocker(preset: Preset, model: ModelArch, software: Mapping[str, str | None]) -> str | None:
    """Why Transformer Engine would not take its CUTLASS grouped GEMM for this preset's experts, or None where it
    does. TE >= 2.8 reads NVTE_USE_CUTLASS_GROUPED_GEMM in nvte_multi_tensor_gemm
    (transformer_engine/common/gemm/cublaslt_gemm.cu) and uses CUTLASS only on SM90, for bf16/fp16 GEMMs without a
    fused bias or GELU whose K is one multiple of 128 across the group; every other grouped GEMM falls back to cuBLAS.
    The forward GEMMs' K are the hidden size (fc1) and an expert's width on its expert-tensor-parallel rank (fc2);
    the weight gradients' K is each expert's token count, which varies, so those may take cuBLAS either way.
    auto turns the option on exactly where this is None; validate warns of `on` elsewhere (TRN023)."""
    te = software.get("transformer_engine")
    gpu = GPUS[preset.cluster.gpu]
    if model_builder(dict(software)).value == "te-free":
        return "the TE-free builder runs each expert as its own matmul: there is no grouped GEMM"
    if not model.is_moe:
        return "a dense model has no experts' grouped GEMM"
    if not gpu.is_hopper:
        return f"{gpu.name} is {gpu.sm_label}: Transformer Engine's CUTLASS grouped GEMM runs on SM90 only"
    if not versions.at_least(te, stack.TE_CUTLASS_GROUPED_GEMM):
        return f"Transformer Engine {te} has no CUTLASS grouped GEMM (it came in {stack.TE_CUTLASS_GROUPED_GEMM})"
    if preset.train.precision == "fp8":
        return "fp8: Transformer Engine's CUTLASS grouped GEMM takes bf16 and fp16 GEMMs only"
    ffn = (model.moe_ffn_hidden_size or 0) // preset.parallel.etp
    if model.hidden_size % CUTLASS_K_MULTIPLE or ffn % CUTLASS_K_MULTIPLE:
        return (
            f"the experts' GEMMs reduce over hidden_size {model.hidden_size} and an expert's width {ffn} on each "
            f"expert-tensor-parallel rank; Transformer Engine's CUTLASS path needs both multiples of "
            f"{CUTLASS_K_MULTIPLE}"
        )
    return None


def _auto_cutlass_grouped_gemm(preset: Preset, model: ModelArch, software: Mapping[str, str | None]) -> Decision:
    """On where Transformer Engine takes the CUTLASS path (cutlass_grouped_gemm_blocker). Megatron-Bridge's recipes
    leave the variable unset (cuBLAS); on gdnctl's trainer CUTLASS measured faster (CUTLASS_GROUPED_GEMM_MEASURED)."""
    blocker = cutlass_grouped_gemm_blocker(preset, model, software)
    if blocker is not None:
        return Decision(False, blocker)
    return Decision(True, _WHAT["cutlass_grouped_gemm"].format(measured=CUTLASS_GROUPED_GEMM_MEASURED))


def speed_environment(
    speed: Mapping[str, Decision], model: ModelArch, software: Mapping[str, str | None]
) -> list[tuple[str, str, str]]:
    """(name, value, reason) of the variables the speed options set in the launch scripts' environment: Transformer
    Engine reads its grouped-GEMM choice from the environment, not from a Megatron setting. Where the model has
    experts' grouped GEMMs (a MoE model on the Transformer Engine builder), `off` exports 0, so that a value
    inherited from the shell does not turn it on behind the preset's back."""
    grouped_gemm = model.is_moe and model_builder(dict(software)).value != "te-free"
    if speed["cutlass_grouped_gemm"].value:
        return [
            (CUTLASS_GROUPED_GEMM_ENV, "1", "speed.cutlass_grouped_gemm: the experts' grouped GEMMs through CUTLASS")
        ]
    if grouped_gemm:
        return [
            (CUTLASS_GROUPED_GEMM_ENV, "0", "speed.cutlass_grouped_gemm off: the experts' grouped GEMMs through cuBLAS")
        ]
    return []


def cuda_graphs_blocker(preset: Preset, model: ModelArch, software: Mapping[str, str | None]) -> str | None:
    """Why the layers' CUDA graphs cannot be captured for this preset, or None where they can. auto turns them on
    exactly where this is None; validate refuses `speed.cuda_graphs: on` where it is not (TRN021)."""
    p, t, stack = preset.parallel, preset.train, dict(software)
    if model_builder(stack).value == "te-free":
        return "the TE-free builder has no Transformer Engine layers to graph (megatron-core's graphs need TE)"
    if not model.is_moe:
        return "a dense model has no MoE router to graph (megatron-core: 'moe cuda graph is only supported for MoE')"
    if preset.job not in ("sft", "pretrain"):
        return f"{preset.job}: only the sft and pretrain trainer captures graphs"
    if t.recompute == "full":
        return (
            "full recompute: megatron-core graphs it only as a whole-iteration graph ('full recompute is only "
            "supported with full iteration CUDA graph')"
        )
    if p.pp > 1 or p.cp > 1:
        return (
            "pipeline or context parallel: gdnctl has not run graphs there (megatron-core captures one graph per "
            "micro-batch in flight)"
        )
    if t.recompute != "none" or t.precision != "bf16":
        return (
            "selective recompute or fp8: megatron-core restricts which modules a graph may cover there, and "
            "gdnctl has not run them together"
        )
    if not one_row_shape(preset, stack):
        return (
            "packed rows of whole documents vary in length, and a graph replays one shape (train.packing: fill "
            "or concat gives one)"
        )
    return None


def cuda_graph_modules(preset: Preset, software: Mapping[str, str | None]) -> tuple[str, ...]:
    """What the graphs cover (megatron-core CudaGraphModule names; moe_preprocess needs moe_router): each layer's
    attention or GDN block too where rows carry no packed-sequence offsets, as Megatron-Bridge's H100 MoE recipes
    graph it. A graphed attention takes none: megatron-core 0.19.2 transformer/transformer_layer.py
    `_te_cuda_graph_replay` asserts packed_seq_params is None, so on packed rows the attention and GDN blocks stay
    eager and only the router is graphed."""
    router = ("moe_router", "moe_preprocess")
    return ("attn", *router) if layout(preset, dict(software)).value == "bshd" else router


def _graphs_line(modules: tuple[str, ...]) -> str:
    if "attn" in modules:
        what = (
            "each layer's attention or GDN block with its norm, and each MoE layer's router and dispatch preprocessing,"
        )
        why = "each block's kernels launched as one per layer and micro-batch, as Megatron-Bridge's H100 MoE recipes do"
    else:
        what = "each MoE layer's router and dispatch preprocessing"
        why = (
            "about forty small kernels per layer and micro-batch launched at once; attention and the GDN layers stay "
            "eager on packed rows (megatron-core graphs attention only where it is given no packed-sequence offsets)"
        )
    return _WHAT["cuda_graphs"].format(what=what, modules=", ".join(modules), warmup=CUDA_GRAPH_WARMUP_STEPS, why=why)


def _auto_cuda_graphs(preset: Preset, model: ModelArch, software: Mapping[str, str | None]) -> Decision:
    """On where a captured graph replays what it recorded (cuda_graphs_blocker)."""
    blocker = cuda_graphs_blocker(preset, model, software)
    if blocker is not None:
        return Decision(False, blocker)
    return Decision(True, _graphs_line(cuda_graph_modules(preset, software)))
