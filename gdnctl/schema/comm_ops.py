"""Names of the communication calls the runtime's memory guard wraps.

This is the single source of truth shared by the `comm` rules (which run without torch) and by
`gdnctl/runtime/comm/guard.py` (which patches these names). The names are the public
`torch.distributed` function names and the `torch.distributed.ProcessGroup` method names: the surface
slime's `slime/utils/reloadable_process_group.py` wraps, plus the object collectives it leaves out
(`gather_object`, `scatter_object_list`, `send_object_list`, `recv_object_list`). Both kinds may appear in
a skip set, exactly as in slime PR #1947, whose skip set mixes them (`all_gather_into_tensor` is a function,
`allgather_into_tensor_coalesced` a method, `barrier` both).
"""

from __future__ import annotations

# torch.distributed functions that communicate (checked unless skipped).
DIST_FUNCTIONS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "gather",
    "gather_object",
    "barrier",
    "send",
    "send_object_list",
    "recv",
    "recv_object_list",
    "isend",
    "irecv",
)

# torch.distributed.ProcessGroup methods that communicate (checked unless skipped).
PROCESS_GROUP_METHODS: tuple[str, ...] = (
    "barrier",
    "broadcast",
    "allreduce",
    "allreduce_coalesced",
    "reduce",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "alltoall_base",
    "alltoall",
    "send",
    "recv",
    "recv_anysource",
)

# torch.distributed query functions: wrapped only to unwrap guarded groups, never memory-checked.
QUERY_FUNCTIONS: tuple[str, ...] = (
    "get_rank",
    "get_world_size",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
)

ALL_OPS: frozenset[str] = frozenset(DIST_FUNCTIONS) | frozenset(PROCESS_GROUP_METHODS)

# slime PR #1947: ops whose profiled steady-state driver free-memory drop was ~0, so the pre-call
# `mem_get_info` (~10 us on an H100) buys nothing. all_reduce, _allgather_base, _reduce_scatter_base,
# all_gather_object, broadcast and reduce_scatter_tensor_coalesced stay checked.
DEFAULT_SKIP_OPS: tuple[str, ...] = (
    "all_gather_into_tensor",
    "allgather_into_tensor_coalesced",
    "barrier",
    "broadcast_object_list",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "isend",
    "irecv",
)

assert set(DEFAULT_SKIP_OPS) <= ALL_OPS
