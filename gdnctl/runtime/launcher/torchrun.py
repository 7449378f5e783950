"""`python -m gdnctl.runtime.launcher.torchrun ARGS`: torchrun (torch.distributed.run, the same arguments), ending
a failed job with one sentence instead of torchrun's ChildFailedError traceback.

A rank that fails says why itself (`gdnctl runtime: ...` for a problem gdnctl knows, a traceback for a bug), so
the 30 lines torchrun adds after it (its own stack, a table of pids and "To enable traceback see ...") hid the
one line a user needs behind a traceback that reads like a crash of gdnctl. What torchrun knows that the rank did
not say (which rank failed first, its exit code or signal, how many others failed) becomes the sentence.

`--rendezvous-dir RUN_DIR` before torchrun's own arguments (the Slurm script's trainer step): the port of the c10d
rendezvous is this launcher's to pick, not the script's (rendezvous.py); --rdzv-endpoint then names the first
node alone.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from pathlib import Path

# torchrun's agent logs each failed rank at ERROR before it raises; the sentence below says the same once.
AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"


def failure_sentence(rank: int, exitcode: int, host: str | None, failed: int) -> str:
    """What torchrun knows about a failed job, as the line gdnctl prints."""
    if exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            how += " (out of memory is the usual cause: `dmesg` or the job's memory use says)"
    else:
        how = f"exited with code {exitcode}"
    others = f"; {failed - 1} other rank(s) failed too" if failed > 1 else ""
    where = f" on {host}" if host else ""
    return f"gdnctl: the job failed: rank {rank}{where} {how}{others}. The rank's own message, above, says why."


def stopped_sentence(host: str, signum: int, under_slurm: bool) -> str:
    """What an agent that was sent a stop signal says instead of torchrun's SignalException traceback."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = (
        ": Slurm stops every node's task when the job is cancelled, requeued or at its time limit, and when the "
        "task of another node fails (a failure above, from that node, then says which rank and why)"
        if under_slurm
        else ""
    )
    return f"gdnctl: torchrun on {host} got {name} and stopped its ranks{why}."


def exit_status(exitcode: int) -> int:
    """A shell's status for the rank's exit: its code, or 128 + the signal that killed it."""
    if exitcode < 0:
        return 128 + (-exitcode)
    return exitcode if 0 < exitcode < 256 else 1


RENDEZVOUS_DIR = "--rendezvous-dir"


def split_arguments(argv: list[str]) -> tuple[Path | None, list[str]]:
    """(the --rendezvous-dir given first, if any; torchrun's own arguments)."""
    if argv[:1] == [RENDEZVOUS_DIR] and len(argv) > 1:
        return Path(argv[1]), argv[2:]
    if argv[:1] and argv[0].startswith(f"{RENDEZVOUS_DIR}="):
        return Path(argv[0].split("=", 1)[1]), argv[1:]
    return None, argv


def with_is_host(rdzv_conf: str, is_host: bool) -> str:
    """torchrun's --rdzv-conf with is_host set: the c10d backend then hosts the store, or connects to it, as told,
    never the one when the other fails."""
    kept = [item for item in rdzv_conf.split(",") if item and not item.startswith("is_host=")]
    return ",".join([*kept, f"is_host={'true' if is_host else 'false'}"])


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    run_dir, argv = split_arguments(list(sys.argv[1:] if argv is None else argv))
    args = torchrun.parse_args(argv)
    rendezvous = None
    if run_dir is not None:
        from gdnctl.runtime.launcher.rendezvous import RendezvousError, prepare

        host = args.rdzv_endpoint
        try:
            if not host or ":" in host:
                raise RendezvousError(
                    f"{RENDEZVOUS_DIR} picks the rendezvous port itself, so --rdzv-endpoint names the first node "
                    f"alone (got {host!r}); re-render the run dir (gdnctl render --force)."
                )
            rendezvous = prepare(run_dir, host, torchrun.parse_min_max_nnodes(args.nnodes)[1])
        except RendezvousError as error:
            print(f"gdnctl: {error}", file=sys.stderr, flush=True)
            return error.exit_code
        args.rdzv_endpoint = f"{host}:{rendezvous.port}"
        args.rdzv_conf = with_is_host(args.rdzv_conf, rendezvous.is_host)
    logging.getLogger(AGENT_LOGGER).setLevel(logging.CRITICAL)
    try:
        torchrun.run(args)
    except ChildFailedError as error:
        # Each node's agent reports the ranks of its own node only: this host is where the rank ran (torch's
        # ProcessFailure names no host), which across nodes is what tells the failing node's sentence apart.
        rank, failure = error.get_first_failure()
        print(
            failure_sentence(rank, failure.exitcode, socket.gethostname(), len(error.failures)),
            file=sys.stderr,
            flush=True,
        )
        return exit_status(failure.exitcode)
    except SignalException as error:
        # torchrun stopped its ranks and raised; its traceback would read like a crash of this node.
        signum = int(error.sigval)
        print(stopped_sentence(socket.gethostname(), signum, "SLURM_JOB_ID" in os.environ), file=sys.stderr, flush=True)
        return 128 + signum
    finally:
        if rendezvous is not None:
            rendezvous.close()
    return 0


def one_node(argv: list[str] | None = None) -> bool:
    """Whether this agent runs the whole job on its node (--standalone or --nnodes 1). Across nodes the agent that
    hosts the rendezvous store stays for its ordinary exit: the other nodes' agents still talk to it at the end."""
    from torch.distributed import run as torchrun

    args = torchrun.parse_args(split_arguments(list(sys.argv[1:] if argv is None else argv))[1])
    return bool(args.standalone) or str(args.nnodes) in ("1", "1:1")


if __name__ == "__main__":
    from gdnctl.runtime.launcher.process_exit import exit_without_teardown

    code = main()
    if code == 0 and one_node():
        exit_without_teardown(code)
    sys.exit(code)
