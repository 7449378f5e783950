"""The live campaign: every arm a subprocess, its console kept in the campaign directory, the record saved after it.

gdnctl's arms are `gdnctl launch` with the defaults (the preset, the campaign's --set and the kernel); the peer's
are benchmarks/megatron_bridge_loop.py at the engine config's shape, with gdnctl's environment switches
(switches.py), its own kernel cache, and gdnctl's rows as its token stream (token_stream.py). An arm that fails or
runs past its limit is recorded with its exit and the campaign goes on; the report shows its log's tail. Progress
goes to stderr, so that --json keeps stdout to the one JSON object.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import yaml

from .campaign import ArmRecord, Campaign
from .plan import Arm, estimate_seconds, plan_arms, speed_environment
from .steps import first_steady_step
from .switches import peer_environment

PEER_SCRIPT = Path(__file__).resolve().parents[1] / "megatron_bridge_loop.py"
POLL_S = 5.0
PROGRESS_EVERY_S = 20.0
STOP_GRACE_S = 30.0
VERSIONED_PACKAGES = (
    "torch",
    "transformer-engine",
    "megatron-core",
    "megatron-bridge",
    "fla-core",
    "flash-qla",
    "tilelang",
)
PEER_ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|")
TOKEN_STREAM = (
    "one stream: the peer trains the rows gdnctl's trainer trains (gdnctl's synthetic documents, ids uniform over "
    "the vocabulary, joined and cut into full rows), through Megatron-Core's mock dataset "
    "(benchmarks/peer_compare/token_stream.py)"
)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class RenderFailed(RuntimeError):
    pass


def render_engine(preset: str, run_dir: Path, sets: list[str]) -> dict:
    """The engine config gdnctl's launch would run (its shape, environment and graph warm-up), rendered on the CPU
    before any arm spends GPU time."""
    command = [sys.executable, "-m", "gdnctl", "render", preset, "-o", str(run_dir), "--force"]
    command += [option for value in sets for option in ("--set", value)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RenderFailed(f"`{shlex.join(command)}` failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return yaml.safe_load((run_dir / "engine.yaml").read_text())


def graph_warmup_steps(engine: dict) -> int | None:
    speed = engine["speed"]
    return speed["cuda_graph_warmup_steps"] if speed["cuda_graphs"] else None


def installed_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def this_device() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = sorted(set(done.stdout.strip().splitlines())) if done.returncode == 0 else []
    return "; ".join(lines) or None


def run_logged(
    command: list[str], log: Path, env: dict[str, str], timeout_s: float, progress: Callable[[], str | None]
) -> tuple[int | None, float]:
    """Run `command` with its output in `log`; a progress line whenever `progress()` changes (at most every
    PROGRESS_EVERY_S). Past `timeout_s` its process group is stopped. Returns (exit code or None, seconds)."""
    started = time.monotonic()
    with log.open("w") as handle:
        handle.write("$ " + shlex.join(command) + "\n")
        handle.flush()
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        said, last = started, None
        while True:
            try:
                code = process.wait(timeout=POLL_S)
                return code, time.monotonic() - started
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now - started > timeout_s:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                return None, now - started
            state = progress()
            if state is not None and state != last and now - said >= PROGRESS_EVERY_S:
                say(f"    {state} ({now - started:.0f} s)")
                said, last = now, state


def _gdnctl_progress(metrics: Path, steps: int) -> Callable[[], str | None]:
    def progress() -> str | None:
        if not metrics.is_file():
            return "starting"
        done = sum(1 for line in metrics.read_text().splitlines() if '"seconds"' in line)
        return f"step {done}/{steps}"

    return progress


def _peer_progress(log: Path) -> Callable[[], str | None]:
    def progress() -> str | None:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 65536))
            found = PEER_ITERATION.findall(handle.read().decode(errors="replace"))
        return f"step {found[-1][0]}/{found[-1][1]}" if found else "starting"

    return progress


class CampaignRun:
    """One campaign's arms, run in plan order into `directory`."""

    def __init__(self, args, directory: Path, explain: Callable[[list[str]], dict] | None) -> None:
        self.args = args
        self.directory = directory
        self.preset = args.preset
        self.sets = [f"train.train_iters={args.steps}", f"cluster.gpus_per_node={args.gpus}", *args.set]
        self.engines = {
            kernel: render_engine(self.preset, directory / f"render-{kernel}", self._kernel_sets(kernel))
            for kernel in args.kernels
        }
        first = self.engines[args.kernels[0]]
        self.arms = plan_arms(args.kernels, args.rounds)
        self.campaign = Campaign(
            preset=self.preset,
            sets=self.sets,
            steps=args.steps,
            gpus=args.gpus,
            kernels=list(args.kernels),
            rounds=args.rounds,
            peer_mode=args.peer_mode,
            model=first["model"]["id"],
            seq_length=first["train"]["seq_length"],
            peak_tflops=first["metrics"]["peak_bf16_tflops"],
            token_stream=TOKEN_STREAM,
            arms=[ArmRecord(arm.name, arm.index, arm.round, arm.kernel, arm.side) for arm in self.arms],
            explain_memory=explain(self.sets) if explain else None,
            device=this_device(),
            versions=installed_versions(),
            date=date.today().isoformat(),
        )

    def _kernel_sets(self, kernel: str) -> list[str]:
        return [f"kernels.gdn_backend={kernel}", *self.sets]

    def run(self) -> Campaign:
        (self.directory / "arms").mkdir(parents=True, exist_ok=True)
        self.campaign.save(self.directory)
        estimate = estimate_seconds(self.arms, self.args.steps)
        say(
            f"{len(self.arms)} arms ({len(self.args.kernels)} kernel(s) x {self.args.rounds} rounds x gdnctl, then "
            f"Megatron-Bridge), {self.args.steps} steps each: about {estimate['total_s'] / 60:.0f} min on one H200 "
            f"with cold caches ({estimate['cold_s'] / 60:.0f} min of it compiling); record in {self.directory}"
        )
        started = time.monotonic()
        for arm in self.arms:
            record = self.campaign.arms[arm.index - 1]
            stop_after = self.args.stop_after_s
            if arm.side == "gdnctl" and stop_after is not None and time.monotonic() - started > stop_after:
                record.status, record.note = "not run", f"the campaign's --stop-after-s {stop_after:g} had passed"
                continue
            if arm.side == "peer" and self.campaign.arms[arm.index - 2].status == "not run":
                record.status, record.note = "not run", "its pair's gdnctl arm did not run"
                continue
            say(f"[{arm.index}/{len(self.arms)}] round {arm.round}, {arm.kernel}, {arm.side}: {arm.name}")
            record.status = "running"
            self.campaign.save(self.directory)
            (self._run_gdnctl if arm.side == "gdnctl" else self._run_peer)(arm, record)
            self.campaign.save(self.directory)
            say(f"    {record.status} in {record.wall_s or 0:.0f} s" + (f": {record.note}" if record.note else ""))
        return self.campaign

    def _finish(self, record: ArmRecord, code: int | None, seconds: float, steps_file: Path) -> None:
        record.wall_s, record.exit_code = round(seconds, 1), code
        if code is None:
            record.status, record.note = "failed", f"stopped after --arm-timeout-s {self.args.arm_timeout_s:g}"
        elif code != 0:
            record.status, record.note = "failed", f"exit {code}"
        elif not steps_file.is_file():
            record.status, record.note = "failed", f"exit 0 but no {steps_file.name}"
        else:
            record.status = "ok"

    def _run_gdnctl(self, arm: Arm, record: ArmRecord) -> None:
        run_dir = self.directory / "runs" / arm.name
        command = [sys.executable, "-m", "gdnctl", "launch", self.preset, "-o", str(run_dir), "--force"]
        command += [option for value in self._kernel_sets(arm.kernel) for option in ("--set", value)]
        record.log = f"arms/{arm.name}.log"
        progress = _gdnctl_progress(run_dir / "metrics.jsonl", self.args.steps)
        code, seconds = run_logged(
            command, self.directory / record.log, dict(os.environ), self.args.arm_timeout_s, progress
        )
        steps_file = self.directory / "arms" / f"{arm.name}.metrics.jsonl"
        if (run_dir / "metrics.jsonl").is_file():
            shutil.copyfile(run_dir / "metrics.jsonl", steps_file)
        engine_path = run_dir / "engine.yaml"
        engine = yaml.safe_load(engine_path.read_text()) if engine_path.is_file() else self.engines[arm.kernel]
        # What the launched job had: the campaign's own environment, under what the launch scripts export.
        record.env = {**speed_environment(dict(os.environ)), **engine["env"]}
        record.graph_warmup_steps = graph_warmup_steps(engine)
        record.steps_file = str(steps_file.relative_to(self.directory))
        self._finish(record, code, seconds, steps_file)

    def _run_peer(self, arm: Arm, record: ArmRecord) -> None:
        engine = self.engines[arm.kernel]
        train, gpus = engine["train"], self.args.gpus
        summary = self.directory / "arms" / f"{arm.name}.json"
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={gpus}"] if gpus > 1 else []
        command = [*(launcher or [sys.executable]), str(PEER_SCRIPT), "--mode", self.args.peer_mode]
        command += ["--steps", str(self.args.steps), "--gbs", str(train["global_batch_size"])]
        command += ["--seq", str(train["seq_length"]), "--mbs", str(train["micro_batch_size"])]
        command += ["--ep", str(engine["parallel"]["ep"]), "--peak-tflops", str(engine["metrics"]["peak_bf16_tflops"])]
        command += ["--tokens-from", str(self.directory / f"render-{arm.kernel}" / "engine.yaml")]
        command += ["--out", str(summary)]
        env = peer_environment(engine["env"], str(self.args.peer_cache_dir), arm.kernel)
        handed = {**os.environ, **env}
        record.log, record.steps_file = f"arms/{arm.name}.log", str(summary.relative_to(self.directory))
        record.env = speed_environment(handed)
        log = self.directory / record.log
        code, seconds = run_logged(command, log, handed, self.args.arm_timeout_s, _peer_progress(log))
        self._finish(record, code, seconds, summary)
        if record.status != "ok":
            return
        ran = json.loads(summary.read_text())
        # What the peer's process had, its recipe's own variables included (it records them itself).
        record.env = ran.get("environment", record.env)
        record.graph_warmup_steps = ran.get("graph_warmup_steps")
        if record.graph_warmup_steps is not None and first_steady_step(record.graph_warmup_steps) > self.args.steps:
            record.status, record.note = "failed", f"{self.args.steps} steps end before its steady window"
