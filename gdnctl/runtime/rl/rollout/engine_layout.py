"""Where the rollout's engines run and which trainer rank drives each: rollout GPUs / rollout.tp vLLM engines.

A rollout of G GPUs at rollout.tp T runs G / T engines, each a vLLM of T GPUs with its own rollout server
(rollout/server.py); each generates its share of a step's prompts, and each loads every weight sync.

- Colocated: engine k takes the GPUs of trainer ranks k*T .. k*T + T - 1, so it sits on the node of those
  ranks, and that node's first trainer rank drives it: spawns its server (which listens on loopback, as a
  colocated server always has) and sends its requests. On one node that is rank 0 for every engine.
- Separate: the engines take the GPUs after the trainer's on one node (trainer rank 0 spawns them there), or
  the Slurm script's rollout step's nodes (a launcher per node starts that node's engines; serve_node in
  rollout/server.py). Trainer rank 0 drives every engine.

No torch: the rollout server's side imports it in vLLM's environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gdnctl.errors import GdnctlError


@dataclass(frozen=True)
class EngineSlot:
    """One engine: its index among the rollout's engines, and the GPUs its server is given
    (CUDA_VISIBLE_DEVICES), or None to inherit what its parent sees (on CPU, or a server someone else placed)."""

    engine: int
    devices: str | None = None


def visible_devices(count: int) -> list[str]:
    """This node's GPUs as CUDA_VISIBLE_DEVICES lists them, or the first `count` when it is unset."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return listed.split(",") if listed else [str(index) for index in range(count)]


def engine_count(num_gpus: int, tp: int) -> int:
    """The rollout's engines: its GPUs in groups of rollout.tp (RLT007 refuses a remainder)."""
    return max(num_gpus // tp, 1)


def engines_per_node(gpus_per_node: int, tp: int) -> int:
    """Engines on one node's GPUs (at least one: a rollout.tp above the node's GPUs is refused by validate)."""
    return max(gpus_per_node // tp, 1)


def colocated_driver(engine: int, tp: int, ranks_per_node: int) -> int:
    """The trainer rank that drives colocated engine `engine`: the first rank of the node its GPUs are on."""
    return (engine * tp) // ranks_per_node * ranks_per_node


def drivers(count: int, tp: int, colocate: bool, ranks_per_node: int) -> list[int]:
    """The driving trainer rank of every engine, in engine order."""
    if not colocate:
        return [0] * count
    return [colocated_driver(engine, tp, ranks_per_node) for engine in range(count)]


def _slice(devices: list[str], first: int, tp: int, what: str) -> str:
    mine = devices[first : first + tp]
    if len(mine) < tp:
        raise EngineLayoutError(
            f"{what} needs GPUs {first}..{first + tp - 1} of this node, but it shows "
            f"{len(devices)} ({','.join(devices) or 'none'}); lower rollout.num_gpus or "
            "rollout.tp to what the nodes have, or set cluster.gpus_per_node to the GPUs a "
            "node has."
        )
    return ",".join(mine)


class EngineLayoutError(GdnctlError):
    """The GPUs this process sees cannot hold the engines it must start."""


def driven_slots(
    *, count: int, tp: int, colocate: bool, rank: int, ranks_per_node: int, visible: list[str] | None, spawn: bool
) -> list[EngineSlot]:
    """The engines trainer rank `rank` drives, with the GPUs to give the servers it spawns.

    visible: the node's GPUs as CUDA_VISIBLE_DEVICES would list them (None on CPU: no devices are assigned).
    spawn: whether this rank starts the servers (False when the Slurm script's rollout step starts them).
    """
    slots = []
    for engine, driver in enumerate(drivers(count, tp, colocate, ranks_per_node)):
        if driver != rank:
            continue
        devices = None
        if visible is not None and spawn:
            if colocate:
                # Engine k's GPUs are those of its trainer ranks, counted from the node's first rank.
                first = engine * tp - driver
                devices = _slice(visible, first, tp, f"colocated rollout engine {engine}")
            else:
                # After the trainer's ranks, which take the node's first GPUs.
                first = ranks_per_node + engine * tp
                devices = _slice(
                    visible, first, tp, f"separate rollout engine {engine} beside {ranks_per_node} trainer rank(s)"
                )
        slots.append(EngineSlot(engine, devices))
    return slots


def node_slots(*, count: int, tp: int, gpus_per_node: int, node: int, visible: list[str] | None) -> list[EngineSlot]:
    """The engines the Slurm script's rollout step starts on its node `node` (0 = its first node), with each
    one's GPUs among the node's."""
    per_node = engines_per_node(gpus_per_node, tp)
    slots = []
    for local in range(per_node):
        engine = node * per_node + local
        if engine >= count:
            break
        devices = None if visible is None else _slice(visible, local * tp, tp, f"rollout engine {engine}")
        slots.append(EngineSlot(engine, devices))
    return slots


def shares(prompts: int, count: int) -> list[range]:
    """Each engine's prompts of a step, in order: contiguous runs whose sizes differ by at most one (an engine
    gets none when there are fewer prompts than engines)."""
    base, extra = divmod(prompts, count)
    out, start = [], 0
    for engine in range(count):
        size = base + (engine < extra)
        out.append(range(start, start + size))
        start += size
    return out
