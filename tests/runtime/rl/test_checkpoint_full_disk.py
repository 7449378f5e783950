"""A checkpoint save (the durable writers, and the CPU rl policy's whole save) on a disk that fills up, a real
filesystem of a fixed size (a tmpfs mounted for the test): one sentence naming the directory and its free space,
whatever writer met the full disk, no partial file left, and `latest` on the last complete checkpoint. And the
permissions of what a save writes: the umask's, every file."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.model.checkpoint import CheckpointError
from gdnctl.runtime.model.durable_files import make_directory, write_file, write_json, write_safetensors
from gdnctl.runtime.rl.algorithm import batch as rl_batch
from tests.runtime.rl.test_torch_policy import samples


@pytest.fixture
def small_disk(tmp_path):
    """A mount point whose filesystem holds `size` bytes (and `inodes` entries): mount(size) mounts a tmpfs there,
    unmounted after (lazily: a failed write's traceback may still hold a file of it open)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem of a fixed size needs root")
    mounted = []

    def mount(size: int, inodes: int | None = None) -> Path:
        point = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
        point.mkdir()
        options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True)
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "--lazy", str(point)], check=False)


def _leftovers(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.name.endswith(".tmp"))


WRITERS = {
    "safetensors": lambda path: write_safetensors(path, {"w": torch.zeros(256 * 1024)}, durable=True),
    "torch.save": lambda path: write_file(
        path, lambda temporary: torch.save([{"w": torch.zeros(256 * 1024)}], temporary)
    ),
    "json": lambda path: write_json(path, {"files": ["x" * 1024] * 1024}),
}


@pytest.mark.parametrize("writer", WRITERS.values(), ids=WRITERS.keys())
def test_a_full_disk_is_one_sentence_and_leaves_no_partial_file(small_disk, writer):
    disk = small_disk(512 * 1024)
    (disk / "model.bin").write_bytes(b"the last complete one")
    with pytest.raises(CheckpointError) as full:
        writer(disk / "model.bin")
    message = str(full.value)
    assert (
        message.startswith(f"the disk holding {disk} is full (or the quota there is used up; ") and "\n" not in message
    )
    assert "MiB free there" in message and "save_dir/latest still names the last complete checkpoint" in message
    assert _leftovers(disk) == [] and (disk / "model.bin").read_bytes() == b"the last complete one"


def test_a_directory_that_cannot_be_made_on_a_full_disk_is_a_sentence(small_disk):
    disk = small_disk(1024 * 1024, inodes=4)  # the root and three more entries
    make_directory(disk / "iter_0000001")
    with pytest.raises(CheckpointError, match=f"the disk holding {disk / 'iter_0000001'} is full"):
        make_directory(disk / "iter_0000001" / "optimizer" / "more" / "and-more")


def test_a_policy_save_on_a_disk_too_small_for_it_keeps_latest_on_the_last_checkpoint(
    small_disk, engine, gloo, tmp_path
):
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    probe = TorchPolicy(engine)
    probe.train_step([rl_batch.build_batch(samples(), pad_id=256)], engine.grpo)  # Adam's moments, saved too
    probe.save(tmp_path / "probe", 1)
    one = sum(path.stat().st_size for path in (tmp_path / "probe").rglob("*") if path.is_file())
    save_dir = small_disk(int(one * 1.5))  # room for one checkpoint, not two
    config = engine.model_copy(update={"train": engine.train.model_copy(update={"save_dir": str(save_dir)})})
    policy = TorchPolicy(config)
    policy.train_step([rl_batch.build_batch(samples(), pad_id=256)], config.grpo)
    policy.save(save_dir, 1)
    policy.train_step([rl_batch.build_batch(samples(), pad_id=256)], config.grpo)
    with pytest.raises(CheckpointError, match=f"the disk holding {save_dir}"):
        policy.save(save_dir, 2)
    assert (save_dir / "latest").read_text() == "iter_0000001\n" and _leftovers(save_dir) == []
    assert checkpoint.latest_checkpoint(save_dir) == save_dir / "iter_0000001"


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_every_file_of_a_checkpoint_follows_the_umask(engine, gloo, tmp_path, umask):
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    previous = os.umask(umask)
    try:
        TorchPolicy(engine).save(tmp_path / "save", 1)
    finally:
        os.umask(previous)
    modes = {
        str(path.relative_to(tmp_path)): oct(path.stat().st_mode & 0o777)
        for path in (tmp_path / "save").rglob("*")
        if path.is_file()
    }
    assert "save/iter_0000001/model.safetensors" in modes
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
