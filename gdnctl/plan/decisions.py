"""Preset-level defaults: the only place a value the user left out is decided.

Each function takes the preset (and the GPU where the answer depends on it), never a resolved Run, so the Run
(`gdnctl.plan.run`) can be built from these decisions without an import circle. Each returns the value with
the reason for it, so `gdnctl explain` can show why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdnctl.knowledge import GDN_BACKENDS, GpuSpec, ModelArch, lora, stack, versions
from gdnctl.schema import Preset, RolloutSpec

# Where TileLang's compiled FlashQLA kernels go when launch.kernel_cache_dir is unset: one cache per user, shared
# by every run and filled once by `gdnctl prewarm` (on clusters, put it on a shared filesystem).
DEFAULT_KERNEL_CACHE = "~/.cache/gdnctl/tilelang"


def kernel_cache_env(kernel_cache_dir: str, *, rollout: bool = False) -> list[tuple[str, str, str]]:
    """The compiler caches the trainer fills on first use, all under the one kernel cache directory so that a job
    (or `gdnctl prewarm`) fills them once for every later job: (variable, value, what it holds). Measured on the
    35B-A3B proxy on an H100 (benchmarks/results/kernel-compile-prewarm-h100-2026-11-24.md): FLA's first call
    98.5 s cold, 1.7 s with a warm Triton cache; step 1 48.9 s cold, 14.5 s with warm Triton and inductor caches.
    With Triton's autotuning results cached as well (TRITON_CACHE_AUTOTUNING, Triton's own knob; 6 autotuning runs
    in the first process, 0 in the next), the proxy's step 1 went from 14.0 s to 9.6 s, torch.compile off. Without
    these variables Triton writes to ~/.triton/cache and inductor to /tmp/torchinductor_$USER, which a cluster
    job's node usually does not keep.

    With `rollout` (an rl job), vLLM's cache too: its engines compile the model with torch.compile unless
    rollout.enforce_eager, and keep what they compiled under VLLM_CACHE_ROOT/torch_compile_cache, in a folder named
    by the hash of the model, the config and vLLM's own code, with VLLM_CACHE_ROOT left out of that hash (vLLM
    0.26.0 vllm/compilation/backends.py:1068, vllm/envs.py:677 and :2112); its default is ~/.cache/vllm."""
    root = kernel_cache_dir.rstrip("/")
    rows = [
        ("TILELANG_CACHE_DIR", kernel_cache_dir, "FlashQLA's TileLang kernels (gdnctl prewarm fills it)"),
        (
            "TRITON_CACHE_DIR",
            f"{root}/triton",
            "FLA's Triton kernels (gdnctl prewarm fills it for kernels.gdn_backend: fla)",
        ),
        (
            "TRITON_CACHE_AUTOTUNING",
            "1",
            "Triton keeps autotuning results in triton/ too, so FLA's kernels are not re-benchmarked in every new "
            "process (4.4 s of the 35B-A3B proxy's step 1 on an H100)",
        ),
        (
            "TORCHINDUCTOR_CACHE_DIR",
            f"{root}/inductor",
            "torch.compile'd functions, with kernels.torch_compile (the first job fills it)",
        ),
    ]
    if rollout:
        rows.append(
            (
                "VLLM_CACHE_ROOT",
                f"{root}/vllm",
                "the rollout's vLLM: what its engines compiled, found again by the next engine with the same "
                "model and settings",
            )
        )
    return rows


@dataclass(frozen=True)
class Decision:
    value: Any
    reason: str


def layout(preset: Preset, software: dict[str, str | None]) -> Decision:
    requested = preset.train.layout
    if requested == "auto" and preset.cluster.gpu == "cpu":
        return Decision(
            "bshd",
            "on CPU the model is transformers' class, which trains padded rows (it takes no per-document offsets)",
        )
    if requested == "auto" and preset.parallel.cp == 1 and packing(preset, software).value == "concat":
        return Decision(
            "bshd",
            "packing concat: every row is seq_length tokens of one stream, so full rows need no padding and no "
            "per-document offsets (and without offsets attention and the GDN layers can be CUDA graphed)",
        )
    return _layout_of_documents(preset, software)


def _layout_of_documents(preset: Preset, software: dict[str, str | None]) -> Decision:
    """The layout where rows keep documents apart: packed wherever megatron-core's GDN takes packed sequences."""
    requested = preset.train.layout
    mcore = software.get("megatron_core")
    if requested != "auto":
        return Decision(requested, f"set in the preset (train.layout: {requested})")
    if versions.at_least(mcore, stack.MCORE_GDN_PACKED_AND_CP):
        return Decision(
            "thd",
            f"megatron-core {mcore} supports packed (THD) sequences in GDN "
            f"(since {stack.MCORE_GDN_PACKED_AND_CP}, PR #2645): no padding is computed",
        )
    return Decision(
        "bshd",
        f"megatron-core {mcore} GDN raises NotImplementedError on packed sequences "
        f"(THD needs >= {stack.MCORE_GDN_PACKED_AND_CP}), so sequences are padded (BSHD)",
    )


def packing(preset: Preset, software: dict[str, str | None]) -> Decision:
    """How documents become rows (runtime/data/pipeline.py): whole documents per packed row, packed rows filled by
    cutting documents at row ends, or one stream of concatenated documents cut into full rows.

    concat is what Megatron's GPT pretraining does unless told otherwise: its `--reset-attention-mask` and
    `--reset-position-ids` are off by default (Megatron-LM megatron/training/arguments.py, core 0.19.2, line 3154),
    so a sample is seq_length + 1 consecutive tokens of the document stream (megatron/core/datasets/gpt_dataset.py
    line 381) and attends across document ends; Megatron-Bridge's pretraining datasets set both False
    (megatron-bridge 0.6.2 recipes/utils/dataset_utils.py line 355)."""
    requested = preset.train.packing
    if requested != "auto":
        return Decision(requested, f"set in the preset (train.packing: {requested})")
    if preset.job == "pretrain":
        return Decision(
            "concat",
            "pretrain: documents joined end to end and cut into full rows of "
            f"{preset.train.seq_length} tokens, as Megatron's GPT pretraining does by default (attention resets "
            "at no document end): nothing is padding, and every step has one shape",
        )
    if _layout_of_documents(preset, software).value != "thd":
        return Decision("whole", "padded (BSHD) rows hold one document each")
    return Decision(
        "whole", f"{preset.job}: each document stays in one row (cut, a response would train without its prompt)"
    )


def one_row_shape(preset: Preset, software: dict[str, str | None]) -> bool:
    """Whether every training row has one shape: padded or full rows, or packed rows filled to their end
    (train.packing: fill or concat). Packed rows of whole documents change length every step."""
    return layout(preset, software).value != "thd" or packing(preset, software).value in ("fill", "concat")


def model_builder(software: dict[str, str | None]) -> Decision:
    """megatron-bridge's provider where the trainer has Transformer Engine, else gdnctl's TE-free spec."""
    te = software.get("transformer_engine")
    if te is None:
        return Decision(
            "te-free",
            "runtime.transformer_engine is none: gdnctl's TE-free Megatron-Core spec "
            "(no context parallel, no FP8, experts as one matmul each)",
        )
    return Decision(
        "megatron-bridge",
        f"Transformer Engine {te}: megatron-bridge "
        f"{software.get('megatron_bridge')}'s provider builds TE layers, TE attention "
        "and grouped-GEMM experts",
    )


def torch_compile(preset: Preset, software: dict[str, str | None], gpu: GpuSpec) -> Decision:
    """Whether the trainer runs Megatron-Core's torch.compile'd fused functions compiled or eagerly.

    Megatron-Core decorates its elementwise glue with torch.compile (megatron/core/jit.py `jit_fuser`, megatron-core
    0.19.2): the GDN output gate and norm, the g/beta gate, SwiGLU, the attention output gate. Eager, each is a chain
    of fp32 kernels. Profiled on the 35B-A3B proxy (one H200, megatron-bridge builder, filled rows;
    benchmarks/results/step-profile-h200-2026-11-26.md): elementwise kernels took 170 ms of GPU time a step eager and
    50 ms compiled; the step 0.821 s against 0.776 s without the router graphs, and within the noise with them (0.758 s
    eager, 0.766 s compiled); the peak 1.25 GiB lower either way; step 1 about 3 s longer. With the defaults on one
    H100 (FlashQLA, concatenated full rows, attention and GDN blocks graphed;
    benchmarks/results/startup-h100-2026-11-27.md): 0.686 s a step compiled against 0.768 s eager, the reserved peak
    53.81 GiB against 55.19 GiB, step 1 about 4 s longer (Dynamo's tracing of 14 graphs: the inductor cache spares only
    the code generation, and torch 2.11's caching precompile, which would spare the tracing, fails in AOTAutograd's
    cache). Megatron-Bridge's own loop compiles them too. auto stays where that was measured: one row shape every
    step (a new shape recompiles)."""
    requested = preset.kernels.torch_compile
    if requested != "auto":
        return Decision(bool(requested), f"set in the preset (kernels.torch_compile: {str(requested).lower()})")
    if gpu.sm is None:
        return Decision(False, "no GPU: nothing to compile for")
    if model_builder(software).value == "te-free":
        return Decision(
            False, "the TE-free builder (small models): compiling costs more than its fused functions save there"
        )
    if preset.job not in ("sft", "pretrain"):
        return Decision(False, f"{preset.job}: gdnctl has not measured compiled functions in this job")
    if not one_row_shape(preset, software):
        return Decision(
            False,
            "packed rows of whole documents change length every step, and a compiled function "
            "recompiles for new shapes (not measured)",
        )
    return Decision(
        True,
        "Megatron-Core's fused functions (GDN gate and norm, SwiGLU, attention output gate) run as "
        "a few compiled kernels instead of chains of fp32 ones: on the 35B-A3B proxy on an H100 the "
        "step 82 ms shorter (0.686 s against 0.768 s) and the reserved peak 1.38 GiB lower; step 1 about 4 s "
        "longer",
    )


# The widest head TE's cuDNN fused attention trained right on packed rows in gdnctl's check
# (runtime/model/core_attention.py: at 256 its THD backward was 15-19% off on an H100 with TE 2.20.2 and its cuDNN
# 9.14, NaN in dK/dV; the same kernel on full rows, SBHD, was within 0.3%).
TE_PACKED_ATTENTION_MAX_HEAD_DIM = 128


def attention(preset: Preset, model: ModelArch, software: dict[str, str | None]) -> Decision:
    """The full-attention layers' core attention: Transformer Engine's, or torch's SDPA and varlen FlashAttention.
    Rests on benchmarks/attention_check.py run on an H100 (benchmarks/results/packed-rows-nan-h100-2026-11-25.md)."""
    requested = preset.kernels.attention
    if model_builder(software).value == "te-free":
        return Decision(
            "torch", "the TE-free builder has only torch's attention (SDPA, varlen FlashAttention for packed rows)"
        )
    if requested != "auto":
        return Decision(requested, f"set in the preset (kernels.attention: {requested})")
    if preset.parallel.cp > 1:
        return Decision(
            "te",
            "parallel.cp > 1: only Transformer Engine's attention splits a sequence over the context-parallel ranks",
        )
    packed = layout(preset, software).value == "thd"
    if packed and model.head_dim > TE_PACKED_ATTENTION_MAX_HEAD_DIM:
        return Decision(
            "torch",
            f"packed rows at head_dim {model.head_dim}: Transformer Engine's cuDNN fused "
            "attention computes wrong gradients there on an H100 (dQ 15-19% off fp32, NaN "
            "dK/dV; TE 2.20.2, cuDNN 9.14); torch's varlen FlashAttention is within 0.3% "
            "(benchmarks/attention_check.py)",
        )
    return Decision(
        "te",
        "Transformer Engine's fused attention"
        + (f" (full rows at head_dim {model.head_dim}: within 0.3% of fp32 on an H100)" if not packed else ""),
    )


def sequence_parallel(preset: Preset) -> Decision:
    chosen = preset.parallel.sequence_parallel
    if chosen is not None:
        return Decision(chosen, "set in the preset (parallel.sequence_parallel)")
    if preset.parallel.tp > 1:
        return Decision(
            True, "tp > 1: sequence parallel shards norm/dropout activations over TP, and MoE with TP requires it"
        )
    return Decision(False, "tp == 1: sequence parallel has nothing to shard")


def rollout_gpus(preset: Preset, total_gpus: int) -> Decision:
    rollout = preset.rollout
    if preset.job != "rl" or rollout is None:
        return Decision(0, "no rollout: the job is not rl")
    if rollout.num_gpus is not None:
        return Decision(rollout.num_gpus, "set in the preset (rollout.num_gpus)")
    if rollout.colocate:
        return Decision(total_gpus, "colocated: vLLM uses every GPU and sleeps while the trainer steps")
    return Decision(total_gpus // 2, "not colocated and rollout.num_gpus unset: half of the GPUs")


def rollout_engines(preset: Preset, total_gpus: int) -> Decision:
    """How many vLLM engines the rollout runs: its GPUs in groups of rollout.tp, each engine generating its share
    of a step's prompts and loading every weight sync (runtime/rl/rollout/engine_layout.py)."""
    rollout = preset.rollout
    if preset.job != "rl" or rollout is None:
        return Decision(0, "no rollout: the job is not rl")
    gpus = rollout_gpus(preset, total_gpus).value
    count = max(gpus // rollout.tp, 1)
    driver = (
        "the first trainer rank of each engine's node drives it"
        if rollout.colocate
        else "trainer rank 0 drives every engine"
    )
    return Decision(
        count,
        f"rollout_gpus / rollout.tp = {gpus} / {rollout.tp}: each engine samples its share of "
        f"a step's prompts and loads every weight sync; {driver}",
    )


def train_world_size(preset: Preset, total_gpus: int) -> Decision:
    rollout = preset.rollout
    if preset.job == "rl" and rollout is not None and not rollout.colocate:
        used = rollout_gpus(preset, total_gpus).value
        return Decision(total_gpus - used, f"{total_gpus} GPUs minus {used} for the separate rollout")
    return Decision(total_gpus, f"nodes x gpus_per_node = {total_gpus}")


def weight_export(preset: Preset, software: dict[str, str | None], gpu: GpuSpec) -> Decision:
    """What writes the HF weights the rollout loads after every step: the policy exports through its model's
    builder (runtime/rl/policy/megatron_policy.py, runtime/model/builders.py; runtime/rl/policy/torch_policy.py on
    CPU)."""
    if preset.job != "rl":
        return Decision(None, "no rollout: the job is not rl")
    if gpu.sm is None:
        return Decision(
            "transformers' state dict",
            "device cpu: the policy is transformers' Qwen3.5 class, whose own state dict holds the HF names",
        )
    if model_builder(software).value == "te-free":
        return Decision(
            "gdnctl's HF name rules",
            "runtime.transformer_engine is none: the TE-free model is exported "
            "through gdnctl's own HF name rules (runtime/model/hf_weights.py)",
        )
    return Decision(
        "megatron-bridge export_hf_weights",
        "the megatron-bridge builder's model: megatron-bridge converts it to HF names (runtime/model/bridge.py)",
    )


def rollout_weight_transport(preset: Preset, gpu: GpuSpec, software: dict[str, str | None]) -> Decision:
    """How the trainer's weights reach the rollout after every step: "cuda_ipc" (runtime/rl/weights/cuda_ipc.py: every
    trainer rank shares its GPU's copy of the HF tensors in buckets, the vLLM worker on that GPU loads them),
    "broadcast" (runtime/rl/weights/broadcast.py: trainer rank 0 broadcasts the buckets to every vLLM worker over a
    process group, NCCL on GPUs, gloo on CPU) or "disk" (the safetensors directory vLLM reloads from). The
    reason of a "disk" the preset did not ask for is what RLT014 quotes when the preset asks for an in-memory
    transport where it cannot run."""
    rollout = preset.rollout
    if preset.job != "rl" or rollout is None:
        return Decision(None, "no rollout: the job is not rl")
    requested = rollout.weight_sync
    if requested == "disk":
        return Decision("disk", "set in the preset (rollout.weight_sync: disk)")
    transport = requested if requested != "auto" else _in_memory_transport(rollout, gpu)
    if transport is None:
        return Decision(
            "disk",
            "no GPU: vLLM's CPU build reloads from the safetensors directory (rollout."
            "weight_sync: broadcast sends the weights over gloo instead)",
        )
    blocker = _in_memory_blocker(transport, preset, rollout, gpu, software)
    if blocker is not None:
        return Decision("disk", blocker)
    why = _IN_MEMORY_WHY[transport]
    return Decision(transport, why if requested == "auto" else f"set in the preset; {why}")


_IN_MEMORY_WHY = {
    "cuda_ipc": "colocated on GPUs: each trainer rank shares its GPU's copy of the HF weights with the vLLM worker "
    "on that GPU, bucket by bucket, with no copy through host memory or the disk",
    "broadcast": "trainer rank 0 broadcasts the HF weights to every vLLM worker over a process group of their own "
    "(NCCL on GPUs, gloo on CPU), bucket by bucket, with no copy through the disk",
}


def _in_memory_transport(rollout: RolloutSpec, gpu: GpuSpec) -> str | None:
    """What `rollout.weight_sync: auto` picks before the blockers: CUDA IPC on the shared GPUs of a colocated
    rollout, a broadcast to the GPUs of a separate one, and the directory on CPU (the tests' default there)."""
    if gpu.sm is None:
        return None
    return "cuda_ipc" if rollout.colocate else "broadcast"


def _in_memory_blocker(
    transport: str, preset: Preset, rollout: RolloutSpec, gpu: GpuSpec, software: dict[str, str | None]
) -> str | None:
    """Why `transport` cannot serve this run (its rollout section `rollout`), or None when it can."""
    p = preset.parallel
    if transport == "cuda_ipc":
        if gpu.sm is None:
            return "no GPU: vLLM's CPU build reloads from the safetensors directory"
        if not rollout.colocate:
            return (
                "separate placement (rollout.colocate: false): CUDA IPC shares memory within a GPU; "
                "rollout.weight_sync: broadcast reaches separate rollout GPUs"
            )
    elif gpu.sm is not None and rollout.colocate:
        # ProcessGroupNCCL refuses a communicator with two ranks on one device ("Duplicate GPU detected").
        return (
            "colocated on GPUs: the vLLM workers share the trainer's GPUs, and NCCL refuses two ranks of one "
            "group on one GPU; rollout.weight_sync: cuda_ipc serves colocated runs"
        )
    elif rollout.colocate and preset.cluster.nodes > 1:
        # runtime/rl/rollout/engine_layout.py: each node's first rank drives its node's engines; rank 0 sends the
        # buckets.
        return (
            "colocated engines on several nodes: each node's first trainer rank drives its node's engines, and "
            "trainer rank 0 can broadcast only to the engines it drives; the directory in the run dir reaches "
            "them all"
        )
    if model_builder(software).value == "te-free" and (p.pp > 1 or p.ep > 1):
        return (
            "the TE-free builder gathers HF tensors over tensor parallel only, so with pp or ep > 1 no rank "
            "holds every weight to send; the directory in the run dir carries them"
        )
    return None


def rollout_class(preset: Preset, model, software: dict[str, str | None]) -> Decision:
    """The HF class the rollout's vLLM serves: Qwen3.5's text-only class from vLLM 0.27, before that the
    vision-language class with its vision tower skipped (vLLM builds no tower when every modality's
    limit_mm_per_prompt is 0: `_mark_tower_model` in vllm/model_executor/models/interfaces.py, 0.26.0)."""
    vllm = software.get("vllm")
    family = model.family
    since = family.vllm_text_class_since
    if preset.job == "rl" and preset.train.images is not None and family.vision_language_class is not None:
        # The engine config's vision_language_class stays false: the runtime serves image prompts from
        # train.images (rollout/server.py engine_kwargs, checkpoint.rollout_source).
        return Decision(
            "vision-language with its tower",
            f"image prompts: vLLM serves {family.vision_language_class} with its vision tower, at most "
            f"{preset.train.images.max_per_sample} image(s) a prompt (limit_mm_per_prompt, no videos), and every "
            "sync sends the tower with the language model and checks it by checksum (docs/images.md)",
        )
    if preset.job != "rl" or since is None or not versions.below(vllm, since):
        return Decision(
            "text",
            "the text-only class" + ("" if since is None else f" (vLLM {vllm} registers {family.text_class})"),
        )
    return Decision(
        "vision-language",
        f"vLLM {vllm} registers only the vision-language {family.label} classes (the "
        f"text-only ones arrive in {since}): the weight sync "
        "names the language model as that class does and the engine builds no "
        "vision tower (limit_mm_per_prompt 0 for images and videos)",
    )


def cuda_device_max_connections(preset: Preset, gpu: GpuSpec) -> Decision:
    p = preset.parallel
    if gpu.sm is None:
        return Decision(None, "no GPU")
    if gpu.is_blackwell:
        return Decision("32", "Blackwell: Megatron-Bridge's performance overrides use 32")
    if p.tp > 1 or p.cp > 1:
        return Decision("1", "TP or CP > 1 without comm overlap: Megatron needs kernels queued in issue order")
    return Decision(None, "TP == CP == 1: no ordering constraint, leave the driver default")


def environment(preset: Preset, gpu: GpuSpec) -> list[tuple[str, str, str]]:
    """(name, value, reason) for every variable the runtime needs, before the user's own `launch.env`."""
    env: list[tuple[str, str, str]] = []
    connections = cuda_device_max_connections(preset, gpu)
    if connections.value is not None:
        env.append(("CUDA_DEVICE_MAX_CONNECTIONS", connections.value, connections.reason))
    if gpu.sm is not None:
        env.append(
            (
                "PYTORCH_CUDA_ALLOC_CONF",
                "expandable_segments:True",
                "fewer fragmentation OOMs with variable-length (packed) batches",
            )
        )
        env.append(
            (
                "NCCL_GRAPH_REGISTER",
                "0",
                "NCCL must not register CUDA-graph memory from expandable segments (illegal memory access; "
                "megatron-core 0.19.2 transformer/cuda_graphs.py TECudaGraphHelper refuses the pair)",
            )
        )
        env.append(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "a failed collective ends the job instead of hanging"))
    backend = GDN_BACKENDS[preset.kernels.gdn_backend]
    env += [(name, value, backend.environment_reason) for name, value in backend.environment.items()]
    env.append(
        (
            "OMP_NUM_THREADS",
            "1" if gpu.sm is not None else "2",
            "one CPU thread per rank unless told otherwise (torchrun would warn)",
        )
    )
    return env


# The default warmup: a tenth of the run, capped where a long run's warmup would only waste steps at a low lr.
DEFAULT_WARMUP_FRACTION = 10
MAX_DEFAULT_WARMUP_STEPS = 1_000


def lr_schedule(preset: Preset) -> dict[str, Decision]:
    """The lr schedule (runtime/train/lr_schedule.py): warmup steps, decay shape and the lr it decays to."""
    t = preset.train
    if t.lr_warmup_steps is not None:
        warmup = Decision(t.lr_warmup_steps, "set in the preset (train.lr_warmup_steps)")
    else:
        steps = max(1, min(t.train_iters // DEFAULT_WARMUP_FRACTION, MAX_DEFAULT_WARMUP_STEPS))
        warmup = Decision(
            steps,
            f"a tenth of train_iters {t.train_iters} (at least 1, at most "
            f"{MAX_DEFAULT_WARMUP_STEPS:,}): Adam's first updates, before its second-moment "
            "estimate settles, are the ones a full lr makes too large",
        )
    if t.lr_decay is not None:
        decay = Decision(t.lr_decay, "set in the preset (train.lr_decay)")
    elif preset.job == "rl":
        decay = Decision(
            "constant",
            "rl: the policy keeps learning from fresh rollouts at one lr after the warmup "
            "(verl's and slime's default schedule)",
        )
    else:
        decay = Decision("cosine", f"{preset.job}: cosine decay to min_lr over the run (Megatron-Bridge's recipes)")
    if decay.value == "constant":
        min_lr = Decision(t.lr, "no decay: the lr stays at train.lr after the warmup")
    elif t.min_lr is not None:
        min_lr = Decision(t.min_lr, "set in the preset (train.min_lr)")
    else:
        min_lr = Decision(t.lr / 10, "a tenth of train.lr (Megatron-Bridge's recipes decay to lr / 10)")
    return {"warmup_steps": warmup, "decay": decay, "min_lr": min_lr}


def lora_expert_adapters(preset: Preset) -> Decision:
    """One LoRA adapter for all of a layer's routed experts ("shared") or one for each ("per_expert").

    megatron-bridge 0.6.2's per-expert adapter (GroupedExpertLinearAdapter, megatron/bridge/peft/utils.py) reads
    each grouped linear's tokens per expert to the host (`expert_splits.tolist()`, a device synchronisation) and
    loops over the experts in Python, for the gate-and-up and the down projection of every MoE layer, forward and
    backward; the shared one is a single ParallelLinearAdapter. On the 35B-A3B proxy (one H100, rank 32,
    benchmarks/results/lora-h100-2026-11-27.md) the step took 0.551 s shared, 1.074 s per expert and
    0.667 s fine-tuning every weight, with the same losses to four digits over 8 steps. With expert parallel a
    shared adapter is refused (TRN024: Megatron-Core's expert optimizer would count every EP rank's copy in the
    gradient norm), so auto keeps one per expert there."""
    spec = preset.train.lora
    if spec is None:
        return Decision(None, "no train.lora")
    if spec.expert_adapters != "auto":
        return Decision(spec.expert_adapters, f"set in the preset (train.lora.expert_adapters: {spec.expert_adapters})")
    if preset.parallel.ep > 1:
        return Decision(
            "per_expert",
            f"parallel.ep is {preset.parallel.ep}: each expert's adapter lives on its expert's rank, where a shared "
            "one would be a copy on every rank that Megatron-Core's expert optimizer counts in the gradient norm "
            "each time (TRN024)",
        )
    return Decision(
        "shared",
        "one adapter for all of a layer's routed experts, megatron-bridge's own default: megatron-bridge's "
        "per-expert adapters synchronise with the host and loop over the experts in every grouped linear (on "
        "the 35B-A3B proxy, one H100, rank 32: 0.551 s a step shared, 1.074 s per expert, 0.667 s full "
        "fine-tuning)",
    )


def lora_targets(preset: Preset, model: ModelArch) -> Decision:
    """The linears train.lora adapts: the preset's targets, or megatron-bridge's Qwen3.5 LoRA recipes' coverage
    that this model has (knowledge/lora.py DEFAULT_TARGETS, read in megatron-bridge 0.6.2)."""
    spec = preset.train.lora
    if spec is None:
        return Decision((), "no train.lora: every parameter trains")
    if spec.targets is not None:
        return Decision(tuple(spec.targets), "set in the preset (train.lora.targets)")
    return Decision(
        lora.default_targets(model),
        "megatron-bridge's Qwen3.5 LoRA recipes' coverage (LoRA()'s "
        "linear_qkv, linear_proj, linear_fc1, linear_fc2: every linear but "
        "the GDN layers') that this model has",
    )


# The default save interval: a tenth of the run, so a failure late in a run loses at most a tenth of it.
DEFAULT_SAVES_PER_RUN = 10


def save_interval(preset: Preset) -> Decision:
    """How often a training job saves a resumable checkpoint into train.save_dir (runtime/train/trainer.py,
    runtime/rl/job.py); the last step always saves."""
    t = preset.train
    if t.save_dir is None:
        return Decision(t.save_interval, "no train.save_dir: the job saves nothing")
    if t.save_interval is not None:
        return Decision(t.save_interval, "set in the preset (train.save_interval)")
    steps = max(1, -(-t.train_iters // DEFAULT_SAVES_PER_RUN))
    return Decision(
        steps,
        f"a tenth of train_iters {t.train_iters}, rounded up: a job that fails loses at most that many steps "
        "(it resumes from the last checkpoint), and saving takes ten checkpoints' time per run",
    )


def rl_rows(preset: Preset) -> Decision:
    """What an rl job trains on: each sample is one padded row (runtime/rl/algorithm/batch.py build_batch), whatever
    train.layout and train.packing say (those shape sft and pretrain data)."""
    if preset.job != "rl":
        return Decision(None, "not rl")
    return Decision(
        "padded rows (bshd)",
        "each rollout sample is one row, its prompt and response right-padded to the micro-batch's longest row "
        "(runtime/rl/algorithm/batch.py), so the rows change length every step; train.layout and train.packing "
        "shape sft and pretrain documents and are not read here",
    )


def importance_weight(preset: Preset) -> Decision:
    """Whether each token's loss is weighted by the trainer's probability over the engine's (truncated importance
    sampling, runtime/rl/algorithm/grpo.py policy_loss with tis_cap): the preset's rollout_correction, and always
    off-policy, where it is the decoupled objective's behaviour correction."""
    g, rollout = preset.grpo, preset.rollout
    cap = g.rollout_correction_cap
    if rollout is not None and (rollout.max_staleness > 0 or rollout.partial):
        why = f"rollout.max_staleness {rollout.max_staleness}" if rollout.max_staleness else "rollout.partial"
        return Decision(
            True,
            f"{why}: the decoupled objective (AReaL's): the PPO ratio is against the policy's own log-probs at the "
            f"start of the update (the proximal policy) and each token's loss is weighted by min(p_proximal / "
            f"p_engine, {cap:g}), the engine's log-probs being those of the older weights that sampled it",
        )
    if g.rollout_correction:
        return Decision(
            True,
            f"truncated importance sampling: each token's loss is weighted by min(p_trainer / p_rollout, {cap:g}), "
            "the trainer's probability of the sampled token over vLLM's, so the gap between the two engines' "
            "numerics does not bias the update (slime's --use-tis, verl's rollout importance sampling)",
        )
    return Decision(
        False,
        "grpo.rollout_correction is false and the loop is on-policy: the loss takes the rollout's samples as "
        "drawn from the trainer's policy",
    )


def engine_restarts(preset: Preset) -> Decision:
    """How many times the job restarts a rollout engine that died or stopped making progress
    (runtime/rl/rollout/stream.py): the preset's bound where trainer rank 0 spawned and drives every engine."""
    rollout = preset.rollout
    if preset.job != "rl" or rollout is None:
        return Decision(0, "no rollout: the job is not rl")
    if not rollout.colocate and preset.launch.executor == "slurm":
        return Decision(
            0,
            "the Slurm script's rollout step starts the engines on nodes of their own, and the trainer cannot start "
            "one there again: an engine that fails ends the step and the job (a requeue resumes it)",
        )
    if rollout.colocate and preset.cluster.nodes > 1:
        return Decision(
            0,
            "colocated engines on several nodes are driven by each node's first trainer rank, which waits for "
            "its engines inside the rollout's collective: an engine that fails ends the job (it resumes from the "
            "last checkpoint)",
        )
    if rollout.max_engine_restarts == 0:
        return Decision(0, "set in the preset (rollout.max_engine_restarts: 0): the first failure ends the job")
    return Decision(
        rollout.max_engine_restarts,
        f"rollout.max_engine_restarts: an engine that exits, or has requests in flight and produces no token for "
        f"rollout.stall_timeout_s {rollout.stall_timeout_s:g} s, is stopped and started again on the current "
        "weights, its requests sent again, up to this many times over the job",
    )
