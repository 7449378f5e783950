"""`python -m gdnctl.runtime.launcher.torchrun ARGS`: torchrun (torch.distributed.run, the same arguments), ending
a failed job with one sentence instead of torchrun's ChildFailedError traceback.

A rank that fails says why itself (`gdnctl runtime: ...` for a problem gdnctl knows, a traceback for a bug), so
the 30 lines torchrun adds after it (its own stack, a table of pids and "To enable traceback see ...") hid the
one line a user needs behind a traceback that reads like a crash of gdnctl. What torchrun knows that the rank did
not say (which rank failed first, its exit code or signal, how many others failed) becomes the sentence.
"""

from __future__ import annotations

import logging
import signal
import sys

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


def exit_status(exitcode: int) -> int:
    """A shell's status for the rank's exit: its code, or 128 + the signal that killed it."""
    if exitcode < 0:
        return 128 + (-exitcode)
    return exitcode if 0 < exitcode < 256 else 1


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)
    logging.getLogger(AGENT_LOGGER).setLevel(logging.CRITICAL)
    try:
        torchrun.run(args)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        print(
            failure_sentence(rank, failure.exitcode, getattr(failure, "hostname", None), len(error.failures)),
            file=sys.stderr,
            flush=True,
        )
        return exit_status(failure.exitcode)
    return 0


def one_node(argv: list[str] | None = None) -> bool:
    """Whether this agent runs the whole job on its node (--standalone or --nnodes 1). Across nodes the agent that
    hosts the rendezvous store stays for its ordinary exit: the other nodes' agents still talk to it at the end."""
    from torch.distributed import run as torchrun

    args = torchrun.parse_args(argv)
    return bool(args.standalone) or str(args.nnodes) in ("1", "1:1")


if __name__ == "__main__":
    from gdnctl.runtime.launcher.process_exit import exit_without_teardown

    code = main()
    if code == 0 and one_node():
        exit_without_teardown(code)
    sys.exit(code)
