"""The run-dir commands (`runs`, `status`, `cancel`, `logs`, `resume`, `render --force`) on run dirs that hold what
gdnctl did not write there: a FIFO at a record's name, a manifest of the wrong shape, a log larger than a chunk or
growing mid-character, a hostile directory name, engine.yaml or a script edited since gdnctl rendered them, a
smoke report left by an earlier run. Each is a sentence (exit 2) or a correct answer, never a hang, a traceback or
a control sequence on the terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdnctl.errors import GdnctlError
from gdnctl.launch import runs
from gdnctl.launch.log_tail import CHUNK_BYTES, LogTail
from gdnctl.launch.run_dir import MANIFEST, SLURM_JOBS_FILE
from gdnctl.launch.submit import KnownJob
from gdnctl.schema import SMOKE_FILE
from tests.launch.helpers import fake_torchrun, recorder
from tests.launch.test_launch import SELFTEST
from tests.slurm_cluster import slurm_env

COMMANDS = (("status",), ("cancel",), ("logs",), ("logs", "--follow"), ("resume",))


def gdnctl(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # A hang (a FIFO read without O_NONBLOCK) fails the test through the timeout rather than stalling the suite.
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("rendered") / "run"
    proc = gdnctl("render", SELFTEST, "-o", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    return run_dir


def copy_of(rendered: Path, into: Path) -> Path:
    subprocess.run(["cp", "-r", str(rendered), str(into)], check=True)
    return into


def test_a_fifo_at_the_manifest_or_the_job_record_is_a_sentence_for_every_command(rendered, tmp_path):
    runs_root = tmp_path / "runs"
    runs_root.mkdir()
    at_manifest = copy_of(rendered, runs_root / "a-manifest")
    (at_manifest / MANIFEST).unlink()
    os.mkfifo(at_manifest / MANIFEST)
    at_record = copy_of(rendered, runs_root / "b-record")
    os.mkfifo(at_record / SLURM_JOBS_FILE)
    for args in COMMANDS:
        proc = gdnctl(*args, str(at_manifest))
        assert proc.returncode == 2, (args, proc.stderr)
        assert f"{at_manifest / MANIFEST} is a named pipe (FIFO), not a regular file" in proc.stderr, args
        proc = gdnctl(*args, str(at_record))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert f"{at_record / SLURM_JOBS_FILE} is a named pipe (FIFO)" in proc.stderr, (args, proc.stderr)
    forced = gdnctl("render", SELFTEST, "-o", str(at_record), "--force")
    assert forced.returncode == 2 and f"{at_record / SLURM_JOBS_FILE} is a named pipe (FIFO)" in forced.stderr
    forced = gdnctl("render", SELFTEST, "-o", str(at_manifest), "--force")
    assert forced.returncode == 2 and "is not a gdnctl run dir" in forced.stderr and "named pipe" in forced.stderr
    # The listing leaves out what is no run dir and lists the one it cannot ask, with the sentence.
    listed = gdnctl("runs", str(runs_root))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        f"{at_record}: selftest-cpu (selftest, local) unknown",
        f"  {at_record / SLURM_JOBS_FILE} is a named pipe (FIFO), not a regular file, not the record of Slurm jobs "
        f"gdnctl keeps there; remove it (rm -r {at_record / SLURM_JOBS_FILE}).",
    ]


# Values of every JSON type, nested a little: what a manifest's fields could hold after a hand edit.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
MANIFEST_FIELDS = ("resolved", "launch", "files", "gdnctl_version", "engine_config_sha256")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(MANIFEST_FIELDS), JSON_VALUES, min_size=1))
def test_a_manifest_of_any_shape_gives_a_status_or_a_sentence(rendered, tmp_path_factory, changes):
    run_dir = copy_of(rendered, tmp_path_factory.mktemp("shape") / "run")
    manifest = json.loads((run_dir / MANIFEST).read_text())
    manifest.update(changes)
    (run_dir / MANIFEST).write_text(json.dumps(manifest))
    try:
        found = runs.status(run_dir)
    except GdnctlError as error:
        assert str(run_dir) in str(error) and "\n" not in str(error)
    else:
        assert isinstance(found.name, str) and isinstance(found.job, str) and found.executor in ("local", "slurm")
        json.dumps(found.to_json())
        assert found.line().isprintable()
    assert runs.listed_status(run_dir).run_dir == run_dir  # `gdnctl runs` lists it either way


def test_a_manifest_whose_resolved_is_not_an_object_is_a_sentence(rendered, tmp_path):
    run_dir = copy_of(rendered, tmp_path / "run")
    manifest = json.loads((run_dir / MANIFEST).read_text())
    (run_dir / MANIFEST).write_text(json.dumps({**manifest, "resolved": ["selftest-cpu"]}))
    for args in COMMANDS:
        proc = gdnctl(*args, str(run_dir))
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
        assert f"{run_dir} is not a gdnctl run dir ({run_dir / MANIFEST} does not have the expected shape: its " in (
            proc.stderr
        ), (args, proc.stderr)


def test_runs_writes_hostile_names_out_as_escapes(rendered, tmp_path):
    runs_root = tmp_path / "runs"
    runs_root.mkdir()
    hostile = copy_of(rendered, runs_root / "evil\x1b]0;owned\x07\x1b[2J\r")
    manifest = json.loads((hostile / MANIFEST).read_text())
    manifest["resolved"]["name"] = "name\x1b[31m\u202e"
    (hostile / MANIFEST).write_text(json.dumps(manifest))
    undecodable = copy_of(rendered, Path(os.fsdecode(bytes(runs_root) + b"/latin1-\xe9")))
    listed = subprocess.run(
        [sys.executable, "-m", "gdnctl", "runs", str(runs_root)], capture_output=True, timeout=120, check=False
    )
    assert listed.returncode == 0, listed.stderr
    assert b"\x1b" not in listed.stdout and b"\r" not in listed.stdout and b"\x07" not in listed.stdout
    text = listed.stdout.decode()
    assert "evil\\x1b]0;owned\\x07\\x1b[2J\\r: name\\x1b[31m\\u202e (selftest, local) rendered" in text
    assert "latin1-\\udce9: selftest-cpu (selftest, local) rendered" in text
    status = subprocess.run(
        [sys.executable, "-m", "gdnctl", "status", str(undecodable)], capture_output=True, timeout=120, check=False
    )
    assert status.returncode == 0 and b"latin1-\\udce9" in status.stdout, status.stderr
    # On a terminal click leaves escape sequences in (it strips them only from a pipe): what a user at one sees.
    assert b"\x1b" not in on_a_terminal("runs", str(runs_root))


def test_what_gdnctl_says_of_a_hostile_run_dir_reaches_a_terminal_as_escapes(tmp_path):
    """render, then resume, of a run dir whose name holds escape sequences (one another user made, listed by
    `gdnctl runs`): what they say of it, on stdout and stderr, is written out, not acted on by the terminal."""
    job = tmp_path / "bin" / "job"  # stands in for the job's python: answers launch's check, then ends at once
    job.parent.mkdir()
    job.write_text(f'#!/usr/bin/env bash\nif [[ ${{1-}} == -c ]]; then exec {sys.executable} "$@"; fi\nexit 0\n')
    job.chmod(0o755)
    hostile = tmp_path / "evil\x1b]0;owned\x07\x1b[2J"
    said = on_a_terminal("render", SELFTEST, "-o", str(hostile), "--set", f"launch.python={job}", stderr=True)
    said += on_a_terminal("resume", str(hostile), "--local", stderr=True)
    assert b"\x1b" not in said and b"\x07" not in said, said
    text = said.decode()
    assert f"rendered {tmp_path}/evil\\x1b]0;owned\\x07\\x1b[2J" in text, text
    assert f"gdnctl: resuming {tmp_path}/evil\\x1b]0;owned\\x07\\x1b[2J (local)" in text, text


def test_no_job_starts_in_a_run_dir_whose_path_is_not_text(rendered, tmp_path):
    """Bytes that are not UTF-8 in a run dir's name: `status` names it, but a job there would stop at its first
    step (TensorBoard's writer takes paths as text), so `resume` refuses with a sentence before it starts one."""
    undecodable = copy_of(rendered, Path(os.fsdecode(bytes(tmp_path) + b"/latin1-\xe9")))
    proc = gdnctl("resume", str(undecodable), "--local")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "latin1-\\udce9 has a path that is not UTF-8 text" in proc.stderr and "rename it" in proc.stderr
    assert not list((undecodable / "logs").glob("local-*.out"))  # no job started


def on_a_terminal(*args: str, stderr: bool = False) -> bytes:
    """What `gdnctl ARGS` writes to stdout (and with `stderr`, to stderr too) when it is a terminal (a
    pseudo-terminal here)."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gdnctl", *args],
        stdout=follower,
        stderr=follower if stderr else subprocess.PIPE,
    )
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end closed with the process
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert proc.wait(timeout=120) == 0, output if stderr else proc.stderr.read()
    return output


def test_a_log_is_handed_on_a_chunk_at_a_time(tmp_path):
    log = tmp_path / "job.out"
    text = ("é€ a line of the job's log 🙂\n" * (3 * CHUNK_BYTES // 30))[: 3 * CHUNK_BYTES]
    log.write_text(text)
    pieces: list[str] = []
    read = LogTail(log).drain(pieces.append, final=True)
    assert read == log.stat().st_size and "".join(pieces) == text
    assert len(pieces) >= 3 and max(len(piece.encode()) for piece in pieces) <= CHUNK_BYTES


def test_a_character_cut_by_the_writer_is_held_until_its_rest_arrives(tmp_path):
    log = tmp_path / "job.out"
    whole = "step 1 done ✓ 🙂\n".encode()
    tail, pieces = LogTail(log), []
    for end in range(1, len(whole) + 1):  # the job writes a byte at a time; the follower reads after each
        log.write_bytes(whole[:end])
        tail.drain(pieces.append)
    tail.drain(pieces.append, final=True)
    assert "".join(pieces) == whole.decode()
    log.write_bytes(whole + "✓".encode()[:2])  # the job ended mid-character
    tail.drain(pieces.append, final=True)
    assert "".join(pieces).endswith("\n\ufffd")


def test_logs_of_a_fifo_at_the_log_is_a_sentence(rendered, tmp_path):
    run_dir = copy_of(rendered, tmp_path / "run")
    os.mkfifo(run_dir / "logs" / "local-20260101-000000.out")
    proc = gdnctl("logs", str(run_dir))
    assert proc.returncode == 2, proc.stderr
    assert "the log " in proc.stderr and "is a named pipe (FIFO), not a regular file" in proc.stderr


@pytest.mark.parametrize("name", ["engine.yaml", "launch_local.sh", "launch_slurm.sbatch"])
def test_resume_refuses_a_file_edited_since_gdnctl_rendered_it(rendered, tmp_path, name):
    run_dir = copy_of(rendered, tmp_path / "run")
    path = run_dir / name
    path.write_text(path.read_text() + "\n# edited\n")
    proc = gdnctl("resume", str(run_dir), "--local")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{path} is not what gdnctl rendered (manifest.json records another sha256" in proc.stderr
    assert "render it again (gdnctl render PRESET -o RUN_DIR --force" in proc.stderr
    assert sorted(entry.name for entry in run_dir.iterdir()) == sorted(entry.name for entry in rendered.iterdir())
    assert not any((run_dir / "logs").iterdir())  # nothing ran


def test_resume_refuses_an_engine_yaml_that_brings_back_a_forbidden_variable(rendered, tmp_path):
    run_dir = copy_of(rendered, tmp_path / "run")
    engine = run_dir / "engine.yaml"
    engine.write_text(engine.read_text().replace("\nenv:\n", "\nenv:\n  PS4: $(touch /tmp/x)\n"))
    proc = gdnctl("resume", str(run_dir), "--local")
    assert proc.returncode == 2 and f"{engine} is not what gdnctl rendered" in proc.stderr, proc.stderr


def _green_report() -> str:
    return json.dumps(
        {
            "job": "selftest",
            "ranks": 2,
            "green": True,
            "checks": [{"name": "comm guard", "status": "ok", "detail": "an earlier smoke run"}],
            "measured": {
                "step_seconds": None,
                "peak_memory_gib": None,
                "memory_source": None,
                "estimate_peak_memory_gib": None,
                "estimate_allocated_gib": None,
            },
        }
    )


def test_a_smoke_that_fails_before_the_runtime_is_not_judged_by_the_last_ones_report(tmp_path):
    """The earlier smoke's green smoke.json stays in the run dir; the new smoke run's interpreter exits 1 before
    the runtime starts (a broken environment), so it never writes one of its own."""
    failing = recorder(tmp_path / "bin", exit_code=1)
    run_dir = tmp_path / "run"
    rendered = gdnctl("render", SELFTEST, "-o", str(run_dir), "--set", f"launch.python={failing}")
    assert rendered.returncode == 0, rendered.stderr
    (run_dir / SMOKE_FILE).write_text(_green_report())
    # --force: a second smoke in a run dir that holds the first's outputs (smoke.json among them) renders over it.
    proc = gdnctl(
        "launch",
        SELFTEST,
        "--smoke",
        "--json",
        "--run-dir",
        str(run_dir),
        "--force",
        "--set",
        f"launch.python={failing}",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["smoke"]["green"] is False and result["smoke"]["report"] is None
    assert f"the smoke run ended with exit code 1 without writing {run_dir / SMOKE_FILE}" in proc.stderr
    assert not (run_dir / SMOKE_FILE).exists()


def test_a_job_belongs_to_a_run_dir_by_its_name_and_working_directory(tmp_path):
    run_dir = tmp_path / "runs" / "a"
    run_dir.mkdir(parents=True)
    (tmp_path / "link").symlink_to(run_dir)
    assert KnownJob("7", "RUNNING", "selftest-cpu", str(tmp_path / "link")).belongs_to(run_dir, "selftest-cpu")
    assert not KnownJob("7", "RUNNING", "selftest-cpu", str(tmp_path / "runs" / "b")).belongs_to(
        run_dir, "selftest-cpu"
    )
    assert not KnownJob("7", "RUNNING", "other", str(run_dir)).belongs_to(run_dir, "selftest-cpu")


@pytest.mark.slurm
def test_a_slurm_smoke_that_fails_before_the_runtime_is_never_green(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    failing = recorder(tmp_path / "bin", exit_code=1)
    run_dir = tmp_path / "run"
    sets = ("--set", f"launch.python={failing}", "--set", "launch.slurm.exclusive=false")
    assert gdnctl("render", SELFTEST, "-o", str(run_dir), *sets, env=env).returncode == 0
    (run_dir / SMOKE_FILE).write_text(_green_report())
    proc = gdnctl(
        "launch",
        SELFTEST,
        "--slurm",
        "--smoke",
        "--wait",
        "--json",
        "--run-dir",
        str(run_dir),
        "--force",
        *sets,
        env=env,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] is False and result["smoke"]["green"] is False and result["smoke"]["report"] is None
    assert "passed every check" not in proc.stderr


def _until(check, timeout: float = 120) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


@pytest.mark.slurm
def test_a_copied_run_dir_never_acts_on_the_originals_slurm_job(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    data = yaml.safe_load(Path(SELFTEST).read_text())
    data["launch"] = {**data["launch"], "python": str(fake_torchrun(tmp_path / "bin")), "slurm": {"exclusive": False}}
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(data))
    original, copy = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    launched = gdnctl("launch", str(preset), "--slurm", "--run-dir", str(original), env=env)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    (job_id,) = (original / SLURM_JOBS_FILE).read_text().split()
    try:
        _until(lambda: "RUNNING" in gdnctl("status", str(original), env=env).stdout)
        subprocess.run(["cp", "-r", str(original), str(copy)], check=True)
        foreign = f"Slurm job {job_id}, recorded in {copy / SLURM_JOBS_FILE}, is not this run dir's"
        for args in COMMANDS:
            proc = gdnctl(*args, str(copy), env=env)
            assert proc.returncode == 2 and foreign in proc.stderr, (args, proc.stdout, proc.stderr)
            assert f"submitted from {original}" in proc.stderr and f"remove the line {job_id}" in proc.stderr
        forced = gdnctl("render", str(preset), "-o", str(copy), "--force", env=env)
        assert forced.returncode == 2 and foreign in forced.stderr, forced.stderr
        listed = gdnctl("runs", str(tmp_path / "runs"), env=env)
        assert f"{original}: selftest-cpu (selftest, slurm) RUNNING (Slurm job {job_id})" in listed.stdout
        assert f"{copy}: selftest-cpu (selftest, slurm) unknown" in listed.stdout and foreign in listed.stdout
        # The original's job went on through all of it, and is still its own to cancel.
        assert "RUNNING" in gdnctl("status", str(original), env=env).stdout
    finally:
        cancelled = gdnctl("cancel", str(original), env=env)
    assert cancelled.returncode == 0 and f"cancelled Slurm job {job_id}" in cancelled.stdout
