"""The record of how a local run ended (RUN_DIR/.gdnctl-local-exit.json): written whole or not at all, never through
a link, and read back by `gdnctl status` only when it is one gdnctl wrote. The launches that write it for real
are in test_launch.py, test_smoke.py and test_stop.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.launch.run_dir import RunDirNotEmpty, forget_local_exit, read_local_exit, record_local_exit
from gdnctl.schema import LOCAL_EXIT_FILE, LocalExit

RECORD = LocalExit(exit_code=3, ended_at="2026-11-26T00:00:00+00:00")


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    assert CliRunner().invoke(app, ["render", "selftest-cpu", "-o", str(run_dir)]).exit_code == 0
    return run_dir


def _status_line(run_dir: Path) -> str:
    result = CliRunner().invoke(app, ["status", str(run_dir)])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()[0]


def test_the_record_is_written_whole_and_read_back(run_dir):
    record_local_exit(run_dir, RECORD)
    assert read_local_exit(run_dir) == RECORD
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(LOCAL_EXIT_FILE)) == [LOCAL_EXIT_FILE]
    assert _status_line(run_dir) == f"{run_dir}: selftest-cpu (selftest, local) ended: failed, exit code 3"
    forget_local_exit(run_dir)
    assert read_local_exit(run_dir) is None and not (run_dir / LOCAL_EXIT_FILE).exists()


def test_a_link_at_the_name_is_replaced_not_written_through_nor_read(run_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(RECORD.model_dump_json())
    (run_dir / LOCAL_EXIT_FILE).symlink_to(victim)
    assert read_local_exit(run_dir) is None
    record_local_exit(run_dir, RECORD.model_copy(update={"exit_code": 0}))
    assert victim.read_text() == RECORD.model_dump_json()
    assert not (run_dir / LOCAL_EXIT_FILE).is_symlink() and read_local_exit(run_dir).exit_code == 0


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b'{"exit_code": 300, "ended_at": "x"}',
        b"\xff\xfe",
        b'{"exit_code": 0, "ended_at": "x", "extra": 1}',
        b" " * (128 * 1024),
    ],
)
def test_what_gdnctl_did_not_write_is_no_record(run_dir, content):
    (run_dir / LOCAL_EXIT_FILE).write_bytes(content)
    assert read_local_exit(run_dir) is None
    assert _status_line(run_dir) == f"{run_dir}: selftest-cpu (selftest, local) ended"


def test_a_fifo_at_the_name_does_not_block_status(run_dir):
    os.mkfifo(run_dir / LOCAL_EXIT_FILE)
    found: list = []
    reader = threading.Thread(target=lambda: found.append(read_local_exit(run_dir)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert found == [None]


def test_a_directory_at_the_name_is_a_sentence_before_the_run(run_dir):
    (run_dir / LOCAL_EXIT_FILE).mkdir()
    with pytest.raises(RunDirNotEmpty, match=f"{run_dir / LOCAL_EXIT_FILE} cannot be removed .*remove it"):
        forget_local_exit(run_dir)


def test_the_record_says_how_each_kind_of_end_reads():
    ended = "2026-11-26T00:00:00+00:00"
    assert LocalExit(exit_code=0, ended_at=ended).describe() == ": succeeded, exit code 0"
    assert LocalExit(exit_code=0, smoke=True, ended_at=ended).describe() == " (the smoke run): succeeded, exit code 0"
    killed = LocalExit(exit_code=137, signal="SIGKILL", ended_at=ended)
    assert (killed.outcome, killed.describe()) == ("failed", ": failed, killed by SIGKILL (exit code 137)")
    stopped = LocalExit(exit_code=130, signal="SIGINT", stopped=True, ended_at=ended)
    assert (stopped.outcome, stopped.describe()) == ("stopped", ": stopped by gdnctl on SIGINT (exit code 130)")
