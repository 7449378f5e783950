"""The trainer <-> rollout server socket against real server processes: answers, errors, a crash, a hang, and
peers on the port that are not the trainer."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import struct
import subprocess
import sys
import time
from multiprocessing.connection import AuthenticationError, Client
from pathlib import Path

import pytest

from gdnctl.runtime.rl.network import UnresolvableHost, remote_bind_address
from gdnctl.runtime.rl.rollout.protocol import (
    LISTENING_LINE,
    LOCAL,
    ROLLOUT_ENV,
    RolloutClient,
    RolloutError,
    address_file,
    answer_all,
    listen,
)

HANDSHAKE_SECONDS = 2
SERVER = """
import sys, time
from pathlib import Path
from gdnctl.runtime.rl.rollout.protocol import listen
behaviour = sys.argv[2]
engine = int(sys.argv[4]) if len(sys.argv) > 4 else 0
with listen(Path(sys.argv[1]), local=True, engine=engine, handshake_seconds=float(sys.argv[3])) as listener, \\
        listener.accept() as connection:
    while True:
        request = connection.recv()
        if request["op"] == "shutdown":
            sys.exit(0)
        if behaviour in ("answer", "slow"):
            time.sleep(2 if behaviour == "slow" else 0)
            connection.send({"echo": request["value"]} if request["op"] == "echo" else {"error": "no such op"})
        elif behaviour == "die":
            sys.exit(3)
        elif behaviour == "engine":  # as vLLM's engine core fails: the cause in its own output, a summary answered
            print("(EngineCore pid=7) ERROR [core.py:1330] AssertionError: Error in memory profiling.", flush=True)
            connection.send({"error": "RuntimeError: Engine core initialization failed. See root cause above."})
        elif behaviour == "refuse":  # an error that is its own cause
            connection.send({"error": "ValueError: unknown request"})
        else:  # hang
            time.sleep(3600)
"""


# Servers the running test started: a test that fails before its server exits must not leave it running.
STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def stop_servers():
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def start(tmp_path: Path, behaviour: str, earlier_log: str = "", engine: int = 0) -> tuple[subprocess.Popen, Path]:
    """The server (of rollout engine `engine`), its output appended to its log after `earlier_log` (an earlier
    server's output) and the line a real server writes once it listens."""
    log = tmp_path / f"rollout-{engine}.log"
    log.write_text(f"{earlier_log}{LISTENING_LINE}127.0.0.1:1\n")
    with log.open("a") as handle:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(tmp_path), behaviour, str(HANDSHAKE_SECONDS), str(engine)],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    STARTED.append(process)
    return process, log


def test_requests_are_answered_and_errors_become_rollout_errors(tmp_path):
    process, log = start(tmp_path, "answer")
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    assert client.request("echo", value=[1, 2], timeout=10) == {"echo": [1, 2]}
    with pytest.raises(RolloutError, match="failed 'generate': no such op"):
        client.request("generate", timeout=10)
    client.close()
    assert process.returncode == 0


def test_an_error_answer_quotes_the_root_cause_the_servers_log_holds(tmp_path):
    process, log = start(tmp_path, "engine")
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    with pytest.raises(RolloutError) as failed:
        client.request("start", timeout=10)
    assert str(failed.value) == (
        "the rollout server failed 'start': RuntimeError: Engine core initialization failed. See root cause above.; "
        f"its log {log} says: AssertionError: Error in memory profiling."
    )
    client.close()


def test_an_error_that_is_its_own_cause_quotes_nothing_an_earlier_server_logged(tmp_path):
    process, log = start(tmp_path, "refuse", earlier_log="Traceback (most recent call last):\nOSError: an old run\n")
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    with pytest.raises(RolloutError) as failed:
        client.request("start", timeout=10)
    assert str(failed.value) == f"the rollout server failed 'start': ValueError: unknown request; its log is {log}"
    client.close()


def engines(tmp_path: Path, *behaviours: str) -> list[RolloutClient]:
    """A named client per engine, engine k's server behaving as behaviours[k]."""
    clients = []
    for engine, behaviour in enumerate(behaviours):
        process, log = start(tmp_path, behaviour, engine=engine)
        clients.append(
            RolloutClient.connect(tmp_path, timeout=30, engine=engine, process=process, log_path=log, named=True)
        )
    return clients


def test_every_engines_answer_comes_back_in_engine_order(tmp_path):
    clients = engines(tmp_path, "answer", "answer")
    for engine, client in enumerate(clients):
        client.send("echo", value=engine)
    assert answer_all(clients, "echo", timeout=30) == [{"echo": 0}, {"echo": 1}]


def test_each_answer_is_handed_on_as_it_arrives_while_another_engine_still_works(tmp_path):
    """What lets the rewards of one engine's samples start before the other engines answer."""
    clients = engines(tmp_path, "slow", "answer")
    for engine, client in enumerate(clients):
        client.send("echo", value=engine)
    arrived: list[tuple[int, dict, float]] = []
    answers = answer_all(clients, "echo", timeout=30, on_answer=lambda i, a: arrived.append((i, a, time.monotonic())))
    assert answers == [{"echo": 0}, {"echo": 1}]
    assert [(index, answer) for index, answer, _ in arrived] == [(1, {"echo": 1}), (0, {"echo": 0})]
    assert arrived[1][2] - arrived[0][2] > 1.0  # engine 1's answer was handed on while engine 0 slept


def test_an_engine_that_dies_is_reported_while_another_still_works(tmp_path):
    clients = engines(tmp_path, "hang", "die")
    for client in clients:
        client.send("echo", value=1)
    began = time.monotonic()
    with pytest.raises(RolloutError, match=r"rollout engine 1's server exited with code 3 during 'echo'"):
        answer_all(clients, "echo", timeout=60)
    assert time.monotonic() - began < 30  # not at the deadline: engine 0 still hangs


def test_engines_that_miss_the_deadline_are_all_stopped_and_named(tmp_path):
    clients = engines(tmp_path, "answer", "hang", "hang")
    for client in clients:
        client.send("echo", value=1)
    with pytest.raises(RolloutError) as failed:
        answer_all(clients, "echo", timeout=2)
    assert str(failed.value).startswith(
        "rollout engine 1's server, rollout engine 2's server did not answer 'echo' "
        "within 2 s (rollout.timeout_s), so they were stopped as hung"
    )
    assert [process.poll() is not None for process in STARTED[1:]] == [True, True]
    assert STARTED[0].poll() is None  # the one that answered is left to its shutdown


def test_the_address_file_is_private(tmp_path):
    process, log = start(tmp_path, "answer")
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    mode = stat.S_IMODE(os.stat(address_file(tmp_path)).st_mode)
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


def test_a_server_the_address_file_names_by_a_node_name_is_named_with_it(tmp_path):
    """The Slurm script's rollout step publishes its node's name (rollout_protocol.listen, local=False): the
    trainer's messages about that server say which node it is on."""
    process, log = start(tmp_path, "hang")
    published = address_file(tmp_path)
    deadline = time.monotonic() + 30
    while not published.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    host = socket.gethostname()  # resolves on this machine, as a node's name does on its cluster
    published.write_text(json.dumps({**json.loads(published.read_text()), "host": host}))
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    with pytest.raises(RolloutError, match=f"the rollout server on {re.escape(host)} did not answer 'generate'"):
        client.request("generate", timeout=1)


def test_a_server_that_never_comes_up_is_reported(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(5)"])
    with pytest.raises(RolloutError, match="exited with code 5 during 'starting'"):
        RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=tmp_path / "x.log")
    with pytest.raises(RolloutError, match="did not come up within 1 s"):
        RolloutClient.connect(tmp_path, timeout=1)


def test_a_server_killed_by_a_signal_is_reported_so_whoever_reports_its_end(tmp_path):
    """Popen's own child reports a signal as -N; the server group's leader (the server's parent in a job) as a shell
    does, 128 + N: both read as the signal's name."""
    for command in ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "import sys; sys.exit(137)"):
        process = subprocess.Popen([sys.executable, "-c", command])
        with pytest.raises(RolloutError, match=r"was killed by SIGKILL \(exit code (-9|137)\) during 'starting'"):
            RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=tmp_path / "x.log")


def test_an_address_left_by_a_gone_server_is_waited_past_until_the_new_one_listens(tmp_path):
    stale, log = start(tmp_path, "answer")
    RolloutClient.connect(tmp_path, timeout=30, process=stale, log_path=log).close()
    assert stale.wait(10) == 0  # gone; its address file stays behind
    fresh, log = start(tmp_path, "answer")
    client = RolloutClient.connect(tmp_path, timeout=30, process=fresh, log_path=log)
    assert client.request("echo", value=7, timeout=10) == {"echo": 7}
    client.close()


# --- peers that are not the trainer --------------------------------------------------------------------------


def server_address(run_dir: Path) -> tuple[str, int]:
    """The address the server published, once it listens."""
    path = address_file(run_dir)
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, "the server published no address"
        time.sleep(0.05)
    address = json.loads(path.read_text())
    return address["host"], address["port"]


def recv_exactly(peer: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = peer.recv(count - len(data))
        assert chunk, "the server closed the connection early"
        data += chunk
    return data


def send_junk(address: tuple[str, int]) -> None:
    with socket.create_connection(address) as peer:
        peer.sendall(b"GET / HTTP/1.1\r\nHost: rollout\r\n\r\n")
        try:
            peer.shutdown(socket.SHUT_WR)
        except OSError as error:
            # The server may have read the header, refused it and closed with our later bytes unread, which
            # resets the connection before we get here: it has dropped us already, which is all we wait for.
            if error.errno != errno.ENOTCONN:
                raise
            return
        # Close only once the server has dropped us, so that it reads the junk rather than a reset.
        try:
            while peer.recv(4096):
                pass
        except ConnectionResetError:
            pass


def send_a_wrong_authkey(address: tuple[str, int]) -> None:
    with pytest.raises(AuthenticationError):
        Client(address, authkey=b"not the authkey")


def stall(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address)  # says nothing; closed once the trainer got through


def hang_up_mid_handshake(address: tuple[str, int]) -> None:
    with socket.create_connection(address) as peer:
        (size,) = struct.unpack("!i", recv_exactly(peer, 4))
        recv_exactly(peer, size)  # the server's challenge, left unanswered


@pytest.mark.parametrize(
    ("fault", "logged"),
    [
        (send_junk, "it sent bytes that are not the rollout protocol (a message header announcing"),
        (send_a_wrong_authkey, "it answered the authkey challenge wrongly"),
        (stall, f"it did not finish the handshake within {HANDSHAKE_SECONDS} s"),
        (hang_up_mid_handshake, "it disconnected during the handshake"),
    ],
    ids=["junk", "wrong-authkey", "stall", "hang-up"],
)
def test_a_peer_that_fails_the_handshake_is_logged_and_the_trainer_still_gets_through(tmp_path, fault, logged):
    process, log = start(tmp_path, "answer")
    peer = fault(server_address(tmp_path))
    began = time.monotonic()
    client = RolloutClient.connect(tmp_path, timeout=30, process=process, log_path=log)
    assert client.request("echo", value=[1, 2], timeout=10) == {"echo": [1, 2]}
    assert time.monotonic() - began < HANDSHAKE_SECONDS + 5  # at most one handshake's time behind the peer
    client.close()
    if peer is not None:
        peer.close()
    assert process.returncode == 0
    dropped = [line for line in log.read_text().splitlines() if "dropped" in line]
    assert len(dropped) == 1, log.read_text()
    assert re.fullmatch(
        r"gdnctl rollout: dropped a connection from 127\.0\.0\.1:\d+: " + re.escape(logged) + ".*", dropped[0]
    ), dropped[0]


def test_a_server_beside_the_trainer_listens_on_loopback_only(tmp_path):
    with listen(tmp_path, local=True) as listener:
        published = json.loads(address_file(tmp_path).read_text())
        assert listener.address == ("127.0.0.1", published["port"])
        assert published["host"] == "127.0.0.1"


def test_a_server_on_another_node_listens_where_its_name_resolves():
    assert remote_bind_address("10.1.2.3") == "10.1.2.3"
    # A name that resolves to loopback here (Debian's 127.0.1.1 line) is reached elsewhere at an address this
    # node cannot name.
    assert remote_bind_address("localhost") == "0.0.0.0"
    with pytest.raises(UnresolvableHost, match="no-such-host.invalid does not resolve"):
        remote_bind_address("no-such-host.invalid")


@pytest.mark.parametrize(
    ("colocate", "marked", "beside"),
    [
        (True, None, True),
        (False, LOCAL, True),
        (False, "external", False),
        (False, None, False),
    ],
)
def test_the_rollout_server_listens_on_loopback_when_the_trainer_is_on_its_host(monkeypatch, colocate, marked, beside):
    from gdnctl.runtime.rl.rollout.server import trainer_shares_host
    from gdnctl.schema import EngineRollout

    rollout = EngineRollout.model_validate(
        {
            "engine": "vllm",
            "tp": 1,
            "num_gpus": 1,
            "colocate": colocate,
            "gdn_prefill_backend": None,
            "gpu_memory_utilization": 0.5,
            "kv_cache_gib": None,
            "max_model_len": 256,
            "n_samples_per_prompt": 2,
            "prompts_per_step": 1,
            "max_response_tokens": 16,
            "temperature": 1.0,
            "timeout_s": 60.0,
            "probe_tolerance": 0.1,
            "max_step0_logprob_gap": 0.05,
            "python": None,
            "enforce_eager": False,
            "weight_transport": "disk",
            "weight_transport_reason": "CPU",
            "sleep_between_phases": False,
            "vision_language_class": False,
        }
    )
    if marked is None:
        monkeypatch.delenv(ROLLOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(ROLLOUT_ENV, marked)
    assert trainer_shares_host(rollout) is beside
