"""The weight group of the broadcast sync (runtime/rl/weights/broadcast.py) between two real processes: trainer rank 0's
TrainerEnd in this one, a rollout worker's end (join_group, then the worker's part of each broadcast) in a child.
Gloo on CPU; NCCL between two GPUs when the machine has them. The whole path, with vLLM's workers loading the
buckets, runs in tests/runtime/rl/test_rl_vllm.py (CPU) and tests/gpu/test_rl_vllm_gpu.py (2 GPUs)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from gdnctl.runtime.rl.rollout.protocol import RolloutError
from gdnctl.runtime.rl.weights import broadcast
from gdnctl.runtime.rl.weights import buckets as packing

BACKENDS = [
    pytest.param("cpu", id="gloo"),
    pytest.param(
        "cuda",
        id="nccl",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (one per side)"),
        ],
    ),
]


def _tensors(device: str) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [(f"model.layers.{i}.weight", torch.randn(64, 48, generator=generator).to(device)) for i in range(5)]


def _joined_worker(fields: dict, first_rank: int, device: str) -> tuple[SimpleNamespace, int]:
    """A rollout engine's only worker (GPU 0 on CUDA), joined to rank 0's group as `first_rank`."""
    if device == "cuda":
        torch.cuda.set_device(0)
    worker = SimpleNamespace(rank=0, device=torch.device(device, 0) if device == "cuda" else torch.device("cpu"))
    return worker, broadcast.join_group(worker, **fields, first_rank=first_rank)


def _worker(fields: dict, first_rank: int, plan: list, device: str, results) -> None:
    """A rollout engine's only worker: join as `first_rank`, receive each planned bucket, send back what
    arrived."""
    worker, rank = _joined_worker(fields, first_rank, device)
    group = getattr(worker, broadcast._WORKER_GROUP)
    received = []
    for nbytes, wire in plan:
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=worker.device)
        broadcast._receive(group, buffer)
        received += [(name, tensor.cpu()) for name, tensor in packing.views(buffer, packing.entries_from_wire(wire))]
    # As bytes, not tensors: a tensor put on a queue travels as a file descriptor that the receiver fetches from
    # this process's resource sharer, which is gone once this process has exited (FileNotFoundError in the test).
    results.put((rank, [(name, _as_bytes(tensor)) for name, tensor in received]))


def _as_bytes(tensor: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...], bytes]:
    return tensor.dtype, tuple(tensor.shape), tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _from_bytes(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def _trainer_device(device: str) -> torch.device:
    if device == "cuda":
        torch.cuda.set_device(1)
        return torch.device("cuda", 1)
    return torch.device("cpu")


@pytest.mark.parametrize("device", BACKENDS)
def test_every_bucket_reaches_every_engines_worker_byte_for_byte(device):
    """One broadcast reaches every rollout engine: on gloo, two one-worker engines (group ranks 1 and 2); on
    NCCL, one (a GPU each side)."""
    engines = 2 if device == "cpu" else 1
    context = multiprocessing.get_context("spawn")
    end = broadcast.TrainerEnd(True, workers=engines, device=_trainer_device(device), timeout_s=60)
    tensors = [(name, tensor.to(end.device)) for name, tensor in _tensors("cpu")]
    packed = list(packing.buckets(tensors, bucket_bytes=16 << 10))
    assert len(packed) > 1
    results = context.Queue()
    plan = [(b.buffer.numel(), b.wire_entries()) for b in packed]
    children = [
        context.Process(target=_worker, args=(end.join_fields(), 1 + engine, plan, device, results))
        for engine in range(engines)
    ]
    for child in children:
        child.start()
    try:
        end.join(check=lambda: None)
        for bucket in packed:
            end.send(bucket, check=lambda: None)
        arrived = sorted((results.get(timeout=60) for _ in children), key=lambda result: result[0])
    finally:
        end.close()
        for child in children:
            child.join(30)
    assert [rank for rank, _ in arrived] == list(range(1, engines + 1))
    for _, received in arrived:
        assert [name for name, _ in received] == [name for name, _ in tensors]
        for (_, sent), (_, got) in zip(tensors, received, strict=True):
            assert torch.equal(_from_bytes(*got), sent.cpu().to(torch.bfloat16))


def test_a_worker_that_never_joins_stops_rank_0_with_a_sentence_at_the_deadline():
    end = broadcast.TrainerEnd(True, workers=1, device=torch.device("cpu"), timeout_s=2)
    began = time.monotonic()
    try:
        with pytest.raises(broadcast.WeightGroupError, match=r"did not join the weight group within 2 s"):
            end.join(check=lambda: None)
    finally:
        end.close()
    assert time.monotonic() - began < 30  # rank 0's deadline, not the group's own (60 s longer) timeout


def test_a_rollout_server_that_fails_meanwhile_is_reported_while_rank_0_waits():
    """The check rank 0 runs while waiting is how the rollout server's error reaches it (RolloutClient.check)."""
    end = broadcast.TrainerEnd(True, workers=1, device=torch.device("cpu"), timeout_s=60)
    began = time.monotonic()

    def check() -> None:
        if time.monotonic() - began > 0.5:
            raise RolloutError("the rollout server failed 'group_join': RuntimeError: no GPU")

    try:
        with pytest.raises(RolloutError, match="no GPU"):
            end.join(check=check)
    finally:
        end.close()
    assert time.monotonic() - began < 10


def _worker_that_dies_mid_broadcast(fields: dict, device: str, ready, joined) -> None:
    """Join as the only worker, then never take the bucket: the test kills this process while rank 0 sends it.
    `ready` is set once the process has started and made its CUDA context, before it joins: rank 0's join deadline
    (5 s on NCCL) is for a rollout server's worker that is already up, not for a fresh process's start."""
    if device == "cuda":
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda")
    ready.set()
    _joined_worker(fields, 1, device)
    joined.set()
    time.sleep(600)


# What rank 0 says when the worker dies mid-bucket and the rollout server has not (yet) failed: gloo reports the
# closed connection, which rank 0 turns into a sentence; NCCL never completes the broadcast, so rank 0's own
# deadline (rollout.timeout_s, 5 s here) ends the wait.
WORKER_ONLY = {
    "cpu": (60, broadcast.WeightGroupError, "the weight broadcast to the rollout's workers failed"),
    "cuda": (5, broadcast.WeightGroupError, "did not receive a bucket of weights within 5 s"),
}


@pytest.mark.parametrize("server_reports", [False, True], ids=["worker-only", "server-too"])
@pytest.mark.parametrize("device", BACKENDS)
def test_a_worker_killed_during_a_broadcast_stops_rank_0_with_a_sentence(device, server_reports):
    """A bucket too large for the transport's buffers is in flight when the worker dies. Rank 0 neither hangs on
    it nor ends in the transport's own error: it reports the rollout server's failure where the server has one
    (RolloutClient.check in the job), else a sentence of its own."""
    timeout_s, error, message = WORKER_ONLY[device]
    if server_reports:
        error, message = RolloutError, "exited with code -9"
    context = multiprocessing.get_context("spawn")
    end = broadcast.TrainerEnd(True, workers=1, device=_trainer_device(device), timeout_s=timeout_s)
    ready, joined = context.Event(), context.Event()
    worker = context.Process(
        target=_worker_that_dies_mid_broadcast, args=(end.join_fields(), device, ready, joined), daemon=True
    )
    worker.start()

    def check() -> None:
        if server_reports:
            worker.join(timeout=10)  # the job's check sees a dead server; here, the killed process once reaped
        if server_reports and worker.exitcode is not None:
            raise RolloutError(f"the rollout server exited with code {worker.exitcode} during 'broadcast_bucket'")

    try:
        assert ready.wait(120), "the worker process did not start"
        end.join(check=lambda: None)
        assert joined.wait(60)
        bucket = packing.Bucket(torch.zeros(256 * 2**20, dtype=torch.uint8, device=end.device), [])
        killer = threading.Timer(1.0, worker.kill)
        killer.start()
        began = time.monotonic()
        with pytest.raises(error, match=message):
            end.send(bucket, check=check)
        assert time.monotonic() - began < 30  # not the group's own timeout (rank 0's deadline + 60 s)
    finally:
        end.close()
        worker.kill()
        worker.join()
