"""The rl job: GRPO steps that alternate vLLM rollouts and policy updates, with a weight sync after each.

One step, for the step's prompts (train.global_batch_size / n_samples_per_prompt of them, from the seeded
PromptSchedule):

    rank 0: rollout server generates n samples per prompt -> grpo.reward per sample (a shipped rule, the user's
            function in worker processes, or a reward server; each engine's samples submitted as they arrive:
            runtime/rl/rewards) -> group-normalised advantages
            (rollout.environment: n multi-turn episodes per prompt instead, each ending with the environment's
            reward: runtime/rl/rollout/episodes.py)
    every rank: its share of the samples, in mini-batches of micro-batches -> clipped policy loss (+ KL) against
            the sampling policy's log-probs -> grpo.mini_batches x grpo.epochs optimizer steps (runtime/rl/updates)
    rank 0: HF weights -> rollout server reloads them -> per-parameter checksums compared (weight_sync)

Rank 0 owns the rollout server: it spawns it with rollout.python (or, when the Slurm script started it as its
own step, GDNCTL_ROLLOUT=external, finds it through the run dir). A server that dies or stops answering within
rollout.timeout_s fails the job with a sentence; checkpoints are only marked `latest` once complete, so the last
good one stays what a restart resumes from.
"""

from __future__ import annotations

import os
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
from gdnctl.runtime.rl.algorithm import Sample, check_step0_gap, grpo, updates
from gdnctl.runtime.rl.evaluation import HeldOutEval
from gdnctl.runtime.rl.policy import Policy, make_policy
from gdnctl.runtime.rl.prompts import PromptSchedule, check_prompts, describe, load_chat_template, load_prompts
from gdnctl.runtime.rl.rewards import StepRewards, make_scorer
from gdnctl.runtime.rl.rollout import EXTERNAL, ROLLOUT_ENV, Episodes, RolloutEngines, rollout_dir
from gdnctl.runtime.rl.rollout import server as rollout_server
from gdnctl.runtime.rl.weights import broadcast, buckets, cuda_ipc
from gdnctl.runtime.rl.weights import sync as weight_sync
from gdnctl.runtime.train import MetricsLog, NonFiniteGuard, StepVerdict, eta_text, lr_of, mfu, progress
from gdnctl.schema import EngineConfig

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
            + (f" | turns {self.extra['episode_turns']:.2f}" if "episode_turns" in self.extra else "")
            + (f" | reward failures {self.extra['reward_failures']:g}" if self.extra.get("reward_failures") else "")
        )

    def row(self) -> dict:
        """The metrics row: every field, with `extra`'s numbers beside them."""
        values = asdict(self)
        values.update(values.pop("extra"))
        return values


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
        # The weight-sync probe: the dataset's first prompt, which both sides score after every sync.
        self.probe = self.encoded[records[0].line][:PROBE_TOKENS]
        if len(self.probe) < 2:
            raise RlSetupError(
                f"{train.data_path}:{records[0].line}: the first prompt encodes to fewer than two "
                "tokens; the weight-sync probe scores it, so make it a sentence."
            )
        # Rank 0 scores: grpo.reward's worker pool starts (its import checked) or its server is asked once, here,
        # before the policy takes a GPU. An environment scores its own episodes.
        self.scorer = make_scorer(config.grpo.reward) if self.rank == 0 and self.episodes is None else None
        self.evaluation = None  # every rank: the engines' drivers generate the held-out samples, rank 0 scores them
        if config.eval is not None:
            self.evaluation = HeldOutEval(
                config,
                self._encode_record,
                self._log,
                scorer=self.scorer,
                episodes=self.episodes,
                prompt_text=lambda record: self._prompt_text(record.prompt, record.line),
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
        # < 0.27), for the in-memory sync; the disk export names them through the policy's own source.
        self.rollout_names = checkpoint.rollout_source(config.model, rollout.vision_language_class)
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
        self.first_minute = FirstMinuteWatch(config, self._log)
        self.nonfinite = NonFiniteGuard(train.skip_nonfinite_steps)
        self.reported: list[RlStepStats] = []  # rank 0: every step's stats (the smoke run's verdicts read them)

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
            replies = self.engines.start(str(self.weights_dir))
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
        transport = self.config.rollout.weight_transport
        if self.engines.started and transport == "cuda_ipc":
            return self._sync_in_memory(step)
        if self.engines.started and transport == "broadcast":
            return self._sync_broadcast(step)
        written, probe = self.policy.export(self.weights_dir), self.policy.probe_logprobs(self.probe)
        if self.engines.gathers:
            dist.barrier()  # drivers on other nodes read the directory rank 0 wrote
        if not self.engines.started:
            self._start_engines()
        with progress(f"step {step}: the rollout reloads the weights", self._log if step == self.first_step else None):
            replies = self.engines.request("load_weights", path=str(self.weights_dir), probe=self.probe)
        if replies is None:
            return None
        return self._check(replies, weight_sync.checksums_by_name(written.items()), probe, step, "disk")

    def _sync_in_memory(self, step: int) -> tuple[weight_sync.SyncCheck, float] | None:
        """Every rank shares its GPU's copy of the HF weights bucket by bucket (weights/cuda_ipc.py); rank 0 has the
        rollout load each bucket before any rank frees it."""
        probe = self.policy.probe_logprobs(self.probe)
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
        replies = self.engines.request("reload_end", probe=self.probe)
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
        probe = self.policy.probe_logprobs(self.probe)
        names = self._rollout_named_tensors()
        if self.rank != 0:
            for _ in names:  # the builders gather each tensor collectively
                pass
            return None
        if self.weight_group is None:
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
        replies = self.engines.request("reload_end", probe=self.probe)
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
    def rollout(self, step: int) -> tuple[list[Sample], float, int, dict] | None:
        """Every rank (the engines' drivers generate); rank 0 gets the step's samples with rewards and advantages,
        the generation seconds (the slowest engine's) and tokens, and colocated on GPUs, the GPU memory in use
        while vLLM was awake and what its sleep then gave back (engine 0's GPUs)."""
        config, rollout = self.config, self.config.rollout
        records = self.schedule.batch(step).records
        prompts = [self.encoded[record.line] for record in records]
        sampling = {
            "max_tokens": rollout.max_response_tokens,
            "temperature": rollout.temperature,
            "seed": config.train.seed + step * rollout.prompts_per_step,
            "stop_token_ids": self.stop_token_ids,
        }
        if self.episodes is not None:
            return self._episodes(step, records, sampling)
        scoring = self._step_rewards(step, records, "train.data_path", timeline=True) if self.rank == 0 else None
        reply = self.engines.generate(
            prompts,
            n=rollout.n_samples_per_prompt,
            **sampling,
            on_samples=None if scoring is None else scoring.answered,
        )
        slept = self.engines.request("sleep") if self.sleeps else None
        if reply is None:
            return None
        scores, extra = scoring.finish(reply["samples"])
        drawn = [
            (group, prompt, output)
            for group, (prompt, outputs) in enumerate(zip(prompts, reply["samples"], strict=True))
            for output in outputs
        ]
        samples = [
            Sample(
                group, tuple(prompt), tuple(output["tokens"]), tuple(output["logprobs"]), output["finish_reason"], score
            )
            for (group, prompt, output), score in zip(drawn, scores, strict=True)
        ]
        return self._advantaged(samples, reply["seconds"], reply["gpu_used_bytes"], reply["engines"], slept, extra)

    def _episodes(self, step: int, records, sampling: dict) -> tuple[list[Sample], float, int, dict] | None:
        """rollout.environment: every prompt's n episodes through the engines (rollout/episodes.py)."""
        rollout = self.config.rollout
        ran = self.episodes.run(
            records,
            n=rollout.n_samples_per_prompt,
            generate=self.engines.generate,
            share=self._share,
            leader=self.rank == 0,
            dataset="train.data_path",
            **sampling,
        )
        slept = self.engines.request("sleep") if self.sleeps else None
        if ran is None:
            return None
        samples, seconds, extra = ran
        return self._advantaged(samples, seconds, None, self.engines.count, slept, extra)

    def _share(self, value):
        """Rank 0's `value` on every rank (the episodes' next prompts)."""
        if dist.get_world_size() == 1:
            return value
        payload = [value]
        dist.broadcast_object_list(payload, src=0)
        return payload[0]

    def _step_rewards(self, step: int, records, dataset: str, *, timeline: bool) -> StepRewards:
        """Rank 0: a batch's samples through grpo.reward's scorer, submitted as each engine's answer arrives."""
        return StepRewards(
            self.scorer,
            self.config.grpo.reward,
            decode=self.tokenizer.decode,
            records=records,
            prompt_texts=[self._prompt_text(record.prompt, record.line) for record in records],
            dataset=dataset,
            log=self._log,
            logs_dir=self.run_dir / "logs",
            step=step + 1,
            timeline=timeline,
        )

    def _advantaged(
        self, samples: list[Sample], seconds: float, gpu_used: int | None, engines: int, slept, extra: dict
    ) -> tuple[list[Sample], float, int, dict]:
        """Rank 0: the samples with their advantages, the generation seconds, the tokens the model generated, and
        the step's other numbers."""
        config, rollout = self.config, self.config.rollout
        rewards = torch.tensor([s.reward for s in samples])
        advantages = grpo.group_advantages(
            rewards, rollout.n_samples_per_prompt, normalize_std=config.grpo.normalize_std
        )
        samples = [Sample(**{**asdict(s), "advantage": float(a)}) for s, a in zip(samples, advantages, strict=True)]
        # The model's tokens: a multi-turn sample's environment tokens were not generated.
        generated = sum(len(s.response) if s.loss_mask is None else sum(s.loss_mask) for s in samples)
        phases: dict = {}
        if slept is not None and gpu_used is not None:
            phases["gpu_used_gib_rollout"] = gpu_used / 2**30
        if slept is not None:
            phases["sleep_freed_gib"] = slept[0]["freed_bytes"] / 2**30
        phases["rollout_engines"] = engines
        phases["extra"] = _flat(extra)
        return samples, seconds, generated, phases

    def _encode_record(self, record) -> list[int]:
        """A record's prompt tokens (an environment's opening, with one); its text is kept for the reward."""
        if self.episodes is not None:
            return self.episodes.opening(record, f"{self.config.train.data_path}:{record.line}")[2]
        return self._encode(record.prompt, record.line)

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
        while self.step < total:
            payload = [self.rollout(self.step)]
            dist.broadcast_object_list(payload, src=0)
            samples, rollout_seconds, generated, phases = payload[0]
            started = time.perf_counter()
            lr = lr_of(config.train, self.step)
            stats = self._update(samples, lr)
            self._check_finite(stats)
            train_seconds = time.perf_counter() - started
            if self.sleeps:  # every process's use of the GPU while vLLM sleeps and the trainer steps
                free, capacity = torch.cuda.mem_get_info()
                phases["gpu_used_gib_train"] = (capacity - free) / 2**30
            if self.step == 0:  # a fresh run's first step: a resumed run starts past it
                check_step0_gap(stats["rollout_logprob_abs_diff"], config.rollout.max_step0_logprob_gap)
            self.step += 1
            began = time.perf_counter()
            synced = self.sync(self.step)
            sync_seconds = time.perf_counter() - began
            if synced is not None:
                result, probe_gap = synced
                rewards = torch.tensor([s.reward for s in samples])
                tflops = self._train_tflops(stats["tokens"], len(samples), train_seconds)
                self._report(
                    RlStepStats(
                        step=self.step,
                        reward_mean=float(rewards.mean()),
                        reward_std=float(rewards.std(correction=0)),
                        response_length=generated / len(samples),
                        rollout_tokens_per_second=generated / max(rollout_seconds, 1e-9),
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
                        peak_memory_gib=(
                            torch.cuda.max_memory_allocated() / 2**30 if config.device == "cuda" else None
                        ),
                        gdn_backend=config.kernels.gdn_backend if config.device == "cuda" else "torch (cpu)",
                        weight_transport=self.last_sync["weight_transport"],
                        wake_seconds=self.last_sync["wake_seconds"],
                        **phases,
                    )
                )
            if self.evaluation is not None and self.evaluation.due(self.step):  # every rank: a collective
                self._evaluate()
            self.first_minute.after_step()
            interval = config.train.save_interval
            if self.save_dir and (self.step == total or (interval and self.step % interval == 0)):
                self.policy.save(self.save_dir, self.step)
                self._log(f"saved {self.save_dir / checkpoint.checkpoint_name(self.step)}")

    def _update(self, samples: list[Sample], lr: float) -> dict[str, float]:
        """This data-parallel rank's share of the step's updates at `lr` (grpo.mini_batches x grpo.epochs optimizer
        steps, runtime/rl/algorithm/updates.py); returns the step's stats."""
        return updates.update(
            self.policy, samples, self.config, lr=lr, pad_id=self.pad_id, row_multiple=self.row_multiple
        )

    def _evaluate(self) -> None:
        """The held-out prompts through the rollout's engines, on the weights just synced; rank 0 writes the
        `eval_reward` row."""
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

    def _check_finite(self, stats: dict) -> None:
        """Stop (or, within train.skip_nonfinite_steps, log and go on) after a step whose loss or gradients were not
        finite; the policy did not apply it. Every rank takes the same branch (the policy's checks are reduced)."""
        records = self.schedule.batch(self.step).records
        lines = ", ".join(str(record.line) for record in records[:8]) + (
            f" and {len(records) - 8} more" if len(records) > 8 else ""
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
