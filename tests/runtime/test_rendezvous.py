"""gdnctl/runtime/launcher/rendezvous.py: the Slurm trainer step's first node holds a port the kernel picked and
hosts the store torchrun's agent then uses; the other nodes take only the port a file of this run names, and only a
store that holds this run's token. A file another run left, or a store someone else opened, is never joined."""

from __future__ import annotations

import json
import socket
import stat
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import _create_tcp_store

from gdnctl.runtime.launcher import rendezvous
from gdnctl.runtime.launcher.rendezvous import RendezvousError, prepare, published_file
from gdnctl.runtime.launcher.torchrun import split_arguments, with_is_host

TOKEN = "0123456789abcdef0123456789abcdef"


def slurm(task: int, token: str = TOKEN) -> dict[str, str]:
    return {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(task), rendezvous.TOKEN_ENV: token}


def test_the_first_node_holds_a_free_port_and_torchruns_agent_hosts_its_store_there(tmp_path):
    first = prepare(tmp_path, "127.0.0.1", 2, slurm(0))
    assert first.is_host and first.port > 0
    # Nobody else can take the port while the launcher holds it.
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", first.port))
    # What torchrun's c10d backend does with the endpoint and is_host: it gets this launcher's store, not a new one.
    parameters = RendezvousParameters(
        "c10d", f"127.0.0.1:{first.port}", "7", 2, 2, is_host=with_is_host("", True).split("=")[1]
    )
    assert _create_tcp_store(parameters).get(rendezvous.TOKEN_KEY).decode() == TOKEN
    published = published_file(tmp_path, "7", "0")
    assert json.loads(published.read_text()) == {"port": first.port, "token": TOKEN}
    assert stat.S_IMODE(published.stat().st_mode) == 0o600
    first.close()
    assert not published.exists()


def test_another_node_takes_the_port_its_token_names_and_connects_as_a_client(tmp_path):
    first = prepare(tmp_path, "127.0.0.1", 2, slurm(0))
    second = prepare(tmp_path, "127.0.0.1", 2, slurm(1))
    assert (second.port, second.is_host, second.store) == (first.port, False, None)


def test_one_node_publishes_nothing(tmp_path):
    only = prepare(tmp_path, "127.0.0.1", 1, slurm(0))
    assert only.is_host and not list(tmp_path.iterdir())


def test_a_file_another_run_left_is_waited_past_and_refused_at_the_deadline(tmp_path, monkeypatch):
    """A requeued job's steps, and a fresh cluster's job ids, reuse a file name; the token tells the runs apart."""
    monkeypatch.setattr(rendezvous, "WAIT_SECONDS", 0.5)
    stale = prepare(tmp_path, "127.0.0.1", 2, slurm(0, token="f" * 32))  # another run's first node, still there
    with pytest.raises(RendezvousError) as refused:
        prepare(tmp_path, "127.0.0.1", 2, slurm(1))
    message = str(refused.value)
    assert "did not publish its rendezvous port within 0.5 s" in message
    assert "holds another run's token (an earlier run of the steps left it)" in message
    stale.close()


def test_a_store_someone_else_opened_at_the_published_port_is_never_joined(tmp_path):
    foreign = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    published_file(tmp_path, "7", "0").write_text(json.dumps({"port": foreign.port, "token": TOKEN}))
    with pytest.raises(RendezvousError) as refused:
        prepare(tmp_path, "127.0.0.1", 2, slurm(1))
    assert f"the store at 127.0.0.1:{foreign.port}" in str(refused.value)
    assert "is not this job's (it does not hold this run's token), so this node does not join it" in str(refused.value)
    assert foreign.num_keys() == 0  # nothing of this job was written into it


def test_outside_a_slurm_step_or_without_the_token_it_says_what_is_missing(tmp_path):
    with pytest.raises(RendezvousError, match="SLURM_STEP_ID, SLURM_PROCID is not set here"):
        prepare(tmp_path, "127.0.0.1", 2, {"SLURM_JOB_ID": "7", rendezvous.TOKEN_ENV: TOKEN})
    with pytest.raises(RendezvousError, match="GDNCTL_RENDEZVOUS_TOKEN is not set"):
        prepare(tmp_path, "127.0.0.1", 2, {**slurm(0), rendezvous.TOKEN_ENV: ""})


def test_the_launcher_takes_its_own_option_off_and_tells_torchrun_who_hosts():
    assert split_arguments(["--rendezvous-dir", "/r", "--nnodes", "2"]) == (rendezvous.Path("/r"), ["--nnodes", "2"])
    assert split_arguments(["--rendezvous-dir=/r", "x"]) == (rendezvous.Path("/r"), ["x"])
    assert split_arguments(["--nnodes", "2"]) == (None, ["--nnodes", "2"])
    assert with_is_host("", True) == "is_host=true"
    assert with_is_host("join_timeout=900,is_host=true", False) == "join_timeout=900,is_host=false"
