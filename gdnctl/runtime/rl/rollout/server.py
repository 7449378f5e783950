"""The rollout server: vLLM in its own environment, driven by the rl trainer over rollout_protocol.

`python -m gdnctl.runtime --config engine.yaml --role rollout --engine K` runs this with rollout.python (vLLM's
environment, which has gdnctl installed beside vLLM) for rollout engine K of rollout.num_gpus / rollout.tp
(rollout/engine_layout.py); without --engine it starts the engines of its node (serve_node: the Slurm script's rollout
step). Each server publishes its address, then serves the trainer rank that drives its engine: the operations of
rollout/protocol.py's OPERATIONS (its docstring is the contract), on vLLM's asynchronous engine
(rollout/vllm_engine.py), in one event loop. A thread reads the trainer's requests off the socket; the loop answers
them in order, one at a time, while the engine's requests stream their tokens meanwhile.

Prompts and samples are token ids: the trainer owns the tokenizer, and vLLM runs with skip_tokenizer_init, so
both sides cannot disagree about tokenization. Image prompts carry their images beside the ids (rl/prompts/
images.py), and vLLM gets the tokenizer written beside the weights, which only its multi-modal processor uses.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.rollout import engine_layout
from gdnctl.runtime.rl.rollout import protocol as rollout_protocol
from gdnctl.runtime.rl.rollout.vllm_engine import VllmEngine
from gdnctl.schema import EngineConfig, EngineRollout

# vLLM's CPU build sizes its KV cache from this rather than from gpu_memory_utilization; rl runs on CPU are
# tiny test models with a few hundred tokens per sequence.
CPU_KV_CACHE_BYTES = 512 << 20
# The token budget of a CPU engine's step, with chunked prefill off (at least max_model_len: vLLM's condition).
CPU_MAX_BATCHED_TOKENS = 2048


def engine_kwargs(config: EngineConfig, model: str) -> dict[str, Any]:
    """vLLM's engine arguments (AsyncEngineArgs) from the engine config."""
    rollout = config.rollout
    kwargs: dict[str, Any] = {
        "model": model,
        "skip_tokenizer_init": True,
        # As LLM(...) runs: no periodic stats work in the engine (the trainer measures what it reports).
        "disable_log_stats": True,
        "dtype": "bfloat16",
        "seed": config.train.seed,
        "tensor_parallel_size": rollout.tp,
        "max_model_len": rollout.max_model_len,
        # The sampled tokens' log-probs after temperature (and any top-k/top-p): those of the distribution the
        # engine sampled from, which the trainer scores with its logits / rollout.temperature. vLLM's default,
        # raw_logprobs, is the untempered softmax. Prompt log-probs (the probe) are the same in both modes. The
        # option and its four values are in vLLM 0.26.0 and 0.32.0 (vllm/config/model.py LogprobsMode).
        "logprobs_mode": "processed_logprobs",
    }
    kv_cache_bytes = None if rollout.kv_cache_gib is None else int(rollout.kv_cache_gib * 2**30)
    if config.device == "cpu":
        # CPU vLLM: eager (torch.compile on CPU costs minutes at start-up for no gain on a toy model) and a
        # fixed KV cache. Every prompt prefilled in one step: a seeded request whose prefill is split over steps
        # stops the engine on vLLM's CPU build (vLLM 0.32.0 gpu_model_runner._bookkeeping_sync rewinds the
        # request's generator with set_offset, which a CPU generator refuses: "CPU Generator does not use offset").
        # It splits prefills longer than a KV block (384 tokens for the tiny Qwen3.5) once a step's prompts pass
        # its token budget, as a partial rollout's continuations (prompt and response so far) soon do. Chunked
        # prefill can only be turned off with prefix caching (a GDN model's "align" state cache needs chunks).
        kwargs.update(
            enforce_eager=True,
            kv_cache_memory_bytes=kv_cache_bytes or CPU_KV_CACHE_BYTES,
            enable_chunked_prefill=False,
            enable_prefix_caching=False,
            max_num_batched_tokens=max(rollout.max_model_len, CPU_MAX_BATCHED_TOKENS),
        )
    else:
        kwargs.update(gpu_memory_utilization=rollout.gpu_memory_utilization, enforce_eager=rollout.enforce_eager)
        if kv_cache_bytes is not None:
            # vLLM reserves exactly this and skips its memory profiling (gpu_worker.determine_available_memory),
            # whose check fails when another process on the GPU frees memory while it profiles.
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
    if rollout.sleep_between_phases:
        kwargs["enable_sleep_mode"] = True
    if config.job == "rl" and config.train.images is not None:
        # Image prompts: vLLM's multi-modal processor expands each prompt's images and needs a tokenizer to build
        # (the one written beside the weights, weights/processor_files.py); prompts stay token ids, tokenized by
        # the trainer. At most train.images.max_per_sample images a prompt, as the dataset's checks hold them.
        kwargs["skip_tokenizer_init"] = False
        kwargs["limit_mm_per_prompt"] = {"image": config.train.images.max_per_sample, "video": 0}
    elif rollout.vision_language_class:
        # Qwen3.5 on vLLM < 0.27: the vision-language class, whose vision tower vLLM does not build when no
        # prompt may carry an image or a video (the weight sync sends the language model only).
        kwargs["limit_mm_per_prompt"] = {"image": 0, "video": 0}
    if rollout.gdn_prefill_backend not in (None, "auto"):
        kwargs["gdn_prefill_backend"] = rollout.gdn_prefill_backend
    return kwargs


class RolloutServerError(GdnctlError):
    """The rollout server was started for an engine this rollout does not have."""


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
        return asyncio.run(_serve_connection(config, connection))


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


# Every operation of the protocol but shutdown, and the VllmEngine method that answers it.
HANDLERS = {
    "start": "start",
    "submit": "submit",
    "collect": "collect",
    "generate": "generate",
    "load_weights": "load_weights",
    "sleep": "sleep",
    "reload_begin": "reload_begin",
    "ipc_bucket": "ipc_bucket",
    "group_join": "group_join",
    "broadcast_bucket": "broadcast_bucket",
    "reload_end": "reload_end",
}


async def _serve_connection(config: EngineConfig, connection: Connection) -> int:
    """Answer the trainer's requests in order until it disconnects or says shutdown; the engine generates between
    and during them."""
    engine = VllmEngine(config, engine_kwargs(config, model=""))
    handlers = {op: getattr(engine, name) for op, name in HANDLERS.items()}
    inbox = _inbox(connection, asyncio.get_running_loop())
    try:
        while True:
            request = await inbox.get()
            if request is None:
                print("gdnctl rollout: the trainer disconnected; exiting", flush=True)
                return 0
            op = request.pop("op")
            if op == "shutdown":
                return 0
            if op not in handlers:
                connection.send({"error": f"unknown request '{op}'"})
                continue
            if op != "start" and engine.engine is None:
                connection.send({"error": f"'{op}' before 'start'"})
                continue
            try:
                reply = handlers[op](**request)
                if inspect.isawaitable(reply):
                    reply = await reply
            except Exception as error:  # noqa: BLE001 - any vLLM failure goes back to the trainer as a sentence
                traceback.print_exc(file=sys.stdout)
                connection.send({"error": f"{type(error).__name__}: {error}"})
                continue
            connection.send(reply)
    finally:
        engine.shutdown()


def _inbox(connection: Connection, loop: asyncio.AbstractEventLoop) -> asyncio.Queue:
    """The trainer's requests as they arrive, read by a thread of their own (the socket's reads block), None once
    it disconnected. Only the event loop writes to the connection."""
    inbox: asyncio.Queue = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                request = connection.recv()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(inbox.put_nowait, None)
                return
            loop.call_soon_threadsafe(inbox.put_nowait, request)
            if request.get("op") == "shutdown":
                return

    threading.Thread(target=read, name="gdnctl-rollout-requests", daemon=True).start()
    return inbox
