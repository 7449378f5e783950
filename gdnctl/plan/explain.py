"""`gdnctl explain`: every derived value with the reason for it, and the memory table."""

from __future__ import annotations

from dataclasses import dataclass

from gdnctl.knowledge import GDN_BACKENDS
from gdnctl.plan import memory
from gdnctl.plan.run import Run
from gdnctl.schema import RewardFunctionSpec, RewardServerSpec


@dataclass(frozen=True)
class Derived:
    name: str
    value: object
    reason: str


def derived_values(run: Run) -> list[Derived]:
    p, t, preset = run.preset.parallel, run.preset.train, run.preset
    m = run.model
    out = [
        Derived(
            "model",
            m.label,
            f"{m.architecture}: {m.num_layers} layers ({m.num_gdn_layers} GDN + "
            f"{m.num_full_attention_layers} full attention), hidden {m.hidden_size}, "
            f"{m.num_attention_heads}/{m.num_key_value_heads} attention/KV heads, GDN "
            f"{m.linear_num_key_heads}/{m.linear_num_value_heads} key/value heads"
            + (f", {m.num_experts} experts top-{m.num_experts_per_tok}" if m.is_moe else ""),
        ),
        Derived("gpu", run.gpu.name, f"{run.gpu.description}, {run.gpu.sm_label}, {run.gpu.memory_gib:g} GiB"),
        Derived("world_size", run.world_size.value, run.world_size.reason),
        Derived("dp", run.dp, f"world_size / (tp x pp x cp) = {run.world_size.value} / ({p.tp} x {p.pp} x {p.cp})"),
        (
            Derived("layout", run.rl_rows.value, run.rl_rows.reason)
            if preset.job == "rl"
            else Derived("layout", run.layout.value, run.layout.reason)
        ),
        *(
            [Derived("packing", run.packing.value, run.packing.reason)]
            if (run.layout.value == "thd" or run.packing.value == "concat") and preset.job in ("sft", "pretrain")
            else []
        ),
        Derived("sequence_parallel", run.sequence_parallel.value, run.sequence_parallel.reason),
    ]
    if run.is_training and run.gpu.sm is not None:  # the CPU jobs build no Megatron model
        out.append(Derived("model_builder", run.model_builder.value, run.model_builder.reason))
    if run.is_training and t.lora is not None:
        out.extend(_lora(run))
    if run.dp:
        out.append(
            Derived(
                "num_microbatches",
                t.global_batch_size // (t.micro_batch_size * run.dp),
                f"global_batch_size / (micro_batch_size x dp) = {t.global_batch_size} / "
                f"({t.micro_batch_size} x {run.dp})",
            )
        )
    if run.is_training:
        out.append(_lr_schedule(run))
        if t.save_dir is not None:
            out.append(Derived("save_interval", run.save_interval.value, run.save_interval.reason))
        if preset.eval is not None:
            out.append(_eval(run))
    if m.is_moe:
        out.append(
            Derived(
                "expert_data_parallel",
                run.world_size.value // (p.ep * p.etp * p.pp) or None,
                "world_size / (etp x ep x pp): the group the experts' optimizer state is sharded over",
            )
        )
    out.append(Derived("gdn_backend", preset.kernels.gdn_backend, GDN_BACKENDS[preset.kernels.gdn_backend].explain))
    if run.is_training and run.gpu.sm is not None:
        out.append(Derived("torch_compile", run.torch_compile.value, run.torch_compile.reason))
        out.append(Derived("attention", run.attention.value, run.attention.reason))
        for name, decision in run.speed.items():
            out.append(Derived(f"speed.{name}", _shown(decision.value), decision.reason))
    comm = preset.comm
    out.append(
        Derived(
            "comm.skip_ops",
            list(comm.effective_skip_ops()),
            (
                "guard off: nothing is checked"
                if not comm.memory_guard
                else "slime PR #1947's skip set"
                if comm.skip_ops is None and not comm.add_skip_ops and not comm.remove_skip_ops
                else "the preset's skip set"
            ),
        )
    )
    if preset.job == "rl":
        out.append(Derived("rollout_gpus", run.rollout_gpus.value, run.rollout_gpus.reason))
        out.append(Derived("rollout_engines", run.rollout_engines.value, run.rollout_engines.reason))
        out.append(Derived("weight_sync", run.weight_export.value, run.weight_export.reason))
        out.append(_reward(run))
        out.extend(_ppo(run))
        if preset.rollout is not None:
            r = preset.rollout
            out.extend(_rollout_flow(run))
            limit = (r.max_model_len or t.seq_length) - r.max_response_tokens
            out.append(
                Derived(
                    "overlong_prompts",
                    r.overlong_prompts,
                    f"every prompt is encoded before step 1; one of more than {limit} tokens (max_model_len "
                    f"- max_response_tokens) is "
                    + (
                        "left out and named in the log"
                        if r.overlong_prompts == "drop"
                        else "refused: the job stops before step 1"
                    ),
                )
            )
        transport = run.rollout_weight_transport
        out.append(Derived("weight_transport", transport.value, transport.reason))
        if preset.rollout is not None and preset.rollout.colocate and run.gpu.sm is not None:
            out.append(
                Derived(
                    "rollout_sleep",
                    "level 2",
                    "colocated: vLLM frees its weights and KV cache while "
                    "the trainer steps, and wakes for the weight sync",
                )
            )
        if m.family.vllm_text_class_since is not None:  # the family has a class to choose
            out.append(Derived("rollout_class", run.rollout_class.value, run.rollout_class.reason))
    for name, value, reason in run.environment:
        out.append(Derived(f"env.{name}", value, reason))
    return out


def _lora(run: Run) -> list[Derived]:
    spec, targets = run.preset.train.lora, run.lora_targets
    assert spec is not None
    expert_adapters = run.lora_expert_adapters
    shared = expert_adapters.value == "shared"
    adapters = memory.count_lora_params(run.model, targets.value, spec.rank, shared)
    base = memory.count_params(run.model).total(run.model, with_mtp=False)
    out = [Derived("lora.targets", list(targets.value), targets.reason)]
    experts = ""
    if run.model.is_moe and "experts" in targets.value:
        out.append(Derived("lora.expert_adapters", expert_adapters.value, expert_adapters.reason))
        owner = "one shared by each layer's routed experts" if shared else "each routed expert its own"
        experts = f", {owner} ({adapters.experts:,} in experts)"
    return out + [
        Derived(
            "lora.adapter_params",
            f"{adapters.total:,}",
            f"rank {spec.rank} x (in + out features) of every wrapped linear{experts}; "
            f"{100 * adapters.total / base:.3f}% of the "
            f"{base / 1e9:.2f}B frozen base, scaled by alpha / rank = {spec.alpha / spec.rank:g}",
        ),
        Derived(
            "lora.checkpoints",
            "adapters and their optimizer state at every save; the merged model at the last",
            "the base is model.path's and does not change, so a save holds adapter/ in the peft layout and each "
            "rank's adapter tensors, and a resume loads model.path again and checks it against the base's "
            "fingerprint the checkpoint recorded; the last step's save also writes base + (alpha / rank)·B·A as "
            "a full HF checkpoint (runtime/model/lora_checkpoint.py)",
        ),
    ]


def _reward(run: Run) -> Derived:
    """What scores the samples, and where the user's code of it runs (docs/rl.md, "Your own task")."""
    rollout, reward = run.preset.rollout, run.preset.grpo.reward
    if rollout is not None and rollout.environment is not None:
        spec = rollout.environment
        return Derived(
            "reward",
            f"the episodes of {spec.class_}",
            f"rollout.environment: at most {spec.max_turns} model turn(s) per episode through the chat template, "
            "the environment's tokens masked out of the loss; each episode's reward is what its step() ends it "
            "with; rank 0 runs the episodes (grpo.reward is not used)",
        )
    if isinstance(reward, RewardFunctionSpec):
        cpu = "no CPU limit" if reward.cpu_seconds is None else f"{reward.cpu_seconds:g} CPU s"
        memory = "no memory limit" if reward.memory_gib is None else f"{reward.memory_gib:g} GiB of address space"
        failed = (
            "stops the job with a sentence"
            if reward.on_error == "stop"
            else f"scores {reward.default_score:g}, counted and logged"
        )
        return Derived(
            "reward",
            reward.function,
            f"in {run.preset.grpo.reward_workers} worker process(es) beside trainer rank 0, each sample as it "
            f"arrives; a call may take {reward.timeout_s:g} s, {cpu} and {memory}; a failed call {failed} "
            "(grpo.reward.on_error)",
        )
    if isinstance(reward, RewardServerSpec):
        return Derived(
            "reward",
            reward.url,
            f"a reward server: POSTs of at most {reward.batch_size} samples, {reward.concurrency} in flight, a "
            f"{reward.timeout_s:g} s connection timeout, each sent again up to {reward.retries} time(s) with "
            "backoff; checked once before step 1",
        )
    return Derived("reward", reward, "a shipped rule (runtime/rl/rewards/shipped.py), run inline on trainer rank 0")


def _ppo(run: Run) -> list[Derived]:
    """How a rollout batch is trained on, and whether the rollout's log-probs correct the loss."""
    g = run.preset.grpo
    steps = g.mini_batches * g.epochs
    out = [
        Derived(
            "ppo_updates",
            f"{steps} optimizer step{'s' if steps > 1 else ''} per rollout step",
            f"grpo.mini_batches {g.mini_batches} x grpo.epochs {g.epochs}: "
            + (
                "one update on the policy that sampled, so the ratio is 1 and the clip never acts"
                if steps == 1
                else "the ratio is against the sampling policy's log-probs, computed once before the first "
                f"update; later updates move off it, so the clip (1 - {g.clip_low:g}, 1 + "
                f"{g.clip_high:g}) acts"
            ),
        )
    ]
    weight = run.importance_weight
    out.append(
        Derived("rollout_correction", f"on, cap {g.rollout_correction_cap:g}" if weight.value else "off", weight.reason)
    )
    rollout = run.preset.rollout
    if rollout is not None:
        t = rollout.temperature
        reason = (
            "trainer and engine score the distribution the rollout sampled: the trainer's logits / "
            "rollout.temperature, and vLLM's processed log-probs (logprobs_mode processed_logprobs, after "
            "temperature); the weight-sync probe scores at temperature 1 on both sides"
            if t != 1
            else "rollout.temperature 1: the trainer's log-softmax and vLLM's processed log-probs are the "
            "same distribution"
        )
        if run.preset.train.images is not None:
            reason += (
                "; image prompts: the vision tokens take a logit bias of -100 on both sides before the "
                "temperature, so no response samples one (the vision-language class reads every image token as "
                "an image's place)"
            )
        out.append(Derived("logprobs", f"at temperature {t:g}", reason))
    if g.dynamic_sampling is not None:
        out.append(
            Derived(
                "dynamic_sampling",
                f"up to {g.dynamic_sampling.max_rounds} rounds",
                "groups whose rewards are all equal carry no advantage and are dropped (DAPO); further prompts, "
                "drawn from (seed, step, round), are rolled out until the batch is whole or the rounds run out, "
                "and what is still missing is filled with dropped groups that take no loss",
            )
        )
    if g.overlong is not None:
        o = g.overlong
        limit = rollout.max_response_tokens if rollout is not None else 0
        start = max(limit - o.buffer_tokens, 0)
        out.append(
            Derived(
                "overlong",
                f"penalty up to {o.penalty:g} over tokens {start + 1}-{limit}"
                + (", truncated responses masked" if o.mask_truncated else ""),
                f"DAPO's soft over-long punishment: a response longer than {start} tokens loses "
                f"(length - {start}) / {o.buffer_tokens} x {o.penalty:g} of its reward"
                + (
                    "; one cut at rollout.max_response_tokens takes no loss (DAPO's overlong filtering)"
                    if o.mask_truncated
                    else ""
                ),
            )
        )
    return out


def _rollout_flow(run: Run) -> list[Derived]:
    """How the rollout overlaps the trainer, and what happens to an engine that fails."""
    r = run.preset.rollout
    assert r is not None
    if r.max_staleness == 0:
        flow = Derived(
            "max_staleness",
            0,
            "on-policy: each step's rollout starts after the weights of the step before it are synced, so the "
            "trainer waits for the rollout and the rollout for the trainer",
        )
    else:
        flow = Derived(
            "max_staleness",
            r.max_staleness,
            f"the prompts of step k go to the engines once the weights of step k - {r.max_staleness} are there, so "
            f"the next {r.max_staleness} step(s)' rollouts run while the trainer trains; every sample records the "
            f"weight version that generated each token, and none more than {r.max_staleness} version(s) old is "
            "trained on (it is dropped and regenerated)",
        )
    out = [flow]
    if r.max_staleness:
        out.append(
            Derived(
                "partial",
                r.partial,
                "a weight update stops the requests in flight and continues each under the new weights, "
                "re-prefilled from its prompt and the tokens so far (a GDN layer's recurrent and conv state "
                "summarise the prefix under the weights that computed it, so none is kept)"
                if r.partial
                else "a weight update waits for the requests in flight to finish on the old weights",
            )
        )
    restarts = run.engine_restarts
    out.append(Derived("engine_restarts", restarts.value, restarts.reason))
    return out


def _eval(run: Run) -> Derived:
    """What the held-out evaluation logs, and how often."""
    spec, rollout = run.preset.eval, run.preset.rollout
    assert spec is not None, "explain asks for the evaluation only when the preset has an eval section"
    if run.preset.job == "rl":
        tokens = spec.max_response_tokens or (rollout.max_response_tokens if rollout is not None else None)
        what = (
            f"mean reward and pass@{spec.samples_per_prompt} of {spec.samples_per_prompt} samples per held-out "
            f"prompt at temperature {spec.temperature:g}, up to {tokens} tokens each"
            + ("" if spec.max_response_tokens else " (rollout.max_response_tokens)")
            + (f", the first {spec.max_prompts} prompts" if spec.max_prompts else ", every prompt")
        )
        rows = "eval_reward"
    else:
        what = f"the held-out loss over {spec.batches} global batch{'es' if spec.batches > 1 else ''}"
        rows = "eval_loss"
    return Derived(
        "eval",
        f"every {spec.interval} steps and after the last",
        f"{what} of {spec.data_path}: {rows} rows in metrics.jsonl, TensorBoard and W&B",
    )


def _lr_schedule(run: Run) -> Derived:
    """One line for the whole schedule: its shape, then why each part has its value."""
    decided, lr = run.lr_schedule, run.preset.train.lr
    warmup, decay, min_lr = (decided[name] for name in ("warmup_steps", "decay", "min_lr"))
    shape = f"warmup {warmup.value} steps to {lr:g}, then " + (
        "constant"
        if decay.value == "constant"
        else f"{decay.value} to {min_lr.value:g} at step {run.preset.train.train_iters}"
    )
    why = f"warmup: {warmup.reason}; decay: {decay.reason}" + (
        "" if decay.value == "constant" else f"; min_lr: {min_lr.reason}"
    )
    return Derived("lr_schedule", shape, why)


def memory_table(run: Run) -> memory.MemoryEstimate | None:
    if not run.is_training or run.gpu.sm is None or run.dp is None:
        return None
    return memory.estimate_training(run)


def _shown(value: object) -> object:
    """on/off for the speed options that are switches, as the preset spells them."""
    return ("on" if value else "off") if isinstance(value, bool) else value
