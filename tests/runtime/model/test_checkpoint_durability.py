"""Checkpoints survive a save killed at any moment and files damaged afterwards.

Real processes on real gloo groups (tests/runtime/model/checkpoint_worker.py, forked by multiprocessing's forkserver
so that torch is imported once): checkpoint 1 is saved, then checkpoint 2, killed by SIGKILL before and after every
fsync and rename of its save (and with the file being written cut short); a fresh process then resumes with gdnctl's
own code; a save stopped by SIGTERM instead leaves no temporary file. Checkpoint 2 must come back only when `latest`
had moved to it, and what comes back must be exactly what was saved. Damaging any file of the newest checkpoint
afterwards must make the resume fall back to checkpoint 1, with one line saying why, on every rank alike.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import re
import shutil
import signal
import subprocess
import sys
from multiprocessing.connection import wait
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.rl.algorithm import batch as rl_batch
from gdnctl.runtime.rl.algorithm.batch import Sample
from gdnctl.schema.engine import EngineConfig
from tests.runtime.model import checkpoint_worker
from tests.runtime.model.checkpoint_worker import Kill

FIRST, SECOND, THIRD = (checkpoint.checkpoint_name(i) for i in (1, 2, 3))
KILLED = -signal.SIGKILL
TIMEOUT_S = 90


@pytest.fixture(scope="module")
def forkserver():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([checkpoint_worker.__name__])
    return context


class Job:
    """One case's save dir and its rank processes, torchrun-like: when a rank dies the others are killed."""

    def __init__(self, context, root: Path, world_size: int) -> None:
        self.context, self.root, self.world_size = context, root, world_size
        self.save_dir = root / "ckpt"
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self.runs = 0

    def _run(self, target, *args) -> list[int]:
        self.runs += 1
        store, logs = self.root / f"store-{self.runs}", self.log_paths()
        processes = [
            self.context.Process(target=target, args=(rank, self.world_size, self.save_dir, store, logs[rank], *args))
            for rank in range(self.world_size)
        ]
        for process in processes:
            process.start()
        running = list(processes)
        while running:
            ready = wait([process.sentinel for process in running], timeout=TIMEOUT_S)
            assert ready, f"ranks hung; logs:\n{self.logs()}"
            running = [process for process in running if process.sentinel not in ready]
            if any(process.exitcode for process in processes if process.sentinel in ready):
                for process in running:
                    process.kill()
        for process in processes:
            process.join()
        return [process.exitcode for process in processes]

    def log_paths(self) -> list[Path]:
        return [self.root / f"run-{self.runs}.rank{rank}.log" for rank in range(self.world_size)]

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text()}" for path in self.log_paths() if path.exists())

    def save(self, kill: dict[int, Kill] | None = None, record: bool = False) -> list[int]:
        return self._run(checkpoint_worker.save_run, kill or {}, self.root / "events.json" if record else None)

    def resume(self, then_save: bool = False) -> tuple[list[int], str]:
        """Exit codes and rank 0's stderr."""
        codes = self._run(checkpoint_worker.resume_run, self.root / "resumed", then_save)
        return codes, self.log_paths()[0].read_text()

    def resumed(self) -> list[dict]:
        return [torch.load(self.root / f"resumed.{rank}", weights_only=True) for rank in range(self.world_size)]

    def expected(self) -> dict:
        return torch.load(self.root / "expected.pt", weights_only=True)

    def copy(self, root: Path) -> Job:
        shutil.copytree(self.root, root, ignore=shutil.ignore_patterns("store-*", "*.log", "resumed.*"))
        return Job(self.context, root, self.world_size)


@pytest.fixture(scope="module")
def saved(forkserver, tmp_path_factory) -> Job:
    """Checkpoints 1 and 2 of a two-rank job, saved whole, with every rank's durability calls recorded."""
    job = Job(forkserver, tmp_path_factory.mktemp("saved"), world_size=2)
    assert job.save(record=True) == [0, 0], job.logs()
    return job


def latest_verifies(save_dir: Path) -> str:
    """The checkpoint `latest` names, after checking (here, independently of gdnctl) every file it recorded."""
    name = (save_dir / checkpoint.LATEST).read_text().strip()
    state = json.loads((save_dir / name / checkpoint.STATE_FILE).read_text())
    content = {key: value for key, value in state.items() if key != "state_sha256"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    assert hashlib.sha256(canonical).hexdigest() == state["state_sha256"]
    for file, record in state["files"].items():
        data = (save_dir / name / file).read_bytes()
        assert len(data) == record["size"] and hashlib.sha256(data).hexdigest() == record["sha256"], file
    return name


def temporary_files(save_dir: Path) -> list[str]:
    return sorted(str(path.relative_to(save_dir)) for path in save_dir.rglob("*.tmp"))


def assert_resumed(job: Job, iteration: int) -> None:
    expected = job.expected()[iteration]
    for report in job.resumed():
        assert report["checkpoint"] == checkpoint.checkpoint_name(iteration)
        assert report["iteration"] == iteration
        for name, tensor in expected["weights"].items():
            assert torch.equal(report["weights"][name], tensor), name
        for index, state in expected["optimizer"].items():
            assert int(report["optimizer"][index]["step"]) == iteration
            for key, tensor in state.items():
                assert torch.equal(report["optimizer"][index][key], tensor), (index, key)


# --- a save killed at every stage -------------------------------------------------------------------------


def test_every_file_is_written_fsynced_renamed_and_its_directory_fsynced_and_latest_moves_last(saved):
    events = json.loads((saved.root / "events.json.0").read_text())
    calls = [(call, path) for call, path, _ in events]
    files = [path for call, path in calls if call == "replace"]
    assert set(files) == {
        f"{SECOND}/{name}"
        for name in ("model.safetensors", "config.json", "trainer_state.json", "optimizer/rank-00000.pt")
    } | {"latest"}
    for file in files:
        directory, name = file.rpartition("/")[0] or ".", file.rpartition("/")[2]
        at = calls.index(("replace", file))
        assert calls[at - 1] == ("fsync", f"{directory}/.{name}.tmp".removeprefix("./"))
        assert calls[at + 1] == ("fsync", directory)
    # trainer_state.json (with every file's checksum) is the last checkpoint file; latest moves after it.
    assert files[-2:] == [f"{SECOND}/trainer_state.json", "latest"]
    assert temporary_files(saved.save_dir) == []
    assert latest_verifies(saved.save_dir) == SECOND


def kill_points(events: list) -> list[tuple[Kill, bool]]:
    """Every kill point of a save's durability calls, with whether checkpoint 2 is complete there (`latest`
    renamed to it): before and after each call, and a cut-short write at each fsync of a temporary file."""
    moved = events.index(["replace", "latest", 1])
    points = []
    for index, event in enumerate(map(tuple, events)):
        points += [(Kill(event), index > moved), (Kill(event, after=True), index >= moved)]
        if event[1].endswith(".tmp"):
            points.append((Kill(event, cut=True), False))
    return points


def test_a_save_killed_at_any_stage_resumes_from_the_last_complete_checkpoint(forkserver, tmp_path):
    probe = Job(forkserver, tmp_path / "probe", world_size=1)
    assert probe.save(record=True) == [0], probe.logs()
    points = kill_points(json.loads((probe.root / "events.json.0").read_text()))
    assert len(points) == 39  # 17 calls (5 files x fsync/rename/fsync dir, 2 new directories) x 2, 5 cut writes
    for number, (kill, complete) in enumerate(points):
        job = Job(forkserver, tmp_path / f"kill-{number}", world_size=1)
        case = f"{kill}\n{job.logs()}"
        assert job.save({0: kill}) == [KILLED], case
        # latest never names an incomplete checkpoint, so the resume needs no fallback and says nothing.
        assert latest_verifies(job.save_dir) == (SECOND if complete else FIRST), case
        codes, stderr = job.resume(then_save=True)
        assert codes == [0] and stderr == "", f"{case}\n{job.logs()}"
        assert_resumed(job, 2 if complete else 1)
        # The next save replaces whatever the killed one left half-done.
        assert temporary_files(job.save_dir) == [], case
        assert latest_verifies(job.save_dir) == (THIRD if complete else SECOND), case


def test_a_rank_killed_while_writing_its_optimizer_state_leaves_latest_on_the_previous_checkpoint(forkserver, tmp_path):
    mine = f"{SECOND}/optimizer/rank-00001.pt"
    fsync_temporary = ("fsync", f"{SECOND}/optimizer/.rank-00001.pt.tmp", 1)
    kills = [
        Kill(fsync_temporary, cut=True),
        Kill(fsync_temporary),
        Kill(("replace", mine, 1)),
        Kill(("fsync", f"{SECOND}/optimizer", 1)),
        Kill(("fsync", f"{SECOND}/optimizer", 1), after=True),
    ]
    for number, kill in enumerate(kills):
        job = Job(forkserver, tmp_path / f"kill-{number}", world_size=2)
        assert job.save({1: kill})[1] == KILLED, f"{kill}\n{job.logs()}"
        assert latest_verifies(job.save_dir) == FIRST
        codes, stderr = job.resume()
        assert codes == [0, 0] and stderr == "", job.logs()
        assert_resumed(job, 1)


def test_a_save_stopped_by_sigterm_leaves_no_temporary_file_and_dies_of_the_signal(forkserver, tmp_path):
    """A cancel (torchrun's or Slurm's SIGTERM) while a rank writes a file: the half-written temporary is removed
    at once, not left for the next save of that file, and the rank still ends by SIGTERM, as torchrun reports."""
    temporary = f"{SECOND}/optimizer/.rank-00000.pt.tmp"
    kills = [
        Kill(("fsync", temporary, 1), cut=True, signum=signal.SIGTERM),
        Kill(("fsync", temporary, 1), after=True, signum=signal.SIGTERM),
        Kill(("replace", "latest", 1), signum=signal.SIGTERM),
    ]
    for number, kill in enumerate(kills):
        job = Job(forkserver, tmp_path / f"stop-{number}", world_size=1)
        assert job.save({0: kill}) == [-signal.SIGTERM], f"{kill}\n{job.logs()}"
        assert temporary_files(job.save_dir) == [], kill
        assert latest_verifies(job.save_dir) == FIRST
        codes, stderr = job.resume()
        assert codes == [0] and stderr == "", job.logs()
        assert_resumed(job, 1)


# --- files damaged after the save -------------------------------------------------------------------------


def checkpoint_files(job: Job) -> list[str]:
    return sorted(
        str(path.relative_to(job.save_dir / SECOND)) for path in (job.save_dir / SECOND).rglob("*") if path.is_file()
    )


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip_a_byte])
def test_a_damaged_file_of_the_latest_checkpoint_falls_back_to_the_previous_one_on_every_rank(saved, tmp_path, damage):
    files = checkpoint_files(saved)
    assert files == [
        "config.json",
        "model.safetensors",
        "optimizer/rank-00000.pt",
        "optimizer/rank-00001.pt",
        "trainer_state.json",
    ]
    for file in files:
        job = saved.copy(tmp_path / file.replace("/", "-"))
        path = job.save_dir / SECOND / file
        size = path.stat().st_size
        damage(path)
        codes, stderr = job.resume()
        assert codes == [0, 0], job.logs()
        assert "Traceback" not in job.logs()
        line = (
            re.escape(f"gdnctl: checkpoint {SECOND} is ")
            + r"(incomplete|corrupt) \((.+)\)"
            + re.escape(f"; resuming from {FIRST}\n")
        )
        match = re.fullmatch(line, stderr)
        assert match, stderr
        if file == "trainer_state.json":
            assert file in match.group(2)
        elif damage is truncate:
            assert match.group(2) == f"{file}: {size // 2:,} of {size:,} bytes"
        else:
            assert match.group(2) == f"{file}: its sha256 differs from the one recorded when it was saved"
        assert_resumed(job, 1)


def test_latest_naming_a_deleted_checkpoint_falls_back(saved, tmp_path):
    job = saved.copy(tmp_path / "job")
    shutil.rmtree(job.save_dir / SECOND)
    codes, stderr = job.resume()
    assert codes == [0, 0]
    assert stderr == (
        f"gdnctl: checkpoint {SECOND} is missing ({job.save_dir / SECOND} does not exist); resuming from {FIRST}\n"
    )
    assert_resumed(job, 1)


def test_no_checkpoint_that_verifies_is_one_sentence_naming_the_save_dir_and_the_fix(saved, tmp_path):
    job = saved.copy(tmp_path / "job")
    for name in (FIRST, SECOND):
        truncate(job.save_dir / name / "optimizer/rank-00001.pt")
    codes, stderr = job.resume()
    assert codes == [2, 2], job.logs()
    assert "Traceback" not in job.logs()
    assert stderr.startswith(
        f"gdnctl runtime: no checkpoint in {job.save_dir} can be resumed (checkpoint {SECOND} "
        "is incomplete (optimizer/rank-00001.pt: "
    )
    assert stderr.endswith(
        f"); restore an intact checkpoint directory there and write its name into "
        f"{job.save_dir / 'latest'}, or delete that file to start the run over.\n"
    )


# --- a trainer_state.json without checksums --------------------------------------------------------------------


def test_a_checkpoint_without_recorded_checksums_is_refused_not_half_checked(saved, tmp_path):
    """Every checkpoint gdnctl writes records its files' sizes and checksums; one that records none (hand-made, or
    edited) is not resumed on a weaker check."""
    job = saved.copy(tmp_path / "job")
    for iteration in (1, 2):
        path = job.save_dir / checkpoint.checkpoint_name(iteration) / checkpoint.STATE_FILE
        state = json.loads(path.read_text())
        path.write_text(json.dumps({"iteration": iteration, "world_size": state["world_size"]}, indent=2) + "\n")
    codes, stderr = job.resume()
    assert codes == [2, 2], job.logs()
    assert stderr.startswith(
        f"gdnctl runtime: no checkpoint in {job.save_dir} can be resumed (checkpoint {SECOND} "
        "is corrupt (trainer_state.json records no checksum of its own); checkpoint "
        f"{FIRST} is corrupt (trainer_state.json records no checksum of its own))"
    ), stderr


# --- the rl job's CPU policy ----------------------------------------------------------------------------------


def test_the_cpu_rl_policy_resumes_from_the_previous_checkpoint_when_the_latest_is_truncated(tmp_path, capfd):
    """TorchPolicy's own save and resume (the worker above follows the same calls on a smaller model)."""
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    rendered = subprocess.run(
        [sys.executable, "-m", "gdnctl", "render", "tiny-qwen3.5-rl-cpu", "-o", str(tmp_path / "run")],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    engine = EngineConfig.from_file(tmp_path / "run" / "engine.yaml")
    save_dir = tmp_path / "ckpt"
    config = engine.model_copy(update={"train": engine.train.model_copy(update={"save_dir": str(save_dir)})})
    rows = [
        Sample(0, (81, 58, 32), (49, 50, 256), (-5.5,) * 3, "stop", 0.0, 1.0),
        Sample(0, (70, 71), (48, 49), (-5.5,) * 2, "stop", 0.0, -1.0),
    ]
    batch = [rl_batch.build_batch(rows, pad_id=256)]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        policy = TorchPolicy(config)
        policy.train_step(batch, config.grpo)
        policy.save(save_dir, 1)
        first = {name: tensor.clone() for name, tensor in policy.module.state_dict().items()}
        policy.train_step(batch, config.grpo)
        policy.save(save_dir, 2)
        assert temporary_files(save_dir) == [] and latest_verifies(save_dir) == SECOND
        weights = save_dir / SECOND / "model.safetensors"
        size = weights.stat().st_size
        truncate(weights)
        capfd.readouterr()
        resumed = TorchPolicy(config)
        assert capfd.readouterr().err == (
            f"gdnctl: checkpoint {SECOND} is incomplete (model.safetensors: "
            f"{size // 2:,} of {size:,} bytes); resuming from {FIRST}\n"
        )
        assert resumed.step == 1
        for name, tensor in resumed.module.state_dict().items():
            assert torch.equal(tensor, first[name]), name
        assert {int(state["step"]) for state in resumed.optimizer.state_dict()["state"].values()} == {1}
    finally:
        dist.destroy_process_group()
