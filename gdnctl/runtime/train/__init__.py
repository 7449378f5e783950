"""The sft / pretrain trainer on Megatron-Core: start-up order, GDN warm-up, steps, metrics, checkpoints."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {"Trainer": "trainer", "ADAM_BETAS": "trainer", "CLIP_GRAD": "trainer", "WEIGHT_DECAY": "trainer",
    "run_training": "trainer"}
__all__ = ["ADAM_BETAS", "CLIP_GRAD", "Trainer", "WEIGHT_DECAY", "run_training", "trainer"]
__getattr__ = lazy_attributes(__name__, _HOMES)
