"""`gdnctl launch --smoke [--then-run]`: run the job's smoke run, read its verdicts back from RUN_DIR/smoke.json,
and start the job only after a green smoke.

The runtime decides every check and prints their lines (rank 0, in the job's output); this side reads smoke.json
to decide whether the job may start and what to say about it. A smoke run that ended without writing smoke.json
(a rank killed, a crash before the checks) is a failed smoke, whatever its exit code.

A verdict belongs to the run that wrote it: gdnctl removes an earlier smoke.json before it starts a smoke run
(forget_verdict), here or on Slurm, so a run that fails before the runtime gets to it is never judged by the
last one's report. A smoke run whose exit code is known and not 0 is never green, whatever its report says.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, read_json
from gdnctl.launch import submit
from gdnctl.schema import SMOKE_FILE, SmokeReport

SMOKE_ARGS = ("--smoke",)  # launch_local.sh and launch_slurm.sbatch: the smoke run only
SMOKE_THEN_RUN_ARGS = ("--smoke-then-run",)  # launch_slurm.sbatch: the smoke run, then the job after a green one


@dataclass(frozen=True)
class SmokeOutcome:
    path: Path  # RUN_DIR/smoke.json
    report: SmokeReport | None
    exit_code: int | None  # the smoke run's own exit code; None where it is not known apart from the job's (Slurm)
    unreadable: str | None = None  # why smoke.json could not be read, when it exists

    @property
    def green(self) -> bool:
        return self.report is not None and self.report.green and self.exit_code in (0, None)

    def verdict(self) -> str:
        """One sentence on what the smoke found."""
        if self.report is None:
            ended = f"ended with exit code {self.exit_code}" if self.exit_code is not None else "ended"
            why = self.unreadable or "its output above says why"
            return f"the smoke run {ended} without writing {self.path} ({why}); the job was judged not ready."
        report = self.report
        if not report.green:
            failed = ", ".join(check.name for check in report.checks if check.status == "FAIL")
            return f"the smoke run failed {report.count('FAIL')} check(s): {failed}; the verdicts are in {self.path}."
        if self.exit_code not in (0, None):
            return f"the smoke run passed its checks but exited with code {self.exit_code}; its output above says why."
        warned = f", {report.count('warn')} with a warning" if report.count("warn") else ""
        return f"the smoke run passed every check ({report.count('ok')} ok{warned}); the verdicts are in {self.path}."

    def to_json(self) -> dict:
        return {
            "green": self.green,
            "exit_code": self.exit_code,
            "verdict": self.verdict(),
            "path": str(self.path),
            "report": self.report.model_dump(mode="json") if self.report is not None else None,
        }


# A report is a few KiB: a line per check.
MAX_SMOKE_REPORT_BYTES = 1024**2


class SmokeVerdictInTheWay(GdnctlError):
    pass


def forget_verdict(run_dir: Path) -> None:
    """Remove an earlier smoke run's RUN_DIR/smoke.json before a new one starts (a link there is removed, not
    followed); something else than a file at the name is refused with a sentence."""
    path = run_dir / SMOKE_FILE
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        raise SmokeVerdictInTheWay(
            f"{path} cannot be removed ({error.strerror}), and the smoke run writes its verdicts there: remove it "
            f"(rm -r {path}) and launch again."
        ) from None


def read_outcome(run_dir: Path, exit_code: int | None) -> SmokeOutcome:
    path = run_dir / SMOKE_FILE
    if not os.path.lexists(path):
        return SmokeOutcome(path, None, exit_code)
    try:
        if path.is_symlink():
            raise UnreadableFile(f"{path} is a symbolic link, which the smoke run never writes")
        document = read_json(path, MAX_SMOKE_REPORT_BYTES)
        return SmokeOutcome(path, SmokeReport.model_validate(document), exit_code)
    except UnreadableFile as error:
        return SmokeOutcome(path, None, exit_code, f"{path.name} is not a smoke report: {error}")
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"]) or "its content"
        return SmokeOutcome(path, None, exit_code, f"{path.name} is not a smoke report: {field}: {first['msg']}")


@dataclass(frozen=True)
class LocalLaunch:
    smoke: SmokeOutcome | None  # None: no smoke run was asked for
    job_exit_code: int | None  # None: the job was not started

    @property
    def exit_code(self) -> int:
        if self.job_exit_code is not None:
            return self.job_exit_code
        return 0 if self.smoke is not None and self.smoke.green else 1

    def to_json(self) -> dict:
        return {
            "ok": self.exit_code == 0,
            "exit_code": self.exit_code,
            "smoke": self.smoke.to_json() if self.smoke is not None else None,
            "job": {"started": self.job_exit_code is not None, "exit_code": self.job_exit_code},
        }


def launch_local(
    run_dir: Path, *, smoke: bool, then_run: bool, say: Callable[[str], None], stdout: IO | None = None
) -> LocalLaunch:
    """The smoke run (when asked for), then the job (unless only the smoke was asked for, or it was not green).
    `say` gets the sentences between the two; `stdout` the runs' own output (default: this process's stdout)."""
    outcome = None
    if smoke:
        forget_verdict(run_dir)
        outcome = read_outcome(run_dir, submit.run_local(run_dir, SMOKE_ARGS, stdout))
        say(outcome.verdict())
        if not then_run:
            return LocalLaunch(outcome, None)
        if not outcome.green:
            say("the job was not started.")
            return LocalLaunch(outcome, None)
        say("starting the job.")
    return LocalLaunch(outcome, submit.run_local(run_dir, (), stdout))
