"""Parallel arithmetic: world size, data parallel, expert parallel, pipeline and batch divisibility."""

from __future__ import annotations

from collections.abc import Iterator

from gdnctl.plan import Run
from gdnctl.validate.findings import Issue, Severity, rule


@rule("PAR001", Severity.ERROR, "World size divisible by tp x pp x cp")
def world_size_divisible(run: Run) -> Iterator[Issue]:
    """
    What it checks: the trainer's world size (nodes x gpus_per_node, less the rollout GPUs when the rollout
    is not colocated) is a multiple of tp x pp x cp. The quotient is the data-parallel size (dp).

    Why: Megatron-Core builds its process groups from this factorisation and asserts it at start-up.

    Source: Megatron-Core's own check: megatron/core/parallel_state.py initialize_model_parallel ("world_size .. is
    not divisible by ..", megatron-core 0.16.1).

    Fix: change tp, pp or cp, or the number of nodes / GPUs per node.
    """
    p = run.preset.parallel
    world = run.world_size.value
    if world < 1:
        yield Issue(
            "rollout.num_gpus",
            f"the rollout takes all {run.total_gpus} GPUs and leaves the trainer none.",
            "Lower rollout.num_gpus or set rollout.colocate: true.",
        )
    elif run.dp is None:
        yield Issue(
            "parallel",
            f"the trainer's world size {world} ({run.world_size.reason}) is not divisible by "
            f"tp x pp x cp = {p.tp} x {p.pp} x {p.cp} = {run.model_parallel_size}.",
            f"Pick tp, pp, cp whose product divides {world}.",
        )


@rule("PAR002", Severity.ERROR, "Expert parallel size divides the expert count")
def ep_divides_experts(run: Run) -> Iterator[Issue]:
    """
    What it checks: for MoE models, `parallel.ep` divides the number of routed experts.

    Why: each EP rank holds num_experts / ep experts; Megatron asserts an even split.

    Source: Megatron-Core's own check: megatron/core/transformer/moe/moe_layer.py
    (`assert self.config.num_moe_experts % ep_size == 0`, megatron-core 0.16.1).

    Fix: choose an ep that divides the expert count (Qwen3.5-35B-A3B: 256 experts).
    """
    experts = run.model.num_experts
    ep = run.preset.parallel.ep
    if experts and experts % ep:
        yield Issue(
            "parallel.ep",
            f"ep={ep} does not divide the {experts} experts of {run.model.label}.",
            f"Use an ep that divides {experts} (e.g. 8).",
        )


@rule("PAR003", Severity.ERROR, "Expert parallel group fits the world")
def ep_fits_world(run: Run) -> Iterator[Issue]:
    """
    What it checks: etp x ep x pp divides the trainer's world size.

    Why: Megatron-Core's expert-data-parallel size is world / (etp x ep x pp); it must be a whole number.

    Source: Megatron-Core's own check: megatron/core/parallel_state.py initialize_model_parallel ("world_size .. is
    not divisible by expert_tensor_model_pipeline_parallel size", megatron-core 0.16.1).

    Fix: lower ep or etp, or add GPUs.
    """
    p = run.preset.parallel
    group = p.etp * p.ep * p.pp
    world = run.world_size.value
    if world >= 1 and world % group:
        yield Issue(
            "parallel.ep",
            f"etp x ep x pp = {p.etp} x {p.ep} x {p.pp} = {group} does not divide the trainer's world size {world}.",
            f"Choose ep and etp so that etp x ep x pp divides {world}.",
        )


@rule("PAR004", Severity.ERROR, "Expert parallelism on a dense model")
def ep_on_dense(run: Run) -> Iterator[Issue]:
    """
    What it checks: ep and etp stay 1 on dense models (no `num_experts`).

    Why: a dense model has no experts to distribute; Megatron would still carve out expert groups.

    Source: Megatron-Core's own check for ep: megatron/core/transformer/transformer_config.py ("num_moe_experts must
    be non None to use expert-parallel", megatron-core 0.16.1); etp > 1 on a dense model is refused by gdnctl alone.

    Fix: set parallel.ep: 1 and parallel.etp: 1.
    """
    p = run.preset.parallel
    if not run.model.is_moe and (p.ep > 1 or p.etp > 1):
        field = "parallel.ep" if p.ep > 1 else "parallel.etp"
        yield Issue(
            field,
            f"{run.model.label} is a dense model, but ep={p.ep} and etp={p.etp}.",
            "Set parallel.ep: 1 and parallel.etp: 1.",
        )


@rule("PAR005", Severity.ERROR, "MoE with tensor parallelism needs sequence parallel")
def moe_tp_needs_sp(run: Run) -> Iterator[Issue]:
    """
    What it checks: a MoE model with tp > 1 runs with sequence parallel on.

    Why: Megatron-Core asserts `sequence_parallel` when `tensor_model_parallel_size > 1` and experts are used
    (the token dispatcher expects sequence-sharded inputs).

    Source: Megatron-Core's MoELayer.forward, megatron/core/transformer/moe/moe_layer.py (megatron-core 0.16.1:
    ValueError when training MoE with TP > 1 without sequence parallel); docs/sources.md "Megatron-Core".

    Fix: set parallel.sequence_parallel: true (or leave it unset: it defaults to on when tp > 1).
    """
    if run.model.is_moe and run.preset.parallel.tp > 1 and not run.sequence_parallel.value:
        yield Issue(
            "parallel.sequence_parallel",
            f"{run.model.label} is MoE with tp={run.preset.parallel.tp}, which needs sequence parallel, but it is off.",
            "Set parallel.sequence_parallel: true.",
        )


@rule("PAR006", Severity.ERROR, "Virtual pipeline needs pipeline parallelism")
def vpp_needs_pp(run: Run) -> Iterator[Issue]:
    """
    What it checks: `parallel.vpp` is only set when pp > 1.

    Why: virtual pipeline stages interleave chunks across pipeline ranks; with one stage there is nothing
    to interleave and Megatron rejects it.

    Source: Megatron-Core's own check: megatron/core/parallel_state.py initialize_model_parallel
    ("pipeline-model-parallel size should be greater than 1 with interleaved schedule", megatron-core 0.16.1).

    Fix: remove parallel.vpp or raise parallel.pp.
    """
    p = run.preset.parallel
    if p.vpp is not None and p.pp == 1:
        yield Issue("parallel.vpp", f"vpp={p.vpp} is set but pp=1.", "Remove parallel.vpp, or set parallel.pp > 1.")


@rule("PAR007", Severity.ERROR, "Layers divisible by pp (x vpp)")
def layers_divisible(run: Run) -> Iterator[Issue]:
    """
    What it checks: the number of layers divides evenly into pp stages, and into pp x vpp model chunks when
    vpp is set.

    Why: gdnctl builds even pipeline stages; an uneven split would need per-stage layer counts.

    Source: Megatron-Core's own check: megatron/core/transformer/transformer_block.py get_num_layers_to_build
    ("num_layers should be divisible by pipeline_model_parallel_size", megatron-core 0.16.1); gdnctl passes no
    per-stage layer counts.

    Fix: choose pp (and vpp) dividing the layer count (Qwen3.5-35B-A3B: 40 layers).
    """
    p = run.preset.parallel
    layers = run.model.num_layers
    chunks = p.pp * (p.vpp or 1)
    if layers % chunks:
        what = f"pp x vpp = {p.pp} x {p.vpp}" if p.vpp else f"pp={p.pp}"
        yield Issue(
            "parallel.vpp" if p.vpp else "parallel.pp",
            f"{run.model.label} has {layers} layers, which {what} does not divide evenly.",
            f"Choose pp{' and vpp' if p.vpp else ''} so that {layers} splits evenly.",
        )


@rule("PAR008", Severity.ERROR, "Global batch divisible by micro batch x dp")
def global_batch_divisible(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.global_batch_size is a multiple of micro_batch_size x dp.

    Why: each step runs global / (micro x dp) micro-batches per data-parallel rank; Megatron asserts it.

    Source: gdnctl's data pipeline refuses it at start-up (runtime/data/pipeline.py); Megatron-Core's
    megatron/core/num_microbatches_calculator.py asserts the same (megatron-core 0.16.1).

    Fix: change the global batch, the micro batch, or the parallel layout.
    """
    t = run.preset.train
    if run.dp is None:
        return
    unit = t.micro_batch_size * run.dp
    if t.global_batch_size % unit:
        yield Issue(
            "train.global_batch_size",
            f"global_batch_size {t.global_batch_size} is not a multiple of micro_batch_size x dp = "
            f"{t.micro_batch_size} x {run.dp} = {unit}.",
            f"Use a multiple of {unit}, e.g. {max(unit, t.global_batch_size // unit * unit)}.",
        )


@rule("PAR010", Severity.ERROR, "CPU clusters run only the selftest, rl and image sft jobs")
def cpu_only_selftest(run: Run) -> Iterator[Issue]:
    """
    What it checks: `cluster.gpu: cpu` is used only with `job: selftest`, `job: rl`, or `job: sft` with
    train.images.

    Why: Megatron-Core does not run on a CPU-only torch (it calls torch.cuda.current_device()), and the
    GDN kernels need a GPU. The selftest job exercises the runtime with gloo instead, the rl job trains
    a tiny policy with torch beside vLLM's CPU build, and the sft job on records with images trains transformers'
    vision-language class with torch.

    Source: docs/sources.md "Megatron-Core" (Megatron-Core calls torch.cuda.current_device(), so it does not run on
    a CPU-only torch); gdnctl's gloo selftest (runtime/selftest.py), CPU rl policy
    (runtime/rl/policy/torch_policy.py) and CPU image sft (runtime/train/cpu_sft.py).

    Fix: set cluster.gpu to the GPU of your nodes, job: selftest, or (sft on images) train.images.
    """
    job = run.preset.job
    image_sft = job == "sft" and run.preset.train.images is not None
    if run.gpu.sm is None and job not in ("selftest", "rl") and not image_sft:
        yield Issue(
            "cluster.gpu",
            f"job '{job}' needs GPUs, but cluster.gpu is cpu"
            + (" (on CPU, sft trains records with images only)." if job == "sft" else "."),
            "Set cluster.gpu to your GPU kind (e.g. h100), or job: selftest"
            + ("; or train.images for records with images." if job == "sft" else "."),
        )


@rule("PAR011", Severity.ERROR, "Sequence parallel needs tensor parallelism")
def sp_needs_tp(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job on GPUs (the jobs whose runtime builds Megatron-Core's TransformerConfig)
    with parallel.sequence_parallel: true and tp == 1.

    Why: gdnctl's trainer passes sequence_parallel to Megatron-Core's TransformerConfig as it is, and
    ModelParallelConfig.__post_init__ raises `ValueError("Cannot use sequence parallelism without tensor
    parallelism")`: Megatron-Core does not turn it off, so the job would stop at model build after it had been
    scheduled. (It replaces PAR009, an info that said Megatron drops it with a warning: that is the Megatron-LM
    training script's habit, and gdnctl's runtime does not go through that script.) Found by
    tests/runtime/model/test_config_agreement.py.

    Source: megatron/core/model_parallel_config.py, ModelParallelConfig.__post_init__: lines 409-411 of
    megatron-core 0.16.1 (checked by constructing TransformerConfig on CPU), lines 502-504 of 0.19.2 (read in the
    0.19.2 wheel).

    Fix: remove parallel.sequence_parallel (it defaults to on exactly when tp > 1), or raise parallel.tp.
    """
    p = run.preset.parallel
    if run.is_training and run.gpu.sm is not None and run.sequence_parallel.value and p.tp == 1:
        yield Issue(
            "parallel.sequence_parallel",
            "sequence_parallel: true with tp=1 stops the trainer at model "
            "build: Megatron-Core refuses sequence parallelism without "
            "tensor parallelism.",
            "Remove parallel.sequence_parallel, or raise parallel.tp.",
        )
