"""Communication memory guard policy: skip-set names and threshold."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from gdnctl.plan import Run
from gdnctl.schema import comm_ops
from gdnctl.validate.findings import Issue, Severity, rule


def skip_op_names(run: Run) -> Iterator[Issue]:
    """
    What it checks: every name in comm.skip_ops, add_skip_ops and remove_skip_ops is a torch.distributed
    collective function or a ProcessGroup communication method that the guard wraps
    (`gdnctl.comm_ops`).

    Why: a misspelt name would silently keep the guard on that op (or off another), and query functions
    (get_rank, ...) are never checked anyway.

    Source: the torch.distributed functions and ProcessGroup methods of gdnctl/schema/comm_ops.py: the surface
    slime's slime/utils/reloadable_process_group.py wraps (slime PR #1947; docs/sources.md "Communication guard").

    Fix: use the suggested name; `gdnctl rules COM001` lists the valid ones below.
    """
    comm = run.preset.comm
    for field in ("skip_ops", "add_skip_ops", "remove_skip_ops"):
        for index, name in enumerate(getattr(comm, field) or []):
            if name in comm_ops.ALL_OPS:
                continue
            close = difflib.get_close_matches(name, sorted(comm_ops.ALL_OPS), n=1, cutoff=0.6)
            what = "a query function, never checked" if name in comm_ops.QUERY_FUNCTIONS else "not a wrapped op"
            yield Issue(
                f"comm.{field}[{index}]",
                f"'{name}' is {what}.",
                (f"Did you mean '{close[0]}'? " if close else "")
                + "Valid names: torch.distributed collectives and ProcessGroup methods (gdnctl rules COM001).",
            )


# The docs list the valid names from the one table that defines them.
skip_op_names.__doc__ = (skip_op_names.__doc__ or "") + "\n    Valid names: " + ", ".join(sorted(comm_ops.ALL_OPS))
rule("COM001", Severity.ERROR, "Unknown op in the comm skip set")(skip_op_names)


@rule("COM002", Severity.ERROR, "Guard threshold at or above the GPU memory")
def threshold_fits_gpu(run: Run) -> Iterator[Issue]:
    """
    What it checks: comm.free_gb_threshold is below the GPU's memory (error) and at most a quarter of it
    (warning above).

    Why: the guard synchronizes, collects and empties the cache whenever free memory is below the
    threshold; a threshold near the GPU's size makes every checked collective pay that cost
    (slime issue #1717: a 5x MFU regression from per-call checks). slime uses 3 GiB.

    Source: THUDM/slime #1717 (5x MFU regression from the per-call check) and slime's 3 GB threshold in
    slime/utils/reloadable_process_group.py (docs/sources.md "Communication guard").

    Fix: use a few GiB (3 is slime's value).
    """
    comm = run.preset.comm
    capacity = run.gpu.memory_gib
    if not comm.memory_guard or run.gpu.sm is None:
        return
    if comm.free_gb_threshold >= capacity:
        yield Issue(
            "comm.free_gb_threshold",
            f"threshold {comm.free_gb_threshold} GiB is not below the "
            f"{capacity} GiB of a {run.gpu.description}: every check would empty "
            "the cache.",
            "Use a few GiB, e.g. 3.",
        )
    elif comm.free_gb_threshold > capacity / 4:
        yield Issue(
            "comm.free_gb_threshold",
            f"threshold {comm.free_gb_threshold} GiB is over a quarter of the "
            f"{capacity} GiB GPU: the guard will often synchronize and empty "
            "the cache.",
            "Use a few GiB, e.g. 3.",
            Severity.WARNING,
        )


@rule("COM003", Severity.WARNING, "Skip-set edit that changes nothing")
def skip_set_edits(run: Run) -> Iterator[Issue]:
    """
    What it checks: comm.add_skip_ops names already skipped, or comm.remove_skip_ops names not skipped.

    Why: such an edit does nothing, which usually means the intended op was another one.

    Source: gdnctl's own skip set, gdnctl/schema/comm_ops.py DEFAULT_SKIP_OPS (slime PR #1947's list; docs/sources.md
    "Communication guard").

    Fix: remove the entry, or name the op you meant.
    """
    comm = run.preset.comm
    base = set(comm_ops.DEFAULT_SKIP_OPS if comm.skip_ops is None else comm.skip_ops)
    for index, name in enumerate(comm.add_skip_ops):
        if name in base:
            yield Issue(f"comm.add_skip_ops[{index}]", f"'{name}' is already in the skip set.", "Remove the entry.")
    for index, name in enumerate(comm.remove_skip_ops):
        if name in comm_ops.ALL_OPS and name not in base:
            yield Issue(
                f"comm.remove_skip_ops[{index}]",
                f"'{name}' is not in the skip set, so it is checked already.",
                "Remove the entry.",
            )
