"""The `selftest` job: prove on this cluster, before a real job, that the runtime's pieces behave.

Every rank runs every check; rank 0 prints one line per check (`selftest: <check> ok|FAIL|skipped ...`,
FAIL when any rank failed), the host each rank ran on, and a summary. The checks:

- the comm guard under the engine config's policy, with every op checked and the clear path forced, and
  with every op skipped: each collective gives the same result as with the guard uninstalled, checked ops
  read the memory probe once per call and skipped ops never, and uninstall restores torch.distributed;
- the comm profile (when comm.profile is on): every rank's file is written with the calls made;
- THD <-> BSHD layout round trips on random batches, sequences padded to multiples of cp;
- the GDN kernel backend resolves (on CPU its unavailability is the expected outcome).
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import random
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.runtime.comm import CommGuardPolicy, CountingProbe
from gdnctl.runtime.comm import guard as comm_guard
from gdnctl.runtime.data import layout
from gdnctl.runtime.train import TENSORBOARD_DIR, MetricsLog, wandb_run_id
from gdnctl.schema import PROFILE_FILE_PATTERN, EngineConfig, comm_ops


@dataclass(frozen=True)
class CollectiveCase:
    """One communication call. `op(rank)` is the op name the rank calls (None: it calls no guarded op, as
    ranks outside a point-to-point pair or `batch_isend_irecv`); `run(group)` makes the call through
    `torch.distributed` (or the group's method) and returns what it produced."""

    label: str
    op: Callable[[int], str | None]
    run: Callable[[Any], Any]
    point_to_point: bool = False  # needs ranks 0 and 1


def _values(rank: int, count: int = 4) -> torch.Tensor:
    return torch.arange(count, dtype=torch.float32) + 100 * rank


def _zeros(count: int = 4) -> torch.Tensor:
    return torch.zeros(count, dtype=torch.float32)


def _rank_and_size(group: Any) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def _every_rank(op: str) -> Callable[[int], str]:
    return lambda rank: op


def _pair(sender_op: str, receiver_op: str) -> Callable[[int], str | None]:
    """Point-to-point cases run between ranks 0 and 1; other ranks sit them out."""
    return lambda rank: {0: sender_op, 1: receiver_op}.get(rank)


def _function_cases() -> list[CollectiveCase]:
    def all_reduce(group):
        tensor = _values(dist.get_rank(group))
        dist.all_reduce(tensor, group=group)
        return tensor

    def all_gather(group):
        rank, size = _rank_and_size(group)
        outputs = [_zeros() for _ in range(size)]
        dist.all_gather(outputs, _values(rank), group=group)
        return outputs

    def all_gather_into_tensor(group):
        rank, size = _rank_and_size(group)
        output = _zeros(4 * size)
        dist.all_gather_into_tensor(output, _values(rank), group=group)
        return output

    def all_gather_object(group):
        rank, size = _rank_and_size(group)
        outputs = [None] * size
        dist.all_gather_object(outputs, {"rank": rank, "tokens": [rank] * 3}, group=group)
        return outputs

    def all_to_all(group):
        rank, size = _rank_and_size(group)
        outputs = [_zeros(2) for _ in range(size)]
        dist.all_to_all(outputs, [torch.full((2,), float(10 * rank + peer)) for peer in range(size)], group=group)
        return outputs

    def all_to_all_single(group):
        rank, size = _rank_and_size(group)
        output = _zeros(2 * size)
        dist.all_to_all_single(output, _values(rank, 2 * size), group=group)
        return output

    def broadcast(group):
        tensor = _values(dist.get_rank(group))
        dist.broadcast(tensor, src=0, group=group)
        return tensor

    def broadcast_object_list(group):
        objects = [{"from": dist.get_rank(group)}, "payload"]
        dist.broadcast_object_list(objects, src=0, group=group)
        return objects

    def reduce(group):
        tensor = _values(dist.get_rank(group))
        dist.reduce(tensor, dst=0, group=group)
        return tensor

    def reduce_scatter(group):
        rank, size = _rank_and_size(group)
        output = _zeros(2)
        dist.reduce_scatter(output, [torch.full((2,), float(rank + peer)) for peer in range(size)], group=group)
        return output

    def reduce_scatter_tensor(group):
        rank, size = _rank_and_size(group)
        output = _zeros(2)
        dist.reduce_scatter_tensor(output, _values(rank, 2 * size), group=group)
        return output

    def scatter(group):
        rank, size = _rank_and_size(group)
        output = _zeros(3)
        inputs = [torch.full((3,), float(peer)) for peer in range(size)] if rank == 0 else None
        dist.scatter(output, inputs, src=0, group=group)
        return output

    def gather(group):
        rank, size = _rank_and_size(group)
        outputs = [_zeros() for _ in range(size)] if rank == 0 else None
        dist.gather(_values(rank), outputs, dst=0, group=group)
        return outputs

    def barrier(group):
        dist.barrier(group=group)

    def send_recv(group):
        rank = dist.get_rank(group)
        if rank == 0:
            dist.send(_values(rank), dst=1, group=group)
            return None
        if rank == 1:
            buffer = _zeros()
            dist.recv(buffer, src=0, group=group)
            return buffer
        return None

    def isend_irecv(group):
        rank = dist.get_rank(group)
        if rank == 0:
            dist.isend(_values(rank), dst=1, group=group).wait()
            return None
        if rank == 1:
            buffer = _zeros()
            dist.irecv(buffer, src=0, group=group).wait()
            return buffer
        return None

    def batch_isend_irecv(group):
        rank = dist.get_rank(group)
        if rank > 1:
            return None
        buffer = _values(rank) if rank == 0 else _zeros()
        operation = dist.P2POp(dist.isend if rank == 0 else dist.irecv, buffer, 1 - rank, group=group)
        for work in dist.batch_isend_irecv([operation]):
            work.wait()
        return buffer

    collectives = [
        all_reduce,
        all_gather,
        all_gather_into_tensor,
        all_gather_object,
        all_to_all,
        all_to_all_single,
        broadcast,
        broadcast_object_list,
        reduce,
        reduce_scatter,
        reduce_scatter_tensor,
        scatter,
        gather,
        barrier,
    ]
    return [CollectiveCase(case.__name__, _every_rank(case.__name__), case) for case in collectives] + [
        CollectiveCase("send/recv", _pair("send", "recv"), send_recv, point_to_point=True),
        CollectiveCase("isend/irecv", _pair("isend", "irecv"), isend_irecv, point_to_point=True),
        # P2POp hands batch_isend_irecv the original isend/irecv, which torch calls itself: no guarded op.
        CollectiveCase("P2POp+batch_isend_irecv", lambda rank: None, batch_isend_irecv, point_to_point=True),
    ]


def _method_cases() -> list[CollectiveCase]:
    def allreduce(group):
        tensor = _values(group.rank())
        group.allreduce([tensor]).wait()
        return tensor

    def allreduce_coalesced(group):
        tensors = [_values(group.rank()), _values(group.rank() + 1)]
        group.allreduce_coalesced(tensors).wait()
        return tensors

    def allgather(group):
        outputs = [[_zeros() for _ in range(group.size())]]
        group.allgather(outputs, [_values(group.rank())]).wait()
        return outputs

    def _allgather_base(group):
        output = _zeros(4 * group.size())
        group._allgather_base(output, _values(group.rank())).wait()
        return output

    def allgather_into_tensor_coalesced(group):
        outputs = [_zeros(4 * group.size())]
        group.allgather_into_tensor_coalesced(outputs, [_values(group.rank())]).wait()
        return outputs

    def broadcast(group):
        tensor = _values(group.rank())
        group.broadcast([tensor]).wait()
        return tensor

    def barrier(group):
        group.barrier().wait()

    def reduce(group):
        tensor = _values(group.rank())
        group.reduce([tensor]).wait()
        return tensor

    def reduce_scatter(group):
        output = _zeros(2)
        group.reduce_scatter(
            [output], [[torch.full((2,), float(group.rank() + peer)) for peer in range(group.size())]]
        ).wait()
        return output

    def _reduce_scatter_base(group):
        output = _zeros(2)
        group._reduce_scatter_base(output, _values(group.rank(), 2 * group.size())).wait()
        return output

    def reduce_scatter_tensor_coalesced(group):
        outputs = [_zeros(2)]
        group.reduce_scatter_tensor_coalesced(outputs, [_values(group.rank(), 2 * group.size())]).wait()
        return outputs

    def alltoall_base(group):
        output = _zeros(2 * group.size())
        group.alltoall_base(output, _values(group.rank(), 2 * group.size()), [], []).wait()
        return output

    def alltoall(group):
        outputs = [_zeros(2) for _ in range(group.size())]
        group.alltoall(
            outputs, [torch.full((2,), float(10 * group.rank() + peer)) for peer in range(group.size())]
        ).wait()
        return outputs

    def gather(group):
        outputs = [[_zeros() for _ in range(group.size())]] if group.rank() == 0 else []
        group.gather(outputs, [_values(group.rank())]).wait()
        return outputs

    def scatter(group):
        output = _zeros()
        inputs = [[_values(peer) for peer in range(group.size())]] if group.rank() == 0 else []
        group.scatter([output], inputs).wait()
        return output

    def send_recv(group):
        if group.rank() == 0:
            group.send([_values(0)], 1, 0).wait()
        elif group.rank() == 1:
            buffer = _zeros()
            group.recv([buffer], 0, 0).wait()
            return buffer
        return None

    def send_recv_anysource(group):
        if group.rank() == 0:
            group.send([_values(0)], 1, 0).wait()
        elif group.rank() == 1:
            buffer = _zeros()
            group.recv_anysource([buffer], 0).wait()
            return buffer
        return None

    def world_allreduce(_group):
        tensor = _values(dist.get_rank())
        dist.group.WORLD.allreduce([tensor]).wait()
        return tensor

    collectives = [
        allreduce,
        allreduce_coalesced,
        allgather,
        _allgather_base,
        allgather_into_tensor_coalesced,
        broadcast,
        barrier,
        reduce,
        reduce_scatter,
        _reduce_scatter_base,
        reduce_scatter_tensor_coalesced,
        alltoall_base,
        alltoall,
        gather,
        scatter,
    ]
    return [CollectiveCase(f"group.{case.__name__}", _every_rank(case.__name__), case) for case in collectives] + [
        CollectiveCase("group.send/recv", _pair("send", "recv"), send_recv, point_to_point=True),
        CollectiveCase(
            "group.send/recv_anysource", _pair("send", "recv_anysource"), send_recv_anysource, point_to_point=True
        ),
        CollectiveCase("group.WORLD.allreduce", _every_rank("allreduce"), world_allreduce),
    ]


def gloo_cases(world_size: int) -> list[CollectiveCase]:
    """Every guarded call that gloo runs at this world size: torch.distributed functions, then ProcessGroup
    methods (point-to-point ones need two ranks)."""
    return [case for case in _function_cases() + _method_cases() if world_size > 1 or not case.point_to_point]


def same_result(left: Any, right: Any) -> bool:
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        return isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor) and torch.equal(left, right)
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(map(same_result, left, right))
    return left == right


def snapshot_torch_distributed() -> dict[str, Any]:
    """Every object the guard could replace: torch.distributed's namespace and P2POp's class dict."""
    return {
        **{f"dist.{name}": value for name, value in vars(dist).items()},
        **{f"P2POp.{name}": value for name, value in vars(dist.P2POp).items()},
    }


def changed_entries(before: dict[str, Any]) -> list[str]:
    after = snapshot_torch_distributed()
    return sorted(name for name in before.keys() | after.keys() if before.get(name) is not after.get(name))


# --- the job ------------------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    name: str
    status: str  # "ok", "FAIL" or "skipped"
    detail: str


class _Checks:
    def __init__(self) -> None:
        self.results: list[CheckResult] = []

    def record(self, name: str, ok: bool, detail: str) -> None:
        self.results.append(CheckResult(name, "ok" if ok else "FAIL", detail))

    def skip(self, name: str, detail: str) -> None:
        self.results.append(CheckResult(name, "skipped", detail))


def run(config: EngineConfig, policy: CommGuardPolicy, run_dir: Path) -> int:
    """Run every check on every rank; return 0 when all ranks passed them all, else 1."""
    results = check_all(config, policy, run_dir)
    hosts: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return _report(results, hosts)


def hosts_line(hosts: list[str]) -> str:
    """Where the ranks ran, each run of consecutive ranks on one host as one entry: `ranks 0-7 on a, rank 8 on b`.
    Across nodes it is the first thing to read: a job whose ranks all sit on one host did not span its nodes."""
    groups: list[tuple[int, int, str]] = []
    for rank, host in enumerate(hosts):
        if groups and groups[-1][2] == host:
            groups[-1] = (groups[-1][0], rank, host)
        else:
            groups.append((rank, rank, host))
    where = ", ".join(
        f"rank {first} on {host}" if first == last else f"ranks {first}-{last} on {host}"
        for first, last, host in groups
    )
    return f"selftest: where the ranks ran: {where}"


def check_all(config: EngineConfig, policy: CommGuardPolicy, run_dir: Path) -> list[CheckResult]:
    """Run every check on every rank; the results merged over ranks, the same on every rank."""
    # torch 2.13 flags all_gather_into_tensor and reduce_scatter_tensor as deprecated; Megatron still calls
    # them, which is why they are tested, and the warning would bury the check lines.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    checks = _Checks()
    ranks = list(range(dist.get_world_size()))
    plain_group = dist.new_group(ranks)
    cases, baseline, unsupported = _supported_cases(gloo_cases(len(ranks)), plain_group)
    if unsupported:
        checks.skip("collectives this torch's gloo lacks", f"{', '.join(unsupported)}: not exercised")
    # memory_guard decides whether training jobs install the guard; the selftest tests the policy either way.
    modes = [
        (
            f"guard with the config policy ({policy.free_gb_threshold:g} GiB, {len(policy.skip_ops)} ops skipped)",
            replace(policy, profile=False),
        ),
        (
            "guard with every op checked and the clear path forced",
            CommGuardPolicy(math.inf, frozenset(), profile=False),
        ),
        ("guard with every op skipped", CommGuardPolicy(policy.free_gb_threshold, comm_ops.ALL_OPS, profile=False)),
    ]
    # The guard's clear path runs gc.collect, which walks every tracked object: the ~180k that torch's import
    # leaves take ~80 ms a walk on a CPU node, and the forced mode clears once per checked call (34 walks, 3 s of
    # every rank's selftest). Frozen, the objects that outlive the checks are left out of the walks; the clear
    # path still runs in full, over what the checks allocate.
    gc.collect()
    gc.freeze()
    try:
        for name, mode_policy in modes:
            _check_guard_mode(checks, name, mode_policy, cases, baseline, ranks)
        _check_profile(checks, config, policy, cases, baseline, ranks)
        _check_layouts(checks, config)
        _check_kernel_backend(checks, config)
        _check_metrics(checks, config, policy, cases, run_dir)
    finally:
        gc.unfreeze()
    return _merged(checks)


def _check_metrics(
    checks: _Checks, config: EngineConfig, policy: CommGuardPolicy, cases: list[CollectiveCase], run_dir: Path
) -> None:
    """The sinks every job logs its steps to work here: one step per selftest step (the wall time of one
    guarded round of the collectives), to metrics.jsonl, TensorBoard and, when configured, W&B."""
    name = "metrics"
    rank = dist.get_rank()
    try:
        metrics = MetricsLog(config, run_dir, enabled=rank == 0, group="selftest")
    except (ImportError, GdnctlError) as error:
        checks.record(name, False, f"{type(error).__name__}: {error}")
        return
    try:
        group = dist.new_group(list(range(dist.get_world_size())))
        comm_guard.install(replace(policy, profile=False))
        try:
            for step in range(1, config.selftest.steps + 1):
                started = time.perf_counter()
                for case in cases:
                    case.run(group)
                metrics.log(step, {"round_seconds": time.perf_counter() - started, "collectives": len(cases)})
        finally:
            comm_guard.uninstall()
    finally:
        metrics.close()
    if rank != 0:
        checks.record(name, True, "rank 0 writes the metrics")
        return
    written = [json.loads(line) for line in metrics.path.read_text().splitlines()] if metrics.path.is_file() else []
    events = sorted((run_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    problems = []
    if len(written) < config.selftest.steps:
        problems.append(f"{metrics.path} holds {len(written)} steps, expected {config.selftest.steps}")
    if not events:
        problems.append(f"no TensorBoard event file in {run_dir / TENSORBOARD_DIR}")
    sinks = f"{len(written)} steps in {metrics.path.name}, TensorBoard events in {TENSORBOARD_DIR}/"
    if config.metrics.wandb_project is not None:
        sinks += f", W&B run {wandb_run_id(run_dir)}"
    checks.record(name, not problems, "; ".join(problems) or sinks)


def _supported_cases(cases: list[CollectiveCase], group: Any) -> tuple[list[CollectiveCase], list[Any], list[str]]:
    """The cases this build's gloo runs, their unguarded results, and the labels of the ones it lacks.

    gloo's coverage differs between torch builds (the CUDA build of torch 2.11 has no gloo alltoall, the CPU
    build of 2.13 has); a missing op raises on every rank before any data moves, so it can be left out.
    """
    kept, results, missing = [], [], []
    for case in cases:
        try:
            result = case.run(group)
        except RuntimeError as error:
            if "does not support" not in str(error):
                raise
            missing.append(case.label)
            continue
        kept.append(case)
        results.append(result)
    return kept, results, missing


def _compare(case: CollectiveCase, group: Any, expected: Any) -> list[str]:
    try:
        result = case.run(group)
    except Exception as error:  # reported as a failed check, so the other checks still run and print
        return [f"{case.label} raised {type(error).__name__}: {error}"]
    return [] if same_result(result, expected) else [f"{case.label} result differs from the unguarded call"]


def _check_guard_mode(
    checks: _Checks,
    name: str,
    policy: CommGuardPolicy,
    cases: list[CollectiveCase],
    baseline: list[Any],
    ranks: list[int],
) -> None:
    before = snapshot_torch_distributed()
    probe = CountingProbe(comm_guard.default_memory_probe())
    problems = []
    comm_guard.install(policy, probe)
    try:
        guarded_group = dist.new_group(ranks)
        for case, expected in zip(cases, baseline, strict=True):
            op = case.op(dist.get_rank())
            reads_before = probe.reads
            problems += _compare(case, guarded_group, expected)
            reads = probe.reads - reads_before
            wanted = int(op is not None and op not in policy.skip_ops)
            if reads != wanted:
                problems.append(f"{case.label} read the memory probe {reads} times, expected {wanted}")
    finally:
        comm_guard.uninstall()
    changed = changed_entries(before)
    if changed:
        problems.append(f"uninstall left {', '.join(changed)} replaced")
    checked = sum(case.op(dist.get_rank()) not in (None, *policy.skip_ops) for case in cases)
    if policy.free_gb_threshold == math.inf and probe.releases != checked:
        problems.append(f"the clear path ran {probe.releases} times for {checked} checked calls")
    checks.record(
        name,
        not problems,
        "; ".join(problems)
        or f"{len(cases)} calls match the unguarded results; the {checked} checked ones read the memory "
        f"probe once each, the other {len(cases) - checked} never; uninstall restored torch.distributed",
    )


def _check_profile(
    checks: _Checks,
    config: EngineConfig,
    policy: CommGuardPolicy,
    cases: list[CollectiveCase],
    baseline: list[Any],
    ranks: list[int],
) -> None:
    name = "comm profile"
    if not policy.profile:
        checks.skip(name, "comm.profile is off")
        return
    steps = config.selftest.steps
    rank = dist.get_rank()
    problems = []
    comm_guard.install(policy)
    try:
        guarded_group = dist.new_group(ranks)
        for _ in range(steps):
            for case, expected in zip(cases, baseline, strict=True):
                problems += _compare(case, guarded_group, expected)
    finally:
        comm_guard.uninstall()
    path = policy.profile_dir / PROFILE_FILE_PATTERN.format(rank=rank)
    if not path.is_file():
        checks.record(name, False, f"{path} was not written")
        return
    recorded = json.loads(path.read_text())["ops"]
    expected_calls: dict[str, int] = {}
    for case in cases:
        op = case.op(rank)
        if op is not None:
            expected_calls[op] = expected_calls.get(op, 0) + steps
    for op, calls in expected_calls.items():
        stats = recorded.get(op, {"calls": 0, "checks": 0})
        wanted_checks = 0 if op in policy.skip_ops else calls
        if (stats["calls"], stats["checks"]) != (calls, wanted_checks):
            problems.append(
                f"{op}: recorded {stats['calls']} calls / {stats['checks']} checks, expected {calls} / {wanted_checks}"
            )
    checks.record(
        name,
        not problems,
        "; ".join(problems) or f"{len(expected_calls)} ops over {steps} steps in {policy.profile_dir}",
    )


def _check_layouts(checks: _Checks, config: EngineConfig) -> None:
    cp = config.parallel.cp
    generator = random.Random(config.train.seed + dist.get_rank())
    batches = max(config.selftest.steps, 1) * 4
    problems = []
    for index in range(batches):
        sequence_multiple = cp if index % 2 else 1
        pad_to = generator.choice((1, 8, 64))
        sequences = [_random_sequence(generator, config.model.vocab_size) for _ in range(generator.randint(1, 6))]
        thd = layout.pack(sequences, sequence_multiple)
        bshd = layout.to_bshd(thd, pad_to)
        if not all(map(_same_fields, layout.unpack(thd), sequences)):
            problems.append(f"batch {index}: unpack(pack(x)) != x")
        if not _same_fields(layout.to_thd(bshd), thd):
            problems.append(f"batch {index}: to_thd(to_bshd(thd)) != thd")
        if not _same_fields(layout.to_bshd(layout.to_thd(bshd), pad_to), bshd):
            problems.append(f"batch {index}: to_bshd(to_thd(bshd)) != bshd")
        if bool((thd.padded_seq_lens % sequence_multiple).any()):
            problems.append(f"batch {index}: a packed sequence is not a multiple of {sequence_multiple}")
    checks.record(
        "layout round trip",
        not problems,
        "; ".join(problems)
        or f"{batches} random batches, THD <-> BSHD and back, sequences padded to multiples of 1 and "
        f"of cp={cp}; the config runs {config.layout}",
    )


def _random_sequence(generator: random.Random, vocab_size: int) -> layout.TokenSequence:
    length = generator.randint(1, 48)
    ids = torch.tensor([generator.randrange(vocab_size) for _ in range(length + 1)])
    loss_mask = torch.tensor([float(generator.random() < 0.8) for _ in range(length)])
    return layout.TokenSequence(ids[:-1], ids[1:], loss_mask)


def _same_fields(left: Any, right: Any) -> bool:
    return all(same_result(value, getattr(right, key)) for key, value in vars(left).items())


def _check_kernel_backend(checks: _Checks, config: EngineConfig) -> None:
    name = "gdn kernel backend"
    backend = config.kernels.gdn_backend
    try:
        kernels = importlib.import_module("gdnctl.runtime.kernels.backends")
    except ModuleNotFoundError as error:
        if error.name != "gdnctl.runtime.kernels.backends":
            raise
        checks.skip(name, "gdnctl.runtime.kernels.backends is not in this build")
        return
    try:
        kernel = kernels.resolve_backend(backend)
    except kernels.GdnBackendUnavailable as error:
        expected = config.device == "cpu"
        checks.record(name, expected, f"{backend} unavailable{' (expected on CPU)' if expected else ''}: {error}")
        return
    checks.record(name, True, f"{backend} resolved to {kernels.describe_kernel(kernel)}")


def _merged(checks: _Checks) -> list[CheckResult]:
    """Every rank's results of each check as one: FAIL when any rank failed it, with each failing rank's detail."""
    per_rank: list[list[CheckResult]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(per_rank, checks.results)
    merged = []
    for index, result in enumerate(per_rank[0]):
        failing_ranks = [rank for rank, results in enumerate(per_rank) if results[index].status == "FAIL"]
        if failing_ranks:
            details = "; ".join(f"rank {rank}: {per_rank[rank][index].detail}" for rank in failing_ranks)
            result = CheckResult(result.name, "FAIL", details)
        merged.append(result)
    return merged


def _report(results: list[CheckResult], hosts: list[str]) -> int:
    lines = [f"selftest: {result.name} {result.status} ({result.detail})" for result in results]
    lines.append(hosts_line(hosts))
    failed = sum(result.status == "FAIL" for result in results)
    skipped = sum(result.status == "skipped" for result in results)
    summary = (
        f"selftest: {'passed' if not failed else 'FAILED'}: {len(results) - failed - skipped} ok, {failed} "
        f"failed, {skipped} skipped on {dist.get_world_size()} ranks ({dist.get_backend()})"
    )
    if dist.get_rank() == 0:
        print("\n".join([*lines, summary]), flush=True)
    return 1 if failed else 0
