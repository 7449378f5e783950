"""The sft / pretrain trainer on Megatron-Core (start-up order, GDN warm-up, steps, checkpoints), the sft job on
device cpu (transformers' vision-language class, images), where every job's per-step metrics go (metrics.jsonl,
TensorBoard, W&B), and every job's lr schedule."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "ADAM_BETAS": "trainer",
    "CLIP_GRAD": "trainer",
    "Trainer": "trainer",
    "WEIGHT_DECAY": "trainer",
    "lr_at": "lr_schedule",
    "lr_of": "lr_schedule",
    "set_lr": "lr_schedule",
    "METRICS_FILE": "metrics",
    "MetricsLog": "metrics",
    "TENSORBOARD_DIR": "metrics",
    "eta_text": "metrics",
    "mfu": "metrics",
    "progress": "metrics",
    "wandb_run_id": "metrics",
    "NonFiniteGuard": "nonfinite",
    "NonFiniteStep": "nonfinite",
    "StepVerdict": "nonfinite",
}
__all__ = [
    "ADAM_BETAS",
    "CLIP_GRAD",
    "METRICS_FILE",
    "MetricsLog",
    "NonFiniteGuard",
    "NonFiniteStep",
    "StepVerdict",
    "TENSORBOARD_DIR",
    "Trainer",
    "WEIGHT_DECAY",
    "cpu_sft",
    "eta_text",
    "lr_at",
    "lr_of",
    "lr_schedule",
    "metrics",
    "mfu",
    "nonfinite",
    "progress",
    "set_lr",
    "trainer",
    "wandb_run_id",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
