"""The record of a campaign: campaign.json, beside each arm's step log and console log in the same directory.

The live run writes it before the first arm and again after each one, so a campaign stopped at any point (a
failed arm, the host's time running out) still says what ran, with what, and how it ended; `report` reads nothing
else. Paths in it are relative to its directory, so the directory can be copied anywhere and reported again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

CAMPAIGN_FILE = "campaign.json"
FORMAT = 1
STATUSES = ("planned", "running", "ok", "failed", "not run")


@dataclass
class ArmRecord:
    """One arm as planned and as it ended. graph_warmup_steps: the eager steps before the loop captured its CUDA
    graphs (None: no graphs), from the arm's own configuration (gdnctl's engine.yaml, the peer's summary)."""

    name: str
    index: int
    round: int
    kernel: str
    side: str
    status: str = "planned"
    steps_file: str | None = None
    log: str | None = None
    graph_warmup_steps: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    exit_code: int | None = None
    wall_s: float | None = None
    note: str | None = None


@dataclass
class Campaign:
    """What was compared: the preset and its overrides, the shape, the peer's mode, how the token stream and the
    FLOPs were made alike, and every arm."""

    preset: str
    sets: list[str]
    steps: int
    gpus: int
    kernels: list[str]
    rounds: int
    peer_mode: str
    model: str
    seq_length: int
    peak_tflops: float
    token_stream: str
    arms: list[ArmRecord]
    explain_memory: dict | None = None
    device: str | None = None
    versions: dict[str, str] | None = None
    date: str | None = None
    note: str | None = None
    format: int = FORMAT

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CAMPAIGN_FILE
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(asdict(self), indent=1) + "\n")
        temporary.replace(path)  # a reader (a poll mid-campaign) never sees half a file

    @classmethod
    def load(cls, directory: Path) -> Campaign:
        path = directory / CAMPAIGN_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist; pass the directory `trainer_throughput.py compare --campaign` wrote"
            )
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path} is format {data.get('format')!r}; this report reads format {FORMAT}")
        known = {f.name for f in fields(ArmRecord)}
        arms = [ArmRecord(**{k: v for k, v in arm.items() if k in known}) for arm in data.pop("arms")]
        return cls(arms=arms, **{k: v for k, v in data.items() if k in {f.name for f in fields(cls)}})
