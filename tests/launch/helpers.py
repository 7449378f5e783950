"""Presets with hostile values, and a stand-in interpreter that records how it was called."""

from __future__ import annotations

import json
import stat
import sys
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
    exactly what the script passed. Its own path contains shell metacharacters too.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fake python"
    record = directory / "calls.jsonl"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
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
