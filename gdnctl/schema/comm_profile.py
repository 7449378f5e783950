"""The comm guard's profile files: what the runtime writes per rank and `gdnctl comm-report` reads.

One JSON document per rank, `comm_profile_rank{R}.json`, in the run dir's `comm_profile/` (the engine config's
`comm.profile_dir`). Version 2 tracks first use per (op, process group): each group's first collective sets up
its communicator, which version 1 mistook for steady state on every group but the first.

`CommProfile` is the document's shape as gdnctl/runtime/comm/guard.py writes it (profile_document), checked
strictly when read: a count is an integer (not a bool), a memory change a whole number of bytes, seconds a
finite number, so no NaN or infinity can reach a verdict.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROFILE_FORMAT = "gdnctl-comm-profile"
PROFILE_VERSION = 2
PROFILE_FILE_PATTERN = "comm_profile_rank{rank}.json"
DEFAULT_PROFILE_SUBDIR = "comm_profile"
# More ranks than any GPU cluster has (the largest run tens of thousands of GPUs): comm-report lists the ranks
# whose file is missing, and a world_size past this is a damaged file, not a job.
MAX_PROFILE_WORLD_SIZE = 2**20

Count = Annotated[int, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False)


class ProfiledCallMemory(_Strict):
    """How one call moved memory (the largest over the calls it sums up): bytes, a drop positive."""

    driver_drop_bytes: int
    allocated_delta_bytes: int
    reserved_delta_bytes: int


class ProfiledOp(_Strict):
    calls: Count
    checks: Count
    clears: Count
    guard_seconds: Annotated[float, Field(ge=0)]
    groups: Count
    first_use_max: ProfiledCallMemory  # every op profiled was called, so on a first group at least once
    steady_state_max: ProfiledCallMemory | None  # None: no call past each group's first


class CommProfile(_Strict):
    format: Literal["gdnctl-comm-profile"]
    version: Literal[2]
    rank: Count
    world_size: Annotated[int, Field(ge=1, le=MAX_PROFILE_WORLD_SIZE)]
    probe: str
    free_gb_threshold: Annotated[float, Field(ge=0)]
    skip_ops: list[str]
    ops: dict[str, ProfiledOp]

    @model_validator(mode="after")
    def _rank_in_world(self) -> CommProfile:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is outside its world of {self.world_size} ranks")
        return self
