"""In-memory weight sync for a rollout on GPUs of its own: trainer rank 0 broadcasts its HF tensors, in buckets,
over a process group that holds it and every vLLM worker (NCCL on GPUs, gloo on CPU).

Separate placement (rollout.colocate: false) puts vLLM on GPUs the trainer does not use, so the CUDA IPC path
(cuda_ipc.py) cannot reach them and the disk path copies every weight through host memory and the filesystem.
Here the weights go GPU to GPU: trainer rank 0 (which holds every HF tensor: the builders gather them) packs a
bucket (buckets.py) and broadcasts it; each worker receives it into a buffer of its own, copies the tensors out
and loads them through worker_reload.py, so vLLM's name mapping, fusing and tensor-parallel sharding apply as
they do for a checkpoint. Every worker receives whole tensors and keeps its own shard.

The group is built once, on the first in-memory sync: trainer rank 0 hosts a TCPStore and is group rank 0; the
vLLM worker of rank r in vLLM's world is group rank 1 + r. It is a bare backend object (ProcessGroupNCCL or
ProcessGroupGloo on the store), not a torch.distributed group, so it stands beside the trainer's and vLLM's own
default groups without touching either. Joining and each bucket are collective, so trainer rank 0 sends the
rollout server its request first and then takes part; the server's answer comes once the workers are done.

This module runs on both sides (the rollout server's workers run the worker functions through collective_rpc):
torch and stdlib only.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from gdnctl.runtime.rl import buckets as packing
from gdnctl.runtime.rl.worker_reload import load_into_model

# The trainer's rank in the group; vLLM's worker r is 1 + r.
ROOT = 0
_PREFIX = "gdnctl-weights"  # the store's keys, apart from anything else a store on that port might carry
_WORKER_GROUP = "_gdnctl_weight_group"  # the attribute a worker keeps its end of the group under


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def store_host(rollout_on_this_host: bool) -> str:
    """The address the rollout's workers reach trainer rank 0's store by: loopback when the rollout runs on
    this host, else this node's name (the Slurm script's rollout step runs on other nodes)."""
    return "127.0.0.1" if rollout_on_this_host else socket.gethostname()


def _group(store: dist.Store, rank: int, size: int, backend: str, timeout: datetime.timedelta):
    prefixed = dist.PrefixStore(_PREFIX, store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


# How often trainer rank 0, waiting on the group, asks whether the rollout server has failed meanwhile.
_CHECK_SECONDS = 0.01


def _broadcast(group, tensor: torch.Tensor, check: Callable[[], None] | None = None) -> None:
    """Broadcast `tensor` from ROOT. `check` (trainer rank 0's) runs while the broadcast is under way and raises
    when the other side failed, so a worker that died before taking part fails the job with the server's
    sentence instead of holding it until the group's timeout."""
    options = dist.BroadcastOptions()
    options.rootRank = ROOT
    work = group.broadcast([tensor], options)
    while check is not None and not work.is_completed():
        check()
        time.sleep(_CHECK_SECONDS)
    work.wait()
    if tensor.is_cuda:
        torch.cuda.current_stream().synchronize()  # NCCL's wait only orders the stream; the buffer is reused next


class TrainerEnd:
    """Trainer rank 0's end of the group: it hosts the store, so it is created before the workers join."""

    def __init__(self, host: str, workers: int, device: torch.device, timeout_s: float) -> None:
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.size = 1 + workers
        self.backend = backend_for(device)
        self.host = host
        # The store's server listens on every interface; port 0 takes a free one, which the workers are told
        # (join_fields). The workers connect later, so the constructor must not wait for them.
        self.store = dist.TCPStore(host, 0, self.size, True, timeout=self.timeout, wait_for_workers=False)
        self.group = None

    def join_fields(self) -> dict:
        """What the rollout server hands its workers to join (the `group_join` request)."""
        return {"host": self.host, "port": self.store.port, "size": self.size, "backend": self.backend,
                "timeout_s": self.timeout.total_seconds()}

    def join(self, check: Callable[[], None]) -> None:
        """Take part in the group's creation while the workers join; `check` runs meanwhile and raises when the
        rollout server failed to (gloo's constructor blocks until every rank connected or the timeout passed)."""
        made: list = []
        failed: list[BaseException] = []

        def make() -> None:
            try:
                made.append(_group(self.store, ROOT, self.size, self.backend, self.timeout))
            except BaseException as error:  # noqa: BLE001 - handed to the calling thread
                failed.append(error)

        maker = threading.Thread(target=make, name="gdnctl-weight-group", daemon=True)
        maker.start()
        while maker.is_alive():
            check()
            maker.join(_CHECK_SECONDS)
        if failed:
            raise failed[0]
        self.group = made[0]

    def send(self, bucket: packing.Bucket, check: Callable[[], None]) -> None:
        _broadcast(self.group, bucket.buffer, check)


# --- rollout side: run inside vLLM's workers through LLM.collective_rpc (the first argument is the worker) -----

def join_group(worker, host: str, port: int, size: int, backend: str, timeout_s: float) -> int:
    """Join trainer rank 0's weight group as rank 1 + this worker's rank; returns that rank."""
    timeout = datetime.timedelta(seconds=timeout_s)
    rank = 1 + worker.rank
    store = dist.TCPStore(host, port, size, False, timeout=timeout)
    setattr(worker, _WORKER_GROUP, _group(store, rank, size, backend, timeout))
    return rank


def receive_bucket(worker, nbytes: int, wire_entries: list[tuple]) -> int:
    """Receive one bucket from trainer rank 0 and load it; returns how many tensors it held."""
    group = getattr(worker, _WORKER_GROUP, None)
    if group is None:
        raise RuntimeError("this worker has not joined the trainer's weight group (group_join comes first)")
    # The worker's own device: inside a layerwise reload the model's parameters are on the meta device.
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=worker.device)
    _broadcast(group, buffer)
    return load_into_model(worker, packing.copies(buffer, packing.entries_from_wire(wire_entries)))
