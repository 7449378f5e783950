"""The default process group of a GPU check script (hf_roundtrip_check.py, rl_policy_check.py).

Under torchrun the ranks meet at the port torchrun chose. Run directly, a check is one rank that meets itself
through a file store in its own output directory: checks running side by side (`pytest -n`) then never race for a
fixed port.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist


def init_check_process_group(out_dir: Path, backend: str) -> tuple[int, int]:
    """Start the default group; returns (rank, world size)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun's ranks (it sets MASTER_ADDR/PORT too)
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        return rank, world_size
    out_dir.mkdir(parents=True, exist_ok=True)
    store = (out_dir / "process-group-store").resolve()  # file:// wants an absolute path
    dist.init_process_group(backend, init_method=store.as_uri(), rank=0, world_size=1)
    return 0, 1
