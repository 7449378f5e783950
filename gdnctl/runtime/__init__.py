"""What the rendered scripts run on the cluster (`python -m gdnctl.runtime --config engine.yaml`).

Imports only gdnctl's base, knowledge and schema layers; torch and the GPU stack are imported by the
subpackages that need them, when they are used:

- kernels: the GDN kernel switch (FLA / FlashQLA), its fp32 reference and warm-up timing
- comm: the communication memory guard and its profile
- data: documents, packing (THD) and padding (BSHD), data-parallel sharding
- model: the Megatron-Core model, HF weights in and out, checkpoints
- train: the sft / pretrain trainer
- rl: the GRPO job, its rollout server, weight sync and the two policies
"""

__all__ = ["comm", "data", "kernels", "model", "rl", "train"]
