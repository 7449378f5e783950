"""The resolved run: a valid preset joined with the facts the rules reason about.

Model architecture (catalog or checkpoint), the GPU's capabilities, the software stack the job will run
on, and the values the compiler derives (dp, layout, sequence parallel, GPU split between trainer and
rollout). Rules are pure functions of this object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from gdnctl.knowledge import DEFAULT_STACK, GPUS, GpuSpec, ModelArch, ModelNotFound, RankShape, catalog, per_rank_shapes
from gdnctl.plan import decisions as decide
from gdnctl.plan.speed import cuda_graphs_blocker, cutlass_grouped_gemm_blocker, speed_environment, speed_options
from gdnctl.schema import Preset


@dataclass(frozen=True)
class Run:
    preset: Preset
    model: ModelArch
    gpu: GpuSpec
    stack: dict[str, str | None]  # package -> version, None when not installed / unknown
    # model.path is the cluster's and not on this machine: `model` is the catalog's architecture of model.id
    # (checkpoint_on_cluster), which LCH008 says.
    model_path_on_cluster: bool = False

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
    def rollout_engines(self) -> decide.Decision:
        return decide.rollout_engines(self.preset, self.total_gpus)

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
    def packing(self) -> decide.Decision:
        return decide.packing(self.preset, self.stack)

    @cached_property
    def model_builder(self) -> decide.Decision:
        return decide.model_builder(self.stack)

    @cached_property
    def torch_compile(self) -> decide.Decision:
        return decide.torch_compile(self.preset, self.stack, self.gpu)

    @cached_property
    def attention(self) -> decide.Decision:
        return decide.attention(self.preset, self.model, self.stack)

    @cached_property
    def cuda_graphs_blocker(self) -> str | None:
        """Why the layers' CUDA graphs cannot be captured here (plan/speed.py), or None."""
        return cuda_graphs_blocker(self.preset, self.model, self.stack)

    @cached_property
    def cutlass_grouped_gemm_blocker(self) -> str | None:
        """Why Transformer Engine would not take its CUTLASS grouped GEMM here (plan/speed.py), or None."""
        return cutlass_grouped_gemm_blocker(self.preset, self.model, self.stack)

    @cached_property
    def speed(self) -> dict[str, decide.Decision]:
        """The trainer's speed options (plan/speed.py)."""
        return speed_options(self.preset, self.model, self.stack, self.dp)

    @cached_property
    def environment(self) -> list[tuple[str, str, str]]:
        """(name, value, reason) of every variable the launch scripts set before the user's own `launch.env`."""
        return decide.environment(self.preset, self.gpu) + speed_environment(self.speed, self.model, self.stack)

    def kernel_cache_environment(self, kernel_cache_dir: str) -> list[tuple[str, str, str]]:
        """(name, value, reason) of the compiler caches under the kernel cache directory; an rl job's rollout
        engines keep theirs there too."""
        return decide.kernel_cache_env(kernel_cache_dir, rollout=self.preset.job == "rl")

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
    def lora_targets(self) -> decide.Decision:
        return decide.lora_targets(self.preset, self.model)

    @cached_property
    def lora_expert_adapters(self) -> decide.Decision:
        """train.lora.expert_adapters resolved: "shared" or "per_expert" (None without train.lora)."""
        return decide.lora_expert_adapters(self.preset)

    @cached_property
    def weight_export(self) -> decide.Decision:
        return decide.weight_export(self.preset, self.stack, self.gpu)

    @cached_property
    def save_interval(self) -> decide.Decision:
        return decide.save_interval(self.preset)

    @cached_property
    def rl_rows(self) -> decide.Decision:
        return decide.rl_rows(self.preset)

    @cached_property
    def importance_weight(self) -> decide.Decision:
        return decide.importance_weight(self.preset)

    @cached_property
    def engine_restarts(self) -> decide.Decision:
        return decide.engine_restarts(self.preset)

    def gdn_rank_shapes(self) -> list[RankShape]:
        """The GDN kernel shapes one rank of this job calls (what doctor --kernels and prewarm run)."""
        p, t = self.preset.parallel, self.preset.train
        return per_rank_shapes(
            self.model,
            tp=p.tp,
            cp=p.cp,
            seq_length=t.seq_length,
            micro_batch_size=t.micro_batch_size,
            layout=self.layout.value,
        )


def resolve_stack(preset: Preset) -> dict[str, str | None]:
    stack = dict(DEFAULT_STACK)
    for name, value in preset.runtime.model_dump().items():
        if value is not None:
            stack[name] = None if value == "none" else value
    return stack


def checkpoint_on_cluster(preset: Preset) -> bool:
    """Whether model.path names a checkpoint on the Slurm cluster rather than on this machine: it does not exist
    here, the job is submitted with sbatch (so the path is read where the job runs), and model.id names a catalog
    model, whose architecture the checks then use instead of the checkpoint's config.json. A preset for a cluster
    is written and launched from a laptop that has no copy of the checkpoint."""
    m = preset.model
    return (
        m.path is not None
        and m.id is not None
        and preset.launch.executor == "slurm"
        and catalog.in_catalog(m.id)
        and not os.path.exists(os.path.expanduser(m.path))
    )


def _missing_path(preset: Preset) -> ModelNotFound:
    """model.path is not on this machine and the catalog cannot stand in for it (checkpoint_on_cluster): why, and
    the fix for this preset's executor and model.id."""
    m = preset.model
    said = (
        f"model.path {m.path} does not exist on this machine, so gdnctl cannot read the model's architecture "
        "from its config.json"
    )
    cluster_fix = (
        "so the checks use the catalog's architecture and the job reads model.path on the cluster; or "
        "run gdnctl where the checkpoint is."
    )
    if preset.launch.executor == "local":
        return ModelNotFound(
            f"{said}, and the local executor runs the job here.",
            "Point model.path at the checkpoint directory on this machine; or, for a checkpoint on "
            "a Slurm cluster, launch with --slurm (launch.executor: slurm) and set model.id to its "
            "catalog id.",
        )
    if m.id is None:
        return ModelNotFound(
            f"{said}, and model.id is unset.",
            f"Set model.id to the catalog id of the checkpoint's architecture "
            f"({', '.join(catalog.catalog_ids())}), {cluster_fix}",
        )
    return ModelNotFound(
        f"{said}, and model.id '{m.id}' is not in gdnctl's catalog.{catalog.did_you_mean(m.id)}",
        f"Set model.id to the catalog id of the checkpoint's architecture "
        f"({', '.join(catalog.catalog_ids())}), {cluster_fix}",
    )


def resolve_model(preset: Preset, on_cluster: bool = False) -> ModelArch:
    """model.path's config.json (fields it lacks from model.id's catalog entry), else model.id's catalog entry.
    `on_cluster` (checkpoint_on_cluster): model.id's catalog entry, carrying model.path for the job to load on the
    cluster. Raises catalog.ModelNotFound with a sentence when neither the id nor the path can be used."""
    m = preset.model
    if m.path is not None and on_cluster:
        assert m.id is not None
        return catalog.from_catalog(m.id).model_copy(update={"path": m.path})
    if m.path is not None:
        if not os.path.exists(os.path.expanduser(m.path)):
            raise _missing_path(preset)
        return catalog.from_checkpoint(m.path, fallback_id=m.id)
    assert m.id is not None
    return catalog.from_catalog(m.id)


def resolve(preset: Preset) -> Run:
    on_cluster = checkpoint_on_cluster(preset)
    return Run(
        preset=preset,
        model=resolve_model(preset, on_cluster),
        gpu=GPUS[preset.cluster.gpu],
        stack=resolve_stack(preset),
        model_path_on_cluster=on_cluster,
    )
