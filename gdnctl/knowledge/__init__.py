"""What gdnctl knows about the world, with sources: the model architectures (catalog and checkpoint config.json)
and their families, GPUs, the software stack's versions and thresholds, sbatch's options, model FLOPs and the GDN
kernel shapes a rank calls, the GDN kernel backends and the LoRA targets.

The bottom layer: plain data and pure functions, importing nothing of gdnctl's but the base modules.
"""

from gdnctl.knowledge import catalog, flops, hardware, lora, model_families, slurm, stack, versions
from gdnctl.knowledge.catalog import (
    HF_CONFIG_KEYS,
    PREPROCESSOR_FILE,
    ROPE_KEYS,
    VISION_CONFIG_KEYS,
    VISION_TOKEN_KEYS,
    ModelNotFound,
    is_vision_language,
)
from gdnctl.knowledge.gdn_backends import (
    DEFAULT_GDN_BACKEND,
    FLA,
    FLASHQLA,
    GDN_BACKENDS,
    KERNEL_DISTRIBUTIONS,
    GdnBackend,
    GdnBackendName,
)
from gdnctl.knowledge.gdn_shapes import RankShape, kernel_heads, per_rank_shapes
from gdnctl.knowledge.hardware import FLASHQLA_FORWARD_ONLY_SMS, FLASHQLA_SMS, GPUS, GpuSpec, sm_label
from gdnctl.knowledge.lora import DEFAULT_TARGETS as DEFAULT_LORA_TARGETS
from gdnctl.knowledge.lora import TARGETS as LORA_TARGETS
from gdnctl.knowledge.lora import LoraTargetName
from gdnctl.knowledge.model_arch import ModelArch, VisionArch
from gdnctl.knowledge.model_families import MODEL_FAMILIES, ModelFamily, family_of
from gdnctl.knowledge.stack import DEFAULT_STACK

__all__ = [
    "DEFAULT_GDN_BACKEND",
    "DEFAULT_LORA_TARGETS",
    "DEFAULT_STACK",
    "FLA",
    "FLASHQLA",
    "FLASHQLA_FORWARD_ONLY_SMS",
    "FLASHQLA_SMS",
    "GDN_BACKENDS",
    "GPUS",
    "HF_CONFIG_KEYS",
    "KERNEL_DISTRIBUTIONS",
    "LORA_TARGETS",
    "MODEL_FAMILIES",
    "PREPROCESSOR_FILE",
    "ROPE_KEYS",
    "VISION_CONFIG_KEYS",
    "VISION_TOKEN_KEYS",
    "VisionArch",
    "GdnBackend",
    "GdnBackendName",
    "GpuSpec",
    "LoraTargetName",
    "ModelArch",
    "ModelFamily",
    "ModelNotFound",
    "RankShape",
    "catalog",
    "family_of",
    "flops",
    "is_vision_language",
    "hardware",
    "kernel_heads",
    "lora",
    "model_families",
    "per_rank_shapes",
    "slurm",
    "sm_label",
    "stack",
    "versions",
]
