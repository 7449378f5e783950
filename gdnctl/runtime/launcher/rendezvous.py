"""The Slurm trainer step's rendezvous: a port that no other job can collide with or guess, and a store that no
launcher takes for its own unless its job opened it.

The script used to give torchrun `--rdzv-endpoint HEAD:$((29500 + SLURM_JOB_ID % 1000))`. Two jobs 1,000 ids apart
whose first node was the same asked for the same port, and torchrun's c10d backend, when it cannot open its store
on the host it should host it on, connects to whatever holds the port instead (torch/distributed/elastic/
rendezvous/c10d_rendezvous_backend.py, _create_tcp_store: it tries is_host, then False). The second job met in the
first job's store and died when the first ended; anyone who bound the port first hosted the job's rendezvous.

Now the launcher on the step's first node (task 0 of the step, which starts at the job's first node) opens the
store itself, on a port the kernel picks among the free ones, before torchrun starts, and keeps it for the whole
run: torchrun's agent in the same process takes that very store (TCPStore's multi_tenant shares one server per
process and port). It is told it hosts (is_host), so it never falls back to connecting elsewhere. The launchers
of the other nodes learn the port from a file in the run dir that the first one writes, beside a token the batch
script drew for this run of the steps (GDNCTL_RENDEZVOUS_TOKEN, in the environment only); the first launcher puts
the token in its store too. A launcher uses only a file that holds its token (a file an earlier run left, after a
requeue or with a fresh cluster's job ids, is waited past) and only a store that holds the token: a store that
someone else opened at that port is refused with a sentence, never joined.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, read_json, replace_text

TOKEN_ENV = "GDNCTL_RENDEZVOUS_TOKEN"
# The store's key for the token, apart from torchrun's own keys (torch.rendezvous.RUN_ID...).
TOKEN_KEY = "gdnctl/rendezvous-token"
# How long the other nodes' launchers wait for the first one's port: torchrun's own default join timeout.
WAIT_SECONDS = 600.0
POLL_SECONDS = 0.25
# Connecting to the first node's store, and reading the token back from it.
CONNECT_SECONDS = 60.0
MAX_FILE_BYTES = 4096


class RendezvousError(GdnctlError):
    """The trainer step's launchers could not meet in their job's own store."""

    exit_code = 1


@dataclass
class Rendezvous:
    """Where this node's torchrun agent meets the others: `port` on the endpoint's host, and whether it hosts the
    store. `store` keeps the first node's store open while torchrun runs (None on the other nodes)."""

    port: int
    is_host: bool
    store: object | None = None
    published: Path | None = None

    def close(self) -> None:
        """After torchrun: the published port is no use to anyone any more."""
        if self.published is not None:
            self.published.unlink(missing_ok=True)


def published_file(run_dir: Path, job_id: str, step_id: str) -> Path:
    """Where the first node's launcher of step `step_id` of job `job_id` writes its port."""
    return run_dir / f".gdnctl-rendezvous-{job_id}.{step_id}.json"


def _slurm(environ: dict[str, str]) -> tuple[str, str, int]:
    names = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID")
    missing = [name for name in names if not environ.get(name)]
    if missing:
        raise RendezvousError(
            f"--rendezvous-dir is for the Slurm script's trainer step, and {', '.join(missing)} is not set here; "
            "run the job with sbatch launch_slurm.sbatch, or with launch_local.sh on one host."
        )
    return environ["SLURM_JOB_ID"], environ["SLURM_STEP_ID"], int(environ["SLURM_PROCID"])


def _token(environ: dict[str, str]) -> str:
    token = environ.get(TOKEN_ENV, "")
    if len(token) < 16:
        raise RendezvousError(
            f"{TOKEN_ENV} is not set (or too short) in the trainer step's environment: the Slurm script draws it "
            "for each run of its steps; run the script as gdnctl rendered it (re-render with gdnctl render --force)."
        )
    return token


def prepare(run_dir: Path, host: str, nnodes: int, environ: dict[str, str] | None = None) -> Rendezvous:
    """This node's rendezvous: the first node's launcher opens the store, the others find it (see the module's
    docstring). `host`: the endpoint's host, the first node's name; `nnodes`: the step's nodes."""
    import torch.distributed as dist

    environ = dict(os.environ if environ is None else environ)
    job_id, step_id, task = _slurm(environ)
    token = _token(environ)
    path = published_file(run_dir, job_id, step_id)
    if task == 0:
        # Every interface, as torchrun's own store listens; port 0: one the kernel finds free, and holds from now on.
        store = dist.TCPStore(
            "0.0.0.0",
            0,
            None,
            True,
            timeout=timedelta(seconds=CONNECT_SECONDS),
            wait_for_workers=False,
            multi_tenant=True,
        )
        store.set(TOKEN_KEY, token)
        print(f"gdnctl: rendezvous on {host}:{store.port} (a port this launcher holds)", flush=True)
        if nnodes == 1:
            return Rendezvous(store.port, True, store)
        replace_text(path, json.dumps({"port": store.port, "token": token}), mode=0o600)
        return Rendezvous(store.port, True, store, path)
    port = _wait_for_port(path, token, host)
    _check_store(host, port, token, path)
    return Rendezvous(port, False)


def _wait_for_port(path: Path, token: str, host: str) -> int:
    deadline = time.monotonic() + WAIT_SECONDS
    stale = False
    while True:
        try:
            found = read_json(path, MAX_FILE_BYTES)
        except UnreadableFile:  # not there yet (or being replaced)
            found = None
        if isinstance(found, dict) and found.get("token") == token and isinstance(found.get("port"), int):
            return found["port"]
        stale = stale or found is not None
        if time.monotonic() > deadline:
            what = "holds another run's token (an earlier run of the steps left it)" if stale else "was not written"
            raise RendezvousError(
                f"the trainer step's first node ({host}) did not publish its rendezvous port within "
                f"{WAIT_SECONDS:g} s: {path} {what}; the first node's output above says why it did not start."
            )
        time.sleep(POLL_SECONDS)


def _check_store(host: str, port: int, token: str, path: Path) -> None:
    """Refuse a store at host:port that does not hold this run's token: not the one the first node opened."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=CONNECT_SECONDS))
        held = store.get(TOKEN_KEY).decode() if store.check([TOKEN_KEY]) else None
    except (RuntimeError, OSError, ValueError) as error:
        raise RendezvousError(
            f"cannot reach the trainer step's rendezvous store at {host}:{port}, which {path} names "
            f"({str(error).splitlines()[0]}); the first node's output above says whether it still runs."
        ) from None
    if held != token:
        raise RendezvousError(
            f"the store at {host}:{port}, which {path} names, is not this job's (it does not hold this run's "
            "token), so this node does not join it: another process holds that port; start the job again."
        )
