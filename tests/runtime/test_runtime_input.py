"""`python -m gdnctl.runtime` on an engine.yaml that is no YAML gdnctl wrote (a sentence, exit 2, no traceback and
no hang), and every rank's own error on stderr, named by its rank."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gdnctl.runtime.__main__ import TORCHRUN_VARIABLES, main

from .engine_fixture import WORLD_SIZE, tiny_engine_config, write_engine_yaml


@pytest.fixture
def outside_torchrun(monkeypatch):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _fifo(path):
    os.mkfifo(path)


def _zero(path):
    path.symlink_to("/dev/zero")


def _huge(path):
    with path.open("wb") as stream:
        stream.truncate(17 * 1024**2)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_fifo, "is a named pipe (FIFO), not a regular file"),
        (_zero, "is a device, not a regular file"),
        (_huge, "is larger than 16 MiB"),
        (lambda path: path.mkdir(), "is a directory, not a regular file"),
        (lambda path: path.write_bytes(b"job: \xff\n"), "is not UTF-8 text"),
        (lambda path: path.write_text("[" * 100_000), "cannot be read (RecursionError)"),
        (lambda path: path.write_text("train: {seq_length: !!int abc}\n"), "cannot be read (ValueError)"),
        (lambda path: path.write_text("name: !!timestamp 2020-13-45\n"), "cannot be read (ValueError)"),
        (lambda path: path.write_text("a: [unclosed\n"), "cannot be read (ParserError)"),
        (lambda path: path.write_text("- job\n- rl\n"), "is invalid at the top level"),
    ],
)
def test_an_engine_yaml_that_does_not_parse_is_a_sentence(tmp_path, capsys, outside_torchrun, make, said):
    path = tmp_path / "engine.yaml"
    make(path)
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gdnctl runtime: engine config {path}") and said in err, err
    assert err.rstrip().endswith("render the run dir again with `gdnctl render`."), err


def test_a_rank_other_than_0_says_what_stopped_it(tmp_path, capsys, outside_torchrun):
    outside_torchrun.setenv("RANK", "3")
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err.startswith("gdnctl runtime (rank 3): engine config ")


def test_every_rank_prints_its_error(tmp_path):
    """Each rank as torchrun starts it (its variables set, one process per rank), all finding one problem."""
    config_path = write_engine_yaml(tmp_path, tiny_engine_config(selftest=None))
    ranks = []
    for rank in range(WORLD_SIZE):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORLD_SIZE),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29999",
        }
        ranks.append(
            subprocess.run(
                [sys.executable, "-m", "gdnctl.runtime", "--config", str(config_path)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
        )
    assert [proc.returncode for proc in ranks] == [2] * WORLD_SIZE
    assert [proc.stderr.split(":", 1)[0] for proc in ranks] == ["gdnctl runtime"] + [
        f"gdnctl runtime (rank {rank})" for rank in range(1, WORLD_SIZE)
    ]
    assert all("no selftest section" in proc.stderr for proc in ranks)
