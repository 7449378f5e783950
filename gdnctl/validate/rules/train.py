"""Where the trained weights come from."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from gdnctl.knowledge import lora, stack, versions
from gdnctl.plan import Run
from gdnctl.schema import LoraSpec
from gdnctl.validate.findings import Issue, Severity, rule


@rule("TRN001", Severity.WARNING, "A released model trained from random weights")
def released_model_without_weights(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job on a released checkpoint's architecture (model.id) with no model.path.

    Why: the catalog holds architectures, not weights, and nothing is downloaded at run time, so the trainer
    initialises the model randomly: fine for a throughput test, surprising for fine-tuning.

    Source: gdnctl's catalog (gdnctl/knowledge/catalog.yaml holds architectures, not weights); the trainer loads
    model.path's safetensors or initialises the model randomly.

    Fix: set model.path to the downloaded checkpoint directory (its safetensors are loaded), or keep it unset
    on purpose for a benchmark.
    """
    p = run.preset
    if run.is_training and p.model.path is None and run.model.released:
        yield Issue(
            "model.path",
            f"{run.model.label} has released weights but model.path is unset, so the "
            "trainer starts from random weights.",
            "Set model.path to the downloaded checkpoint directory, or ignore this for a benchmark.",
        )


@rule("TRN002", Severity.ERROR, "The TE-free builder has no context parallel and no FP8")
def te_free_trainer(run: Run) -> Iterator[Issue]:
    """
    What it checks: a GPU training job (sft, pretrain, rl) built by gdnctl's TE-free spec
    (`runtime.transformer_engine: none`) with parallel.cp > 1 or train.precision fp8.

    Why: the TE-free builder (gdnctl/runtime/model/megatron.py) makes the model from Megatron-Core modules
    alone; Megatron-Core's context-parallel attention and FP8 exist only in Transformer Engine's modules, so the
    model build would stop (runtime/model/megatron_config.py says so) after the job had been scheduled. The
    megatron-bridge builder (runtime/model/bridge.py) has both.

    Source: gdnctl's TE-free builder: runtime/model/megatron_config.py stops the build (ModelBuildError) for cp > 1
    and fp8; Megatron-Core's CP attention and FP8 live in Transformer Engine's modules.

    Fix: name the trainer's Transformer Engine in runtime.transformer_engine (the megatron-bridge builder), or set
    parallel.cp: 1 and train.precision: bf16.
    """
    p = run.preset
    if not run.is_training or run.gpu.sm is None or run.model_builder.value != "te-free":
        return
    fix = "Name the trainer's Transformer Engine in runtime.transformer_engine (the megatron-bridge builder), or "
    if p.parallel.cp > 1:
        yield Issue(
            "parallel.cp",
            f"cp={p.parallel.cp} needs Transformer Engine's context-parallel attention, and "
            "runtime.transformer_engine: none selects gdnctl's TE-free builder.",
            fix + "set parallel.cp: 1.",
        )
    if p.train.precision != "bf16":
        yield Issue(
            "train.precision",
            f"precision {p.train.precision} needs Transformer Engine, and "
            "runtime.transformer_engine: none selects gdnctl's TE-free builder.",
            fix + "set train.precision: bf16.",
        )


@rule("TRN008", Severity.ERROR, "The rl policy does not shard sequences over context-parallel ranks")
def context_parallel_not_sharded(run: Run) -> Iterator[Issue]:
    """
    What it checks: an rl job on GPUs with parallel.cp > 1.

    Why: Megatron-Core's context parallel expects every CP rank to be handed its own chunks of each sequence
    (megatron/core/utils.py _get_batch_on_this_cp_rank_per_document_balancing, TE's thd_get_partitioned_indices),
    and each rank's log-probs are then those chunks only. The sft/pretrain trainer does this
    (runtime/data/context_parallel.py); the rl policy (runtime/rl/policy/megatron_policy.py) feeds padded rows whole and
    reads every token's log-prob on every rank, so with cp > 1 each rank would train on the whole sequence and
    the GRPO loss would count each token cp times.

    Source: megatron/core/utils.py (0.19) _get_batch_on_this_cp_rank_per_document_balancing; gdnctl's
    runtime/rl/policy/megatron_policy.py (no CP split).

    Fix: set parallel.cp: 1 for rl; fit long rollouts with TP, recompute or optimizer offload instead.
    """
    p = run.preset
    if p.job == "rl" and run.gpu.sm is not None and p.parallel.cp > 1:
        yield Issue(
            "parallel.cp",
            f"cp={p.parallel.cp}: gdnctl's rl policy does not give each context-parallel "
            "rank its own chunks of the sequences, so every rank would train on the whole "
            "sequence.",
            "Set parallel.cp: 1 for rl; fit long rollouts with TP, recompute or optimizer offload instead.",
        )


@rule("TRN009", Severity.ERROR, "FP8 training needs an SM89+ GPU")
def fp8_needs_sm89(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.precision fp8 on a GPU older than SM89 (A100 is SM80).

    Why: Transformer Engine's FP8 GEMMs need FP8 tensor cores, which arrive with SM89 (Ada) and SM90 (Hopper);
    TE refuses FP8 below that (transformer_engine/pytorch/fp8.py check_fp8_support: "Device compute capability
    8.9 or higher required for FP8 execution").

    Source: transformer_engine/pytorch/fp8.py check_fp8_support ("Device compute capability 8.9 or higher required
    for FP8 execution").

    Fix: set train.precision: bf16, or run on H100/H200/B200.
    """
    p = run.preset
    if run.is_training and p.train.precision == "fp8" and run.gpu.sm is not None and run.gpu.sm < (8, 9):
        yield Issue(
            "train.precision",
            f"FP8 needs FP8 tensor cores (SM89 or newer); {run.gpu.name} is {run.gpu.sm_label}.",
            "Set train.precision: bf16, or run on an H100, H200 or B200.",
        )


@rule("TRN003", Severity.ERROR, "The trainer's transformers does not know the model")
def trainer_transformers_model_type(run: Run) -> Iterator[Issue]:
    """
    What it checks: an rl or sft job on device cpu whose runtime.transformers is older than the first transformers
    release with the model's classes: qwen3_5 and qwen3_5_moe (Qwen3_5TextConfig, Qwen3_5ForCausalLM,
    Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM) need transformers >= 5.2.0, qwen3_next needs >= 4.57.0.
    Quiet while runtime.transformers is unset (unknown).

    Why: on device cpu the rl policy is transformers' text-only class (runtime/rl/policy/torch_policy.py imports it by
    name), and the sft job its vision-language class (runtime/train/cpu_sft.py), so an older transformers fails at
    start-up with an ImportError, the trainer-side half of verl #5937
    ("model type qwen3_5 ... Transformers does not recognize this architecture"; upgrading transformers in the
    same environment then broke vLLM, which RLT008 keeps apart). The GPU trainer does not import transformers:
    it builds Megatron-Core modules and writes HF checkpoints with its own safetensors writer, so sft, pretrain
    and rl on GPUs are not checked.

    Source: transformers wheels: models/qwen3_next is in 4.57.0, not 4.56.2 (release notes "v4.57.0: Qwen3-Next");
    models/qwen3_5 and qwen3_5_moe (and their *_text configs in the auto mappings) are in 5.2.0, not 5.1.0.
    verl-project/verl #5937.

    Fix: install transformers >= the version named (gdnctl's runtime extra asks for >= 5.23, the release its CPU
    rl tests run) in the trainer's environment and set runtime.transformers.
    """
    found = run.stack.get("transformers")
    if run.preset.job not in ("rl", "sft") or run.gpu.sm is not None or found is None:
        return
    # The family whose text-only class the device-cpu rl policy builds (runtime/rl/policy/torch_policy.py).
    family = run.model.family
    since = family.transformers_since
    if versions.below(found, since):
        yield Issue(
            "runtime.transformers",
            f"transformers {found} has no {family.name} classes (added in {since}), "
            f"and the {run.preset.job} job on device cpu is transformers' model.",
            f"Install transformers >= {since} in the trainer's environment and set runtime.transformers.",
        )


def _builds_megatron_model(run: Run) -> bool:
    """The jobs whose runtime builds Megatron-Core's TransformerConfig: sft, pretrain and rl on GPUs."""
    return run.is_training and run.gpu.sm is not None


@rule("TRN005", Severity.ERROR, "The trainer's MoE router cannot route to one expert per token")
def moe_top1_router(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job on GPUs with a MoE model whose `num_experts_per_tok` (top-k) is 1.

    Why: gdnctl's trainer builds the Qwen3.5 / Qwen3-Next router as HF computes it: softmax over all experts,
    then top-k, then renormalised (`moe_router_pre_softmax=False`, score function softmax, aux-loss balancing).
    With top-1 that renormalised weight is always 1, so the router would get no gradient, and Megatron-Core's
    TransformerConfig raises `ValueError("Please use --moe-router-pre-softmax when topk is 1.")`; a pre-softmax
    router would be a different model from the checkpoint's. The released checkpoints route to 8 or 10 experts;
    only a custom config.json (model.path) meets this. Found by tests/runtime/model/test_config_agreement.py.

    Source: megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__: lines 1633-1641 of
    megatron-core 0.16.1 (checked by constructing TransformerConfig on CPU), lines 2328-2336 of 0.19.2 (read in
    the 0.19.2 wheel).

    Fix: use a checkpoint with num_experts_per_tok >= 2.
    """
    m = run.model
    if _builds_megatron_model(run) and m.is_moe and m.num_experts_per_tok == 1:
        yield Issue(
            "model",
            f"{m.label} routes each token to 1 expert, and Megatron-Core refuses top-1 routing "
            "with the softmax-then-top-k router gdnctl's trainer builds.",
            "Use a checkpoint with num_experts_per_tok >= 2 (config.json).",
        )


@rule("TRN006", Severity.ERROR, "The shared expert's size is positive")
def shared_expert_size(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job on GPUs with a MoE model whose `shared_expert_intermediate_size` is 0 or
    negative (left out is fine: no shared expert).

    Why: gdnctl's trainer passes the size to Megatron-Core as `moe_shared_expert_intermediate_size`, and
    TransformerConfig raises `ValueError("moe_shared_expert_intermediate_size must be num_shared_experts *
    ffn_size_of_each_shared_expert, but got 0")` for a value <= 0, so the job would stop at model build. Only a
    custom config.json (model.path) meets this. Found by tests/runtime/model/test_config_agreement.py.

    Source: megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__: lines 1083-1089
    of megatron-core 0.16.1 (checked by constructing TransformerConfig on CPU), lines 1637-1643 of 0.19.2 (read in
    the 0.19.2 wheel).

    Fix: remove shared_expert_intermediate_size from the checkpoint's config.json when the model has no shared
    expert, or give its real size.
    """
    m = run.model
    size = m.shared_expert_ffn_hidden_size
    if _builds_megatron_model(run) and m.is_moe and size is not None and size <= 0:
        yield Issue(
            "model",
            f"{m.label} has shared_expert_intermediate_size {size}, which Megatron-Core refuses "
            "(it must be positive, or left out for no shared expert).",
            "Remove shared_expert_intermediate_size from config.json, or set the shared expert's size.",
        )


@rule("TRN004", Severity.ERROR, "gdnctl's trainer does not train the MTP layer (train.mtp)")
def mtp_not_trained(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job with train.mtp: true.

    Why: Qwen3.5 checkpoints carry a multi-token-prediction layer (`mtp.*`, `mtp_num_hidden_layers: 1`) that
    vLLM uses for speculative decoding. gdnctl's trainers build the model without it: loading skips the `mtp.*`
    tensors (gdnctl/runtime/model/hf_weights.py IGNORED_HF_PREFIXES), and every saved checkpoint copies them
    from the source checkpoint unchanged, with the source's config.json and so its mtp_num_hidden_layers
    (gdnctl/runtime/model/passthrough.py, written by checkpoint.py's save_hf, save_tensors and ShardWriter;
    vLLM 0.32 serves such a checkpoint with speculative decoding: tests/runtime/rl/test_hf_export.py). With
    train.mtp: true the job would run and report success while the MTP layer it saves is the source's, untrained.

    Source: gdnctl's trainer: runtime/model/hf_weights.py IGNORED_HF_PREFIXES (skips `mtp.*`) and
    runtime/model/passthrough.py (copies them unchanged); tests/runtime/rl/test_hf_export.py (vLLM 0.32).

    Fix: set train.mtp: false; the saved checkpoints keep the source's MTP layer as it is, so speculative
    decoding still works (its drafts may be accepted less often as training moves the model away from it).
    """
    if run.is_training and run.preset.train.mtp:
        yield Issue(
            "train.mtp",
            "train.mtp is true, but gdnctl's trainer does not train the MTP layer: its saves "
            "carry the source checkpoint's MTP weights over unchanged.",
            "Set train.mtp: false; the saved checkpoints keep the source's MTP layer as it is.",
        )


@rule("TRN007", Severity.ERROR, "gdnctl's trainer does not build virtual pipeline stages (parallel.vpp)")
def vpp_not_built(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job with parallel.vpp set.

    Why: the TE-free trainer builds one model chunk per pipeline rank: it never passes
    virtual_pipeline_model_parallel_size to Megatron-Core's TransformerConfig (gdnctl/runtime/model/
    megatron_config.py) nor builds a chunk per virtual stage, so the preset's vpp would be silently ignored and
    the job would run with the plain pipeline schedule and its larger bubble. Found while checking that every
    config validate accepts is the config the runtime builds (tests/runtime/model/test_config_agreement.py).

    Source: gdnctl's runtime/model/megatron_config.py (passes no virtual_pipeline_model_parallel_size);
    tests/runtime/model/test_config_agreement.py.

    Fix: remove parallel.vpp (pp alone is built), until gdnctl builds virtual pipeline stages.
    """
    if run.is_training and run.preset.parallel.vpp is not None:
        yield Issue(
            "parallel.vpp",
            f"vpp={run.preset.parallel.vpp} would be ignored: gdnctl's trainer builds one "
            "model chunk per pipeline rank, with no virtual stages.",
            "Remove parallel.vpp; parallel.pp alone is built.",
        )


@rule("TRN010", Severity.ERROR, "gdnctl's CPU rl policy and CPU sft do not train LoRA adapters (train.lora)")
def lora_not_trained(run: Run) -> Iterator[Issue]:
    """
    What it checks: an rl or sft job on the CPU pseudo-device (cluster.gpu: cpu) with train.lora set.

    Why: on CPU the rl policy is transformers' class in plain torch (runtime/rl/policy/torch_policy.py), and so is
    the image sft job (runtime/train/cpu_sft.py); neither wraps anything in adapters: it would update every
    parameter while explain and the memory estimate count the adapters alone. On GPUs the rl policy is the trainer's
    megatron-bridge model, which wraps the base in megatron-bridge's LoRA (runtime/model/lora_wrap.py); its weight
    sync sends the rollout megatron-bridge's export, which merges the adapters into the base tensors, and its KL
    reference is the base with the adapters switched off (runtime/rl/policy/megatron_policy.py). TRN016 refuses LoRA
    with the TE-free builder on GPUs.

    Source: gdnctl's runtime/rl/policy/interface.py (device cpu takes TorchPolicy),
    runtime/rl/policy/torch_policy.py and runtime/train/cpu_sft.py (no adapters); megatron-bridge 0.6.2
    models/conversion/auto_bridge.py export_hf_weights (merge_adapter_weights defaults to True) for the GPU policy's
    sync.

    Fix: run the job on GPUs with the megatron-bridge builder, or remove train.lora for full-parameter training on
    CPU.
    """
    job = run.preset.job
    if job in ("rl", "sft") and run.preset.train.lora is not None and run.gpu.sm is None:
        what = "rl policy" if job == "rl" else "sft job"
        yield Issue(
            "train.lora",
            f"gdnctl's CPU {what} (transformers in plain torch) adds no LoRA adapters, so it "
            "would update every parameter while the memory estimate counts the adapters alone.",
            f"Run the {job} job on GPUs with the megatron-bridge builder, or remove train.lora for "
            f"full-parameter {job} on CPU.",
        )


@rule("TRN011", Severity.ERROR, "FP8 with padded rows needs seq_length a multiple of 16")
def fp8_padded_row_length(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.precision fp8 with the padded (BSHD) layout and a seq_length that is not a multiple of 16.

    Why: Transformer Engine's FP8 GEMMs need the tokens of a call divisible by 8 and the hidden size by 16
    (transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec; an H100 run stopped at step 1 on a packed row
    of 995 tokens with "FP8 execution requires the product of all dimensions except the last to be divisible
    by 8"). Packed (THD) rows are padded for it by the runtime (runtime/data/pipeline.py FP8_TOKEN_MULTIPLE);
    padded rows are exactly seq_length wide.

    Source: transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec; measured: H100,
    benchmarks/results/trains-right-2026-11-24.md (the FP8 run that stopped at step 1 on a 995-token row).

    Fix: make train.seq_length a multiple of 16, or use train.layout: thd.
    """
    p = run.preset
    if run.is_training and p.train.precision == "fp8" and run.layout.value == "bshd" and p.train.seq_length % 16:
        yield Issue(
            "train.seq_length",
            f"FP8 GEMMs need a multiple of 16 tokens per padded row, and seq_length is {p.train.seq_length}.",
            f"Set train.seq_length to {p.train.seq_length + 16 - p.train.seq_length % 16}, or use train.layout: thd.",
        )


@rule("TRN013", Severity.ERROR, "The lr decays to a minimum above its peak")
def min_lr_above_lr(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.min_lr above train.lr with a cosine or linear decay (train.lr_decay).

    Why: the decay would raise the lr after the warmup instead of lowering it, which is never what a schedule
    with a "minimum" means; a typo in one of the two exponents is the usual cause.

    Source: gdnctl's schedule (gdnctl/runtime/train/lr_schedule.py) goes from train.lr to train.min_lr; Megatron-
    Core's OptimizerParamScheduler asserts min_lr <= max_lr the same way (megatron/core/optimizer_param_scheduler.py).

    Fix: set train.min_lr at or below train.lr, or leave it unset (lr / 10).
    """
    t = run.preset.train
    decay = run.lr_schedule["decay"].value
    if run.is_training and t.min_lr is not None and t.min_lr > t.lr and decay != "constant":
        yield Issue(
            "train.min_lr",
            f"min_lr {t.min_lr:g} is above lr {t.lr:g}, so the {decay} decay would raise the lr after the warmup.",
            "Set train.min_lr at or below train.lr, or leave it unset (lr / 10).",
        )


@rule("TRN014", Severity.WARNING, "The lr warmup lasts the whole run")
def warmup_outlasts_run(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.lr_warmup_steps at or above train.train_iters.

    Why: the lr then rises for the whole run and never reaches train.lr, and no decay happens: the run trains at
    a lower lr than the preset names.

    Source: gdnctl's schedule (gdnctl/runtime/train/lr_schedule.py): step s < lr_warmup_steps trains at
    lr * (s + 1) / lr_warmup_steps.

    Fix: lower train.lr_warmup_steps below train.train_iters, or leave it unset (a tenth of the run).
    """
    t = run.preset.train
    if run.is_training and t.lr_warmup_steps is not None and t.lr_warmup_steps >= t.train_iters:
        yield Issue(
            "train.lr_warmup_steps",
            f"lr_warmup_steps {t.lr_warmup_steps} is not below train_iters "
            f"{t.train_iters}, so the lr never reaches {t.lr:g}.",
            "Lower train.lr_warmup_steps below train.train_iters, or leave it unset (a tenth of the run).",
        )


@rule("TRN015", Severity.WARNING, "An eval section the job does not run")
def eval_not_run(run: Run) -> Iterator[Issue]:
    """
    What it checks: an eval section in a selftest job.

    Why: only the training jobs evaluate (rl: held-out reward and pass@k; sft and pretrain: held-out loss); a
    selftest ignores the section, so the preset promises an evaluation that never happens.

    Source: gdnctl's compiler (gdnctl/plan/compile.py writes eval into the engine config of sft, pretrain and rl
    only).

    Fix: remove the eval section, or run an sft, pretrain or rl job.
    """
    if run.preset.eval is not None and not run.is_training:
        yield Issue(
            "eval",
            f"a {run.preset.job} job runs no evaluation, so the eval section is ignored.",
            "Remove the eval section, or run an sft, pretrain or rl job.",
        )


@rule("TRN016", Severity.ERROR, "LoRA needs the Transformer Engine builder")
def lora_te_free(run: Run) -> Iterator[Issue]:
    """
    What it checks: a GPU training job with train.lora set that the TE-free builder would build
    (`runtime.transformer_engine: none`).

    Why: gdnctl's adapters are megatron-bridge's LoRA, applied to the model megatron-bridge's provider builds.
    megatron-bridge's LoRA layers import Transformer Engine when they are imported (megatron/bridge/peft/
    lora_layers.py line 20, `import transformer_engine.pytorch as te`), so `megatron.bridge.peft.lora` cannot be
    imported where the TE-free builder runs, and that builder (runtime/model/megatron.py) builds the model from
    Megatron-Core's spec without megatron-bridge's provider.

    Source: megatron-bridge 0.6.2 megatron/bridge/peft/lora_layers.py line 20 and peft/lora.py lines 25-31 (LoRA
    imports lora_layers); gdnctl's runtime/model/builders.py (the TE-free builder uses no megatron-bridge).

    Fix: name the trainer's Transformer Engine in runtime.transformer_engine (the megatron-bridge builder), or
    remove train.lora.
    """
    if (
        run.is_training
        and run.gpu.sm is not None
        and run.preset.train.lora is not None
        and run.model_builder.value == "te-free"
    ):
        yield Issue(
            "train.lora",
            "LoRA adapters are megatron-bridge's, which need Transformer Engine, and "
            "runtime.transformer_engine: none selects gdnctl's TE-free builder.",
            "Name the trainer's Transformer Engine in runtime.transformer_engine (the megatron-bridge "
            "builder), or remove train.lora.",
        )


_MISSING_TARGET = {
    "dense": "it is a MoE model: every layer's MLP block is routed experts",
    "moe": "it is a dense model: it has no routed experts",
    "shared_expert": "it has no shared expert",
}


@rule("TRN017", Severity.ERROR, "A LoRA target names linears the model does not have")
def lora_target_absent(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job whose train.lora.targets names linears the model lacks: mlp on a MoE model,
    experts on a dense one, shared_expert on a model without a shared expert.

    Why: megatron-bridge's LoRA matches its target_modules against the model's module names and, when a target
    matches nothing, only logs a warning ("No modules matched the requested target_modules entries") and trains the
    rest: the job would run with fewer adapters than the preset asks for, and the adapter would not be what the
    preset says.

    Source: megatron-bridge 0.6.2 megatron/bridge/peft/module_matcher.py ModuleMatcher._validate_target_matches
    (lines 195-209: a warning, not an error); gdnctl/knowledge/lora.py (what each target wraps).

    Fix: remove the target from train.lora.targets, or leave targets unset for megatron-bridge's Qwen3.5 recipe
    coverage of this model.
    """
    spec = run.preset.train.lora
    if not run.is_training or spec is None or spec.targets is None:
        return
    for index, name in enumerate(spec.targets):
        if not lora.has_target(run.model, name):
            yield Issue(
                f"train.lora.targets[{index}]",
                f"{run.model.label} has no {name} linears to adapt: {_MISSING_TARGET[lora.TARGETS[name].needs]}.",
                f"Remove {name} from train.lora.targets, or leave targets unset for this model's default "
                f"({', '.join(lora.default_targets(run.model))}).",
            )


def _routed_expert_lora(run: Run) -> LoraSpec | None:
    """The preset's train.lora where a training job adapts a MoE model's routed experts, else None."""
    spec = run.preset.train.lora
    if run.is_training and spec is not None and run.model.is_moe and "experts" in run.lora_targets.value:
        return spec
    return None


@rule("TRN018", Severity.ERROR, "One LoRA adapter per routed expert needs megatron-bridge >= 0.5.0")
def lora_per_expert_adapters(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job with train.lora targeting experts, one adapter per expert
    (train.lora.expert_adapters per_expert, set or picked by auto), on a megatron-bridge older than 0.5.0.

    Why: with train.lora.expert_adapters: per_expert (what auto picks with parallel.ep > 1) every routed expert gets
    its own adapter, as the Hugging Face adapter layout holds one per expert (peft target_parameters on
    mlp.experts.gate_up_proj and down_proj). megatron-bridge builds per-expert adapters for grouped-GEMM experts
    from 0.5.0 (LoRA(share_expert_adapters=False), GroupedExpertLinearAdapter, PR #3408); before it, every grouped
    expert of an expert-parallel rank shares one adapter whatever is asked (peft/lora.py 0.4.2).

    Source: NVIDIA-NeMo/Megatron-Bridge commit 747caeb ("Support not sharing expert adapters", PR #3408), first in
    v0.5.0; megatron/bridge/peft/lora.py v0.4.2 (one ParallelLinearAdapter per grouped linear) and 0.6.2 (lines
    163-182).

    Fix: set runtime.megatron_bridge to 0.5.0 or newer (gdnctl pins 0.6.2), set train.lora.expert_adapters: shared
    with parallel.ep 1, or remove experts from train.lora.targets.
    """
    spec = _routed_expert_lora(run)
    if spec is None or run.lora_expert_adapters.value != "per_expert":
        return
    bridge = run.stack.get("megatron_bridge")
    if versions.below(bridge, stack.BRIDGE_LORA_PER_EXPERT):
        # Shared adapters are an answer only with one expert-parallel rank (TRN024).
        shared = ", set train.lora.expert_adapters: shared" if run.preset.parallel.ep == 1 else ""
        if spec.expert_adapters == "per_expert":
            field = "train.lora.expert_adapters"  # set in the preset, not picked by auto
        else:
            field = "train.lora.targets" if spec.targets is not None else "train.lora"
        yield Issue(
            field,
            f"megatron-bridge {bridge} shares one LoRA adapter among an expert-parallel rank's routed "
            f"experts; one adapter per expert arrived in {stack.BRIDGE_LORA_PER_EXPERT}.",
            f"Set runtime.megatron_bridge to {stack.BRIDGE_LORA_PER_EXPERT} or newer{shared}, or remove experts "
            "from train.lora.targets.",
        )


@rule("TRN019", Severity.WARNING, "peft cannot load a Qwen3-Next shared expert's LoRA adapter")
def lora_qwen3_next_shared_expert(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job on Qwen3-Next whose LoRA targets (set, or the default) include shared_expert.

    Why: the adapter checkpoint names the shared expert's gate_proj, up_proj and down_proj, as transformers'
    Qwen3NextForCausalLM does. peft, loading it, converts a Qwen3-Next config from transformers 4's layout first:
    every target ending in gate_proj, up_proj or down_proj becomes the routed experts' fused gate_up_proj /
    down_proj parameters (at twice the rank for gate_up_proj), so the shared expert gets no adapter and
    PeftModel.from_pretrained stops on a size mismatch of the experts' adapter. The merged export
    (base + (alpha/rank)·B·A) is unaffected, and Qwen3.5-MoE's classes have no such conversion. While
    megatron-bridge refuses LoRA on Qwen3-Next (TRN020) this comes second; it is the limit that remains after.

    Source: peft 0.21.2 peft/utils/transformers_weight_conversion.py _convert_peft_config_moe (qwen3_next maps to
    the qwen2_moe pattern: gate_proj, up_proj -> gate_up_proj; down_proj -> down_proj);
    tests/runtime/model/test_lora_adapters.py (the refusal, on a tiny Qwen3-Next).

    Fix: set train.lora.targets without shared_expert if the adapter is to be loaded with peft, or load the
    merged export.
    """
    spec = run.preset.train.lora
    family = run.model.family
    if (
        run.is_training
        and spec is not None
        and family.peft_fuses_shared_expert_adapter
        and "shared_expert" in run.lora_targets.value
    ):
        yield Issue(
            "train.lora.targets" if spec.targets is not None else "train.lora",
            f"peft cannot load a {family.label} adapter on the shared expert: it reads the shared expert's "
            "gate_proj, up_proj and down_proj as the routed experts' fused parameters.",
            "Set train.lora.targets without shared_expert if the adapter is to be loaded with peft, or "
            "load the merged export.",
        )


@rule("TRN020", Severity.ERROR, "megatron-bridge does not support LoRA on Qwen3-Next")
def lora_qwen3_next(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job with train.lora on a Qwen3-Next model.

    Why: megatron-bridge declares PEFT unsupported for Qwen3-Next: its Qwen3-Next PEFT recipe raises
    NotImplementedError ("PEFT is not currently supported for Qwen3-Next models. Only full SFT is available"),
    from v0.3.1 to 0.6.2 and on main (2026-08), where its Qwen3.5 recipes train LoRA. Its adapter export also splits
    a GDN in_proj adapter only into Qwen3.5's HF names (models/conversion/peft_bridge.py _is_gdn_in_proj_split), not
    Qwen3-Next's in_proj_qkvz / in_proj_ba.

    Source: megatron-bridge 0.6.2 megatron/bridge/recipes/qwen/h100/qwen3_next.py lines 296-314
    (qwen3_next_80b_a3b_peft_1gpu_h100_bf16_config); NVIDIA-NeMo/Megatron-Bridge commit 7e7084fa7, first in
    v0.3.1.

    Fix: remove train.lora (full-parameter training of Qwen3-Next), or train LoRA on a Qwen3.5 model.
    """
    family = run.model.family
    if run.is_training and run.preset.train.lora is not None and not family.bridge_lora:
        yield Issue(
            "train.lora",
            f"megatron-bridge does not support LoRA on {run.model.label}: its {family.label} PEFT "
            "recipe raises NotImplementedError.",
            f"Remove train.lora for full-parameter training of {family.label}, or train LoRA on a model "
            "megatron-bridge trains LoRA on.",
        )


@rule("TRN022", Severity.ERROR, "LoRA needs a base checkpoint (model.path)")
def lora_needs_base(run: Run) -> Iterator[Issue]:
    """
    What it checks: a training job with train.lora and no model.path.

    Why: LoRA trains adapters on a frozen base, so the base is the whole point, and gdnctl's LoRA checkpoints hold
    the adapters and their optimizer state but not the base (runtime/model/lora_checkpoint.py): a resume, and the
    smoke run's checkpoint round trip, load the base again from model.path and check it against the fingerprint
    the checkpoint recorded. Random weights could not be loaded again, and adapters on a random base learn
    nothing a later job can use.

    Source: gdnctl's runtime/model/lora_checkpoint.py (what a LoRA checkpoint holds) and runtime/train/trainer.py
    (the base is loaded from model.path before megatron-bridge's LoRA wraps it, as megatron-bridge's own finetune
    loads the pretrained checkpoint in its PEFT pre-wrap hook: training/setup.py _create_peft_pre_wrap_hook,
    0.6.2).

    Fix: set model.path to the base checkpoint's directory, or remove train.lora.
    """
    if run.is_training and run.preset.train.lora is not None and run.preset.model.path is None:
        yield Issue(
            "model.path",
            "train.lora trains adapters on a frozen base, and model.path is unset, so the base "
            "would be random weights that a resume cannot load again.",
            "Set model.path to the base checkpoint's directory, or remove train.lora.",
        )


@rule("TRN021", Severity.ERROR, "CUDA graphs asked for where they cannot be captured")
def cuda_graphs_cannot_capture(run: Run) -> Iterator[Issue]:
    """
    What it checks: `speed.cuda_graphs: on` in a preset whose run gdnctl cannot capture the layers' graphs for
    (plan/speed.py cuda_graphs_blocker, the same test `auto` makes).

    Why: the graphs are megatron-core's Transformer Engine graphs of each MoE layer's router and dispatch
    preprocessing (and, on rows without packed-sequence offsets, of each layer's attention or GDN block), captured
    after one eager step. Megatron-core stops the model build for a dense model ("moe cuda
    graph is only supported for MoE") and for full recompute ("full recompute is only supported with full
    iteration CUDA graph"); its TECudaGraphHelper needs Transformer Engine; a graph replays the shape it recorded,
    so packed rows of whole documents (a new length every step) stop at step 2; and the rl loop captures nothing.

    Source: megatron-core 0.19.2 megatron/core/transformer/transformer_config.py lines 2491-2525 (the asserts
    quoted), transformer/cuda_graphs.py line 2098 ("CUDA Graphs are not supported without TE."); gdnctl's
    runtime/train/cuda_graphs.py (check_row).

    Fix: set speed.cuda_graphs to auto (on wherever it can be captured) or off; for pretraining rows,
    train.packing: concat (full rows) or fill (packed rows) gives every row one length.
    """
    blocker = run.cuda_graphs_blocker
    if run.is_training and run.gpu.sm is not None and run.preset.speed.cuda_graphs == "on" and blocker is not None:
        yield Issue(
            "speed.cuda_graphs",
            f"speed.cuda_graphs is on, but the graphs cannot be captured here: {blocker}.",
            "Set speed.cuda_graphs: auto (on wherever it can be captured) or off.",
        )


@rule("TRN023", Severity.WARNING, "CUTLASS grouped GEMM asked for where Transformer Engine does not use it")
def cutlass_grouped_gemm_not_taken(run: Run) -> Iterator[Issue]:
    """
    What it checks: `speed.cutlass_grouped_gemm: on` in a preset whose experts Transformer Engine would not run
    through its CUTLASS grouped GEMM (plan/speed.py cutlass_grouped_gemm_blocker, the same test `auto` makes).

    Why: the option exports NVTE_USE_CUTLASS_GROUPED_GEMM=1, which Transformer Engine reads in
    nvte_multi_tensor_gemm. It takes CUTLASS only on SM90 (Hopper), from TE 2.8, for bf16/fp16 grouped GEMMs
    without a fused bias or GELU; anywhere else it runs cuBLAS as if the variable were unset. The job runs, but not
    what the preset says, and a speed comparison would credit an option that did nothing.

    Source: Transformer Engine 2.8 and later, transformer_engine/common/gemm/cublaslt_gemm.cu
    `nvte_multi_tensor_gemm` ("Currently only support cutlass group gemm on Hopper Arch", and the fallback to
    cuBLAS after its dtype and shape checks); docs/envvars.rst NVTE_USE_CUTLASS_GROUPED_GEMM.

    Fix: set speed.cutlass_grouped_gemm to auto (on wherever Transformer Engine takes it) or off.
    """
    blocker = run.cutlass_grouped_gemm_blocker
    if run.is_training and run.preset.speed.cutlass_grouped_gemm == "on" and blocker is not None:
        yield Issue(
            "speed.cutlass_grouped_gemm",
            f"speed.cutlass_grouped_gemm is on, but Transformer Engine would run cuBLAS here: {blocker}.",
            "Set speed.cutlass_grouped_gemm: auto (on wherever Transformer Engine takes it) or off.",
        )


@rule("TRN024", Severity.ERROR, "Shared expert LoRA adapters need one expert-parallel rank")
def lora_shared_expert_adapters_need_one_ep_rank(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.lora.expert_adapters: shared on the routed experts with parallel.ep > 1.

    Why: a shared adapter is one ParallelLinearAdapter per grouped expert linear, the same whole adapter on every
    expert-parallel rank, built from Megatron-Core linears with is_expert set. With ep > 1 Megatron-Core marks
    their weights allreduce=False (tensor_parallel/layers.py: `use_expert_pgs` when expert_model_parallel_size
    > 1), so they join the expert optimizer, whose gradient norm sums over the expert-parallel ranks and leaves out
    only parameters flagged `shared` or tensor-parallel duplicates (optimizer/__init__.py `is_expert_parallel =
    not getattr(param, 'allreduce', True)`, optimizer.py get_main_grads_for_grad_norm); megatron-bridge flags
    neither. Each EP rank's identical copy is counted: the logged gradient norm and the clipping (gdnctl clips
    at 1.0) change with parallel.ep. Before megatron-bridge 0.6.0 the copies are not even kept equal (no
    broadcast at build, no all-reduce of their gradients over the EP group), and with weight-gradient fusion
    through APEX the gradient megatron-bridge's hook all-reduces is a placeholder, so they drift apart again.
    With one expert-parallel rank none of this arises: the adapter is an ordinary dense parameter.

    Source: megatron-core 0.19 (NVIDIA/Megatron-LM core_v0.19.0) megatron/core/tensor_parallel/layers.py lines
    961-964 and 1017, optimizer/__init__.py line 348 and the expert optimizer (lines 1181-1215), optimizer.py
    lines 255-280, transformer/module.py param_is_not_shared; megatron-bridge megatron/bridge/peft/utils.py
    (v0.6.0 and 0.6.2 lines 1267-1322: _synchronize_shared_expert_parameters, _register_shared_expert_grad_sync_hooks
    with `weight.register_hook`; PR #5396, absent in v0.5.1).

    Fix: set train.lora.expert_adapters: per_expert (each expert's adapter lives on its own EP rank), or
    parallel.ep: 1.
    """
    spec = _routed_expert_lora(run)
    if spec is not None and run.lora_expert_adapters.value == "shared" and run.preset.parallel.ep > 1:
        yield Issue(
            "train.lora.expert_adapters",
            f"a shared expert adapter is the same on all {run.preset.parallel.ep} expert-parallel ranks, and "
            "Megatron-Core's expert optimizer counts every copy in the gradient norm, so clipping would change "
            "with parallel.ep.",
            "Set train.lora.expert_adapters: per_expert, or parallel.ep: 1.",
        )


@rule("TRN025", Severity.WARNING, "LoRA on the routed experts with expert tensor parallel")
def lora_experts_with_expert_tensor_parallel(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.lora with experts among its targets and parallel.etp > 1.

    Why: an expert's gate-and-up linear (linear_fc1) holds, on each expert-tensor-parallel rank, that rank's gate
    rows followed by its up rows, and so does its adapter's B. megatron-bridge splits a fused fc1 adapter B into
    the Hugging Face gate_proj and up_proj parts per rank where it de-interleaves dense linears, but for expert
    linears it splits as if there were one rank (`tp_size = 1 if is_expert`), both when it saves the adapter and
    when it merges it into the exported weights that the rollout and the last checkpoint get. With etp > 1 the
    gate and up rows of the ranks could land in the wrong halves. gdnctl has trained LoRA on experts with etp 1
    only.

    Source: megatron-bridge 0.6.2 megatron/bridge/models/conversion/peft_bridge.py
    `_split_fused_fc1_linear_out_weight` (lines 490-515) and its callers for experts (lines 1125 and 1246-1251).

    Fix: set parallel.etp: 1 (expert parallel, parallel.ep, splits the experts instead), or leave experts out of
    train.lora.targets.
    """
    if _routed_expert_lora(run) is not None and run.preset.parallel.etp > 1:
        yield Issue(
            "parallel.etp",
            f"parallel.etp is {run.preset.parallel.etp} with LoRA on the routed experts, and megatron-bridge "
            "splits an expert's gate-and-up adapter into gate and up as if expert tensor parallel were 1 when it "
            "saves and merges it; this layout has not run with gdnctl.",
            "Set parallel.etp: 1, or leave experts out of train.lora.targets.",
        )


@rule("TRN026", Severity.ERROR, "model.path inside train.save_dir")
def model_path_in_save_dir(run: Run) -> Iterator[Issue]:
    """
    What it checks: model.path is train.save_dir or a directory inside it (links followed, on the machine that
    validates), such as a checkpoint of an earlier run in that save dir (SAVE_DIR/iter_K).

    Why: the job's saves go to SAVE_DIR/iter_N, each file written under a temporary name and renamed over the one
    there, so the save at step K replaces the checkpoint the job started from (run with the CPU rl policy: a save
    onto model.path's directory replaced its model.safetensors, trainer_state.json and optimizer state). A resume
    reads model.path again (the rl job's KL reference, a LoRA run's base, the weights a run from it starts with),
    and would then take the job's own weights for the original's. The runtime refuses the
    same at start and before any save (runtime/model/checkpoint_layout.py check_source_outside_save_dir,
    refuse_overwriting_source), for a run dir rendered before this rule.

    Source: gdnctl's checkpoint writer (runtime/model/durable_files.py write_file: os.replace over the file at the
    name) and the readers of model.path on a resume (runtime/rl/policy/torch_policy.py, runtime/train/trainer.py).

    Fix: copy the checkpoint out of the save dir and point model.path at the copy, or give this run another
    train.save_dir. To continue the earlier run itself, resume its run dir (gdnctl resume RUN_DIR), which starts
    from save_dir/latest with its own model.path.
    """
    preset = run.preset
    source, saves = preset.model.path, preset.train.save_dir
    if not source or not saves:
        return
    source_path, saves_path = Path(os.path.realpath(source)), Path(os.path.realpath(saves))
    if source_path == saves_path or source_path.is_relative_to(saves_path):
        yield Issue(
            "model.path",
            f"model.path {source} is inside train.save_dir {saves}, where this job's saves would replace the "
            "checkpoint it starts from (and a resume, which reads model.path again, would take the job's own "
            "weights for it).",
            "Copy the checkpoint out of the save dir and point model.path at the copy, or give this run another "
            "train.save_dir; to continue the earlier run, `gdnctl resume` its run dir.",
        )
