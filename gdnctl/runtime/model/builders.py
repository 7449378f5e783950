"""The two ways the trainer gets its model, behind one interface: megatron-bridge's provider (Transformer Engine)
and gdnctl's own TE-free spec. The engine config names one (`train.model_builder`, decided from the preset's
`runtime.transformer_engine`); a builder the machine cannot run stops the job with a sentence rather than
quietly switching to the other, because the two do not allow the same settings (context parallel, FP8).

Each builder: `transformer` (the Megatron TransformerConfig the model was built from), `build(pre_process,
post_process)`, `load(model, directory)` (HF checkpoint -> this rank's shards, returns a tensor count) and
`save(model, directory, source, durable=...)` (collective; writes an HF checkpoint shaped like the
`passthrough.HFSource` and returns the files this rank wrote); `add_lora(model)` wraps the loaded model in
train.lora's adapters (megatron-bridge only: TRN016 refuses LoRA with the TE-free builder) and
`export_adapters(model)` yields them in HF names.
"""

from __future__ import annotations

from pathlib import Path

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.model.megatron_config import ModelBuildError
from gdnctl.schema import EngineConfig

BRIDGE = "megatron-bridge"
TE_FREE = "te-free"


class TeFreeModel:
    """gdnctl's TE-free Megatron-Core model (runtime/model/megatron.py) with its own HF name rules."""

    builder = TE_FREE

    def __init__(self, config: EngineConfig) -> None:
        from gdnctl.runtime.model.megatron import transformer_config

        self.config = config
        self.transformer = transformer_config(config)
        self.transformer.variable_seq_lengths = config.layout == "thd"

    def build(self, *, pre_process: bool, post_process: bool):
        from gdnctl.runtime.model.megatron import build_gpt_model

        return build_gpt_model(self.config, self.transformer, pre_process=pre_process, post_process=post_process).cuda()

    def load(self, model, directory: Path) -> int:
        return checkpoint.load_hf(model, self.config.model, self._place(), directory)

    def add_lora(self, model):
        raise ModelBuildError(
            "train.lora needs megatron-bridge's LoRA, which needs Transformer Engine, and the "
            "engine config names gdnctl's TE-free builder; name the trainer's Transformer Engine "
            "in runtime.transformer_engine, or remove train.lora."
        )

    def hf_tensors(self, model):
        """Every HF tensor on this rank's GPU (collective; whole only with pp == ep == 1: checkpoint.iter_hf)."""
        return checkpoint.iter_hf(model, self.config.model, self._place(), self._groups())

    def save(self, model, directory: Path, source, *, durable: bool = True) -> checkpoint.Files:
        return checkpoint.save_hf(
            model, self.config.model, self._place(), self._groups(), directory, source, durable=durable
        )

    def _place(self):
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        from gdnctl.runtime.model.hf_weights import ShardPlace

        return ShardPlace(
            tp_rank=ps.get_tensor_model_parallel_rank(),
            tp_size=ps.get_tensor_model_parallel_world_size(),
            ep_rank=ps.get_expert_model_parallel_rank(),
            ep_size=ps.get_expert_model_parallel_world_size(),
            etp_rank=ps.get_expert_tensor_parallel_rank(),
            etp_size=ps.get_expert_tensor_parallel_world_size(),
            layer_offset=get_transformer_layer_offset(self.transformer),
        )

    @staticmethod
    def _groups() -> checkpoint.Groups:
        from megatron.core import parallel_state as ps

        dense_writer = (
            ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank(with_context_parallel=True) == 0
        )
        expert_writer = ps.get_expert_tensor_parallel_rank() == 0 and ps.get_expert_data_parallel_rank() == 0
        return checkpoint.Groups(
            tp=ps.get_tensor_model_parallel_group(),
            etp=ps.get_expert_tensor_parallel_group(),
            writes_dense=dense_writer,
            writes_experts=expert_writer,
        )


def make_model_builder(config: EngineConfig):
    """The builder the engine config names, or a sentence saying why it cannot run here."""
    if config.train.model_builder == TE_FREE:
        return TeFreeModel(config)
    from gdnctl.runtime.model.bridge import BridgeModel, transformer_engine_available

    missing = transformer_engine_available()
    if missing is not None:
        raise ModelBuildError(
            f"runtime.transformer_engine names a Transformer Engine, so the trainer builds the "
            f"model through megatron-bridge, but {missing}. Install Transformer Engine and "
            "megatron-bridge in the trainer's environment (`gdnctl doctor PRESET` checks it), or "
            "set runtime.transformer_engine: none for gdnctl's TE-free builder (no context "
            "parallel, no FP8)."
        )
    return BridgeModel(config)
