"""The processes of test_checkpoint_durability: a tiny torch model trained with AdamW on a gloo group of one or two
ranks, saved and resumed with gdnctl's checkpoint functions in the order the CPU rl policy calls them
(TorchPolicy.save: save_tensors on rank 0, save_training_state, barrier, mark_latest, barrier; TorchPolicy's resume:
latest_checkpoint, the weights through HFReader, read_training_state, load_training_state).

The test starts these through multiprocessing's forkserver: the server imports torch once and forks a new process per
rank and case, so each save runs, and dies, in a process of its own, and each resume starts from nothing in memory. A
save dies by SIGKILL at a chosen durability call (os.fsync or os.replace under the save dir), or by the SIGTERM a
cancel sends; the wrappers that count those calls and pull the trigger live here, not in gdnctl.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import safetensors.torch  # noqa: F401  (imported by the checkpoint functions on first use)
import torch
import torch._dynamo  # noqa: F401  (imported by the first optimizer built: 3 s, paid once here in the forkserver)
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.model.passthrough import HFSource

COLLECTIVE_TIMEOUT = timedelta(seconds=60)

Event = tuple[str, str, int]  # (call, path relative to the save dir, how many times that call on that path so far)


@dataclass(frozen=True)
class Kill:
    """Where a save dies: just before `event` (or just after it returns); `cut` first truncates the file being
    fsynced to half its length, the state a write cut short leaves behind; `signum` is what it dies of (SIGKILL, or
    the SIGTERM a cancel sends)."""

    event: Event
    after: bool = False
    cut: bool = False
    signum: int = signal.SIGKILL


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    inputs = torch.linspace(-1, 1, 24).reshape(3, 8)
    optimizer.zero_grad()
    model(inputs).square().mean().backward()
    optimizer.step()


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return {
        "weights": {name: tensor.clone() for name, tensor in model.state_dict().items()},
        "optimizer": {
            index: {key: value.clone() for key, value in state.items()}
            for index, state in optimizer.state_dict()["state"].items()
        },
    }


def save(save_dir: Path, iteration: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    directory = save_dir / checkpoint.checkpoint_name(iteration)
    written = (
        checkpoint.save_tensors(model.state_dict().items(), directory, HFSource({"model_type": "tiny"}))
        if dist.get_rank() == 0
        else {}
    )
    checkpoint.save_training_state(directory, optimizer, {"iteration": iteration}, written)
    dist.barrier()
    if dist.get_rank() == 0:
        checkpoint.mark_latest(save_dir, directory.name)
    dist.barrier()  # as TorchPolicy.save: `latest` moves before any rank goes on


def save_run(
    rank: int, world_size: int, save_dir: Path, store: Path, log: Path, kill: dict[int, Kill], record: Path | None
) -> None:
    """Checkpoints 1 and 2, one AdamW step apart; checkpoint 2 with rank r's `kill[r]` armed. Rank 0 writes what
    each checkpoint holds to save_dir/../expected.pt first, and `record`.RANK gets this rank's durability calls."""
    _start(rank, world_size, store, log)
    model, optimizer = build()
    train_step(model, optimizer)
    save(save_dir, 1, model, optimizer)
    first = snapshot(model, optimizer)
    train_step(model, optimizer)
    if rank == 0:
        torch.save({1: first, 2: snapshot(model, optimizer)}, save_dir.parent / "expected.pt")
    events: list[Event] = []
    _arm(save_dir, kill.get(rank), events)
    save(save_dir, 2, model, optimizer)
    if record is not None:
        record.with_name(f"{record.name}.{rank}").write_text(json.dumps(events))
    dist.destroy_process_group()


def resume_run(
    rank: int, world_size: int, save_dir: Path, store: Path, log: Path, report: Path, then_save: bool
) -> None:
    """Resume as the rl policy does and write what was loaded to `report` (with the rank appended); a
    GdnctlError ends the process the way the runtime's entry point does: its sentence on stderr, its exit code.
    `then_save`: take one more step and save it, so the test can see the next save clean up after a crash."""
    _start(rank, world_size, store, log)
    model, optimizer = build()
    try:
        directory = checkpoint.latest_checkpoint(save_dir)
        reader = checkpoint.HFReader(directory)
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(reader.get(name))
        iteration = checkpoint.read_training_state(directory, world_size)["iteration"]
        checkpoint.load_training_state(directory, optimizer, device="cpu")
    except GdnctlError as error:
        print(f"gdnctl runtime: {error}", file=sys.stderr, flush=True)
        sys.exit(error.exit_code)
    torch.save(
        {"checkpoint": directory.name, "iteration": iteration, **snapshot(model, optimizer)},
        report.with_name(f"{report.name}.{rank}"),
    )
    if then_save:
        train_step(model, optimizer)
        save(save_dir, iteration + 1, model, optimizer)
    dist.destroy_process_group()


def _start(rank: int, world_size: int, store: Path, log: Path) -> None:
    """This rank's stderr into `log` (a traceback, gdnctl's lines), then the gloo group."""
    sys.stderr.flush()
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
    )


def _arm(save_dir: Path, kill: Kill | None, events: list[Event]) -> None:
    """Wrap os.fsync and os.replace: every call on a path under `save_dir` is appended to `events`, and the
    process is sent `kill.signum` at `kill`."""
    real_fsync, real_replace = os.fsync, os.replace
    root = save_dir.resolve()
    counts: Counter = Counter()

    def observe(call: str, path: str, proceed):
        target = Path(path).resolve()
        if target != root and root not in target.parents:
            return proceed()
        key = (call, str(target.relative_to(root)))
        counts[key] += 1
        event = (*key, counts[key])
        events.append(event)
        armed = kill is not None and kill.event == event
        if armed and not kill.after:
            if kill.cut:
                os.truncate(target, target.stat().st_size // 2)
            os.kill(os.getpid(), kill.signum)
        result = proceed()
        if armed:
            os.kill(os.getpid(), kill.signum)
        return result

    os.fsync = lambda fd: observe("fsync", os.readlink(f"/proc/self/fd/{fd}"), lambda: real_fsync(fd))
    os.replace = lambda source, target: observe("replace", target, lambda: real_replace(source, target))
