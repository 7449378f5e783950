"""Presets with hostile values, a stand-in interpreter that records how it was called, and one that stands in for a
long-running torchrun job."""

from __future__ import annotations

import json
import shlex
import stat
import sys
import time
from pathlib import Path

import yaml

HOSTILE = {
    "subshell": "$(touch {canary})",
    "backticks": "`touch {canary}`",
    "quotes": "it's \"quoted\" 'twice'",
    "newline": "line one\nline two; touch {canary}",
    "semicolon": "a; touch {canary}; b",
    "glob_and_vars": "* ${HOME} $HOME \\ | & >out",
}


def hostile_values(canary: Path) -> dict[str, str]:
    return {key: value.replace("{canary}", str(canary)) for key, value in HOSTILE.items()}


def recorder(directory: Path, exit_code: int = 0) -> Path:
    """An executable that writes its argv and environment as JSON next to itself, then exits `exit_code`.

    Used as `launch.python`: the rendered script runs it instead of the real interpreter, so a test sees
    exactly what the script passed. Its own path contains shell metacharacters too. `-c CODE` (launch's check
    that the interpreter has gdnctl's runtime, interpreter.py) runs CODE as the real interpreter would, unrecorded.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fake python"
    record = directory / "calls.jsonl"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if sys.argv[1:2] == ['-c']:\n"
        "    exec(sys.argv[2])\n"
        "    sys.exit(0)\n"
        f"with open({str(record)!r}, 'a') as out:\n"
        "    out.write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}) + '\\n')\n"
        f"sys.exit({exit_code})\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def recorded_calls(directory: Path) -> list[dict]:
    record = directory / "calls.jsonl"
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def write_preset(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fake_torchrun(directory: Path, *, ignore_term: bool = False) -> Path:
    """An executable to use as `launch.python` that stands in for torchrun and its ranks: it starts two ranks,
    each in a session of its own as torch's elastic agent starts them, each with a worker process of its own,
    appends every pid it started (itself included) to `pids` beside it, and waits. With `ignore_term` every one
    of them ignores SIGTERM and SIGINT."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fake torchrun"
    pids = directory / "pids"
    trap = "trap '' TERM INT; " if ignore_term else ""
    path.write_text(
        "#!/usr/bin/env bash\n"
        # launch's check that the interpreter has gdnctl's runtime (interpreter.py): answered as the real one would
        f'if [[ ${{1-}} == -c ]]; then exec {shlex.quote(sys.executable)} "$@"; fi\n'
        f"{trap}\n"
        "for rank in 0 1; do\n"
        f'  setsid bash -c \'{trap}sleep 300 & echo $! >>"$0"; echo $$ >>"$0"; wait\' {shlex.quote(str(pids))} &\n'
        "done\n"
        f"echo $$ >>{shlex.quote(str(pids))}\n"
        "wait\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def started_pids(directory: Path, count: int = 5, timeout: float = 30) -> list[int]:
    """The pids a fake_torchrun in `directory` started, once all `count` of them are there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = directory / "pids"
        pids = [int(line) for line in path.read_text().split()] if path.exists() else []
        if len(pids) >= count:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"the fake torchrun in {directory} did not start its {count} processes")


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has ended: it only waits to be reaped)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line[stat_line.rindex(")") + 2] != "Z"
