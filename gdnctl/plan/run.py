"""The resolved run: a valid preset joined with the facts the rules reason about.

Model architecture (catalog or checkpoint), the GPU's capabilities, the software stack the job will run
on, and the values the compiler derives (dp, layout, sequence parallel, GPU split between trainer and
rollout). Rules are pure functions of this object.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from gdnctl.knowledge import DEFAULT_STACK, GPUS, GpuSpec, ModelArch, RankShape, catalog, per_rank_shapes
from gdnctl.plan import decisions as decide
from gdnctl.plan.speed import speed_options
from gdnctl.schema import Preset


@dataclass(frozen=True)
class Run:
    preset: Preset
    model: ModelArch
    gpu: GpuSpec
    stack: dict[str, str | None]  # package -> version, None when not installed / unknown

    @property
    def is_training(self) -> bool:
        return self.preset.job in ("rl", "sft", "pretrain")

    @property
    def total_gpus(self) -> int:
        return self.preset.cluster.nodes * self.preset.cluster.gpus_per_node

    @cached_property
    def rollout_gpus(self) -> decide.Decision:
        return decide.rollout_gpus(self.preset, self.total_gpus)

    @cached_property
    def world_size(self) -> decide.Decision:
        return decide.train_world_size(self.preset, self.total_gpus)

    @property
    def model_parallel_size(self) -> int:
        p = self.preset.parallel
        return p.tp * p.pp * p.cp

    @property
    def dp(self) -> int | None:
        """Data-parallel size, or None when the world size is empty or not divisible by tp*pp*cp."""
        world = self.world_size.value
        if world < 1 or world % self.model_parallel_size:
            return None
        return world // self.model_parallel_size

    @cached_property
    def layout(self) -> decide.Decision:
        return decide.layout(self.preset, self.stack)

    @cached_property
    def model_builder(self) -> decide.Decision:
        return decide.model_builder(self.stack)

    @cached_property
    def packing(self) -> decide.Decision:
        return decide.packing(self.preset, self.stack)

    @cached_property
    def attention(self) -> decide.Decision:
        return decide.attention(self.preset, self.model, self.stack)

    @cached_property
    def speed(self) -> dict[str, decide.Decision]:
        """The trainer's speed options (plan/speed.py)."""
        return speed_options(self.preset, self.model, self.stack)

    @cached_property
    def rollout_weight_transport(self) -> decide.Decision:
        return decide.rollout_weight_transport(self.preset, self.gpu, self.stack)

    @cached_property
    def rollout_class(self) -> decide.Decision:
        return decide.rollout_class(self.preset, self.model, self.stack)

    @cached_property
    def lr_schedule(self) -> dict[str, decide.Decision]:
        """warmup_steps, decay and min_lr of the lr schedule (decisions.lr_schedule)."""
        return decide.lr_schedule(self.preset)

    @cached_property
    def sequence_parallel(self) -> decide.Decision:
        return decide.sequence_parallel(self.preset)

    @cached_property
    def weight_export(self) -> decide.Decision:
        return decide.weight_export(self.preset, self.stack, self.gpu)

    def gdn_rank_shapes(self) -> list[RankShape]:
        """The GDN kernel shapes one rank of this job calls (what doctor --kernels and prewarm run)."""
        p, t = self.preset.parallel, self.preset.train
        return per_rank_shapes(self.model, tp=p.tp, cp=p.cp, seq_length=t.seq_length,
                               micro_batch_size=t.micro_batch_size, layout=self.layout.value)


def resolve_stack(preset: Preset) -> dict[str, str | None]:
    stack = dict(DEFAULT_STACK)
    for name, value in preset.runtime.model_dump().items():
        if value is not None:
            stack[name] = None if value == "none" else value
    return stack


def resolve_model(preset: Preset) -> ModelArch:
    """Raises catalog.ModelNotFound with a sentence when neither the id nor the path can be used."""
    if preset.model.path is not None:
        return catalog.from_checkpoint(preset.model.path, fallback_id=preset.model.id)
    assert preset.model.id is not None
    return catalog.from_catalog(preset.model.id)


def resolve(preset: Preset) -> Run:
    return Run(preset=preset, model=resolve_model(preset), gpu=GPUS[preset.cluster.gpu],
               stack=resolve_stack(preset))
