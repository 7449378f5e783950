"""Writes in train.save_dir never follow a link planted there: the lock file, the temporary file of every atomic
write (checkpoint files and `latest`), and `latest` itself. Real files and links; the target must stay as it was."""

from __future__ import annotations

import os

import pytest

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.model.checkpoint import CheckpointError
from gdnctl.runtime.model.save_lock import LOCK_FILE, UnsafeLockFile, hold_save_dir


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def test_a_link_as_the_lock_file_is_refused(tmp_path, victim):
    save_dir = tmp_path / "checkpoints"
    save_dir.mkdir()
    (save_dir / LOCK_FILE).symlink_to(victim)
    with pytest.raises(UnsafeLockFile) as refused:
        hold_save_dir(save_dir, tmp_path / "run")
    assert str(refused.value) == (
        f"the save dir's lock file {save_dir / LOCK_FILE} is a symbolic link, which gdnctl does not write through "
        f"(it would truncate what the link points to); remove the link (rm {save_dir / LOCK_FILE}) and start the "
        "job again."
    )
    assert victim.read_text() == "precious\n"


def test_a_fifo_as_the_lock_file_is_refused(tmp_path):
    save_dir = tmp_path / "checkpoints"
    save_dir.mkdir()
    os.mkfifo(save_dir / LOCK_FILE)
    with pytest.raises(UnsafeLockFile, match="is not a regular file; remove it"):
        hold_save_dir(save_dir, tmp_path / "run")


@pytest.mark.parametrize("name", [".latest.tmp", "iter_0000001/.trainer_state.json.tmp"])
def test_a_link_as_a_temporary_file_is_refused(tmp_path, victim, name):
    save_dir = tmp_path / "checkpoints"
    (save_dir / "iter_0000001").mkdir(parents=True)
    (save_dir / name).symlink_to(victim)
    with pytest.raises(
        CheckpointError,
        match=f"{save_dir / name} is a symbolic link or not a regular file, which gdnctl does not write through",
    ):
        if name == ".latest.tmp":
            checkpoint.mark_latest(save_dir, "iter_0000001")
        else:
            checkpoint.write_json(save_dir / "iter_0000001" / "trainer_state.json", {"iteration": 1})
    assert victim.read_text() == "precious\n"
    assert not (save_dir / "latest").exists() and not (save_dir / "iter_0000001" / "trainer_state.json").exists()


def test_latest_as_a_link_is_replaced_not_written_through(tmp_path, victim):
    save_dir = tmp_path / "checkpoints"
    save_dir.mkdir()
    (save_dir / "latest").symlink_to(victim)
    (save_dir / ".latest.tmp").write_text("iter_0000009\n")  # what a save killed mid-write leaves
    checkpoint.mark_latest(save_dir, "iter_0000002")
    assert not (save_dir / "latest").is_symlink() and (save_dir / "latest").read_text() == "iter_0000002\n"
    assert victim.read_text() == "precious\n" and not (save_dir / ".latest.tmp").exists()
