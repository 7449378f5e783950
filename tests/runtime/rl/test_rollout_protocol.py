"""The trainer <-> rollout server socket against real server processes: answers, errors, a crash, a hang."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdnctl.runtime.rl.rollout_protocol import ADDRESS_FILE, RolloutClient, RolloutError, rollout_dir

SERVER = """
import sys, time
from pathlib import Path
from gdnctl.runtime.rl.rollout_protocol import listen
behaviour = sys.argv[2]
with listen(Path(sys.argv[1])) as listener, listener.accept() as connection:
    while True:
        request = connection.recv()
        if request["op"] == "shutdown":
            sys.exit(0)
        if behaviour == "answer":
            connection.send({"echo": request["value"]} if request["op"] == "echo" else {"error": "no such op"})
        elif behaviour == "die":
            sys.exit(3)
        else:  # hang
            time.sleep(3600)
"""


def start(tmp_path: Path, behaviour: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "rollout.log"
    with log.open("w") as handle:
        process = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path), behaviour], stdout=handle,
                                   stderr=subprocess.STDOUT)
    return process, log


def test_requests_are_answered_and_errors_become_rollout_errors(tmp_path):
    process, log = start(tmp_path, "answer")
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    assert client.request("echo", value=[1, 2], timeout=10) == {"echo": [1, 2]}
    with pytest.raises(RolloutError, match="failed 'generate': no such op"):
        client.request("generate", timeout=10)
    client.close()
    assert process.returncode == 0


def test_the_address_file_is_private(tmp_path):
    process, log = start(tmp_path, "answer")
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    mode = stat.S_IMODE(os.stat(rollout_dir(tmp_path) / ADDRESS_FILE).st_mode)
    assert mode == 0o600
    client.close()


def test_a_server_that_dies_fails_the_request_with_its_exit_code_and_log(tmp_path):
    process, log = start(tmp_path, "die")
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    with pytest.raises(RolloutError, match=f"exited with code 3 during 'generate'; its log is {log}"):
        client.request("generate", timeout=60)


def test_a_hung_server_is_stopped_after_the_timeout(tmp_path):
    process, log = start(tmp_path, "hang")
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    began = time.monotonic()
    with pytest.raises(RolloutError, match="did not answer 'generate' within 2 s"):
        client.request("generate", timeout=2)
    assert time.monotonic() - began < 10
    assert process.poll() is not None, "the hung server must be stopped, not left running"


def test_a_server_that_never_comes_up_is_reported(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(5)"])
    with pytest.raises(RolloutError, match="exited with code 5 during 'starting'"):
        RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=tmp_path / "x.log")
    with pytest.raises(RolloutError, match="did not come up within 1 s"):
        RolloutClient.connect(tmp_path, timeout=1)


def test_an_address_left_by_a_gone_server_is_waited_past_until_the_new_one_listens(tmp_path):
    stale, log = start(tmp_path, "answer")
    RolloutClient.connect(tmp_path, timeout=30, process=stale, log_path=log).close()
    assert stale.wait(10) == 0  # gone; its address file stays behind
    fresh, log = start(tmp_path, "answer")
    client = RolloutClient.connect(tmp_path, timeout=30, process=fresh, log_path=log)
    assert client.request("echo", value=7, timeout=10) == {"echo": 7}
    client.close()
