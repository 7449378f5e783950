"""RUN_DIR/.gdnctl-local-exit.json: how the latest local run of a run dir ended, which `gdnctl launch` (and
`resume`) writes when the job it ran ends and `gdnctl status` and `gdnctl runs` read.

A Slurm job's exit code is Slurm's to keep (scontrol); a local job has nobody else to keep it, and its log does not
say it, so gdnctl records it beside the log.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

LOCAL_EXIT_FILE = ".gdnctl-local-exit.json"
LOCAL_EXIT_FORMAT_VERSION = 1

Outcome = Literal["succeeded", "failed", "stopped"]


class LocalExit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    version: int = LOCAL_EXIT_FORMAT_VERSION
    # What `gdnctl launch` exited with for this run: the script's own exit code, or 128 + the number of the signal
    # in `signal`, as a shell reports a process a signal ended.
    exit_code: int = Field(ge=0, le=255)
    # SIGKILL, SIGSEGV ...: the signal that ended the job's launcher; with `stopped`, the signal gdnctl was stopped
    # by (it then sent the job's whole process tree SIGTERM, and SIGKILL to what outlived the grace period).
    signal: str | None = None
    stopped: bool = False
    smoke: bool = False  # the smoke run (launch --smoke), not the job
    ended_at: str  # UTC, ISO 8601

    @property
    def outcome(self) -> Outcome:
        if self.stopped:
            return "stopped"
        return "succeeded" if self.exit_code == 0 else "failed"

    def describe(self) -> str:
        """How the run ended, as status prints it after "ended"."""
        run = " (the smoke run)" if self.smoke else ""
        if self.stopped:
            return f"{run}: stopped by gdnctl on {self.signal} (exit code {self.exit_code})"
        if self.signal is not None:
            return f"{run}: failed, killed by {self.signal} (exit code {self.exit_code})"
        return f"{run}: {self.outcome}, exit code {self.exit_code}"
