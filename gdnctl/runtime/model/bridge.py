"""The model built through megatron-bridge: Transformer Engine layers, TE attention with packed sequences and
context parallel, TEGroupedMLP experts, FP8 through TE recipes; HF weights in and out through the bridge.

The bridge reads the architecture from an HF config (megatron-bridge's Qwen35Bridge / Qwen35MoEBridge /
Qwen3NextBridge `provider_bridge`), so the provider is made from the text-only config.json gdnctl writes for the
architecture (`checkpoint.hf_text_config`), whether the job started from `model.path` or from random weights
(its saves write the source checkpoint's own config.json: runtime/model/passthrough.py). gdnctl then sets what
it decides itself (parallel sizes, precision, recompute, per-token loss) through `apply_overrides_and_finalize`,
which refuses a name the provider lacks.

Checked on an H100 (2026-11-22, megatron-bridge 0.6.2, megatron-core 0.19.2, TE 2.20.2): this provider builds
the TE GDN model. Without APEX, `gradient_accumulation_fusion` is fused in TE's layers only (wgrad_fusion.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.model.megatron_config import INIT_METHOD_STD, ModelBuildError
from gdnctl.schema import EngineConfig

# HF checkpoints of the vision-language classes keep the language model under this prefix; the text bridge
# reads `model.` names, so the loader renames on the fly (no copy of the checkpoint is written).
VL_LANGUAGE_PREFIX = "model.language_model."
TEXT_PREFIX = "model."
# The HF tensors whose rows are the vocabulary.
VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")
# Export shards of at most this many bytes: rank 0 holds one shard in host memory at a time.
SHARD_BYTES = 4 * 2**30
# TE's FP8 recipe on Hopper. Delayed scaling is TE's longest-standing recipe and the one Megatron-Core's
# Hopper recipes default to; tensorwise current scaling measured ~21% slower than bf16 on H100 in the
# Megatron-Bridge Qwen3.5 campaign, and MXFP8 needs Blackwell.
FP8_FORMAT = "hybrid"
FP8_RECIPE = "delayed"


def transformer_engine_available() -> str | None:
    """Why the bridge builder cannot run here, or None when Transformer Engine and megatron-bridge import."""
    for module, package in (
        ("transformer_engine.pytorch", "transformer-engine"),
        ("megatron.bridge", "megatron-bridge"),
    ):
        try:
            __import__(module)
        except Exception as error:  # a broken TE install raises OSError/RuntimeError from its library loader
            return f"{package} cannot be imported ({type(error).__name__}: {error})"
    return None


def hf_config(config: EngineConfig):
    """The transformers config object of the text model gdnctl trains (what the bridge builds from)."""
    from transformers import AutoConfig

    document = dict(checkpoint.hf_text_config(config.model))
    return AutoConfig.for_model(document.pop("model_type"), **document)


def provider_overrides(config: EngineConfig) -> dict[str, Any]:
    """What gdnctl decides on the bridge's provider; the architecture is the bridge's, from the HF config."""
    parallel, train, speed = config.parallel, config.train, config.speed
    overrides: dict[str, Any] = dict(
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        context_parallel_size=parallel.cp,
        sequence_parallel=parallel.sequence_parallel,
        pipeline_dtype=torch.bfloat16,
        # Weight gradients added into the gradient buffer inside TE's GEMM (runtime/model/wgrad_fusion.py says how
        # this works without APEX).
        gradient_accumulation_fusion=speed.wgrad_fusion,
        # The speed options (plan/speed.py): TE's fused RoPE, the experts' fused SwiGLU, TE's or Megatron's
        # cross entropy.
        apply_rope_fusion=speed.rope_fusion,
        bias_activation_fusion=speed.bias_activation_fusion,
        cross_entropy_loss_fusion=True,
        cross_entropy_fusion_impl=speed.cross_entropy,
        # The trainer's loss is a per-token sum divided by the global token count (trainer._loss).
        calculate_per_token_loss=True,
        init_method_std=INIT_METHOD_STD,
        # gdnctl does not train the MTP head (TRN004); the bridge would build it from mtp_num_hidden_layers.
        mtp_num_layers=None,
    )
    if config.model.vocab_size % parallel.tp:
        # Megatron's vocab-parallel embedding needs the rows divisible by TP, and the provider keeps the HF
        # vocabulary as it is unless told to pad (measured on an H100: a 257-token model at TP 2 stops in
        # VocabParallelEmbedding with "257 is not divisible by 2"). Pad to the next multiple of TP, as the TE-free
        # builder does (hf_weights.padded_vocab_size); the bridge's loader fills the extra rows with zeros
        # (ColumnParallelMapping.hf_to_megatron) and `as_stored_in_hf` cuts them from the export.
        overrides.update(should_pad_vocab=True, make_vocab_size_divisible_by=1)
    if config.model.is_moe:
        overrides.update(
            expert_model_parallel_size=parallel.ep,
            expert_tensor_parallel_size=parallel.etp,
            moe_grouped_gemm=True,
            moe_router_dtype="fp32",
            moe_router_fusion=speed.router_fusion,
        )
    if speed.cuda_graphs:
        # Captured by the trainer after its warm-up steps (runtime/train/cuda_graphs.py); TE's RNG tracker is the
        # one a graph can replay.
        overrides.update(
            cuda_graph_impl="transformer_engine",
            # The plan's choice (plan/speed.py cuda_graph_modules): attention too where rows carry no offsets.
            cuda_graph_modules=list(speed.cuda_graph_modules),
            cuda_graph_warmup_steps=speed.cuda_graph_warmup_steps,
            use_te_rng_tracker=True,
        )
    if train.recompute == "full":
        overrides.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif train.recompute == "selective":
        overrides.update(recompute_granularity="selective")
    if train.precision == "fp8":
        overrides.update(fp8=FP8_FORMAT, fp8_recipe=FP8_RECIPE)
    return overrides


class BridgeModel:
    """One rank's bridge: builds the model, loads HF weights into it and exports them."""

    builder = "megatron-bridge"

    def __init__(self, config: EngineConfig) -> None:
        from megatron.bridge import AutoBridge

        self.config = config
        self.bridge = AutoBridge.from_hf_config(hf_config(config))
        provider = self.bridge.to_megatron_provider(load_weights=False)
        try:
            provider.apply_overrides_and_finalize(dtype=torch.bfloat16, overrides=provider_overrides(config))
        except AttributeError as error:
            raise ModelBuildError(
                f"megatron-bridge's provider lacks a setting gdnctl passes ({error}); use the "
                "megatron-bridge version the preset's runtime.megatron_bridge names."
            ) from None
        # Set after finalize, as the TE-free builder does: TransformerConfig's checks refuse variable sequence
        # lengths with the allgather dispatcher a dense model's config keeps by default, which a model without
        # experts never uses (only pipeline parallel reads this, to size its point-to-point buffers).
        provider.variable_seq_lengths = config.layout == "thd"
        self.transformer = provider
        self._check_architecture()

    def _check_architecture(self) -> None:
        """The bridge read the architecture from the HF config; gdnctl's own sizes must agree with it (a mismatch
        would mean the FLOP counts, memory estimate and weight names describe another model)."""
        arch, t = self.config.model, self.transformer
        expected = {
            "num_layers": arch.num_layers,
            "hidden_size": arch.hidden_size,
            "num_attention_heads": arch.num_attention_heads,
            "num_query_groups": arch.num_key_value_heads,
            "linear_num_value_heads": arch.linear_num_value_heads,
            "linear_num_key_heads": arch.linear_num_key_heads,
        }
        if arch.is_moe:
            expected.update(num_moe_experts=arch.num_experts, moe_router_topk=arch.num_experts_per_tok)
        wrong = {
            name: (getattr(t, name, None), value) for name, value in expected.items() if getattr(t, name, None) != value
        }
        if wrong:
            described = ", ".join(f"{name} {got} (gdnctl: {want})" for name, (got, want) in wrong.items())
            raise ModelBuildError(
                f"megatron-bridge read another architecture from the HF config: {described}; "
                "set runtime.transformer_engine: none to use gdnctl's TE-free builder."
            )

    def build(self, *, pre_process: bool, post_process: bool):
        with self._non_te_linears_built():
            model = self.transformer.provide(pre_process=pre_process, post_process=post_process).cuda()
        self._unfuse_non_te_linears(model)
        if self.config.kernels.attention == "torch":
            from gdnctl.runtime.model.core_attention import replace_core_attention

            replace_core_attention(model)
        return model

    def add_lora(self, model):
        """Freeze the built, loaded model and wrap its targeted linears in megatron-bridge's LoRA (train.lora),
        before DDP and the optimizer are built (lora_wrap.py says why); returns what trains on this rank. The
        adapters' own linears are Megatron-Core's non-TE ones, so they are built and unfused as the output
        layer is (wgrad_fusion.py)."""
        from gdnctl.runtime.model.lora_wrap import apply_lora

        assert self.config.train.lora is not None
        with self._non_te_linears_built():
            trained = apply_lora(model, self.config.train.lora)
        self._unfuse_non_te_linears(model)
        return trained

    def _fuses_without_apex(self) -> bool:
        from gdnctl.runtime.model import wgrad_fusion

        return self.config.speed.wgrad_fusion and not wgrad_fusion.apex_fused_wgrad_available()

    def _non_te_linears_built(self):
        """While Megatron-Core's non-TE linears are built: its APEX check passes when gdnctl fuses without APEX."""
        from gdnctl.runtime.model import wgrad_fusion

        return wgrad_fusion.building_with_wgrad_fusion() if self._fuses_without_apex() else contextlib.nullcontext()

    def _unfuse_non_te_linears(self, model) -> None:
        from gdnctl.runtime.model import wgrad_fusion

        if self._fuses_without_apex():
            wgrad_fusion.unfuse_non_te_linears(model)

    # --- HF weights ---------------------------------------------------------------------------------------
    def load(self, model, directory: Path) -> int:
        """Load an HF checkpoint (text-only or vision-language names) into this rank's shards; returns the number
        of HF tensors the checkpoint offered the text model."""
        source = _CheckpointSource(directory, self.bridge.hf_pretrained)
        self.bridge._model_bridge.load_weights_hf_to_megatron(source, [_unwrapped(model)])
        return len(source.state.source.get_all_keys())

    def export(self, model) -> Iterator[tuple[str, torch.Tensor]]:
        """Every HF tensor of the text model, gathered over the parallel groups (collective: all ranks iterate;
        every rank receives every tensor, on the CPU)."""
        yield from as_stored_in_hf(
            self.config.model, self.bridge.export_hf_weights([_unwrapped(model)], cpu=True, show_progress=False)
        )

    def export_adapters(self, model) -> Iterator[tuple[str, torch.Tensor]]:
        """The LoRA adapters alone, in HF names (`<weight>.lora_A.weight` / `.lora_B.weight`), gathered over the
        parallel groups onto the CPU (collective: all ranks iterate; megatron-bridge 0.6.2
        models/conversion/auto_bridge.py export_adapter_weights, lines 782-811)."""
        yield from self.bridge.export_adapter_weights([_unwrapped(model)], cpu=True, show_progress=False)

    def hf_tensors(self, model) -> Iterator[tuple[str, torch.Tensor]]:
        """Every HF tensor of the text model on this rank's GPU (collective: every rank receives every tensor)."""
        yield from as_stored_in_hf(
            self.config.model, self.bridge.export_hf_weights([_unwrapped(model)], cpu=False, show_progress=False)
        )

    def save(self, model, directory: Path, source, *, durable: bool = True) -> checkpoint.Files:
        """An HF checkpoint of the model in `directory`, shaped like `source` (passthrough.py; collective, rank 0
        writes). Returns the files written."""
        import torch.distributed as dist

        writer = (
            checkpoint.ShardWriter(directory, source, durable=durable, shard_bytes=SHARD_BYTES)
            if dist.get_rank() == 0
            else None
        )
        for name, tensor in self.export(model):
            if writer is not None:
                writer.add(name, tensor)
        return writer.close() if writer is not None else {}


def as_stored_in_hf(arch, tensors: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The bridge's export as HF stores it: without `lm_head.weight` when the embeddings are tied (megatron-bridge
    0.6.2 yields the tied output layer under that name too; measured on an H100: the checkpoint of a tied source
    gained an `lm_head.weight` its source never had), and the vocabulary rows without the TP padding (the bridge
    exports the padded rows as they are)."""
    for name, tensor in tensors:
        if arch.tie_word_embeddings and name == "lm_head.weight":
            continue
        if name in VOCAB_ROWS and tensor.shape[0] > arch.vocab_size:
            tensor = tensor[: arch.vocab_size]
        yield name, tensor


def _unwrapped(model):
    return getattr(model, "module", model)  # under Megatron's DDP wrapper


class _CheckpointSource:
    """What the bridge's loader reads an HF checkpoint through (`.config`, `.state.source`,
    `.model_name_or_path`), with vision-language names seen as text-model names."""

    def __init__(self, directory: Path, pretrained) -> None:
        from megatron.bridge.models.hf_pretrained.state import StateDict

        self.model_name_or_path = str(directory)
        self.config = pretrained if not hasattr(pretrained, "config") else pretrained.config
        self.state = StateDict(_renamed_source(directory))


def _renamed_source(directory: Path):
    from megatron.bridge.models.hf_pretrained.state import SafeTensorsStateSource

    class TextModelSource(SafeTensorsStateSource):
        """The checkpoint's safetensors, `model.language_model.*` read as `model.*`; the vision tower and the MTP
        head, which the text model does not have, are not offered."""

        def get_all_keys(self) -> list[str]:
            return sorted(self._stored_names())

        def load_tensors(self, keys: list[str]) -> dict[str, torch.Tensor]:
            names = self._stored_names()
            stored = {names[key]: key for key in keys}
            return {stored[name]: tensor for name, tensor in super().load_tensors(list(stored)).items()}

        def _stored_names(self) -> dict[str, str]:
            """text-model name -> the name stored in the checkpoint (computed once)."""
            if getattr(self, "_names", None) is None:
                self._names = {}
                for key in super().get_all_keys():
                    if key.startswith(("model.visual.", "mtp.", "model.mtp.")):
                        continue
                    text = TEXT_PREFIX + key[len(VL_LANGUAGE_PREFIX) :] if key.startswith(VL_LANGUAGE_PREFIX) else key
                    self._names[text] = key
            return self._names

    return TextModelSource(str(directory))
