"""In-memory weight sync for a rollout on GPUs of its own: trainer rank 0 broadcasts its HF tensors, in buckets,
over a process group that holds it and every vLLM worker (NCCL on GPUs, gloo on CPU).

Separate placement (rollout.colocate: false) puts vLLM on GPUs the trainer does not use, so the CUDA IPC path
(weights/cuda_ipc.py) cannot reach them and the disk path copies every weight through host memory and the filesystem.
Here the weights go GPU to GPU: trainer rank 0 (which holds every HF tensor: the builders gather them) packs a
bucket (weights/buckets.py) and broadcasts it; each worker receives it into a buffer of its own, copies the tensors out
and loads them through weights/worker_reload.py, so vLLM's name mapping, fusing and tensor-parallel sharding apply as
they do for a checkpoint. Every worker receives whole tensors and keeps its own shard.

The group is built once, on the first in-memory sync: trainer rank 0 hosts a TCPStore and is group rank 0; the
vLLM worker of rank r in rollout engine k's world is group rank 1 + k * rollout.tp + r, so one broadcast reaches
every worker of every engine. It is a bare backend object (ProcessGroupNCCL or
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

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.network import LOOPBACK, remote_bind_address
from gdnctl.runtime.rl.weights import buckets as packing
from gdnctl.runtime.rl.weights.worker_reload import load_into_model

# The trainer's rank in the group; worker r of engine k is 1 + k * rollout.tp + r.
ROOT = 0
_PREFIX = "gdnctl-weights"  # the store's keys, apart from anything else a store on that port might carry
_WORKER_GROUP = "_gdnctl_weight_group"  # the attribute a worker keeps its end of the group under


class WeightGroupError(GdnctlError):
    """The weight group with the rollout's workers could not form or a broadcast did not finish."""

    exit_code = 1


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def store_address(rollout_on_this_host: bool) -> tuple[str, str]:
    """(the name the rollout's workers reach trainer rank 0's store by, the address the store listens on):
    loopback when the rollout runs on this host, else this node's name and the interface it resolves to (the
    Slurm script's rollout step runs on other nodes). The store has no authkey, so it listens no wider than the
    workers need."""
    if rollout_on_this_host:
        return LOOPBACK, LOOPBACK
    host = socket.gethostname()
    return host, remote_bind_address(host)


def _group(store: dist.Store, rank: int, size: int, backend: str, timeout: datetime.timedelta):
    prefixed = dist.PrefixStore(_PREFIX, store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


# How often trainer rank 0, waiting on the group, asks whether the rollout server has failed meanwhile.
_CHECK_SECONDS = 0.01
# The group's own timeout exceeds rank 0's deadline by this much, so rank 0 gives up with a sentence before
# the backend aborts the process (gdnctl runs NCCL with TORCH_NCCL_ASYNC_ERROR_HANDLING=1).
_GROUP_TIMEOUT_MARGIN_S = 60.0


def _options() -> dist.BroadcastOptions:
    options = dist.BroadcastOptions()
    options.rootRank = ROOT
    return options


def _receive(group, tensor: torch.Tensor) -> None:
    """A worker's part of one broadcast."""
    group.broadcast([tensor], _options()).wait()
    if tensor.is_cuda:
        torch.cuda.current_stream().synchronize()


def _handshake(group, device: torch.device) -> None:
    """One tiny broadcast: NCCL connects a communicator on its first collective, not when the group is built,
    so this makes the group's creation the moment both sides connect (and fail, if they cannot)."""
    _receive(group, torch.zeros(1, device=device))


class TrainerEnd:
    """Trainer rank 0's end of the group: it hosts the store, so it is created before the workers join. Every
    wait on the group is bounded by `timeout_s` and checked against the rollout server meanwhile; a failure is
    a WeightGroupError sentence."""

    def __init__(self, on_this_host: bool, workers: int, device: torch.device, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.group_timeout = datetime.timedelta(seconds=timeout_s + _GROUP_TIMEOUT_MARGIN_S)
        self.size = 1 + workers
        self.device = device
        self.backend = backend_for(device)
        self.host, bind = store_address(on_this_host)
        # Our own listening socket: TCPStore would listen on every interface. Port 0 takes a free one, which the
        # workers are told (join_fields); they connect later, so the store must not wait for them.
        self._listener = socket.create_server((bind, 0), backlog=64)
        try:
            self.store = dist.TCPStore(
                self.host,
                self._listener.getsockname()[1],
                self.size,
                True,
                timeout=self.group_timeout,
                wait_for_workers=False,
                master_listen_fd=self._listener.fileno(),
            )
        except (RuntimeError, OSError) as error:
            self._listener.close()
            raise WeightGroupError(
                f"trainer rank 0 could not open the weight group's store on {bind} ({error}); "
                "set rollout.weight_sync: disk to sync through the run dir instead."
            ) from None
        self.group = None

    def join_fields(self) -> dict:
        """What the rollout server hands its workers to join (the `group_join` request)."""
        return {
            "host": self.host,
            "port": self.store.port,
            "size": self.size,
            "backend": self.backend,
            "timeout_s": self.group_timeout.total_seconds(),
        }

    def join(self, check: Callable[[], None]) -> None:
        """Take part in the group's creation and first connection while the workers join; `check` runs
        meanwhile and raises when the rollout server failed to join."""
        made: list = []
        failed: list[BaseException] = []

        def make() -> None:
            try:
                if self.device.type == "cuda":
                    torch.cuda.set_device(self.device)  # this thread's NCCL calls go to rank 0's GPU
                group = _group(self.store, ROOT, self.size, self.backend, self.group_timeout)
                _handshake(group, self.device)
                made.append(group)
            except BaseException as error:  # noqa: BLE001 - handed to the calling thread
                failed.append(error)

        maker = threading.Thread(target=make, name="gdnctl-weight-group", daemon=True)
        maker.start()
        self._wait(maker.is_alive, check, "join the weight group")
        if failed:
            raise WeightGroupError(
                f"the weight group with the rollout's workers did not form ({failed[0]}); set "
                "rollout.weight_sync: disk to sync through the run dir instead."
            ) from None
        self.group = made[0]

    def send(self, bucket: packing.Bucket, check: Callable[[], None]) -> None:
        """Broadcast one bucket; returns once every worker has it."""
        work = self.group.broadcast([bucket.buffer], _options())
        self._wait(lambda: not work.is_completed(), check, "receive a bucket of weights")
        try:
            work.wait()
        except RuntimeError as error:  # a worker gone mid-broadcast: gloo reports the closed connection here
            check()  # the rollout server's own failure, where it has one, says more than the transport's
            raise WeightGroupError(
                f"the weight broadcast to the rollout's workers failed ({str(error).splitlines()[0]}); see the "
                "rollout server's log, fix what it reports and start the job again (it resumes from the last "
                "checkpoint)."
            ) from None
        if bucket.buffer.is_cuda:
            torch.cuda.current_stream().synchronize()  # NCCL's wait only orders the stream

    def close(self) -> None:
        """Tear the group down (at the job's end; the workers' ends go with their processes). Abort, not
        shutdown: this also runs after a failed broadcast, whose pending work a shutdown would wait for."""
        abort = getattr(self.group, "abort", None)
        if abort is not None:
            abort()
        self.group = None
        self._listener.close()

    def _wait(self, pending: Callable[[], bool], check: Callable[[], None], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while pending():
            check()
            if time.monotonic() > deadline:
                check()  # the server's own error, if it has one, says more than the deadline
                raise WeightGroupError(
                    f"the rollout's workers did not {what} within {self.timeout_s:g} s "
                    "(rollout.timeout_s); see the rollout server's log, or raise "
                    "rollout.timeout_s if the network between them is just slow."
                )
            time.sleep(_CHECK_SECONDS)


# --- rollout side: run inside vLLM's workers through LLM.collective_rpc (the first argument is the worker) -----


def join_group(worker, host: str, port: int, size: int, backend: str, timeout_s: float, first_rank: int) -> int:
    """Join trainer rank 0's weight group as rank `first_rank` (this engine's first worker's) + this worker's rank
    in its engine; returns that rank."""
    timeout = datetime.timedelta(seconds=timeout_s)
    rank = first_rank + worker.rank
    store = dist.TCPStore(host, port, size, False, timeout=timeout)
    group = _group(store, rank, size, backend, timeout)
    _handshake(group, worker.device)
    setattr(worker, _WORKER_GROUP, group)
    return rank


def receive_bucket(worker, nbytes: int, wire_entries: list[tuple]) -> int:
    """Receive one bucket from trainer rank 0 and load it; returns how many tensors it held."""
    group = getattr(worker, _WORKER_GROUP, None)
    if group is None:
        raise RuntimeError("this worker has not joined the trainer's weight group (group_join comes first)")
    # The worker's own device: inside a layerwise reload the model's parameters are on the meta device.
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=worker.device)
    _receive(group, buffer)
    # Views, not copies: the buffer is this bucket's alone, and the views keep it alive while vLLM's layerwise
    # loader holds them.
    return load_into_model(worker, list(packing.views(buffer, packing.entries_from_wire(wire_entries))))
