"""Launch settings: what the chosen executor can run."""

from __future__ import annotations

from gdnctl.validate.findings import Issue, Severity, rule


@rule("LCH001", Severity.ERROR, "The local executor runs on one node")
def local_single_node(run):
    """
    What it checks: launch.executor: local with cluster.nodes > 1.

    Why: the local script runs torchrun --standalone on this host; other nodes would never start.

    Fix: use the Slurm executor (`gdnctl launch --slurm`, or launch.executor: slurm), or cluster.nodes: 1.
    """
    p = run.preset
    if p.launch.executor == "local" and p.cluster.nodes > 1:
        yield Issue("launch.executor", f"the local executor runs on this host only, but the cluster has "
                                       f"{p.cluster.nodes} nodes.",
                    "Launch with --slurm (or set launch.executor: slurm), or set cluster.nodes: 1.")
