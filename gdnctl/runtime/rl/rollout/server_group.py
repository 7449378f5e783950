"""A rollout server in a process group of its own, which never outlives the trainer rank that started it.

vLLM runs an engine as several processes: the rollout server (the LLM's), its engine core, a worker per GPU and
multiprocessing's resource tracker, none of which starts a session of its own. Killing the server's pid alone
(a hung server, one that failed to start, a job that failed) left the others running, reparented to init (a failed
CPU rl job left vLLM's resource tracker so; an engine core or a worker left on a GPU keeps the GPU). Nothing else
ends them: torchrun signals the process group of a rank that still runs, never of one that has exited (torch
2.13.0, torch/distributed/elastic/multiprocessing/api.py SubprocessContext._close). So the trainer starts
`python server_group.py PARENT COMMAND...` (this file, run as a script by rollout.python: the standard library
only, whatever gdnctl that environment has) in a new session, and this process, the group's leader, starts the
server in its group and waits:

- the server exits: whatever it left in the group is killed, and the leader exits with the server's exit code
  (128 + N for signal N, as a shell reports it);
- the trainer rank that started the leader is gone (killed, crashed, or stopped by torchrun without running its
  close): the leader sees its parent change within POLL_SECONDS and kills the whole group, itself included;
- SIGTERM, SIGINT or SIGHUP (gdnctl stopping the job's process tree): the same, at once.

The trainer's side (ServerProcess, rollout/engines.py) kills the whole group wherever it gives up on a server:
`kill()` is what RolloutClient calls on a hung or dead server, and `end()` what closing the engines does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

POLL_SECONDS = 0.5
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def group_members(group: int) -> list[int]:
    """The live processes of process group `group` (zombies are done: they hold nothing), from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry.name))
    return members


def kill_group(group: int) -> None:
    """SIGKILL every process of `group`, if it still has one (its id is then still the group's, not another's)."""
    if not group_members(group):
        return
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ServerProcess(subprocess.Popen):
    """The leader as the trainer holds it: its pid is its group's id."""

    def kill(self) -> None:
        """Kill the server and every process of its engine (Popen.kill would reach the leader alone)."""
        kill_group(self.pid)

    def end(self) -> None:
        """Kill whatever is left of the group and reap the leader: the last thing the trainer does with it."""
        kill_group(self.pid)
        self.wait()


def spawn(command: list[str], python: str, **popen) -> ServerProcess:
    """Start `command` (the rollout server) under a leader run by `python`, in a new session."""
    leader = [python, str(Path(__file__).resolve()), str(os.getpid()), *command]
    return ServerProcess(leader, start_new_session=True, **popen)


def lead(parent: int, command: list[str]) -> int:
    """The leader's work (see the module's docstring) for the trainer rank `parent`; returns the server's exit
    code."""
    group = os.getpgid(0)

    def stop(signum: int, _frame) -> None:
        kill_group(group)  # itself included: nothing is left to report to

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    if os.getppid() != parent:  # the rank ended before this process got going
        kill_group(group)
    server = subprocess.Popen(command)
    while True:
        try:
            code = server.wait(POLL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:  # the trainer rank is gone: its engine goes with it
                kill_group(group)
    for pid in group_members(group):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(lead(int(sys.argv[1]), sys.argv[2:]))
