"""The trainer's side of the rollout's engines: the servers this rank drives, and requests over every engine.

Every rank holds a RolloutEngines; the ranks rollout/engine_layout.py names as drivers spawn (or find) their engines'
servers and talk to them, the others hold none. Every operation here is collective: all ranks call it, the
drivers send their engines the request, and the answers come together on rank 0 in engine order (a gather only
when some engine's driver is not rank 0: colocated engines on other nodes). `restart` is the one exception: the
driver of an engine that failed starts it again on its own (rollout/stream.py).

Trainer rank 0 may talk to its engines from two threads (the rollout stream's, and the loop's for syncs, the
held-out evaluation and sleep): `lock` makes each operation, and a sync that spans several, whole. The stream's
thread takes it for each of its polls with `lock.after_others()`, behind any other thread that waits for it
(YieldingLock).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.rollout import engine_layout, server_group
from gdnctl.runtime.rl.rollout.protocol import (
    EXTERNAL,
    LOCAL,
    ROLLOUT_ENV,
    RolloutClient,
    address_file,
    answer_all,
    rollout_log,
)
from gdnctl.schema import EngineConfig

# How long servers get to exit after the job asked them to, together.
SHUTDOWN_SECONDS = 60.0
# torchrun's variables: a spawned vLLM must not take itself for a rank of the trainer's job.
_LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class RolloutEngineError(GdnctlError):
    """The rollout's engines cannot be placed or started as the engine config says."""


class YieldingLock:
    """A re-entrant lock that one thread takes only when no other waits for it: `with lock:` for every thread,
    `with lock.after_others():` for the rollout stream's polls.

    The stream polls the engines under the lock in a loop, taking it again as soon as it has let it go, and
    Python's locks are not fair: a sync that waited for it could lose every one of those races until nothing was
    in flight, so a partial rollout's update waited for the very requests it was meant to stop and continue (seen
    on CPU: a sync that began 2 s before the next step's requests finished reloaded the weights only after them).
    With this lock a waiting thread has it by the stream's next poll at the latest."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._state = threading.Condition()
        self._wanted = 0  # threads in __enter__, waiting for the lock (or taking it again, re-entrantly)

    def __enter__(self) -> YieldingLock:
        with self._state:
            self._wanted += 1
        try:
            self._lock.acquire()
        finally:
            with self._state:
                self._wanted -= 1
                self._state.notify_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextmanager
    def after_others(self) -> Iterator[None]:
        """The lock, once no thread waits for it in `with lock:`."""
        with self._state:
            self._state.wait_for(lambda: self._wanted == 0)
        with self._lock:
            yield


class RolloutEngines:
    def __init__(self, config: EngineConfig, config_path: Path) -> None:
        self.config, self.config_path, self.run_dir = config, config_path, config_path.parent
        rollout = config.rollout
        self.rank = dist.get_rank()
        ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.get_world_size())))
        self.count = engine_layout.engine_count(rollout.num_gpus, rollout.tp)
        self.drivers = engine_layout.drivers(self.count, rollout.tp, rollout.colocate, ranks_per_node)
        self.external = os.environ.get(ROLLOUT_ENV) == EXTERNAL
        self.slots = engine_layout.driven_slots(
            count=self.count,
            tp=rollout.tp,
            colocate=rollout.colocate,
            rank=self.rank,
            ranks_per_node=ranks_per_node,
            visible=self._visible_devices(),
            spawn=not self.external,
        )
        self.clients: dict[int, RolloutClient] = {}
        # Every server this rank spawned, connected or not: each the leader of its engine's process group.
        self._processes: dict[int, server_group.ServerProcess] = {}
        self.started = False
        self.lock = YieldingLock()
        self.restarted = 0  # engines started again after a failure, over the job (the broadcast group rejoins)

    @property
    def gathers(self) -> bool:
        """Whether ranks other than 0 drive engines, so answers travel to rank 0 by a gather."""
        return any(self.drivers)

    def _visible_devices(self) -> list[str] | None:
        if self.config.device != "cuda":
            return None
        return engine_layout.visible_devices(torch.cuda.device_count())

    # --- start --------------------------------------------------------------------------------------------
    def start(self, model: str, version: int) -> list[dict] | None:
        """Start every engine on the HF checkpoint directory `model`, weight version `version`: the drivers spawn
        their servers (unless the launch script did), connect, and have them build their engines at once. Rank 0
        gets the answers."""
        if not self.external:
            for slot in self.slots:
                self._processes[slot.engine] = self._spawn(slot)
        for slot in self.slots:
            self.clients[slot.engine] = self._connect(slot)
        self.started = True
        return self.request("start", model=model, version=version)

    def _connect(self, slot: engine_layout.EngineSlot) -> RolloutClient:
        process = self._processes.get(slot.engine)
        return RolloutClient.connect(
            self.run_dir,
            timeout=self.config.rollout.timeout_s,
            engine=slot.engine,
            process=process,
            named=self.count > 1,
            log_path=None if process is None else rollout_log(self.run_dir, slot.engine),
        )

    @property
    def can_restart(self) -> bool:
        """Whether this rank spawned its servers, so it can start one again."""
        return not self.external

    def restart(self, engine: int, model: str, version: int) -> dict:
        """This driver's engine `engine` failed: stop what is left of its server, start a new one on the HF
        checkpoint directory `model` (weight version `version`) and wait for its engine. Not collective."""
        with self.lock:
            old = self.clients.pop(engine, None)
            if old is not None:
                old.kill()
            process = self._processes.pop(engine, None)
            if process is not None:
                process.end()  # its whole group: what a server that died left of its engine goes too
            slot = next(slot for slot in self.slots if slot.engine == engine)
            self._processes[engine] = self._spawn(slot)
            client = self.clients[engine] = self._connect(slot)
            self.restarted += 1
            return client.request("start", timeout=self.config.rollout.timeout_s, model=model, version=version)

    def _spawn(self, slot: engine_layout.EngineSlot) -> subprocess.Popen:
        address_file(self.run_dir, slot.engine).unlink(missing_ok=True)
        log_path = rollout_log(self.run_dir, slot.engine)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        python = self.config.rollout.python or sys.executable
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in _LAUNCHER_VARIABLES and not name.startswith("TORCHELASTIC_")
        }
        # The server is on this host: it listens on loopback only (rollout_server.trainer_shares_host).
        env[ROLLOUT_ENV] = LOCAL
        if slot.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot.devices
        command = [
            python,
            "-m",
            "gdnctl.runtime",
            "--config",
            str(self.config_path),
            "--role",
            "rollout",
            "--engine",
            str(slot.engine),
        ]
        on = f" on GPUs {slot.devices}" if slot.devices is not None else ""  # CPU servers get no devices
        self._say(f"starting rollout engine {slot.engine}{on}: {' '.join(command)} (log: {log_path})")
        with log_path.open("ab") as log:
            try:
                # In a process group of its own, under a leader that ends it with this rank (rollout/server_group.py):
                # every process of the engine ends when the job gives up on it, or when the job ends.
                return server_group.spawn(
                    command, python, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.run_dir
                )
            except OSError as error:
                raise RolloutEngineError(
                    f"rollout.python {python} cannot be started ({error.strerror}); set "
                    "rollout.python to the interpreter of the environment that has "
                    "vLLM."
                ) from None

    # --- requests -----------------------------------------------------------------------------------------
    def request(self, op: str, **fields: Any) -> list[dict] | None:
        """Every engine runs `op` with the same fields, all at once; rank 0 gets the answers in engine order."""
        return self.request_each(op, {engine: fields for engine in self.clients})

    def request_each(
        self, op: str, fields: dict[int, dict], on_answer: Callable[[int, dict], None] | None = None
    ) -> list[dict] | None:
        """Engine k runs `op` with fields[k] (engines this rank drives that fields leaves out are skipped), all at
        once; rank 0 gets {engine: answer} merged over the drivers, in engine order. On rank 0, `on_answer(engine,
        answer)` is called as each answer reaches it (those of engines other ranks drive, after the gather)."""
        mine = {engine: fields[engine] for engine in self.clients if engine in fields}
        engines = list(mine)
        told: set[int] = set()

        def tell(index: int, answer: dict) -> None:
            told.add(engines[index])
            on_answer(engines[index], answer)

        with self.lock:
            for engine, engine_fields in mine.items():
                self.clients[engine].send(op, **engine_fields)
            answers = dict(
                zip(
                    mine,
                    answer_all(
                        [self.clients[engine] for engine in mine],
                        op,
                        timeout=self.config.rollout.timeout_s,
                        on_answer=tell if on_answer is not None and self.rank == 0 else None,
                    ),
                    strict=True,
                )
            )
        merged = self._on_rank_0(answers)
        if merged is not None and on_answer is not None:
            for engine, answer in zip(sorted(fields), merged, strict=True):
                if engine not in told:
                    on_answer(engine, answer)
        return merged

    def send(self, op: str, **fields: Any) -> None:
        """Rank 0, driving every engine: send `op` to each without waiting (a collective request the trainer
        takes part in; answer collects)."""
        for client in self.clients.values():
            client.send(op, **fields)

    def check(self, op: str) -> None:
        for client in self.clients.values():
            client.check(op)

    def answer(self, op: str) -> list[dict]:
        return answer_all(list(self.clients.values()), op, timeout=self.config.rollout.timeout_s)

    def _on_rank_0(self, answers: dict[int, dict]) -> list[dict] | None:
        if self.gathers:
            gathered: list | None = [None] * dist.get_world_size() if self.rank == 0 else None
            dist.gather_object(answers, gathered, dst=0)
            if self.rank != 0:
                return None
            answers = {engine: answer for part in gathered for engine, answer in part.items()}
        elif self.rank != 0:
            return None
        return [answers[engine] for engine in sorted(answers)]

    # --- generation -------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        seeds: list[list[int]],
        stop_token_ids: list[int],
        on_samples: Callable[[int, list], None] | None = None,
        images: list | None = None,
    ) -> dict | None:
        """Every engine samples its share of `prompts` (engine_layout.shares), sample j of prompt i seeded
        seeds[i][j], so the draw does not depend on how many engines there are. Rank 0 gets the samples in prompt
        order, the slowest engine's seconds, and engine 0's GPU memory in use. On rank 0, `on_samples(first,
        groups)` gets each engine's samples as they arrive: groups[i] are prompt first + i's. `images`: each
        prompt's images (the protocol's generate), None for text prompts."""
        shares = dict(enumerate(engine_layout.shares(len(prompts), self.count)))
        fields = {
            engine: {
                "prompts": prompts[share.start : share.stop],
                "n": n,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "seeds": seeds[share.start : share.stop],
                "stop_token_ids": stop_token_ids,
                "images": images[share.start : share.stop] if images else None,
            }
            for engine, share in shares.items()
            if len(share)
        }
        tell = (
            None if on_samples is None else lambda engine, answer: on_samples(shares[engine].start, answer["samples"])
        )
        answers = self.request_each("generate", fields, on_answer=tell)
        if answers is None:
            return None
        return {
            "samples": [group for answer in answers for group in answer["samples"]],
            "seconds": max(answer["seconds"] for answer in answers),
            "gpu_used_bytes": answers[0]["gpu_used_bytes"],
            "engines": len(answers),
        }

    def close(self, failed: bool = False) -> None:
        """Ask every server to exit, then wait for them together (a server busy with a request exits once it is
        done, within a minute); after a failure, stop them at once. Servers that never connected are stopped. Each
        server's whole process group ends here, whatever the server left of its engine (vLLM's engine core, its
        workers, the resource tracker), also when the server itself exited or was killed before."""
        for client in self.clients.values():
            client.shutdown()
        deadline = time.monotonic() + (0.0 if failed else SHUTDOWN_SECONDS)
        for client in self.clients.values():
            client.wait(deadline - time.monotonic())
        for process in self._processes.values():
            process.end()
        self.clients.clear()
        self._processes.clear()

    def _say(self, message: str) -> None:
        # Drivers other than rank 0 speak for their own engines; rank 0's lines carry the job's prefix.
        prefix = "[gdnctl rl]" if self.rank == 0 else f"[gdnctl rl rank {self.rank}]"
        print(f"{prefix} {message}", flush=True)
