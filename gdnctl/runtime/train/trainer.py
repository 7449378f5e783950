"""The `sft` and `pretrain` jobs: a Qwen3.5 GDN model trained with Megatron-Core, one process per GPU.

Order of start-up, each step for a reason:
1. the GDN kernel is resolved and patched into Megatron-Core before the model is built (its layers bind it);
2. the comm memory-guard policy is installed before Megatron creates its process groups (they get wrapped);
3. the model is built (megatron-bridge's TE provider, or the TE-free spec: runtime/model/builders.py), HF weights
   loaded (resume checkpoint, else model.path), then wrapped in
   Megatron's DDP and given Megatron's optimizer, whose fp32 main params copy the loaded weights;
4. the GDN kernel is called at this rank's shape, so that its per-process set-up (FlashQLA: TileLang
   elaborating its templates and loading the compiled kernels, seconds from a warm cache and minutes from a
   cold one; FLA: Triton autotuning) is not billed to step 1; its first, next and warm calls are timed, logged
   and written to `kernel_warm_up.json`.

Every step logs loss, grad norm, lr, tokens/s, model TFLOPS per GPU and MFU, peak memory and the GDN backend
on the console (with an ETA), and into the run dir's `metrics.jsonl`, TensorBoard event files and W&B when the
preset asks (`runtime/train/metrics.py`).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.files import replace_text
from gdnctl.knowledge import flops
from gdnctl.runtime.checks import FirstMinuteWatch
from gdnctl.runtime.data import DataPipeline, MicroBatch, read_documents, training_documents
from gdnctl.runtime.model import checkpoint, lora_checkpoint
from gdnctl.runtime.train.cuda_graphs import LayerGraphs
from gdnctl.runtime.train.gc_policy import collector_between_steps, no_collection
from gdnctl.runtime.train.lr_schedule import lr_of, set_lr
from gdnctl.runtime.train.metrics import MetricsLog, eta_text, mfu
from gdnctl.runtime.train.nonfinite import NonFiniteGuard, StepVerdict, describe_documents, diverged_step
from gdnctl.runtime.train.startup import StartupClock
from gdnctl.schema import EngineConfig

KERNEL_WARM_UP_FILE = "kernel_warm_up.json"
# Warm kernel calls whose median is logged beside the first two (one call can catch an allocator hiccup).
WARM_CALLS = 3
CLIP_GRAD = 1.0
WEIGHT_DECAY = 0.01
ADAM_BETAS = (0.9, 0.95)


class TrainerError(GdnctlError):
    """The trainer cannot run this engine config here."""


@dataclass
class StepStats:
    iteration: int
    loss: float
    grad_norm: float
    tokens: int
    sequences: int
    seconds: float
    peak_memory_gib: float
    # Allocated when the step began: weights, gradient buffers and (from step 2) the optimizer state. The peak less
    # this is what the step itself added: activations, logits, transients.
    resident_memory_gib: float
    tokens_per_second: float
    tflops_per_gpu: float
    mfu: float | None  # against the GPU's dense bf16 peak (engine config metrics.peak_bf16_tflops)
    lr: float
    gdn_backend: str
    skipped: bool
    # Share of the step's token slots that were padding (BSHD rows, or THD sequences padded to a multiple).
    padding_share: float = 0.0
    # The caching allocator's peak reservation in the step. With CUDA graphs it is the figure to compare: a graph's
    # internal tensors live in its private pool, reserved but not counted as allocated while it replays.
    peak_reserved_gib: float = 0.0

    def line(self, total: int, eta: str) -> str:
        mfu = f" ({self.mfu:.1%} MFU)" if self.mfu is not None else ""
        return (
            f"step {self.iteration}/{total} | loss {self.loss:.4f} | grad norm {self.grad_norm:.3f} | "
            f"lr {self.lr:.2e} | {self.tokens_per_second:,.0f} tok/s | {self.tflops_per_gpu:.1f} TFLOPS/GPU{mfu} | "
            f"peak mem {self.peak_memory_gib:.2f} GiB | {self.seconds:.3f} s | {eta}"
            + (f" | padding {self.padding_share:.0%} of the slots" if self.padding_share >= 0.005 else "")
            + (" | update skipped" if self.skipped else "")
        )


@dataclass(frozen=True)
class KernelWarmUp:
    kernel: str
    heads: int
    tokens: int
    first_call_s: float
    next_call_s: float
    warm_call_s: float  # median of WARM_CALLS calls after the first two

    def line(self) -> str:
        return (
            f"GDN kernel warm-up ({self.kernel}, {self.heads} heads x {self.tokens} tokens, fwd+bwd): "
            f"first call {self.first_call_s:.3f} s, next call {self.next_call_s * 1e3:.2f} ms, "
            f"warm {self.warm_call_s * 1e3:.2f} ms (median of {WARM_CALLS})"
        )


def _packed_seq_params(batch: MicroBatch):
    from megatron.core.packed_seq_params import PackedSeqParams

    from gdnctl.runtime.kernels import with_host_copy

    if not batch.is_packed:
        return None
    # The GDN layers read the offsets' host copies (runtime/kernels/host_offsets.py): no synchronisation per layer.
    real = with_host_copy(_to_gpu(batch.cu_seqlens), batch.cu_seqlens)
    padded = with_host_copy(_to_gpu(batch.cu_seqlens_padded), batch.cu_seqlens_padded)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=real,
        cu_seqlens_kv=real,
        cu_seqlens_q_padded=padded,
        cu_seqlens_kv_padded=padded,
        max_seqlen_q=batch.max_seqlen,
        max_seqlen_kv=batch.max_seqlen,
    )


def _loss(loss_mask: torch.Tensor, output: torch.Tensor):
    """Sum of per-token losses and token count: Megatron divides the gradients by the global token count
    (calculate_per_token_loss), so every token weighs the same whatever micro-batch it is in."""
    mask = loss_mask.reshape(-1).float()
    total = (output.float().reshape(-1) * mask).sum()
    count = mask.sum().to(torch.int)
    return total, count, {"lm loss": torch.stack([total.detach(), mask.sum().detach()])}


def _to_gpu(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor's copy on the GPU, queued without waiting for it: a blocking copy synchronises the stream,
    and the host tensors of a step live until the step ends."""
    return tensor.cuda(non_blocking=True)


def _forward_step(data_iterator, model):
    batch: MicroBatch = next(data_iterator)
    output = model(
        _to_gpu(batch.tokens),
        _to_gpu(batch.position_ids),
        None,
        labels=_to_gpu(batch.labels),
        packed_seq_params=_packed_seq_params(batch),
    )
    return output, partial(_loss, _to_gpu(batch.loss_mask))


class Trainer:
    def __init__(self, config: EngineConfig, config_path: Path, policy, *, keep_initial_weights: bool = False):
        """keep_initial_weights: also keep, in pinned host memory, this rank's parameters as the job first
        started (model.path, else the seeded random init), even when resuming: the rl policy's KL reference."""
        self.config = config
        self.run_dir = config_path.parent
        self.policy = policy
        self.keep_initial_weights = keep_initial_weights
        self.initial_weights: dict[str, torch.Tensor] | None = None
        self.rank = dist.get_rank()
        self.metrics = MetricsLog(config, self.run_dir, enabled=self.rank == 0, group="train")
        self.recent_step_seconds: list[float] = []  # the pace behind each step line's ETA
        self.first_minute = FirstMinuteWatch(config, self._log)
        self.step_stats: list[StepStats] = []  # every step of this start (the smoke run's verdicts read them)
        self.nonfinite = NonFiniteGuard(config.train.skip_nonfinite_steps)
        self.lr = config.train.lr  # the step's lr, from the schedule, set before every step
        self.held_out = None  # eval:'s DataPipeline, built in train()
        self.startup = StartupClock()  # where the time to step 1 goes (logged after it)
        self.graphs = None  # speed.cuda_graphs: the layers' graphs, built in train()
        self.base_fingerprints: list = []  # train.lora: each rank's fingerprint of its frozen base (lora_checkpoint)

    # --- set-up ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from megatron.core import parallel_state, tensor_parallel

        from gdnctl.runtime.comm import guard as comm_guard
        from gdnctl.runtime.kernels import (
            apply_torch_compile,
            install_host_side_checks,
            patch_megatron_gdn_kernel,
            resolve_backend,
        )

        config = self.config
        torch_compile = apply_torch_compile(config.kernels.torch_compile, config.kernels.torch_compile_reason)
        self.kernel = resolve_backend(config.kernels.gdn_backend, training=True)
        patch_megatron_gdn_kernel(self.kernel)
        offsets = install_host_side_checks()
        if config.comm.memory_guard:
            comm_guard.install(self.policy)
        p = config.parallel
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=p.tp,
            pipeline_model_parallel_size=p.pp,
            context_parallel_size=p.cp,
            expert_model_parallel_size=p.ep,
            expert_tensor_parallel_size=p.etp,
        )
        # CUDA graphs replay random numbers only from Transformer Engine's tracker (what Megatron-Bridge sets with
        # them: rng.te_rng_tracker).
        tensor_parallel.model_parallel_cuda_manual_seed(config.train.seed, te_rng_tracker=config.speed.cuda_graphs)
        if config.speed.cuda_graphs:
            # Everything runs on a stream of its own, never the legacy default one: a capture records on a side
            # stream, and work or gradient accumulators tied to the legacy stream invalidate it ("operation would
            # make the legacy stream depend on a capturing blocking stream"). Megatron-Bridge does the same before
            # it builds the model (megatron-bridge 0.6.2 training/initialize.py:726).
            torch.cuda.set_stream(torch.cuda.Stream())
        self.ps = parallel_state
        self.startup.mark("imports and process groups")
        self._build()
        self._log(f"model builder: {self.builder.builder} ({config.train.model_builder_reason})")
        self._log(f"attention: {config.kernels.attention} ({config.kernels.attention_reason})")
        self._log(
            "speed: " + ", ".join(f"{name} {_shown(getattr(config.speed, name))}" for name in config.speed.reasons)
        )
        self._log(
            f"model: {config.model.label}, {self._parameter_count() / 1e6:.1f}M parameters on this rank; "
            f"GDN kernel {self.kernel.name} on {len(self.gdn_layers)} layers; layout {config.layout}"
            f"{', packing ' + config.packing if config.layout == 'thd' or config.packing == 'concat' else ''}; "
            f"comm guard {'on' if config.comm.memory_guard else 'off'}"
        )
        self._log(torch_compile)
        if config.layout == "thd":
            self._log(offsets)

    def _build(self) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from gdnctl.runtime.kernels import install_kernel_on_layers
        from gdnctl.runtime.model import hold_save_dir, make_model_builder

        config, train = self.config, self.config.train
        self.builder = make_model_builder(config)
        self.transformer = self.builder.transformer
        model = self.builder.build(
            pre_process=self.ps.is_pipeline_first_stage(), post_process=self.ps.is_pipeline_last_stage()
        )
        self.gdn_layers = install_kernel_on_layers(model, self.kernel)
        self.startup.mark("model build")
        self.resume_dir = None
        if train.save_dir and self.rank == 0:
            # One running job per checkpoint directory (held until this process ends).
            self.save_lock = hold_save_dir(Path(train.save_dir), self.run_dir)
        if train.save_dir:
            self.resume_dir = checkpoint.latest_checkpoint(Path(train.save_dir))
        initial = Path(config.model.path) if config.model.path else None
        # Read before any weights: a LoRA checkpoint holds adapters, not the weights a full resume loads, and the
        # reverse (runtime/model/lora_checkpoint.py).
        self.resume_state = (
            None if self.resume_dir is None else checkpoint.read_training_state(self.resume_dir, dist.get_world_size())
        )
        if self.resume_state is not None:
            problem = lora_checkpoint.resume_problem(self.resume_state, train.lora, self.resume_dir)
            if problem is not None:
                raise TrainerError(problem)
        if train.lora is not None:
            self._load_and_wrap_lora(model, initial)
        elif self.keep_initial_weights:
            self._load(model, initial)
            self.initial_weights = {
                name: param.detach().to("cpu", copy=True).pin_memory() for name, param in model.named_parameters()
            }
            self._load(model, self.resume_dir)
        else:
            self._load(model, self.resume_dir or initial)
        # What every save carries over (the MTP head, a vision tower) and the names and config.json it keeps. A
        # LoRA checkpoint holds no HF weights until the last step, so a LoRA run's saves are shaped like its base.
        self.source = checkpoint.run_source(config.model, initial if train.lora else (self.resume_dir or initial))
        self.startup.mark("weights")
        self.model = DistributedDataParallel(
            config=self.transformer,
            module=model,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=config.speed.grad_reduce == "fp32",
                use_distributed_optimizer=train.distributed_optimizer,
                overlap_grad_reduce=config.speed.overlap_grad_reduce,
            ),
        )
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=train.lr,
                min_lr=train.lr,
                weight_decay=WEIGHT_DECAY,
                adam_beta1=ADAM_BETAS[0],
                adam_beta2=ADAM_BETAS[1],
                clip_grad=CLIP_GRAD,
                bf16=True,
                params_dtype=torch.bfloat16,
                use_distributed_optimizer=train.distributed_optimizer,
                optimizer_cpu_offload=train.optimizer_cpu_offload,
                # A constant scale of 1.0 (exact) turns on Megatron's own inf/NaN check of the main gradients: such a
                # step returns update_successful=False before the optimizer state changes (runtime/train/nonfinite.py).
                loss_scale=1.0,
            ),
            [self.model],
        )
        self.transformer.grad_scale_func = self.optimizer.scale_loss
        self.transformer.no_sync_func = self.model.no_sync
        if config.speed.overlap_grad_reduce:
            # The pipeline schedules start the last micro-batch's reduction through it (what Megatron-Bridge sets with
            # the overlap: megatron-bridge 0.6.2 training/setup.py `_update_model_config_funcs`).
            self.transformer.grad_sync_func = self.model.start_grad_sync
        self.transformer.finalize_model_grads_func = finalize_model_grads
        self.iteration, self.consumed_samples = 0, 0
        if self.resume_dir is not None:
            state = self.resume_state
            checkpoint.load_training_state(self.resume_dir, self.optimizer)
            if "consumed_samples" not in state:  # an rl checkpoint: rl counts rollout steps, not data samples
                raise TrainerError(
                    f"{self.resume_dir} has no consumed_samples in its training state, so it was not written by an "
                    f"sft or pretrain job (an rl job's checkpoint counts rollout steps); set train.save_dir to a new "
                    f"directory and model.path to {self.resume_dir} to start {self.config.job} from its weights."
                )
            self.iteration, self.consumed_samples = state["iteration"], state["consumed_samples"]
            self._log(f"resumed from {self.resume_dir} at step {self.iteration}")
            self.metrics.resumed_at(self.iteration)
        self.startup.mark("DDP and optimizer")

    def _load_and_wrap_lora(self, model, base: Path | None) -> None:
        """train.lora: load the base from model.path into the bare model, fingerprint it, wrap it in megatron-bridge's
        LoRA (every base parameter frozen) and, on a resume, put the checkpoint's adapters in; all before DDP and
        the optimizer, which then hold the adapters alone (runtime/model/lora_wrap.py)."""
        if self.keep_initial_weights:
            # A programming error, not a setting: MegatronPolicy asks for no copy with train.lora.
            raise TrainerError(
                "keep_initial_weights copies every parameter as the rl policy's KL reference, and with "
                "train.lora that reference is the frozen base with the adapters switched off "
                "(runtime/rl/policy/megatron_policy.py); build the Trainer without keep_initial_weights when "
                "train.lora is set."
            )
        if base is None:
            raise TrainerError(
                "train.lora trains adapters on a frozen base, and model.path is unset (TRN022); set "
                "model.path to the base checkpoint's directory."
            )
        self._load(model, base)
        mine = lora_checkpoint.base_fingerprint(model.named_parameters())
        self.base_fingerprints = [None] * dist.get_world_size()
        dist.all_gather_object(self.base_fingerprints, mine)
        if self.resume_state is not None:
            # Every rank compares the same gathered list with the same record, so all stop or none does.
            problem = lora_checkpoint.base_problem(
                self.resume_state.get(lora_checkpoint.STATE_KEY, {}), self.base_fingerprints, str(base)
            )
            if problem is not None:
                raise TrainerError(problem)
        trained = self.builder.add_lora(model)
        adapters = torch.tensor([trained.adapter_params], dtype=torch.int64, device="cuda")
        dist.all_reduce(adapters)
        if int(adapters) == 0:
            raise TrainerError(
                f"train.lora.targets ({', '.join(self.config.train.lora.targets)}) matched no linear of "
                f"{self.config.model.label}, so no adapter was added; name targets the model has "
                "(gdnctl explain PRESET lists them)."
            )
        self._log(trained.line())
        if self.resume_dir is not None:
            count = lora_checkpoint.load_shard(model, self.resume_dir, self.rank)
            self._log(f"loaded {count} adapter tensors from {self.resume_dir}")

    def reload(self, directory: Path) -> None:
        """Load a checkpoint of this run into the built model and optimizer, with the calls a resume makes (the
        smoke run's round trip). A LoRA checkpoint holds the adapters; the base comes from model.path again."""
        if self.config.train.lora is not None:
            self._load(self.model.module, Path(self.config.model.path))
            lora_checkpoint.load_shard(self.model, directory, self.rank)
        else:
            self._load(self.model.module, directory)
        checkpoint.load_training_state(directory, self.optimizer)

    def _load(self, model, weights: Path | None) -> None:
        if weights is not None:
            count = self.builder.load(model, weights)
            self._log(f"loaded {count} tensors from {weights}")

    def _parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # --- kernel warm-up ----------------------------------------------------------------------------------
    def warm_up_kernel(self) -> KernelWarmUp:
        """Forward+backward of the GDN kernel at this rank's shape, timed three ways and logged.

        The first call is this process's first (FlashQLA: TileLang elaborating its templates and loading or
        compiling the binaries; FLA: Triton compiling and autotuning); the next call is what step 1's first GDN
        layer would meet, so it shows whether any set-up is left for the step; the warm median is the yardstick.
        """
        from gdnctl.knowledge import RankShape, kernel_heads
        from gdnctl.runtime.kernels import fwd_bwd_seconds

        arch, p, train = self.config.model, self.config.parallel, self.config.train
        heads = kernel_heads(arch, p.tp, p.cp)
        length = train.seq_length
        shape = RankShape(
            f"{heads} heads x {length} tokens",
            heads,
            heads,
            arch.linear_key_head_dim,
            (length,),
            packed=self.config.layout == "thd",
        )
        if self.kernel.shows_compile_progress:
            first = self._first_call_watching_compiles(shape)
        else:
            first = fwd_bwd_seconds(self.kernel, shape)
        following = fwd_bwd_seconds(self.kernel, shape)
        warm = statistics.median(fwd_bwd_seconds(self.kernel, shape) for _ in range(WARM_CALLS))
        timing = KernelWarmUp(self.kernel.name, heads, length, first, following, warm)
        self._log(timing.line())
        if self.rank == 0:
            replace_text(self.run_dir / KERNEL_WARM_UP_FILE, json.dumps(timing.__dict__) + "\n")
        self.startup.mark("GDN kernel warm-up")
        return timing

    def _first_call_watching_compiles(self, shape) -> float:
        """The call in which TileLang compiles FlashQLA's kernels (minutes from a cold cache): rank 0 says what it
        will cost and logs a line per kernel; every rank's compiler output goes to the kernel cache's log rather
        than filling the job's log with each rank's copy of the same hundreds of lines."""
        from gdnctl.runtime.kernels import compile_quietly, expected_kernels, fwd_bwd_seconds, watch_compiles

        report = self._log if self.rank == 0 else None
        with (
            compile_quietly(
                [shape],
                report,
                header=f"gdnctl trainer {self.config.name} rank {self.rank}",
                prewarm="gdnctl prewarm PRESET",
            ) as say,
            watch_compiles(shape.name, expected_kernels(shape.qk_heads, shape.v_heads), say),
        ):
            return fwd_bwd_seconds(self.kernel, shape)

    # --- training ----------------------------------------------------------------------------------------
    def train(self) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from gdnctl.runtime.kernels import compiles_logged

        config, train = self.config, self.config.train
        pipeline = DataPipeline.from_engine_config(config, training_documents(config))
        dp_rank = self.ps.get_data_parallel_rank()
        stream = pipeline.micro_batches(dp_rank, self.consumed_samples, self.ps.get_context_parallel_rank())
        forward_backward = get_forward_backward_func()
        save_dir = Path(train.save_dir) if train.save_dir else None
        # A packed micro-batch of a shape the warm-up did not cover can make TileLang compile mid-run: a line on
        # rank 0, the compiler's own records in the kernel cache's log.
        # Held-out loss (eval:): the same batches at every evaluation, so two evaluations differ by the weights.
        self.held_out = (
            None
            if config.eval is None
            else DataPipeline.from_engine_config(
                config,
                read_documents(
                    config.eval.data_path, vocab_size=config.model.vocab_size, tokenizer_path=train.tokenizer_path
                ),
            )
        )
        if config.speed.cuda_graphs:
            # The shape the schedule is given (as in _train_steps): a packed micro-batch is one row of max_positions.
            packed = config.layout == "thd"
            micro = 1 if packed else train.micro_batch_size
            self.graphs = LayerGraphs(
                model=self.model,
                optimizer=self.optimizer,
                transformer_config=self.transformer,
                row_length=pipeline.max_positions if packed else pipeline.row_width,
                micro_batch_size=micro,
                global_batch_size=pipeline.num_microbatches * micro * config.parallel.dp,
                dp=config.parallel.dp,
                warmup_steps=config.speed.cuda_graph_warmup_steps,
                modules=config.speed.cuda_graph_modules,
                log=self._log,
            )
        self.startup.mark("data")
        with (
            compiles_logged("training", self._log if self.rank == 0 else None),
            collector_between_steps(self.config.speed.manual_gc_interval) as self.collector,
        ):
            self._train_steps(pipeline, stream, forward_backward, save_dir)

    def _train_steps(self, pipeline, stream, forward_backward, save_dir: Path | None) -> None:
        train = self.config.train
        while self.iteration < train.train_iters:
            batches = [next(stream) for _ in range(pipeline.num_microbatches)]
            if self.graphs is not None:
                for batch in batches:
                    self.graphs.check_row(batch.row_length, f"a micro-batch of step {self.iteration + 1}")
                captured = self.graphs.before_step()
                if captured is not None:
                    self._log(self.startup.graphs_captured(captured, self.run_dir, write=self.rank == 0))
            resident_gib = torch.cuda.memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
            start = time.perf_counter()
            self.model.zero_grad_buffer()
            self.optimizer.zero_grad()
            # The schedule is a function of the step (runtime/train/lr_schedule.py), so a resume continues it.
            self.lr = lr_of(train, self.iteration)
            set_lr(self.optimizer, self.lr)
            try:
                losses = self._schedule(forward_backward, batches, forward_only=False)
            except RuntimeError as error:
                raise self._diverged_or(error, batches) from error
            micro_losses, loss_sum = self._reduced_loss(losses)
            # Checked before the step: a non-finite loss is never applied, whatever its gradients look like.
            loss_finite = bool(torch.isfinite(loss_sum).all())
            updated, grad_norm = False, None
            if loss_finite:
                updated, grad_norm, _ = self.optimizer.step()
                # With bf16 gradient buffers the optimizer steps on fp32 copies of them (4 bytes a parameter):
                # free those now rather than at the next step's start, so they are not held between steps (when a
                # colocated rollout or a save wants the memory).
                self.optimizer.zero_grad()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            self.iteration += 1
            self.consumed_samples += train.global_batch_size
            stats = self._stats(loss_sum, batches, grad_norm, seconds, not updated, resident_gib)
            self._report(stats)
            self._check_finite(loss_finite, updated, micro_losses, batches)
            self.step_stats.append(stats)
            if len(self.step_stats) == 1:
                self.startup.mark("step 1")
                self._log(self.startup.report(self.run_dir, write=self.rank == 0))
            # The step's own peak (reset every step); the reserved one where graphs hold activations (first_minute.py).
            self.first_minute.after_step(
                stats.peak_reserved_gib if self.first_minute.reads_reserved else stats.peak_memory_gib
            )
            if self.held_out is not None and (
                self.iteration % self.config.eval.interval == 0 or self.iteration == train.train_iters
            ):
                self._evaluate(forward_backward)
            if save_dir and (
                self.iteration == train.train_iters
                or (train.save_interval and self.iteration % train.save_interval == 0)
            ):
                self.save(save_dir)
                self.collector.collect()
            self.collector.after_step(self.iteration)

    def _schedule(self, forward_backward, batches: list[MicroBatch], *, forward_only: bool):
        """Megatron's forward-backward schedule over one step's micro-batches (a packed micro-batch is one row)."""
        return forward_backward(
            forward_step_func=_forward_step,
            data_iterator=iter(batches),
            model=[self.model],
            num_microbatches=len(batches),
            seq_length=batches[0].row_length,
            micro_batch_size=self.config.train.micro_batch_size if self.config.layout == "bshd" else 1,
            forward_only=forward_only,
        )

    def _diverged_or(self, error: RuntimeError, batches: list[MicroBatch]) -> BaseException:
        """What a step that raised stops with: the diverged-weights sentence where this rank's weights have left a
        trained model's range (nonfinite.diverged_step), else the error itself. Checked on this rank alone: the
        others may not have raised, so no collective is safe here."""
        if isinstance(error, torch.OutOfMemoryError):
            return error
        weights = [param.detach() for param in self.model.parameters()]
        largest = float(torch.stack(torch._foreach_norm(weights, float("inf"))).max()) if weights else 0.0
        sentence = diverged_step(
            self.iteration + 1,
            error,
            largest,
            describe_documents([index for batch in batches for index in batch.documents], self.config.train.data_path),
            lr_of(self.config.train, self.iteration - 1) if self.iteration else None,
        )
        return sentence or error

    def _evaluate(self, forward_backward) -> None:
        """eval.batches global batches of held-out documents, forward only -> an `eval_loss` row (the token-mean
        loss over every rank's tokens). Needs a GPU check: written against the step's forward_backward call."""
        started = time.perf_counter()
        stream = self.held_out.micro_batches(self.ps.get_data_parallel_rank(), 0, self.ps.get_context_parallel_rank())
        total = torch.zeros(2, device="cuda")
        self.model.eval()
        for _ in range(self.config.eval.batches):
            batches = [next(stream) for _ in range(self.held_out.num_microbatches)]
            with torch.no_grad():
                losses = self._schedule(forward_backward, batches, forward_only=True)
            total += self._reduced_loss(losses)[1]
        self.model.train()
        loss = float(total[0] / total[1].clamp(min=1))
        self._log(
            f"eval at step {self.iteration}: held-out loss {loss:.4f} over {int(total[1])} tokens "
            f"({time.perf_counter() - started:.1f} s)"
        )
        self.metrics.log(
            self.iteration,
            {
                "iteration": self.iteration,
                "eval_loss": loss,
                "eval_tokens": int(total[1]),
                "eval_seconds": time.perf_counter() - started,
            },
        )

    def _reduced_loss(self, losses) -> tuple[list[torch.Tensor], torch.Tensor]:
        """This rank's [sum, count] per micro-batch (last pipeline stage; empty elsewhere), and the step's [sum,
        count] over every data-parallel and pipeline rank."""
        micro = [item["lm loss"].float() for item in losses] if self.ps.is_pipeline_last_stage() else []
        loss_sum = torch.stack(micro).sum(0) if micro else torch.zeros(2, device="cuda")
        dist.all_reduce(loss_sum, group=self.ps.get_data_parallel_group(with_context_parallel=True))
        # Only the last pipeline stage has losses; the others add zeros.
        dist.all_reduce(loss_sum, group=self.ps.get_pipeline_model_parallel_group())
        return micro, loss_sum

    def _check_finite(
        self, loss_finite: bool, updated: bool, micro_losses: list[torch.Tensor], batches: list[MicroBatch]
    ) -> None:
        """Stop (or, within train.skip_nonfinite_steps, log and go on) after a step that was not finite. The branch
        is the same on every rank: the loss is reduced over all of them and Megatron's gradient check too."""
        grad_finite = updated or not loss_finite  # a finite loss whose step was refused had non-finite gradients
        if loss_finite and grad_finite:
            return
        # The micro-batches whose own loss was not finite, where the loss names them; else the whole step's.
        suspects = (
            [batch for batch, loss in zip(batches, micro_losses, strict=False) if not bool(torch.isfinite(loss).all())]
            if not loss_finite
            else []
        )
        mine = [index for batch in (suspects or batches) for index in batch.documents]
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        bad, count = [], 0
        if not grad_finite:
            for name, param in self.model.named_parameters():
                count += 1
                grad = getattr(param, "main_grad", None)
                if grad is not None and not bool(torch.isfinite(grad).all()):
                    bad.append(name.removeprefix("module."))
        verdict = StepVerdict(
            step=self.iteration,
            applied=updated,
            loss_finite=loss_finite,
            grad_finite=grad_finite,
            inputs=describe_documents([i for part in gathered for i in part], self.config.train.data_path),
            bad_parameters=bad,
            parameter_count=count,
        )
        line = self.nonfinite.after_step(verdict)
        if line is not None:
            self._log(line)

    def _stats(
        self,
        loss_sum: torch.Tensor,
        batches: list[MicroBatch],
        grad_norm,
        seconds: float,
        skipped: bool,
        resident_gib: float,
    ) -> StepStats:
        counts = torch.tensor(
            [
                sum(b.num_real_tokens for b in batches),
                sum(self._sequences(b) for b in batches),
                sum(b.batch.input_ids.numel() for b in batches),
            ],
            device=loss_sum.device,
            dtype=torch.float64,
        )
        dist.all_reduce(counts, group=self.ps.get_data_parallel_group())
        tokens, sequences, slots = int(counts[0]), int(counts[1]), int(counts[2])
        mean_length = tokens / max(sequences, 1)
        model_flops = flops.train_flops_per_token(self.config.model, mean_length) * tokens
        tflops_per_gpu = model_flops / seconds / dist.get_world_size() / 1e12
        return StepStats(
            iteration=self.iteration,
            loss=float(loss_sum[0] / loss_sum[1].clamp(min=1)),
            # None: the optimizer refused the step (non-finite gradients) or it was never asked (non-finite loss).
            grad_norm=float("nan") if grad_norm is None else float(grad_norm),
            tokens=tokens,
            sequences=sequences,
            seconds=seconds,
            peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30,
            resident_memory_gib=resident_gib,
            tokens_per_second=tokens / seconds,
            tflops_per_gpu=tflops_per_gpu,
            mfu=mfu(tflops_per_gpu, self.config.metrics.peak_bf16_tflops),
            lr=self.lr,
            gdn_backend=self.config.kernels.gdn_backend,
            skipped=skipped,
            padding_share=1.0 - tokens / max(slots, 1),
            peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
        )

    @staticmethod
    def _sequences(batch: MicroBatch) -> int:
        return int(batch.batch.seq_lens.numel())

    def _report(self, stats: StepStats) -> None:
        if self.rank != 0:
            return
        # the pace of the last few steps: step 1 (compiles, warm-ups) would make every early ETA far too long
        self.recent_step_seconds = (self.recent_step_seconds + [stats.seconds])[-10:]
        pace = statistics.median(self.recent_step_seconds[1:] or self.recent_step_seconds)
        print(
            stats.line(self.config.train.train_iters, eta_text(stats.iteration, self.config.train.train_iters, pace)),
            flush=True,
        )
        self.metrics.log(stats.iteration, asdict(stats))

    def save(self, save_dir: Path) -> None:
        name = checkpoint.checkpoint_name(self.iteration)
        directory = save_dir / name
        start = time.perf_counter()
        state = {"iteration": self.iteration, "consumed_samples": self.consumed_samples}
        if self.config.train.lora is None:
            written = self.builder.save(self.model, directory, self.source)
        else:
            written = self._save_lora(directory)
            state[lora_checkpoint.STATE_KEY] = lora_checkpoint.state_record(
                self.config.train.lora, str(self.config.model.path), self.base_fingerprints
            )
        checkpoint.save_training_state(directory, self.optimizer, state, written)
        dist.barrier()
        if self.rank == 0:
            checkpoint.mark_latest(save_dir, name)
        dist.barrier()
        self._log(f"saved {directory} in {time.perf_counter() - start:.1f} s")

    def _save_lora(self, directory: Path) -> checkpoint.Files:
        """A LoRA checkpoint's weights (runtime/model/lora_checkpoint.py): every rank's adapter tensors, the adapters
        in the `peft` layout (rank 0), and at the last step the merged model through the builder's export
        (collective). Returns the files this rank wrote."""
        lora = self.config.train.lora
        written = lora_checkpoint.write_shard(self.model, directory, self.rank)
        # Collective: every rank takes part in the gathers; rank 0 keeps the tensors (megabytes).
        exported = [
            (name, tensor.detach().to("cpu", copy=True))
            for name, tensor in self.builder.export_adapters(self.model)
            if self.rank == 0
        ]
        if self.rank == 0:
            adapters = lora_checkpoint.adapters_from_hf(exported, self.source.stored_name)
            written.update(lora_checkpoint.write_peft(directory, adapters, lora, str(self.config.model.path)))
        if lora_checkpoint.writes_merged(self.iteration, self.config.train.train_iters):
            written.update(self.builder.save(self.model, directory, self.source))
        return written

    def close(self) -> None:
        """End of the job on this rank: the CUDA graphs go before the process groups can (runtime/train/cuda_graphs.py
        `release`), and the metrics files are closed."""
        if self.graphs is not None:
            self.graphs.release()
        self.metrics.close()

    def _log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[gdnctl trainer] {message}", flush=True)


def _shown(value: object) -> object:
    return ("on" if value else "off") if isinstance(value, bool) else value


def run(config: EngineConfig, config_path: Path, policy) -> int:
    trainer = Trainer(config, config_path, policy)
    try:
        # Set-up makes objects that live for the whole job; the steps' collector takes over collection from it
        # (runtime/train/gc_policy.py).
        with no_collection():
            trainer.setup()
            trainer.warm_up_kernel()
            trainer.train()
    finally:
        trainer.close()
    return 0
