"""speed.cuda_graphs: Transformer Engine CUDA graphs of each MoE layer's router and dispatch preprocessing, and of
each layer's attention or GDN block where rows carry no packed-sequence offsets.

The model is built with megatron-core's `cuda_graph_impl="transformer_engine"` and the modules the plan chose
(speed.cuda_graph_modules, plan/speed.py); the trainer runs `speed.cuda_graph_warmup_steps` steps eagerly, then
megatron-core's TECudaGraphHelper records one graph per layer (megatron-core 0.19.2
transformer/cuda_graphs.py: with one pipeline stage it captures one micro-batch, and every micro-batch replays it,
module.py `_te_cuda_graph_replay`: `current_microbatch % len(self.cuda_graphs)`). This is what Megatron-Bridge's
own loop does (megatron-bridge 0.6.2 training/train.py: the helper is built before the loop and
`create_cudagraphs()` runs when the warm-up steps are done).

A graph replays the shapes it recorded, so every micro-batch must have the recorded row length: the plan turns
graphs on only with filled or concatenated rows or padded rows (plan/speed.py), and `check_row` refuses anything
else with a sentence rather than letting a replay read the wrong number of tokens.

A graphed attention block replays with the tensors it was captured with (megatron-core 0.19.2
transformer/transformer_layer.py `get_layer_static_inputs`: the hidden states, an attention mask and the rotary
table of positions 0..s-1). The trainer passes no mask: megatron-core hands the graph a zero mask in its place
(`_get_te_cuda_graph_replay_args`), and Transformer Engine's causal attention does not read it. Positions 0..s-1
are what a full row without offsets uses anyway (GPTModel computes RoPE from the row length, not the position ids).

megatron-core builds that mask in host memory and copies it over: a float32 seq x seq matrix of ones, its lower
triangle, then the copy, for every layer (0.5 s a layer at 8192 tokens; 3.9 s of the proxy's 8 layers in a
profiled launch on an H100, most of its capture time, and ~20 s for a 40-layer model). `make_static_masks_on_the_gpu`
has each layer build the same boolean mask on the GPU instead.

A captured graph holds references to NCCL buffers, and while one lives `torch.distributed.destroy_process_group()`
never returns: a DP2 job of the 35B-A3B proxy on two H100s trained its steps and then hung there, every rank, until
killed; with the graphs off it exited. `release` resets and drops them when the job ends, as Megatron-Bridge's own
loop does for this reason (megatron-bridge 0.6.2 training/train.py `_delete_cuda_graphs`, citing
pytorch/pytorch#115388; megatron-core 0.19.2 transformer/cuda_graphs.py `TECudaGraphHelper.delete_cuda_graphs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gdnctl.errors import GdnctlError


class CudaGraphError(GdnctlError):
    """A micro-batch of another shape than the graphs recorded (the runtime prints the sentence)."""


def causal_static_mask(rows: int, columns: int, micro_batch_size: int, device):
    """megatron-core's static attention mask for a graphed layer (True where a position is masked), made on
    `device`: the value of megatron-core 0.19.2 transformer/transformer_layer.py `get_layer_static_inputs`,
    `~(torch.tril(torch.ones((rows, columns))).bool())` reshaped to (1, 1, rows, columns) and tiled over the
    micro-batch, without the float32 matrix in host memory and its copy."""
    import torch

    mask = torch.ones((rows, columns), dtype=torch.bool, device=device).tril_().logical_not_()
    return mask.reshape(1, 1, rows, columns).tile(micro_batch_size, 1, 1, 1)


# Marks the replacement on TransformerLayer, so a second trainer in the process leaves it as it is.
_PATCHED = "_gdnctl_static_mask_on_the_gpu"


def make_static_masks_on_the_gpu() -> None:
    """Have megatron-core's TransformerLayer build its graphs' static attention mask on the GPU (see the module
    docstring). The condition for a mask is megatron-core 0.19.2's (transformer_layer.py lines 1111-1114: a layer
    with an attention or GDN block, graphed whole or with `attn` among the graphed modules); the rest of the static
    inputs are its base class's (GraphableMegatronModule's hidden states), unchanged. Idempotent."""
    import torch
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.transformer_layer import TransformerLayer

    try:
        from megatron.core.transformer.enums import CudaGraphModule
    except ImportError:  # a megatron-core before the per-module graph choice: its own mask construction stays
        return
    if getattr(TransformerLayer.get_layer_static_inputs, _PATCHED, False):
        return

    def get_layer_static_inputs(self, seq_length, micro_batch_size):
        static_inputs = super(TransformerLayer, self).get_layer_static_inputs(seq_length, micro_batch_size)
        modules = self.config.cuda_graph_modules
        if not isinstance(self.self_attention, IdentityOp) and (not modules or CudaGraphModule.attn in modules):
            rows = seq_length // self.config.context_parallel_size
            static_inputs["attention_mask"] = causal_static_mask(
                rows, seq_length, micro_batch_size, torch.cuda.current_device()
            )
        return static_inputs

    setattr(get_layer_static_inputs, _PATCHED, True)
    TransformerLayer.get_layer_static_inputs = get_layer_static_inputs


class LayerGraphs:
    """Captures after the warm-up steps of this start; `before_step` is called before every step is timed."""

    def __init__(
        self,
        *,
        model,
        optimizer,
        transformer_config,
        row_length: int,
        micro_batch_size: int,
        global_batch_size: int,
        dp: int,
        warmup_steps: int,
        modules: tuple[str, ...],
        log: Callable[[str], None],
    ) -> None:
        import torch.distributed as dist
        from megatron.core import num_microbatches_calculator as calculator
        from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

        # megatron-core sizes the capture's warm-up from the global micro-batch count (cuda_graphs.py
        # _get_cuda_graph_input_data: get_num_microbatches()), which only its own training loop sets.
        make_static_masks_on_the_gpu()
        calculator.unset_num_microbatches_calculator()
        calculator.init_num_microbatches_calculator(dist.get_rank(), None, global_batch_size, micro_batch_size, dp)
        self.row_length = row_length
        self.warmup_steps = warmup_steps
        self.steps_seen = 0
        self.capture_seconds: float | None = None
        self.modules = modules
        self._log = log
        self._helper = TECudaGraphHelper(
            model=[model],
            config=transformer_config,
            seq_length=row_length,
            micro_batch_size=micro_batch_size,
            optimizers=[optimizer],
        )

    def check_row(self, row_length: int, where: str) -> None:
        if row_length != self.row_length:
            raise CudaGraphError(
                f"{where} is {row_length} tokens long, but the CUDA graphs replay rows of {self.row_length}; set "
                "speed.cuda_graphs: off, or train.packing: concat or fill so that every row has one length."
            )

    def before_step(self) -> float | None:
        """Capture once this start has run its warm-up steps (eager), before the next step is timed; returns the
        capture's seconds when this call captured, else None."""
        captured = None
        if self.steps_seen == self.warmup_steps and self.capture_seconds is None:
            started = time.perf_counter()
            self._helper.create_cudagraphs()
            self.capture_seconds = time.perf_counter() - started
            covered = ("attention or GDN block, " if "attn" in self.modules else "") + "MoE router and preprocessing"
            self._log(
                f"CUDA graphs: captured the {covered} of {len(self._helper.flattened_callables)} layers in "
                f"{self.capture_seconds:.1f} s, after {self.warmup_steps} eager step(s)"
            )
            captured = self.capture_seconds
        self.steps_seen += 1
        return captured

    def release(self) -> None:
        """Reset and drop every captured graph (called when the job ends, before the process groups go)."""
        if self._helper.graphs_created():
            self._helper.delete_cuda_graphs()
