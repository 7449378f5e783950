"""vLLM rollout for rl jobs: prefill backend flag, model class support, head split, GPUs, environments."""

from __future__ import annotations

from collections.abc import Iterator

from gdnctl.knowledge import stack, versions
from gdnctl.plan import Run
from gdnctl.schema import RolloutSpec
from gdnctl.validate.findings import Issue, Severity, rule


def _rollout(run: Run) -> RolloutSpec | None:
    return run.preset.rollout if run.preset.job == "rl" else None


@rule("RLT001", Severity.ERROR, "rl job without a rollout section")
def rl_needs_rollout(run: Run) -> Iterator[Issue]:
    """
    What it checks: job: rl has a `rollout:` section.

    Why: the rl job alternates vLLM rollouts and training steps; it needs the rollout engine's settings.

    Source: gdnctl's rl job: runtime/rl/job.py starts vLLM from the rollout section (runtime/rl/rollout/server.py
    engine_kwargs).

    Fix: add `rollout: {engine: vllm, tp: ..., gdn_prefill_backend: triton}`.
    """
    if run.preset.job == "rl" and run.preset.rollout is None:
        yield Issue(
            "rollout",
            "job rl needs a rollout: section.",
            "Add rollout: {engine: vllm, tp: 1, gdn_prefill_backend: triton}.",
        )


@rule("RLT002", Severity.WARNING, "rollout section on a job that does not roll out")
def rollout_ignored(run: Run) -> Iterator[Issue]:
    """
    What it checks: a `rollout:` section on sft, pretrain or selftest jobs.

    Why: only rl jobs start vLLM; the section would be ignored silently.

    Source: gdnctl's runtime: only the rl job (runtime/rl/job.py) starts vLLM.

    Fix: remove the rollout section, or set job: rl.
    """
    if run.preset.job != "rl" and run.preset.rollout is not None:
        yield Issue(
            "rollout",
            f"job {run.preset.job} does not roll out, so rollout: is ignored.",
            "Remove the rollout: section, or set job: rl.",
        )


@rule("RLT003", Severity.ERROR, "gdn_prefill_backend not available in this vLLM")
def prefill_backend_supported(run: Run) -> Iterator[Issue]:
    """
    What it checks: rollout.gdn_prefill_backend is accepted by runtime.vllm: vLLM < 0.18 has no
    `--gdn-prefill-backend` flag; 0.18-0.21 accept flashinfer and triton; 0.22 adds cutedsl; 0.32 adds
    aiter_flydsl; 0.33 adds sycl. `auto` (or null) emits no flag (vLLM's engine args by release).

    Why: vLLM rejects an unknown flag or choice at start-up, after the trainer has loaded.

    Source: vLLM's `--gdn-prefill-backend` choices by release (docs/sources.md "vLLM GDN prefill backend";
    gdnctl/knowledge/stack.py VLLM_GDN_PREFILL_BACKENDS_SINCE).

    Fix: pick a backend the version offers (triton everywhere since 0.18), or null.
    """
    rollout = _rollout(run)
    if rollout is None or rollout.gdn_prefill_backend in (None, "auto"):
        return
    vllm = run.stack.get("vllm")
    if vllm is None:
        return
    if versions.below(vllm, stack.VLLM_GDN_PREFILL_FLAG):
        yield Issue(
            "rollout.gdn_prefill_backend",
            f"vLLM {vllm} has no --gdn-prefill-backend flag (added in {stack.VLLM_GDN_PREFILL_FLAG}).",
            "Set rollout.gdn_prefill_backend: null, or upgrade vLLM.",
        )
        return
    offered = stack.vllm_gdn_prefill_backends(vllm)
    if rollout.gdn_prefill_backend not in offered:
        yield Issue(
            "rollout.gdn_prefill_backend",
            f"vLLM {vllm} offers --gdn-prefill-backend {{{', '.join(offered)}}}, not '{rollout.gdn_prefill_backend}'.",
            "Use triton (available since 0.18), or null for vLLM's default.",
        )


@rule("RLT004", Severity.WARNING, "FlashInfer GDN prefill on Hopper can hang")
def prefill_hang_sm90(run: Run) -> Iterator[Issue]:
    """
    What it checks: on SM90 GPUs, rollout.gdn_prefill_backend left to vLLM's default (null/auto, which
    picks FlashInfer on SM90) or set to flashinfer, by runtime.vllm: a warning for vLLM 0.18-0.25, an info
    from vLLM 0.26 on.

    Why: FlashInfer's GDN prefill has hang reports on Hopper (flashinfer #2623, #3329, #3986; vllm #38916
    TimeoutError, #41865 JIT multi-worker deadlock); the workaround is `--gdn-prefill-backend triton`. AReaL
    PR #1384 exposes the flag for this reason. Those reports ran FlashInfer's old SM90 kernel: vLLM <= 0.25
    pins flashinfer-python <= 0.6.13 (#3986 saw the hang on vLLM 0.21.0 and 0.25.0). flashinfer 0.6.14 replaced
    that kernel with a CuTe-DSL one (flashinfer PR #3477), on which #3329's reproducer no longer hangs, and
    vLLM 0.26.0 is the first release to pin it; no hang report on it was found, but none says the high-
    concurrency hang of #3986 is gone either, so newer releases still get an info. vllm #53787 (a long-prefill
    slowdown on nightly builds after v0.28.0, with the Triton backend too) is in no release and has no rule.

    Source: flashinfer #2623, #3329 (maintainer: no longer reproduces after PR #3477), #3986, PR #3477 (first in
    v0.6.14); vllm #38916, #41865; AReaL PR #1384; vLLM 0.25.1 and 0.26.0 wheel metadata (flashinfer-python
    ==0.6.13, ==0.6.14).

    Fix: set rollout.gdn_prefill_backend: triton.
    """
    rollout = _rollout(run)
    if rollout is None or not run.gpu.is_hopper:
        return
    backend = rollout.gdn_prefill_backend or "auto"
    vllm = run.stack.get("vllm")
    if backend in stack.VLLM_SM90_HANGING_PREFILL and versions.at_least(vllm, stack.VLLM_GDN_PREFILL_FLAG):
        if versions.below(vllm, stack.VLLM_FLASHINFER_CUTEDSL_SM90):
            yield Issue(
                "rollout.gdn_prefill_backend",
                f"GDN prefill backend {backend} uses FlashInfer's SM90 "
                f"kernel on {run.gpu.sm_label}, which hangs in reports "
                f"against vLLM {vllm}'s FlashInfer (flashinfer #2623, #3329, "
                "#3986; vllm #38916, #41865).",
                "Set rollout.gdn_prefill_backend: triton.",
            )
        else:
            yield Issue(
                "rollout.gdn_prefill_backend",
                f"GDN prefill backend {backend} uses FlashInfer on "
                f"{run.gpu.sm_label}; vLLM {vllm} ships the rewritten SM90 "
                "kernel (flashinfer PR #3477), but hang reports against the "
                "old one (flashinfer #3986) were never shown fixed.",
                "Set rollout.gdn_prefill_backend: triton to be safe.",
                Severity.INFO,
            )


@rule("RLT015", Severity.WARNING, "Qwen3.5 through vLLM's vision-language class, before the vLLM gdnctl ran it on")
def vision_language_rollout(run: Run) -> Iterator[Issue]:
    """
    What it checks: an rl job on a Qwen3.5 model, its prompts text only, whose rollout vLLM is older than the first
    release gdnctl has served Qwen3.5 on through the vision-language class (0.26.0). (With image prompts the engine
    builds the tower and the sync sends it: docs/images.md.)

    Why: vLLM before 0.27 registers Qwen3.5 only as `Qwen3_5ForConditionalGeneration` (and its MoE sibling).
    gdnctl's rollout then serves that class: the weight sync names the language model as its checkpoints do
    (model.language_model.*), and the engine starts with limit_mm_per_prompt 0 for images and videos, so vLLM
    builds no vision tower and expects no vision weights (`_mark_tower_model`,
    vllm/model_executor/models/interfaces.py). gdnctl's tests ran this on vLLM 0.26.0 on an H100 and on the
    CPU build 0.32; older releases may build the tower, or lack the class.

    Source: vllm/model_executor/models/qwen3_5.py and interfaces.py (vLLM 0.26.0); runs:
    tests/gpu/test_rl_vllm_gpu.py on an H100 (benchmarks/results/rl-gpu-vllm-2026-11-24.md).

    Fix: use vLLM >= 0.26 in the rollout's environment (rollout.python), and say so in runtime.vllm.
    """
    rollout = _rollout(run)
    vllm = run.stack.get("vllm")
    family = run.model.family
    checked = family.vllm_vision_language_checked
    text_only = run.preset.train.images is None
    if rollout and text_only and checked is not None and versions.below(vllm, checked):
        yield Issue(
            "runtime.vllm",
            f"vLLM {vllm} would serve {family.label} through its vision-language class, which "
            f"gdnctl has run only from vLLM {checked} on.",
            f"Use vLLM >= {checked} in the rollout's environment and set runtime.vllm to its version.",
        )


@rule("RLT006", Severity.ERROR, "Rollout TP divides the attention and GDN heads")
def rollout_tp_heads(run: Run) -> Iterator[Issue]:
    """
    What it checks: rollout.tp divides the attention heads and the GDN key and value heads.

    Why: vLLM shards heads over its tensor-parallel ranks (it can replicate KV heads, not GDN heads).

    Source: vLLM's tensor-parallel head split (the component that would refuse); no upstream file is cited for it.

    Fix: choose a rollout.tp that divides all three head counts.
    """
    rollout = _rollout(run)
    if rollout is None:
        return
    m = run.model
    counts = {
        "attention heads": m.num_attention_heads,
        "GDN key heads": m.linear_num_key_heads,
        "GDN value heads": m.linear_num_value_heads,
    }
    bad = [f"{n} {name}" for name, n in counts.items() if n % rollout.tp]
    if bad:
        yield Issue(
            "rollout.tp",
            f"rollout tp={rollout.tp} does not divide the {', '.join(bad)} of {m.label}.",
            "Use a rollout.tp that divides every head count (1, 2, 4 or 8 for Qwen3.5).",
        )


@rule("RLT007", Severity.ERROR, "Trainer and rollout GPUs fit the cluster")
def rollout_gpus_fit(run: Run) -> Iterator[Issue]:
    """
    What it checks: rollout GPUs are a whole number of rollout.tp engines and fit the cluster: all GPUs
    at most when colocated; fewer than all when separate, so the trainer keeps some. An engine fits one node:
    rollout.tp divides cluster.gpus_per_node.

    Why: engines are tp GPUs each; a separate rollout takes its GPUs away from the trainer. gdnctl starts each
    engine as one vLLM process on one node (runtime/rl/rollout/engine_layout.py), with no Ray cluster to span nodes, so
    an engine never straddles two.

    Source: gdnctl's own GPU arithmetic (engines of rollout.tp GPUs; the trainer's world size as in PAR001) and
    its engine placement (runtime/rl/rollout/engine_layout.py).

    Fix: adjust rollout.num_gpus, rollout.tp or rollout.colocate.
    """
    rollout = _rollout(run)
    if rollout is None:
        return
    per_node = run.preset.cluster.gpus_per_node
    if per_node % rollout.tp:
        yield Issue(
            "rollout.tp",
            f"a rollout engine of tp={rollout.tp} GPUs does not fit the nodes' {per_node} "
            "GPUs a whole number of times; gdnctl runs each engine within one node.",
            f"Use a rollout.tp that divides cluster.gpus_per_node ({per_node}).",
        )
    gpus = run.rollout_gpus.value
    if gpus % rollout.tp:
        yield Issue(
            "rollout.num_gpus",
            f"{gpus} rollout GPUs is not a whole number of tp={rollout.tp} engines.",
            f"Use a multiple of {rollout.tp} rollout GPUs.",
        )
    if gpus > run.total_gpus or (not rollout.colocate and gpus >= run.total_gpus):
        mode = "colocated" if rollout.colocate else "separate"
        beside = "" if rollout.colocate else " with a trainer beside it"
        yield Issue(
            "rollout.num_gpus",
            f"a {mode} rollout of {gpus} GPUs does not fit the cluster's {run.total_gpus} GPUs{beside}.",
            "Lower rollout.num_gpus, or add nodes.",
        )


@rule("RLT008", Severity.ERROR, "Trainer and rollout cannot share one Python environment")
def separate_environments(run: Run) -> Iterator[Issue]:
    """
    What it checks: when the trainer stack (megatron-bridge) and the rollout stack (vLLM) pin incompatible
    dependencies, the rollout names its own environment (rollout.python or rollout.container_image).

    Why: megatron-bridge 0.6.2 pins transformers <= 5.12.1 and flashinfer-python == 0.6.8.post1, while
    vLLM 0.33.0 pins transformers >= 5.16.1, flashinfer-python == 0.7.2.post1 and torch == 2.14.0
    (their release metadata): one environment cannot satisfy both.

    Source: megatron-bridge 0.6.2 and vLLM 0.33.0 release metadata (docs/sources.md "Megatron-Bridge";
    gdnctl/knowledge/stack.py KNOWN_PINS); verl-project/verl #5937 (upgrading transformers for the trainer broke
    vLLM, as TRN003 says).

    Fix: set rollout.python to the interpreter of a separate vLLM environment (or rollout.container_image).
    """
    rollout = _rollout(run)
    if rollout is None or rollout.python or rollout.container_image:
        return
    trainer = stack.KNOWN_PINS.get(("megatron_bridge", run.stack.get("megatron_bridge") or ""))
    server = stack.KNOWN_PINS.get(("vllm", run.stack.get("vllm") or ""))
    if trainer is None or server is None:
        return
    conflicts = stack.pin_conflicts(trainer, server)
    if conflicts:
        yield Issue(
            "rollout.python",
            "the trainer and vLLM need different packages: " + "; ".join(conflicts) + ".",
            "Install vLLM in its own environment and set rollout.python to its interpreter "
            "(or rollout.container_image).",
        )


@rule("RLT009", Severity.ERROR, "A separate rollout on several nodes takes whole nodes")
def separate_rollout_whole_nodes(run: Run) -> Iterator[Issue]:
    """
    What it checks: with rollout.colocate: false on more than one node (or under Slurm), the rollout GPUs
    are a whole number of nodes.

    Why: the Slurm script runs the trainer and the rollout as separate job steps on disjoint nodes
    (`srun --relative`), each with its own environment; a node split between them would need two
    environments on one node.

    Source: gdnctl's Slurm script: templates/launch_slurm.sbatch.j2 runs the trainer and the rollout as separate
    `srun --relative` job steps.

    Fix: make rollout.num_gpus a multiple of cluster.gpus_per_node, or colocate.
    """
    rollout = _rollout(run)
    p = run.preset
    if rollout is None or rollout.colocate or (p.cluster.nodes == 1 and p.launch.executor == "local"):
        return
    gpus, per_node = run.rollout_gpus.value, p.cluster.gpus_per_node
    if gpus % per_node:
        yield Issue(
            "rollout.num_gpus",
            f"a separate rollout of {gpus} GPUs is not a whole number of {per_node}-GPU nodes.",
            f"Use a multiple of {per_node} for rollout.num_gpus, or set rollout.colocate: true.",
        )


@rule("RLT010", Severity.ERROR, "The rl batch is whole prompt groups")
def batch_of_groups(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.global_batch_size (the samples of one rl step) is a multiple of
    rollout.n_samples_per_prompt.

    Why: each step rolls out global_batch_size / n_samples_per_prompt prompts, n samples each; GRPO normalises
    rewards within a prompt's group, so a group cannot be split across steps.

    Source: GRPO's group-normalised rewards as gdnctl computes them (runtime/rl/algorithm/grpo.py group_advantages).

    Fix: make train.global_batch_size a multiple of rollout.n_samples_per_prompt.
    """
    rollout = _rollout(run)
    if rollout is None:
        return
    batch, n = run.preset.train.global_batch_size, rollout.n_samples_per_prompt
    if batch % n:
        yield Issue(
            "train.global_batch_size",
            f"global_batch_size {batch} is not a whole number of groups of n_samples_per_prompt {n}.",
            f"Use a multiple of {n}, e.g. {max(n, batch - batch % n)}.",
        )


@rule("RLT011", Severity.ERROR, "rl needs a prompt dataset and a tokenizer")
def prompts_and_tokenizer(run: Run) -> Iterator[Issue]:
    """
    What it checks: an rl job names its prompt dataset (train.data_path: a jsonl of {"prompt", "answer"}) and a
    tokenizer (model.tokenizer, or model.path holding one).

    Why: rollouts start from dataset prompts and rewards read decoded responses; there are no synthetic
    prompts, and nothing is downloaded at run time.

    Source: gdnctl's rl runtime: runtime/rl/prompts/dataset.py reads the local jsonl of {"prompt", "answer"}; nothing is
    downloaded at run time.

    Fix: set train.data_path and model.tokenizer (or model.path).
    """
    if _rollout(run) is None:
        return
    p = run.preset
    if p.train.data_path is None:
        yield Issue(
            "train.data_path",
            "an rl job needs a prompt dataset.",
            'Set train.data_path to a local jsonl with one {"prompt": ..., "answer": ...} a line.',
        )
    if p.model.tokenizer is None and p.model.path is None:
        yield Issue(
            "model.tokenizer",
            "an rl job needs a tokenizer to encode prompts and decode responses.",
            "Set model.tokenizer to a local directory with tokenizer.json (or model.path to a checkpoint "
            "that has one).",
        )


@rule("RLT012", Severity.ERROR, "Responses fit the rollout's context")
def response_fits_context(run: Run) -> Iterator[Issue]:
    """
    What it checks: rollout.max_response_tokens is below the rollout's max_model_len (rollout.max_model_len,
    default train.seq_length).

    Why: vLLM rejects a request whose prompt plus max_tokens cannot fit the model length; the prompt needs room
    too.

    Source: vLLM's own check on each request (prompt plus max_tokens within max_model_len); no upstream file is
    cited for it.

    Fix: lower rollout.max_response_tokens or raise rollout.max_model_len.
    """
    rollout = _rollout(run)
    if rollout is None:
        return
    context = rollout.max_model_len or run.preset.train.seq_length
    if rollout.max_response_tokens >= context:
        yield Issue(
            "rollout.max_response_tokens",
            f"max_response_tokens {rollout.max_response_tokens} leaves no "
            f"room for the prompt in a {context}-token context.",
            "Lower rollout.max_response_tokens, or raise rollout.max_model_len.",
        )


@rule("RLT013", Severity.WARNING, "an rl rollout layout gdnctl's GPU tests have not run")
def rl_rollout_layout_untested(run: Run) -> Iterator[Issue]:
    """
    What it checks: an rl job on GPUs whose rollout is past the layouts gdnctl's GPU tests have run: more than two
    engines, several engines of rollout.tp > 1, one engine of rollout.tp > 1 on GPUs of its own (the broadcast to
    each of its workers), engines on several nodes, or the Slurm script's own rollout step on other nodes
    (rollout.colocate: false with launch.executor: slurm).

    Why: gdnctl's GPU tests have run, on one node, with checksums and the probe matching after every sync
    (tests/gpu/test_rl_vllm_gpu.py): one engine colocated on one H100 (vLLM sleeps while the trainer steps, the
    weights arrive through CUDA IPC or the disk directory); one engine of rollout.tp 2 colocated on two H100s (each
    worker opens the bucket of the trainer rank on its own GPU); two engines of rollout.tp 1 colocated on two H100s;
    one and two engines on GPUs of their own beside a one-GPU trainer, and two beside a two-GPU data-parallel
    trainer on four H100s (one NCCL broadcast from trainer rank 0 reaches every engine's worker). The broadcast to
    the workers of one tensor-parallel engine has run on vLLM's CPU build over gloo (tests/runtime/rl/
    test_rl_vllm.py), not on GPUs; colocated engines on two one-rank nodes have run there too, driven by each
    node's first rank. The Slurm script's rollout step on another node has run, unchanged, on two CPU nodes of the
    tests' local Slurm (network namespaces of one machine; tests/runtime/rl/test_rl_nodes.py): the server found
    through the run dir by the node's name, the worker joining trainer rank 0's store across the nodes, every sync
    broadcast over gloo and checked, a requeue resuming on the uninterrupted curve. On GPUs that broadcast is NCCL
    across the network between nodes, which has not run.

    Source: runs: tests/gpu/test_rl_vllm_gpu.py on an H100, 2 H200s and 4 H100s
    (benchmarks/results/rl-gpu-vllm-2026-11-24.md); tests/runtime/rl/test_rl_nodes.py on the two-node local Slurm
    (CPU).

    Fix: try the preset at small scale first.
    """
    rollout = _rollout(run)
    if rollout is None or run.gpu.sm is None:
        return
    p = run.preset
    engines = run.rollout_engines.value
    untried = [
        text
        for untested, text in (
            (engines > 2, f"{engines} rollout engines"),
            (engines > 1 and rollout.tp > 1, f"{engines} engines of rollout.tp {rollout.tp}"),
            (
                engines == 1 and rollout.tp > 1 and not rollout.colocate,
                f"one engine of rollout.tp {rollout.tp} on GPUs of its own (the broadcast to each worker)",
            ),
            (rollout.colocate and p.cluster.nodes > 1, "colocated engines on several nodes"),
            (
                not rollout.colocate and p.launch.executor == "slurm",
                "a rollout step on other nodes over NCCL (that step has run on two CPU nodes, over gloo)",
            ),
        )
        if untested
    ]
    if untried:
        yield Issue(
            "rollout",
            "gdnctl's GPU tests have run rl on one node with up to two rollout engines of "
            "rollout.tp 1 or one colocated engine of rollout.tp 2, not with "
            f"{' or '.join(untried)}.",
            "Try the preset at small scale first.",
        )


@rule("RLT014", Severity.ERROR, "in-memory weight sync where it cannot run")
def in_memory_weight_sync(run: Run) -> Iterator[Issue]:
    """
    What it checks: rollout.weight_sync: cuda_ipc or broadcast on a run where that transport cannot serve.
    cuda_ipc: no GPU, or separate placement (rollout.colocate: false). broadcast: colocated on GPUs. Either: the
    TE-free builder with pp or ep > 1.

    Why: CUDA IPC hands a GPU allocation to another process on the same GPU, so it cannot reach a rollout on
    GPUs of its own. The broadcast is an NCCL group of trainer rank 0 and every vLLM worker, and NCCL refuses a
    communicator with two ranks on one GPU ("Duplicate GPU detected"), which a colocated rollout would be. The
    TE-free builder's HF export gathers over tensor parallel only, so with pipeline or expert parallel no rank
    holds every tensor to send. `auto` picks what can run (or the disk directory); an explicit transport would
    not run as asked.

    Source: gdnctl's runtime (runtime/rl/weights/cuda_ipc.py, runtime/rl/weights/broadcast.py,
    plan/decisions.rollout_weight_transport); torch's CUDA IPC (torch.multiprocessing.reductions.reduce_tensor)
    shares memory between processes on one GPU; NCCL's init checks each rank's device bus id and fails on a
    duplicate (NCCL src/init.cc, initTransportsRank: "Duplicate GPU detected").

    Fix: set rollout.weight_sync: auto (or disk).
    """
    rollout = _rollout(run)
    if rollout is None or rollout.weight_sync not in ("cuda_ipc", "broadcast"):
        return
    transport = run.rollout_weight_transport
    if transport.value != rollout.weight_sync:
        yield Issue(
            "rollout.weight_sync",
            f"the {rollout.weight_sync} weight sync cannot run here: {transport.reason}.",
            "Set rollout.weight_sync: auto (or disk).",
        )


@rule("RLT016", Severity.ERROR, "The rl batch splits into the PPO mini-batches")
def mini_batches_split(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.global_batch_size (the samples of one rl step) is a multiple of grpo.mini_batches x
    the data-parallel size.

    Why: each optimizer step trains one mini-batch, and every data-parallel rank trains an equal share of it, so
    all ranks take the same optimizer steps; a remainder would leave a rank with a share of a different size, and
    the job would stop at its first step.

    Source: gdnctl's PPO updates (gdnctl/runtime/rl/algorithm/updates.py split_mini_batches,
    runtime/rl/algorithm/batch.py rank_share).

    Fix: make train.global_batch_size a multiple of grpo.mini_batches x dp, or change grpo.mini_batches.
    """
    if _rollout(run) is None or run.dp is None:
        return
    batch, minis = run.preset.train.global_batch_size, run.preset.grpo.mini_batches
    unit = minis * run.dp
    if batch % unit:
        yield Issue(
            "grpo.mini_batches",
            f"global_batch_size {batch} does not split into {minis} mini-batches of an "
            f"equal share for each of {run.dp} data-parallel ranks.",
            f"Make train.global_batch_size a multiple of {unit} (grpo.mini_batches x dp), e.g. "
            f"{max(unit, batch - batch % unit)}, or change grpo.mini_batches.",
        )


@rule("RLT017", Severity.ERROR, "Held-out responses fit the rollout's context")
def eval_response_fits_context(run: Run) -> Iterator[Issue]:
    """
    What it checks: eval.max_response_tokens is below the rollout's max_model_len (rollout.max_model_len, default
    train.seq_length) in an rl job that evaluates.

    Why: the held-out prompts go through the same vLLM engine; a response budget that leaves no room for the
    prompt leaves out every held-out prompt (runtime/rl/evaluation.py), and the job would stop at its start.

    Source: gdnctl's held-out evaluation (gdnctl/runtime/rl/evaluation.py, prompt_check.py: a prompt of more than
    max_model_len - max_response_tokens tokens is left out).

    Fix: lower eval.max_response_tokens or raise rollout.max_model_len.
    """
    rollout, spec = _rollout(run), run.preset.eval
    if rollout is None or spec is None or spec.max_response_tokens is None:
        return
    context = rollout.max_model_len or run.preset.train.seq_length
    if spec.max_response_tokens >= context:
        yield Issue(
            "eval.max_response_tokens",
            f"max_response_tokens {spec.max_response_tokens} leaves no room for "
            f"a held-out prompt in a {context}-token context.",
            "Lower eval.max_response_tokens, or raise rollout.max_model_len.",
        )


@rule("RLT018", Severity.ERROR, "GRPO needs more than one sample per prompt")
def grpo_needs_groups(run: Run) -> Iterator[Issue]:
    """
    What it checks: rollout.n_samples_per_prompt is at least 2 in an rl job.

    Why: GRPO's advantage is a sample's reward against its group's mean (and std); a group of one sample is its
    own mean, so every advantage is 0 and the job trains nothing while every step looks healthy.

    Source: gdnctl's group-normalised advantages (gdnctl/runtime/rl/algorithm/grpo.py group_advantages: a group
    whose rewards are all equal, one sample's among them, gets exactly zero advantages), as verl's and slime's
    GRPO compute them.

    Fix: set rollout.n_samples_per_prompt to 2 or more (8 is common), keeping train.global_batch_size a multiple
    of it.
    """
    rollout = _rollout(run)
    if rollout is not None and rollout.n_samples_per_prompt < 2:
        yield Issue(
            "rollout.n_samples_per_prompt",
            "GRPO compares each sample with the other samples of its prompt, so with one sample per prompt "
            "every advantage is 0 and nothing is learned.",
            "Set rollout.n_samples_per_prompt to 2 or more, e.g. 8 (train.global_batch_size a multiple of it).",
        )


@rule("RLT019", Severity.ERROR, "Off-policy rollouts need engines of their own")
def staleness_needs_separate_engines(run: Run) -> Iterator[Issue]:
    """
    What it checks: rollout.max_staleness >= 1 with rollout.colocate: true, or with rollout.environment.

    Why: max_staleness lets the rollout of the next steps run while the trainer trains; colocated engines share
    the trainer's GPUs and sleep while it steps (vLLM's sleep mode frees their weights and KV cache), so nothing
    could overlap, and the stale samples would buy nothing. A multi-turn environment's episodes run turn by turn
    through the collective generate after the step before has synced, so they cannot overlap either.

    Source: gdnctl's rl loop (gdnctl/runtime/rl/feed.py opens step k once the weights of step k - max_staleness are
    on the engines; gdnctl/runtime/rl/job.py puts colocated engines to sleep before every update and runs an
    environment's episodes in RlJob._episode_batch, on-policy).

    Fix: set rollout.colocate: false (with rollout.num_gpus for the engines), or rollout.max_staleness: 0; with
    rollout.environment, rollout.max_staleness: 0.
    """
    rollout = _rollout(run)
    if rollout is not None and rollout.max_staleness > 0 and rollout.colocate:
        yield Issue(
            "rollout.max_staleness",
            f"max_staleness {rollout.max_staleness} overlaps the next steps' rollouts with the trainer's update, "
            "but colocated engines share the trainer's GPUs and sleep while it steps, so nothing can overlap.",
            "Set rollout.colocate: false and give the engines GPUs of their own (rollout.num_gpus), or set "
            "rollout.max_staleness: 0.",
        )
    if rollout is not None and rollout.max_staleness > 0 and rollout.environment is not None:
        yield Issue(
            "rollout.max_staleness",
            f"max_staleness {rollout.max_staleness} overlaps the next steps' rollouts with the trainer's update, "
            "but rollout.environment's episodes run turn by turn after the step before has synced, so nothing "
            "can overlap.",
            "Set rollout.max_staleness: 0 with rollout.environment.",
        )


@rule("RLT020", Severity.ERROR, "Partial rollouts need off-policy steps")
def partial_needs_staleness(run: Run) -> Iterator[Issue]:
    """
    What it checks: rollout.partial: true with rollout.max_staleness 0.

    Why: a partial rollout continues the requests in flight at a weight update under the new weights; on-policy
    (max_staleness 0) every request of a step has finished before its update, so there is never one to continue
    and the setting would do nothing.

    Source: gdnctl's rl loop (gdnctl/runtime/rl/feed.py: with max_staleness 0 a step's prompts go to the engines
    only after the weights of the step before are synced, and the update waits for the step's batch).

    Fix: set rollout.max_staleness: 1 (or more) with it, or remove rollout.partial.
    """
    rollout = _rollout(run)
    if rollout is not None and rollout.partial and rollout.max_staleness == 0:
        yield Issue(
            "rollout.partial",
            "partial rollouts continue requests that are in flight at a weight update, and with max_staleness 0 "
            "every request has finished before its update.",
            "Set rollout.max_staleness: 1 (or more), or remove rollout.partial.",
        )


@rule("RLT021", Severity.ERROR, "The over-long buffer fits the response")
def overlong_buffer_fits_response(run: Run) -> Iterator[Issue]:
    """
    What it checks: grpo.overlong.buffer_tokens is below rollout.max_response_tokens.

    Why: DAPO's soft penalty grows over the last buffer_tokens before the longest response; a buffer as long as
    the response would penalise every response from its first token, turning a length penalty into a reward for
    saying nothing.

    Source: DAPO's overlong reward shaping (arXiv 2503.14476, eq. 13: the penalty applies for L_max - L_cache <
    |y| <= L_max); gdnctl/runtime/rl/algorithm/sampling.py overlong_penalty.

    Fix: lower grpo.overlong.buffer_tokens below rollout.max_response_tokens (DAPO: 4,096 of 20,480).
    """
    rollout, overlong = _rollout(run), run.preset.grpo.overlong
    if rollout is None or overlong is None:
        return
    if overlong.buffer_tokens >= rollout.max_response_tokens:
        yield Issue(
            "grpo.overlong.buffer_tokens",
            f"buffer_tokens {overlong.buffer_tokens} is not below rollout.max_response_tokens "
            f"{rollout.max_response_tokens}, so every response would be penalised from its first token.",
            f"Lower grpo.overlong.buffer_tokens below {rollout.max_response_tokens} (DAPO used a fifth of the "
            "response length).",
        )
