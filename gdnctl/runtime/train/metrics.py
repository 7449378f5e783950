"""Where a job's per-step metrics go: `metrics.jsonl` and TensorBoard event files in the run dir, always, and
Weights & Biases when the engine config asks for it. Only rank 0 writes (the values are already reduced).

W&B's run id is kept in the run dir (`wandb/run_id`), so a requeued or resumed job continues the same W&B run
instead of starting a new one per restart. A job that resumes at step S calls `resumed_at(S)`: the steps a killed
run logged after its last checkpoint are dropped from metrics.jsonl and TensorBoard (its purge_step), so the
history reads as one run when those steps are taken again. W&B keeps the first values logged for a step (it
ignores a step it has seen); with deterministic settings they are the same values.
`WANDB_MODE=offline` (or `metrics.wandb.mode: offline`) works without a network; `wandb sync
RUN_DIR/wandb/offline-run-*` uploads it later.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.files import MIB, UnreadableFile, current_umask, decode_json, open_regular, read_text, replace_text
from gdnctl.schema import EngineConfig

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
WANDB_RUN_ID_FILE = "run_id"
# A metrics record is a line of some hundred bytes, a W&B run id twelve characters: past these, what is there is
# not gdnctl's.
MAX_RECORD_BYTES = 16 * MIB
MAX_RUN_ID_BYTES = 4096
# What gdnctl writes (12 hex digits) and W&B takes: W&B refuses ids holding / \ # ? % :.
WANDB_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class MetricsSetupError(GdnctlError):
    """A metrics sink the engine config asks for cannot be used here."""


def mfu(tflops_per_gpu: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation against the GPU's dense bf16 peak (never the 2:4-sparse figure); None on CPU."""
    if not peak_tflops:
        return None
    return tflops_per_gpu / peak_tflops


def eta_text(done: int, total: int, seconds_per_step: float) -> str:
    """'ETA 1h02m' for the steps left at the recent pace."""
    left = max(total - done, 0) * seconds_per_step
    if not math.isfinite(left):
        return "ETA ?"
    hours, rest = divmod(int(left), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"ETA {hours}h{minutes:02d}m" if hours else f"ETA {minutes}m{seconds:02d}s"


# A long phase (vLLM's engine start, a weight load, a compile) says it is still going this often.
PROGRESS_EVERY_S = 30.0


@contextmanager
def progress(label: str, say, every: float = PROGRESS_EVERY_S):
    """A line when `label` starts and, while it lasts, one every `every` seconds with the time so far; `say`
    is the job's log function (None on ranks that do not print)."""
    if say is None:
        yield
        return
    started = time.monotonic()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every):
            say(f"{label}: still going after {time.monotonic() - started:.0f} s")

    say(f"{label} ...")
    ticker = threading.Thread(target=tick, name="gdnctl-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of this run dir: read back on a restart, made (and kept) on the first start."""
    path = run_dir / WANDB_DIR / WANDB_RUN_ID_FILE
    if os.path.lexists(path):
        try:
            kept = read_text(path, MAX_RUN_ID_BYTES).strip()
        except UnreadableFile as error:
            raise MetricsSetupError(
                f"{error}, not the W&B run id gdnctl keeps there; remove it (rm -r {path}) to start a new W&B run."
            ) from None
        if kept and WANDB_RUN_ID.fullmatch(kept) is None:
            raise MetricsSetupError(
                f"{path} holds {kept[:80]!r}, not a W&B run id (letters, digits, - and _); remove it (rm {path}) "
                "to start a new W&B run."
            )
        if kept:
            return kept
    path.parent.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    replace_text(path, run_id + "\n")
    return run_id


class MetricsLog:
    """One call per step: `log(step, values)` with scalar values (numbers, bools) and labels (strings)."""

    def __init__(self, config: EngineConfig, run_dir: Path, *, enabled: bool, group: str) -> None:
        self.enabled = enabled
        self.group = group  # the scalar tag prefix: "train", "rl", "selftest"
        self.path = run_dir / METRICS_FILE
        self._tensorboard = None
        self._wandb = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (runtime extra)

        self._tensorboard_dir = str(run_dir / TENSORBOARD_DIR)
        self._tensorboard = SummaryWriter(log_dir=self._tensorboard_dir)
        settings = config.metrics
        if settings.wandb_project is not None:
            self._wandb = _start_wandb(config, run_dir)

    def resumed_at(self, step: int) -> None:
        """The job continues after `step`: forget what an earlier start logged for later steps."""
        if not self.enabled or step <= 0:
            return
        if os.path.lexists(self.path):
            self._keep_records_up_to(step)
        from torch.utils.tensorboard import SummaryWriter

        self._tensorboard.close()
        self._tensorboard = SummaryWriter(log_dir=self._tensorboard_dir, purge_step=step + 1)

    def _keep_records_up_to(self, step: int) -> None:
        """Rewrite metrics.jsonl with the records of steps up to `step`, a line at a time (a long run's file is
        large). A line that is no JSON (the last one, cut short when the earlier start was killed mid-write) is
        dropped with a word; what is not a regular file, or a line longer than any record, is a sentence."""
        fix = f"move it out of the way (mv {self.path} {self.path}.old) and resume again"
        try:
            descriptor, _ = open_regular(self.path)
        except UnreadableFile as error:
            raise MetricsSetupError(f"{error}; {fix}.") from None
        dropped = []
        output, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "rb") as lines, os.fdopen(output, "wb") as kept:
                os.fchmod(kept.fileno(), 0o666 & ~current_umask())
                for number, line in enumerate(iter(lambda: lines.readline(MAX_RECORD_BYTES + 1), b""), start=1):
                    if len(line) > MAX_RECORD_BYTES:
                        raise MetricsSetupError(
                            f"{self.path} line {number} is longer than any record gdnctl writes; {fix}."
                        )
                    if not line.strip():
                        continue
                    try:
                        record = decode_json(line, f"{self.path} line {number}", one_line=True)
                    except UnreadableFile:
                        dropped.append(number)
                        continue
                    logged = _logged_step(record)
                    if logged is None or logged <= step:
                        kept.write(line if line.endswith(b"\n") else line + b"\n")
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        if dropped:
            print(
                f"gdnctl: {self.path} line {dropped[0]}{f' and {len(dropped) - 1} more' if len(dropped) > 1 else ''} "
                "held no JSON record (a write the earlier start did not finish) and was dropped",
                flush=True,
            )

    def log(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"time": round(time.time(), 3), **values}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        scalars = {
            name: float(value)
            for name, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value is not None
        }
        for name, value in scalars.items():
            self._tensorboard.add_scalar(f"{self.group}/{name}", value, step)
        self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log({f"{self.group}/{name}": value for name, value in scalars.items()}, step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _logged_step(record: Any) -> int | None:
    """The step a metrics.jsonl record belongs to: rl and selftest records say `step`, the trainer's `iteration`;
    None for a line that names no step (not a record of a step: kept as it is)."""
    value = record.get("step", record.get("iteration")) if isinstance(record, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _start_wandb(config: EngineConfig, run_dir: Path):
    try:
        import wandb
    except ImportError:
        raise MetricsSetupError(
            "metrics.wandb is set but the wandb package is not installed in the trainer's "
            "environment; pip install wandb there, or remove metrics.wandb."
        ) from None
    settings = config.metrics
    directory = run_dir / WANDB_DIR
    directory.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=settings.wandb_project,
        entity=settings.wandb_entity,
        name=config.name,
        id=wandb_run_id(run_dir),
        resume="allow",
        mode=settings.wandb_mode,
        dir=str(directory),
        config={"engine": config.model_dump(mode="json")},
    )
