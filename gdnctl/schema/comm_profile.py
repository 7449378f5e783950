"""The comm guard's profile files: what the runtime writes per rank and `gdnctl comm-report` reads.

One JSON document per rank, `comm_profile_rank{R}.json`, in the run dir's `comm_profile/` (the engine config's
`comm.profile_dir`). Version 2 tracks first use per (op, process group): each group's first collective sets up
its communicator, which version 1 mistook for steady state on every group but the first.
"""

from __future__ import annotations

PROFILE_FORMAT = "gdnctl-comm-profile"
PROFILE_VERSION = 2
PROFILE_FILE_PATTERN = "comm_profile_rank{rank}.json"
DEFAULT_PROFILE_SUBDIR = "comm_profile"
