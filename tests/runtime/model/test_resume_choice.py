"""Which checkpoint a resume takes when save_dir/latest names something else than one of the save dir's own
checkpoints: a path leading out, an absolute one, a link to another run's checkpoint. Each is a sentence; none is
resumed (a one-rank gloo group: the choice is collective)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch.distributed as dist

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.model.checkpoint import CheckpointError
from gdnctl.runtime.model.durable_files import document_checksum


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _whole_checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True)
    state = {"iteration": 1, "world_size": 1, "files": {}}
    (directory / "trainer_state.json").write_text(json.dumps({**state, "state_sha256": document_checksum(state)}))
    return directory


@pytest.mark.parametrize("named", ["../other/iter_0000001", "{other}/iter_0000001", "iter_0000001/../../other"])
def test_latest_naming_a_checkpoint_outside_the_save_dir_is_refused(tmp_path, one_rank, named):
    save_dir, other = tmp_path / "save", tmp_path / "other"
    _whole_checkpoint(other / "iter_0000001")  # another run's checkpoint, whole and resumable
    _whole_checkpoint(save_dir / "iter_0000001")
    (save_dir / "latest").write_text(named.format(other=other) + "\n")
    with pytest.raises(CheckpointError) as refused:
        checkpoint.latest_checkpoint(save_dir)
    assert f"{save_dir / 'latest'} names " in str(refused.value)
    assert f"which is not a checkpoint directory of {save_dir} itself (iter_N)" in str(refused.value)


def test_a_checkpoint_that_is_a_link_out_of_the_save_dir_is_refused(tmp_path, one_rank):
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    os.symlink(_whole_checkpoint(tmp_path / "other" / "iter_0000002"), save_dir / "iter_0000002")
    _whole_checkpoint(save_dir / "iter_0000001")
    (save_dir / "latest").write_text("iter_0000002\n")
    with pytest.raises(CheckpointError, match="'iter_0000002', which is not a checkpoint directory of"):
        checkpoint.latest_checkpoint(save_dir)
    (save_dir / "latest").write_text("iter_0000001\n")  # the older ones skip links too
    assert checkpoint.latest_checkpoint(save_dir) == save_dir / "iter_0000001"
