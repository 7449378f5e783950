"""The rl job: GRPO steps whose rollouts stream from vLLM engines while the policy updates, with a checked weight
sync after each update.

One step s (train.global_batch_size / n_samples_per_prompt prompts from the seeded PromptSchedule):

    rank 0: the rollout feed (runtime/rl/feed.py) has sent step s's prompts to the engines, one request per sample,
            once weight version s - rollout.max_staleness was on them; each sample is scored the moment it
            finishes (grpo.reward: a shipped rule, the user's function in worker processes, or a reward server,
            one call per sample: runtime/rl/rewards), and the step's batch is whole when every group is (dynamic
            sampling may draw more) -> group-normalised advantages
            (rollout.environment: n multi-turn episodes per prompt instead, each ending with the environment's
            reward, through the collective generate after the step before it: runtime/rl/rollout/episodes.py)
    every rank: its share of the samples, in mini-batches of micro-batches -> clipped policy loss (+ KL) against
            the policy's own log-probs at the start of the update, weighted by the importance of the engine's
            (always off-policy) -> grpo.mini_batches x grpo.epochs optimizer steps (algorithm/updates.py)
    rank 0: HF weights -> every engine reloads them (version s + 1) -> per-parameter checksums and the probe
            compared (weights/sync.py); steps up to s + 1 + max_staleness are opened

With max_staleness 0 this is the on-policy loop: step s + 1's rollout starts after step s's sync. With N >= 1 the
next N steps' rollouts run on the engines (their own GPUs) while the trainer trains.

Rank 0 owns the rollout's servers: it spawns them with rollout.python (or, when the Slurm script started them as
its own step, GDNCTL_ROLLOUT=external, finds them through the run dir), and a stream on a thread of its own
(rollout/stream.py) sends the requests, collects the samples, and starts an engine that dies or stops making
progress again, up to rollout.max_engine_restarts. A server that fails otherwise, or does not answer a start or
sync within rollout.timeout_s, fails the job with a sentence; checkpoints are only marked `latest` once complete,
so the last good one stays what a restart resumes from.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.knowledge import flops
from gdnctl.runtime.checks import FirstMinuteWatch, verdicts
from gdnctl.runtime.data import load_tokenizer, sequence_padding_multiple
from gdnctl.runtime.model import checkpoint, hold_save_dir
from gdnctl.runtime.rl.algorithm import PromptPixels, Sample, StepStats, check_step0_gap, grpo, updates
from gdnctl.runtime.rl.evaluation import HeldOutEval
from gdnctl.runtime.rl.feed import ReadyBatch, RolloutFeed
from gdnctl.runtime.rl.policy import Policy, make_policy
from gdnctl.runtime.rl.prompts import (
    ImagePrompt,
    ImagePrompts,
    PromptSchedule,
    check_prompts,
    describe,
    engine_ids,
    load_chat_template,
    load_prompts,
    probe_prefix,
)
from gdnctl.runtime.rl.rewards import StepRewards, make_scorer
from gdnctl.runtime.rl.rollout import EXTERNAL, ROLLOUT_ENV, Episodes, RolloutEngines, RolloutStream, rollout_dir
from gdnctl.runtime.rl.rollout import server as rollout_server
from gdnctl.runtime.rl.weights import broadcast, buckets, cuda_ipc
from gdnctl.runtime.rl.weights import sync as weight_sync
from gdnctl.runtime.train import MetricsLog, NonFiniteGuard, StepVerdict, eta_text, lr_of, mfu, progress
from gdnctl.schema import EngineConfig, image_data

# Tokens of the weight-sync probe: enough for a mean log-prob gap to be stable, cheap to score on both sides.
PROBE_TOKENS = 64


class RlSetupError(GdnctlError):
    """The rl job cannot start with this engine config or data."""


@dataclass
class RlStepStats:
    step: int
    reward_mean: float
    reward_std: float
    response_length: float
    rollout_tokens_per_second: float
    train_tokens_per_second: float
    rollout_seconds: float
    train_seconds: float
    sync_seconds: float
    loss: float
    grad_norm: float
    rollout_logprob_abs_diff: float
    kl: float | None
    # PPO over the rollout batch (runtime/rl/algorithm/updates.py): optimizer steps applied, the share of response
    # tokens the ratio clip cut, the k3 KL between the sampling policy and the updated one, and the ratio's extremes.
    updates: int
    clip_fraction: float
    approx_kl: float
    ratio_min: float
    ratio_max: float
    synced_parameters: int  # rollout parameters whose checksums matched the trainer's
    probe_logprob_abs_diff: float  # rollout vs trainer on the probe sequence, after the sync
    lr: float
    tflops_per_gpu: float  # the policy update's model FLOPs
    mfu: float | None  # against the GPU's dense bf16 peak; None on CPU
    peak_memory_gib: float | None  # the trainer's GPU memory; None on CPU
    gdn_backend: str
    weight_transport: str = "disk"  # how this step's weights reached the rollout: disk, cuda_ipc or broadcast
    rollout_engines: int = 1  # the vLLM engines that generated this step's samples, each with its share of prompts
    # grpo.rollout_correction: the mean truncated importance weight and the share of tokens its cap cut.
    tis_mean: float | None = None
    tis_capped_fraction: float | None = None
    # Colocated on GPUs (None elsewhere): what vLLM's sleep gave back after the rollout, the seconds its wake-up
    # took in the sync, and the GPU's used memory (every process) while vLLM was awake and while it slept.
    sleep_freed_gib: float | None = None
    wake_seconds: float | None = None
    gpu_used_gib_rollout: float | None = None
    gpu_used_gib_train: float | None = None
    # The step's timeline, seconds since the job started (its rows' `time` is the wall clock): when its rollout's
    # first requests went out and its last sample came back, and when the trainer trained on it and synced.
    rollout_began_s: float = 0.0
    rollout_ended_s: float = 0.0
    train_began_s: float = 0.0
    train_ended_s: float = 0.0
    sync_began_s: float = 0.0
    sync_ended_s: float = 0.0
    wait_seconds: float = 0.0  # the trainer waiting for this step's batch
    rollout_busy_s: float | None = None  # the engines' time with requests in flight since the job started
    # Sampling: generation rounds, groups dynamic sampling dropped (and kept without loss to fill the batch), samples
    # regenerated for the staleness bound, samples cut at max_response_tokens and samples taking no loss.
    sampling_rounds: int = 1
    dropped_groups: int = 0
    filler_groups: int = 0
    stale_regenerated: int = 0
    truncated_samples: int = 0
    masked_samples: int = 0
    overlong_penalty: float = 0.0
    # Off-policy: weight versions the trained samples lag the policy (by their oldest token), and samples a weight
    # update stopped and continued (rollout.partial).
    staleness_mean: float = 0.0
    staleness_max: int = 0
    continued_samples: int = 0
    engine_restarts: int = 0  # over the job so far
    prompts_digest: str = ""  # the trained prompts' lines, hashed: which batch this step trained
    images: int = 0  # images in the step's rows (train.images), each through the vision tower on both sides
    # A reward function's or server's numbers (rewards/scoring.py), an environment's (rollout/episodes.py), and the
    # extra ones either returned as reward/NAME: merged into the metrics row; none for a shipped reward.
    extra: dict[str, float] = field(default_factory=dict)

    def line(self, total: int, eta: str) -> str:
        return (
            f"step {self.step}/{total} | {eta} | reward {self.reward_mean:.3f} +- {self.reward_std:.3f} | "
            f"response {self.response_length:.1f} tok | rollout {self.rollout_tokens_per_second:,.0f} tok/s | "
            f"train {self.train_tokens_per_second:,.0f} tok/s | sync {self.sync_seconds:.2f} s | "
            f"loss {self.loss:.4f} | grad norm {self.grad_norm:.3f} | "
            f"|logp train-rollout| {self.rollout_logprob_abs_diff:.4f} | lr {self.lr:.2e}"
            + (f" | clip {self.clip_fraction:.3f}" if self.updates > 1 else "")
            + (f" | kl {self.kl:.4f}" if self.kl is not None else "")
            + (f" | stale {self.staleness_mean:.2f}" if self.staleness_max else "")
            + (f" | dropped {self.dropped_groups} in {self.sampling_rounds} rounds" if self.dropped_groups else "")
            + (f" | engine restarts {self.engine_restarts}" if self.engine_restarts else "")
            + (f" | turns {self.extra['episode_turns']:.2f}" if "episode_turns" in self.extra else "")
            + (f" | reward failures {self.extra['reward_failures']:g}" if self.extra.get("reward_failures") else "")
        )

    def row(self) -> dict:
        """The metrics row: every field, with `extra`'s numbers beside them."""
        values = asdict(self)
        values.update(values.pop("extra"))
        return values


def prompts_digest(lines: tuple[int, ...]) -> str:
    """12 hex digits naming a batch by its prompts' lines in order (two steps trained the same batch iff equal)."""
    return hashlib.sha256(",".join(map(str, lines)).encode()).hexdigest()[:12]


def engine_start_steps(config: EngineConfig) -> str:
    """What vLLM's engine start does, for its progress line: given a fixed KV cache (kv_cache_memory_bytes, which
    the rollout server passes for rollout.kv_cache_gib and always on vLLM's CPU build) it skips the memory
    profiling that sizes the cache."""
    if "kv_cache_memory_bytes" in rollout_server.engine_kwargs(config, model=""):
        return "loads the weights, then allocates a fixed KV cache"
    return "loads the weights, then profiles memory to size the KV cache"


class RlJob:
    def __init__(self, config: EngineConfig, config_path: Path, comm_policy) -> None:
        self.config = config
        self.run_dir = config_path.parent
        self.config_path = config_path
        self.rank = dist.get_rank()
        train, rollout = config.train, config.rollout
        self.tokenizer = load_tokenizer(train.tokenizer_path)
        self.chat_template = load_chat_template(train.tokenizer_path)
        self.stop_token_ids = [] if self.tokenizer.eos_id is None else [self.tokenizer.eos_id]
        self.pad_id = self.tokenizer.eos_id if self.tokenizer.eos_id is not None else 0
        # rollout.environment: the user's class starts every episode (loaded here, before any GPU is used).
        self.episodes = (
            Episodes(config, self.tokenizer, self.chat_template, self.stop_token_ids) if rollout.environment else None
        )
        self.prompt_texts: dict = {}  # a prompt (its messages as tuples) -> its text as the model is given it
        # train.images: records with images are encoded with them (prompts/images.py), their line -> its images.
        self.image_prompts = (
            ImagePrompts(config.model.vision, image_data.ImageLimits(**train.images.model_dump()))
            if train.images is not None
            else None
        )
        self.images: dict[int, ImagePrompt] = {}
        self.eval_images: dict[int, ImagePrompt] = {}  # eval.data_path's
        checked = check_prompts(
            load_prompts(train.data_path, **needed_fields(config)),
            self._encode_record,
            max_model_len=rollout.max_model_len,
            max_response_tokens=rollout.max_response_tokens,
            refuse=rollout.overlong_prompts == "refuse",
            where=str(train.data_path),
        )
        if checked.dropped:
            self._log(
                describe(
                    checked.dropped,
                    len(checked.records) + len(checked.dropped),
                    str(train.data_path),
                    checked.limit,
                    rollout.max_model_len,
                    rollout.max_response_tokens,
                )
                + "; they are left out (rollout.overlong_prompts: refuse stops instead)"
            )
        records = list(checked.records)
        self.encoded = checked.encoded  # line -> token ids: every prompt is encoded once, here
        self.schedule = PromptSchedule(records, rollout.prompts_per_step, seed=train.seed)
        # The weight-sync probe: the dataset's first prompt (its first with images, when it has any, so that the
        # probe goes through the vision tower too), which both sides score after every sync.
        self._set_probe(next((record for record in records if record.line in self.images), records[0]))
        # Rank 0 scores: grpo.reward's worker pool starts (its import checked) or its server is asked once, here,
        # before the policy takes a GPU. An environment scores its own episodes.
        self.scorer = make_scorer(config.grpo.reward) if self.rank == 0 and self.episodes is None else None
        self.evaluation = None  # every rank: the engines' drivers generate the held-out samples, rank 0 scores them
        if config.eval is not None:
            self.evaluation = HeldOutEval(
                config,
                lambda record: self._encode_record(record, self.eval_images, config.eval.data_path),
                self._log,
                scorer=self.scorer,
                episodes=self.episodes,
                prompt_text=lambda record: self._prompt_text(record.prompt, record.line),
                images=self.eval_images,
            )
        self.save_dir = Path(train.save_dir) if train.save_dir else None
        # One running job per checkpoint directory (rank 0 holds the lock until the job's process ends).
        self.save_lock = hold_save_dir(self.save_dir, self.run_dir) if self.save_dir and self.rank == 0 else None
        self.policy: Policy = make_policy(config, config_path, comm_policy)
        self.step = self.policy.step
        if self.step:
            self._log(f"resumed from {self.save_dir / checkpoint.checkpoint_name(self.step)} at step {self.step}")
        self.row_multiple = sequence_padding_multiple(config.parallel, config.train.precision)
        self.metrics = MetricsLog(config, self.run_dir, enabled=self.rank == 0, group="rl")
        self.metrics.resumed_at(self.step)
        self.started = time.perf_counter()
        self.first_step = self.step  # steps before this one were taken by an earlier start (resume)
        self.weights_dir = rollout_dir(self.run_dir) / "weights"  # what the rollout reloads after every step
        # The rollout's names for the trainer's HF tensors (the vision-language class's, for Qwen3.5 on vLLM
        # < 0.27 or image prompts), for the in-memory sync; the disk export names them through the policy's own source.
        self.rollout_names = checkpoint.rollout_source(
            config.model, rollout.vision_language_class, images=train.images is not None
        )
        self.sleeps = rollout.sleep_between_phases
        self.last_sync: dict = {}  # the last sync's transport and wake-up seconds, for the step's stats
        self.engines = RolloutEngines(config, config_path)
        if rollout.weight_transport == "broadcast" and self.engines.gathers:
            # Colocated broadcast is a CPU path (NCCL refuses it on shared GPUs), where one node is the rule.
            raise RlSetupError(
                "rollout.weight_sync: broadcast with colocated engines on several nodes: trainer rank "
                "0 must drive every engine it broadcasts to; set rollout.weight_sync: disk."
            )
        self.weight_group: broadcast.TrainerEnd | None = None  # rank 0, once the first broadcast sync built it
        self._group_restarts = 0  # engine restarts when the weight group formed: one more rebuilds it
        self.first_minute = FirstMinuteWatch(config, self._log)
        self.nonfinite = NonFiniteGuard(train.skip_nonfinite_steps)
        self.reported: list[RlStepStats] = []  # rank 0: every step's stats (the smoke run's verdicts read them)
        self.clock = time.monotonic()  # the timeline's zero
        self.dir_version = -1  # the weight version the weights directory holds (what a restarted engine starts on)
        # Rank 0: the requests to the engines (a stream on its own thread where rank 0 drives every engine; else
        # each round through the collective generate, whose requests collect in `_outbox`) and the feed that opens
        # steps and scores their samples.
        self._outbox: list = []
        self.stream: RolloutStream | None = None
        self.feed: RolloutFeed | None = None
        # Held while a sample is scored on the stream's thread and while the held-out evaluation (which shares the
        # scorer) runs on the loop's.
        self.score_lock = threading.Lock()
        if self.rank == 0 and self.episodes is None:  # an environment's episodes go through the collective generate
            self.feed = RolloutFeed(
                config,
                self.schedule,
                self.encoded,
                self._scoring,
                self._outbox.extend if self.engines.gathers else self._stream_submit,
                stop_token_ids=self.stop_token_ids,
                first_step=self.step,
                score_lock=self.score_lock,
                images=self.images,
            )

    def _set_probe(self, record) -> None:
        """The probe: the record's first PROBE_TOKENS tokens (an image prompt's through its first image at least,
        and never into an image's tokens), as the trainer scores it and as the engines get it."""
        image = self.images.get(record.line)
        self.probe_pixels: PromptPixels | None = None
        if image is None:
            self.probe = self.encoded[record.line][:PROBE_TOKENS]
            self.probe_request: dict = {"probe": self.probe}
        else:
            vision = self.config.model.vision
            prefix = probe_prefix(image, PROBE_TOKENS, vision)
            self.probe = prefix.token_ids
            self.probe_pixels = PromptPixels(prefix.pixel_values, prefix.image_grid_thw)
            self.probe_request = {
                "probe": engine_ids(prefix.token_ids, vision.image_token_id),
                "probe_images": list(prefix.images),
            }
        if len(self.probe) < 2:
            raise RlSetupError(
                f"{self.config.train.data_path}:{record.line}: the first prompt encodes to fewer than two "
                "tokens; the weight-sync probe scores it, so make it a sentence."
            )

    def _stream_submit(self, outgoing: list) -> None:
        self.stream.submit(outgoing)

    # --- rollout server ------------------------------------------------------------------------------------
    def start_rollout(self) -> tuple[weight_sync.SyncCheck, float] | None:
        """The first sync: it starts (or finds) the rollout server, builds its engine on the policy's weights and
        checks one reload before the first step, so a naming mismatch fails here, not after a rollout. Returns
        rank 0's checksum comparison and probe gap (None on the other ranks)."""
        synced = self.sync(self.step)
        if synced is not None:
            checked, gap = synced
            unchecked = verdicts.unchecked_parameters(checked.checked, checked.total)
            self._log(
                f"weight sync checked: {checked.checked} of {checked.total} parameters match{unchecked}; "
                f"probe log-probs within {gap:.4f} nats/token"
            )
        if self.feed is not None and not self.engines.gathers:
            rollout = self.config.rollout
            self.stream = RolloutStream(
                self.engines,
                on_finished=self.feed.on_finished,
                weights=lambda: (str(self.weights_dir), self.dir_version),
                max_restarts=rollout.max_engine_restarts,
                stall_timeout_s=rollout.stall_timeout_s,
                log=self._log,
            )
            self.stream.start(self.step)
        return synced

    def _start_engines(self) -> None:
        """Every rank: the drivers start their engines (or find the launch script's) on the weights dir."""
        self._log_sync_path()
        rollout = self.config.rollout
        if rollout.colocate:
            where = "colocated with the trainer"
        elif self.engines.external:
            where = "the Slurm script's rollout step, on nodes of its own"
        else:
            where = "beside the trainer"
        self._log(f"rollout engines: {self.engines.count} of rollout.tp {rollout.tp} ({where})")
        with progress(
            f"starting the rollout's vLLM engine{'s' if self.engines.count > 1 else ''} "
            f"({engine_start_steps(self.config)})",
            self._log,
        ):
            replies = self.engines.start(str(self.weights_dir), version=self.step)
        if replies is not None:
            self._log(
                f"rollout engine{'s' if len(replies) > 1 else ''} up in "
                f"{max(reply['seconds'] for reply in replies):.1f} s"
            )

    def _log_sync_path(self) -> None:
        """Once, at start: what writes the weights the rollout reloads (explain's weight_sync line says the same,
        from plan/decisions.weight_export)."""
        if self.config.device == "cpu":
            path = "transformers' state dict of the device-cpu policy"
        elif self.config.train.model_builder == "megatron-bridge":
            path = "megatron-bridge export_hf_weights (the TE-built model's HF names are the bridge's)"
        else:
            path = "gdnctl's HF name rules for the TE-free model"
        self._log(f"weight sync: {path}")

    def sync(self, step: int) -> tuple[weight_sync.SyncCheck, float] | None:
        """Every rank: hand the weights over and score the probe; every engine loads them, and rank 0 checks each
        one's checksums and probe (the first time, the engines start on them: always from the directory, which an
        engine's start-up reads). Returns rank 0's checksum comparison and probe gap (None on the other ranks)."""
        if self.sleeps:
            # The trainer's activations and cached blocks go back to the GPU before vLLM wakes into its share.
            torch.cuda.empty_cache()
            dist.barrier()
        if self.stream is not None and not self.config.rollout.partial:
            # The update waits for the requests in flight to finish on the old weights (each sample is one version's),
            # watched by the stream for progress rather than held to one deadline inside the reload request.
            self.stream.drain()
        with self.engines.lock:  # the rollout stream waits while the engines take the weights
            synced = self._sync(step)
        if self.stream is not None:
            self.stream.synced(step)
        return synced

    def _sync(self, step: int) -> tuple[weight_sync.SyncCheck, float] | None:
        transport = self.config.rollout.weight_transport
        if self.engines.started and transport == "cuda_ipc":
            return self._sync_in_memory(step)
        if self.engines.started and transport == "broadcast":
            return self._sync_broadcast(step)
        written, probe = self.policy.export(self.weights_dir), self.policy.probe_logprobs(self.probe, self.probe_pixels)
        self.dir_version = step
        if self.engines.gathers:
            dist.barrier()  # drivers on other nodes read the directory rank 0 wrote
        if not self.engines.started:
            self._start_engines()
        with progress(f"step {step}: the rollout reloads the weights", self._log if step == self.first_step else None):
            replies = self.engines.request(
                "load_weights", path=str(self.weights_dir), version=step, **self.probe_request
            )
        if replies is None:
            return None
        return self._check(replies, weight_sync.checksums_by_name(written.items()), probe, step, "disk")

    def _sync_in_memory(self, step: int) -> tuple[weight_sync.SyncCheck, float] | None:
        """Every rank shares its GPU's copy of the HF weights bucket by bucket (weights/cuda_ipc.py); rank 0 has the
        rollout load each bucket before any rank frees it."""
        probe = self.policy.probe_logprobs(self.probe, self.probe_pixels)
        checksums: weight_sync.Checksums = {}
        self.engines.request("reload_begin")
        uuid = cuda_ipc.device_uuid()
        names = self._rollout_named_tensors()
        for bucket in cuda_ipc.buckets(names):
            shared: list = [None] * dist.get_world_size()
            dist.all_gather_object(shared, (uuid, cuda_ipc.share(bucket.buffer)))
            if self.rank == 0:
                checksums.update(weight_sync.checksums_by_name(bucket.tensors()))
            # One handle per GPU (ranks on the same GPU hold the same weights): every engine's workers map
            # their own GPUs' handles.
            self.engines.request("ipc_bucket", shared=dict(shared), entries=bucket.wire_entries())
            dist.barrier()  # no rank frees its bucket before the rollout has copied it out
            del bucket
        replies = self.engines.request("reload_end", version=step, **self.probe_request)
        if replies is None:
            return None
        return self._check(replies, checksums, probe, step, "cuda_ipc")

    def _rollout_named_tensors(self):
        """The policy's HF tensors under the rollout's names (collective: every rank iterates them all)."""
        return ((self.rollout_names.stored_name(name), tensor) for name, tensor in self.policy.hf_tensors())

    def _sync_broadcast(self, step: int) -> tuple[weight_sync.SyncCheck, float] | None:
        """Rank 0 broadcasts every HF tensor to every engine's workers, bucket by bucket, over the weight group
        (weights/broadcast.py); the other ranks only take part in gathering the tensors. Rank 0 drives every engine
        here: the broadcast serves separate rollouts, and colocated ones only on CPU, on one node."""
        probe = self.policy.probe_logprobs(self.probe, self.probe_pixels)
        names = self._rollout_named_tensors()
        if self.rank != 0:
            for _ in names:  # the builders gather each tensor collectively
                pass
            return None
        if self.weight_group is not None and self.engines.restarted != self._group_restarts:
            # A restarted engine's workers are not in the group: every worker joins a new one.
            self.weight_group.close()
            self.weight_group = None
        if self.weight_group is None:
            self._group_restarts = self.engines.restarted
            self.weight_group = self._join_weight_group()
        checksums: weight_sync.Checksums = {}
        self.engines.request("reload_begin")
        for bucket in buckets.buckets(names):
            checksums.update(weight_sync.checksums_by_name(bucket.tensors()))
            # The workers wait in the broadcast while rank 0 sends it; the answers come once they loaded it.
            self.engines.send("broadcast_bucket", nbytes=bucket.buffer.numel(), entries=bucket.wire_entries())
            self.weight_group.send(bucket, check=lambda: self.engines.check("broadcast_bucket"))
            self.engines.answer("broadcast_bucket")
            del bucket
        replies = self.engines.request("reload_end", version=step, **self.probe_request)
        return self._check(replies, checksums, probe, step, "broadcast")

    def _join_weight_group(self) -> broadcast.TrainerEnd:
        """Rank 0, on the first broadcast sync: build the weight group with every worker of every engine (engine
        k's workers from group rank 1 + k * rollout.tp)."""
        rollout = self.config.rollout
        device = (
            torch.device("cuda", torch.cuda.current_device()) if self.config.device == "cuda" else torch.device("cpu")
        )
        end = broadcast.TrainerEnd(
            os.environ.get(ROLLOUT_ENV) != EXTERNAL,
            workers=self.engines.count * rollout.tp,
            device=device,
            timeout_s=rollout.timeout_s,
        )
        fields = end.join_fields()
        for engine, client in self.engines.clients.items():
            client.send("group_join", **fields, first_rank=1 + engine * rollout.tp)
        end.join(check=lambda: self.engines.check("group_join"))
        replies = self.engines.answer("group_join")
        workers = sum(len(reply["ranks"]) for reply in replies)
        self._log(
            f"weight group up: trainer rank 0 and {workers} rollout worker(s) of {len(replies)} engine(s) "
            f"over {end.backend} ({end.host}:{fields['port']})"
        )
        return end

    def _check(
        self, replies: list[dict], checksums: weight_sync.Checksums, probe: list[float], step: int, transport: str
    ) -> tuple[weight_sync.SyncCheck, float]:
        """Rank 0: every engine's checksums and its log-probs on the probe must match the trainer's."""
        result, gap = weight_sync.check_engines(replies, checksums, probe, step, self.config.rollout.probe_tolerance)
        wake = [reply["wake_seconds"] for reply in replies if reply.get("wake_seconds") is not None]
        self.last_sync = {"weight_transport": transport, "wake_seconds": max(wake) if wake else None}
        return result, gap

    # --- one step --------------------------------------------------------------------------------------------
    def _next_batch(self, step: int) -> tuple[ReadyBatch, float]:
        """Every rank: step `step`'s batch and the seconds the trainer waited for it. Rank 0 waits for the feed (the
        other ranks for rank 0); a restarted engine behind the current weights has them synced again first."""
        began = time.monotonic()
        if self.episodes is not None:
            return self._episode_batch(step), time.monotonic() - began
        if self.engines.gathers:
            return self._collective_batch(step), time.monotonic() - began
        while True:
            payload = [self.feed.wait(step, healthy=self._stream_healthy) if self.rank == 0 else None]
            dist.broadcast_object_list(payload, src=0)
            if payload[0] is not None:
                return payload[0], time.monotonic() - began
            self.sync(self.step)  # the weights of this step again, for the engine that restarted behind them

    def _stream_healthy(self) -> bool:
        self.stream.check()
        return not self.stream.behind

    def _collective_batch(self, step: int) -> ReadyBatch:
        """Colocated engines on several nodes: each round's requests through the collective generate (every driver
        its engines' share), the results scored by the feed on rank 0, until the batch is whole."""
        rollout = self.config.rollout
        while True:
            outgoing = []
            if self.rank == 0 and not self.feed.ready(step):
                self.feed.take_outgoing(step)
                outgoing, self._outbox[:] = list(self._outbox), []
            payload = [[o.request for o in outgoing] if self.rank == 0 else None]
            dist.broadcast_object_list(payload, src=0)
            requests = payload[0]
            if not requests:
                break
            reply = self.engines.generate(
                [r["prompt"] for r in requests],
                n=1,
                max_tokens=rollout.max_response_tokens,
                temperature=rollout.temperature,
                seeds=[[r["seed"]] for r in requests],
                stop_token_ids=self.stop_token_ids,
                images=[r.get("images") for r in requests] if self.images else None,
            )
            if self.rank == 0:
                for item, (result,) in zip(outgoing, reply["samples"], strict=True):
                    self.feed.on_finished(item.key, result)
        payload = [self.feed.take(step) if self.rank == 0 else None]
        dist.broadcast_object_list(payload, src=0)
        return payload[0]

    def _episode_batch(self, step: int) -> ReadyBatch:
        """rollout.environment: every prompt's n episodes through the engines (rollout/episodes.py), on every rank (the
        engines' drivers generate), after the sync that ended the step before: on-policy (validate's RLT019)."""
        config, rollout = self.config, self.config.rollout
        records = self.schedule.batch(step).records
        began = time.monotonic()
        ran = self.episodes.run(
            records,
            n=rollout.n_samples_per_prompt,
            generate=self.engines.generate,
            share=self._share,
            leader=self.rank == 0,
            dataset="train.data_path",
            max_tokens=rollout.max_response_tokens,
            temperature=rollout.temperature,
            seed=config.train.seed + step * rollout.prompts_per_step,
            stop_token_ids=self.stop_token_ids,
        )
        payload: list = [None]
        if ran is not None:  # rank 0
            samples, _, extra = ran
            rewards = torch.tensor([s.reward for s in samples])
            advantages = grpo.group_advantages(
                rewards, rollout.n_samples_per_prompt, normalize_std=config.grpo.normalize_std
            )
            samples = [Sample(**{**asdict(s), "advantage": float(a)}) for s, a in zip(samples, advantages, strict=True)]
            payload[0] = ReadyBatch(
                samples=samples,
                stats=StepStats(
                    rounds=1,
                    dropped_groups=0,
                    filler_groups=0,
                    stale_regenerated=0,
                    prompt_lines=tuple(record.line for record in records),
                ),
                reward_mean=float(rewards.mean()),
                reward_std=float(rewards.std(correction=0)),
                # The model's tokens: a multi-turn sample's environment tokens were not generated.
                generated_tokens=sum(len(s.response) if s.loss_mask is None else sum(s.loss_mask) for s in samples),
                began=began,
                ended=time.monotonic(),
                truncated=sum(s.finish_reason == "length" for s in samples),
                masked=0,
                overlong_penalty=0.0,
                staleness_mean=0.0,
                staleness_max=0,
                continued=0,
                extra=extra,
            )
        dist.broadcast_object_list(payload, src=0)
        return payload[0]

    def _share(self, value):
        """Rank 0's `value` on every rank (the episodes' next prompts)."""
        if dist.get_world_size() == 1:
            return value
        payload = [value]
        dist.broadcast_object_list(payload, src=0)
        return payload[0]

    def _scoring(self, step: int, record_of) -> StepRewards:
        """Rank 0: step `step`'s samples through grpo.reward's scorer, one `score` call per sample as it finishes
        (the feed's); record_of(slot) is the record of the step's prompt in that slot."""
        return StepRewards(
            self.scorer,
            self.config.grpo.reward,
            decode=self.tokenizer.decode,
            records=_Slots(record_of),
            prompt_texts=_Slots(lambda slot: self._prompt_text(record_of(slot).prompt, record_of(slot).line)),
            dataset="train.data_path",
            log=self._log,
            logs_dir=self.run_dir / "logs",
            step=step + 1,
            timeline=True,
        )

    def _encode_record(self, record, images: dict | None = None, data_path: str | None = None) -> list[int]:
        """A record's prompt tokens (an environment's opening, with one); its text is kept for the reward. An image
        prompt's images go to `images` by its line (train.data_path's: self.images, unless `data_path` says
        otherwise)."""
        if self.episodes is not None:
            return self.episodes.opening(record, f"{self.config.train.data_path}:{record.line}")[2]
        if self.image_prompts is not None and image_data.has_images(record.fields):
            data_path = data_path or self.config.train.data_path
            return self._encode_images(record, self.images if images is None else images, Path(data_path))
        return self._encode(record.prompt, record.line)

    def _encode_images(self, record, images: dict, data_path: Path) -> list[int]:
        """An image prompt's tokens, its images' expanded (prompts/images.py); its images are kept by its line."""
        where = f"{data_path}:{record.line}"
        try:
            image = self.image_prompts.encode(
                self._prompt_text(record.prompt, record.line),
                record.fields["images"],
                self.tokenizer.encode,
                where,
                data_path.parent,
            )
        except image_data.ImageDataError as error:
            raise RlSetupError(
                f"{error}; fix the record or raise the limit in train.images (docs/images.md)."
            ) from None
        images[record.line] = image
        return image.token_ids

    def _prompt_text(self, prompt, line: int) -> str:
        """A string prompt is used verbatim; a chat goes through the tokenizer's chat template, ending with the
        assistant's turn opened (add_generation_prompt), once per distinct chat."""
        if isinstance(prompt, str):
            return prompt
        key = tuple((message["role"], message["content"]) for message in prompt)
        if key not in self.prompt_texts:
            if self.chat_template is None:
                raise RlSetupError(
                    f"{self.config.train.data_path}:{line} is a chat prompt, but the tokenizer at "
                    f"{self.config.train.tokenizer_path} has no chat template (chat_template in "
                    "tokenizer_config.json, or chat_template.jinja); add one, or give prompts as "
                    "strings with the template applied."
                )
            self.prompt_texts[key] = self.chat_template.render([dict(message) for message in prompt])
        return self.prompt_texts[key]

    def _encode(self, prompt, line: int) -> list[int]:
        ids = self.tokenizer.encode(self._prompt_text(prompt, line))
        if not ids:
            raise RlSetupError(f"{self.config.train.data_path}:{line}: the prompt encodes to no tokens.")
        return ids

    def train(self) -> None:
        config = self.config
        total = config.train.train_iters
        if self.feed is not None:
            self.feed.open_through(self.step)
        while self.step < total:
            ready, waited = self._next_batch(self.step)
            samples = ready.samples
            phases: dict = {"rollout_engines": self.engines.count}
            if self.sleeps:  # nothing is in flight: on-policy (RLT019), and the step's batch is whole
                slept = self.engines.request("sleep")
                if slept is not None:
                    phases["gpu_used_gib_rollout"] = slept[0]["used_bytes"] / 2**30
                    phases["sleep_freed_gib"] = slept[0]["freed_bytes"] / 2**30
            started = time.perf_counter()
            train_began = time.monotonic()
            lr = lr_of(config.train, self.step)
            stats = self._update(samples, lr)
            self._check_finite(stats, ready.stats.prompt_lines)
            train_seconds = time.perf_counter() - started
            train_ended = time.monotonic()
            if self.sleeps:  # every process's use of the GPU while vLLM sleeps and the trainer steps
                free, capacity = torch.cuda.mem_get_info()
                phases["gpu_used_gib_train"] = (capacity - free) / 2**30
            if self.step == 0:  # a fresh run's first step: a resumed run starts past it
                check_step0_gap(stats["rollout_logprob_abs_diff"], config.rollout.max_step0_logprob_gap)
            self.step += 1
            began = time.perf_counter()
            sync_began = time.monotonic()
            synced = self.sync(self.step)
            sync_seconds = time.perf_counter() - began
            sync_ended = time.monotonic()
            if self.feed is not None:
                self.feed.open_through(self.step)
            if synced is not None:
                self._report(
                    self._stats(
                        ready,
                        stats,
                        synced,
                        phases,
                        lr=lr,
                        waited=waited,
                        train_seconds=train_seconds,
                        sync_seconds=sync_seconds,
                        train=(train_began, train_ended),
                        sync=(sync_began, sync_ended),
                    )
                )
            if self.evaluation is not None and self.evaluation.due(self.step):  # every rank: a collective
                self._evaluate()
            self.first_minute.after_step()
            interval = config.train.save_interval
            if self.save_dir and (self.step == total or (interval and self.step % interval == 0)):
                self.policy.save(self.save_dir, self.step)
                self._log(f"saved {self.save_dir / checkpoint.checkpoint_name(self.step)}")

    def _stats(
        self,
        ready: ReadyBatch,
        stats: dict,
        synced: tuple[weight_sync.SyncCheck, float],
        phases: dict,
        *,
        lr: float,
        waited: float,
        train_seconds: float,
        sync_seconds: float,
        train: tuple[float, float],
        sync: tuple[float, float],
    ) -> RlStepStats:
        """Rank 0: the step's metrics row."""
        config, samples = self.config, ready.samples
        result, probe_gap = synced
        rollout_seconds = ready.ended - ready.began
        tflops = self._train_tflops(stats["tokens"], len(samples), train_seconds)
        since = self.clock
        return RlStepStats(
            step=self.step,
            reward_mean=ready.reward_mean,
            reward_std=ready.reward_std,
            response_length=sum(len(s.response) for s in samples) / len(samples),
            rollout_tokens_per_second=ready.generated_tokens / max(rollout_seconds, 1e-9),
            train_tokens_per_second=stats["tokens"] / max(train_seconds, 1e-9),
            rollout_seconds=rollout_seconds,
            train_seconds=train_seconds,
            sync_seconds=sync_seconds,
            loss=stats["loss"],
            grad_norm=stats["grad_norm"],
            rollout_logprob_abs_diff=stats["rollout_logprob_abs_diff"],
            kl=stats.get("kl"),
            updates=stats["updates"],
            clip_fraction=stats["clip_fraction"],
            approx_kl=stats["approx_kl"],
            ratio_min=stats["ratio_min"],
            ratio_max=stats["ratio_max"],
            tis_mean=stats.get("tis_mean"),
            tis_capped_fraction=stats.get("tis_capped_fraction"),
            synced_parameters=result.checked,
            probe_logprob_abs_diff=probe_gap,
            lr=lr,
            tflops_per_gpu=tflops,
            mfu=mfu(tflops, config.metrics.peak_bf16_tflops),
            peak_memory_gib=(torch.cuda.max_memory_allocated() / 2**30 if config.device == "cuda" else None),
            gdn_backend=config.kernels.gdn_backend if config.device == "cuda" else "torch (cpu)",
            weight_transport=self.last_sync["weight_transport"],
            wake_seconds=self.last_sync["wake_seconds"],
            rollout_began_s=ready.began - since,
            rollout_ended_s=ready.ended - since,
            train_began_s=train[0] - since,
            train_ended_s=train[1] - since,
            sync_began_s=sync[0] - since,
            sync_ended_s=sync[1] - since,
            wait_seconds=waited,
            rollout_busy_s=self.stream.busy() if self.stream is not None else None,
            sampling_rounds=ready.stats.rounds,
            dropped_groups=ready.stats.dropped_groups,
            filler_groups=ready.stats.filler_groups,
            stale_regenerated=ready.stats.stale_regenerated,
            truncated_samples=ready.truncated,
            masked_samples=ready.masked,
            overlong_penalty=ready.overlong_penalty,
            staleness_mean=ready.staleness_mean,
            staleness_max=ready.staleness_max,
            continued_samples=ready.continued,
            engine_restarts=self.stream.restarts if self.stream is not None else 0,
            prompts_digest=prompts_digest(ready.stats.prompt_lines),
            images=sum(len(s.images.image_grid_thw) for s in samples if s.images is not None),
            extra=_flat(ready.extra),
            **phases,
        )

    def _update(self, samples: list[Sample], lr: float) -> dict[str, float]:
        """This data-parallel rank's share of the step's updates at `lr` (grpo.mini_batches x grpo.epochs optimizer
        steps, runtime/rl/algorithm/updates.py); returns the step's stats."""
        return updates.update(
            self.policy, samples, self.config, lr=lr, pad_id=self.pad_id, row_multiple=self.row_multiple
        )

    def _evaluate(self) -> None:
        """The held-out prompts through the rollout's engines, on the weights just synced; rank 0 writes the
        `eval_reward` row."""
        with self.score_lock:  # the scorer is the training's, which the stream's thread may be using
            row = self.evaluation.run(
                self.engines.generate,
                self.tokenizer,
                self.stop_token_ids,
                self.step,
                share=self._share,
                leader=self.rank == 0,
            )
        if row is None:
            return
        self._log(
            f"eval at step {self.step}: reward {row['eval_reward']:.3f}, pass@{row['eval_k']} "
            f"{row['eval_pass_at_k']:.3f} on {row['eval_prompts']} held-out prompts "
            f"({row['eval_seconds']:.1f} s)"
        )
        self.metrics.log(self.step, row)

    def _check_finite(self, stats: dict, prompt_lines: tuple[int, ...]) -> None:
        """Stop (or, within train.skip_nonfinite_steps, log and go on) after a step whose loss or gradients were not
        finite; the policy did not apply it. Every rank takes the same branch (the policy's checks are reduced)."""
        lines = ", ".join(str(line) for line in prompt_lines[:8]) + (
            f" and {len(prompt_lines) - 8} more" if len(prompt_lines) > 8 else ""
        )
        line = self.nonfinite.after_step(
            StepVerdict(
                step=self.step + 1,
                applied=stats["applied"],
                loss_finite=stats["loss_finite"],
                grad_finite=stats["grad_finite"],
                inputs=f"the rollouts of the prompts at lines {lines} of train.data_path",
                bad_parameters=stats["bad_parameters"],
                parameter_count=stats["parameter_count"],
            )
        )
        if line is not None:
            self._log(line)

    def _train_tflops(self, tokens: int, sequences: int, seconds: float) -> float:
        """Model TFLOP/s per GPU of the policy update (all ranks' tokens; `tokens` is the global count)."""
        per_token = flops.train_flops_per_token(self.config.model, tokens / max(sequences, 1))
        return per_token * tokens / max(seconds, 1e-9) / dist.get_world_size() / 1e12

    # --- logs -------------------------------------------------------------------------------------------
    def close(self, failed: bool = False) -> None:
        """failed: the job is stopping on an error, so the rollout's servers are stopped at once."""
        if self.stream is not None:
            self.stream.stop()
        if self.weight_group is not None:
            self.weight_group.close()
        if self.scorer is not None:
            self.scorer.close()
        self.engines.close(failed=failed)
        self.metrics.close()

    def _report(self, stats: RlStepStats) -> None:
        total = self.config.train.train_iters
        pace = (time.perf_counter() - self.started) / max(stats.step - self.first_step, 1)
        print(stats.line(total, eta_text(stats.step, total, pace)), flush=True)
        self.metrics.log(stats.step, stats.row())
        self.reported.append(stats)

    def _log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[gdnctl rl] {message}", flush=True)


def needed_fields(config: EngineConfig) -> dict[str, bool]:
    """Which fields every dataset line needs: a prompt unless an environment starts the conversation, an answer
    for a shipped reward (the user's function, server or environment reads whatever fields it wants)."""
    environment = config.rollout.environment is not None
    return {"needs_prompt": not environment, "needs_answer": not environment and isinstance(config.grpo.reward, str)}


class _Slots:
    """A step's prompts by slot, looked up as the slots fill (dynamic sampling adds slots as it draws)."""

    def __init__(self, get) -> None:
        self._get = get

    def __getitem__(self, slot: int):
        return self._get(slot)


def _flat(extra: dict) -> dict[str, float]:
    """A scorer's or the episodes' stats as metrics: their extra numbers as reward/NAME."""
    flat = {name: value for name, value in extra.items() if name != "reward_metrics"}
    flat.update({f"reward/{name}": value for name, value in extra.get("reward_metrics", {}).items()})
    return flat


def run(config: EngineConfig, config_path: Path, comm_policy) -> int:
    job = RlJob(config, config_path, comm_policy)
    try:
        job.start_rollout()
        job.train()
    except BaseException:
        job.close(failed=True)
        raise
    job.close()
    return 0
