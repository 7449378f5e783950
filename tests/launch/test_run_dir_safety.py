"""What `render`/`launch --force` may touch: only the files the manifest lists, never while a job (local or on
Slurm) uses the run dir, never through a link; and launches in the same second get run dirs of their own. Real
file systems, real bash running the rendered scripts, a real single-node Slurm."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.launch.render import build, write
from gdnctl.launch.run_dir import LOCK_FILE, SLURM_JOBS_FILE, RunDirTaken, sha256
from gdnctl.validate import validate
from tests.launch.helpers import alive, fake_torchrun, recorded_calls, recorder, started_pids
from tests.launch.test_launch import SELFTEST
from tests.slurm_cluster import slurm_env, wait_for_job

runner = CliRunner()
RENDERED = ["engine.yaml", "launch_local.sh", "launch_slurm.sbatch", "manifest.json"]


def render(out: Path, *args: str):
    return runner.invoke(app, ["render", "selftest-cpu", "-o", str(out), *args])


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root` (links not followed): a file's bytes, a link's target."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        found[name] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes() if path.is_file() else "/"
    return found


def _fill_with_the_jobs_data(run_dir: Path) -> None:
    """What a job and its user leave in a run dir: none of it gdnctl's."""
    assert render(run_dir / "nested-run").exit_code == 0  # another run dir inside
    (run_dir / "checkpoints" / "iter_0000010").mkdir(parents=True)
    (run_dir / "checkpoints" / "iter_0000010" / "model.safetensors").write_bytes(b"\0weights")
    (run_dir / "checkpoints" / "latest").write_text("iter_0000010\n")
    (run_dir / "wandb" / "offline-run-20260101_000000-abc").mkdir(parents=True)
    (run_dir / "wandb" / "offline-run-20260101_000000-abc" / "run-abc.wandb").write_bytes(b"unsynced")
    (run_dir / "logs" / "selftest-cpu-7.out").write_text("the last job's log\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')


def test_the_manifest_lists_the_files_gdnctl_wrote(tmp_path):
    out = tmp_path / "run"
    assert render(out).exit_code == 0
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert [entry["path"] for entry in files] == RENDERED
    for entry in files[:-1]:
        assert entry["sha256"] == sha256((out / entry["path"]).read_bytes())


def test_force_replaces_only_what_gdnctl_wrote_and_says_what_it_kept(tmp_path):
    run_dir = tmp_path / "run"
    assert render(run_dir).exit_code == 0
    _fill_with_the_jobs_data(run_dir)
    theirs = {name: data for name, data in snapshot(run_dir).items() if name not in RENDERED}
    result = render(run_dir, "--force", "--set", "name=renamed", "--json")
    assert result.exit_code == 0, result.output
    assert {
        name: data for name, data in snapshot(run_dir).items() if name not in RENDERED and name != LOCK_FILE
    } == theirs
    assert json.loads((run_dir / "manifest.json").read_text())["resolved"]["name"] == "renamed"
    assert "export GDNCTL_JOB_NAME=renamed" in (run_dir / "launch_local.sh").read_text()
    kept = ["checkpoints/", "logs/", "metrics.jsonl", "nested-run/", "wandb/"]
    assert json.loads(result.stdout)["kept"] == kept
    assert (
        "gdnctl: --force replaced only the files gdnctl rendered and kept what it did not write, as it was: "
        + ", ".join(kept)
    ) in result.stderr
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".gdnctl-rendering-")]


def test_force_refuses_a_file_edited_since_gdnctl_wrote_it(tmp_path):
    run_dir = tmp_path / "run"
    assert render(run_dir).exit_code == 0
    script = run_dir / "launch_local.sh"
    script.write_text(script.read_text() + "# my site's tweak\n")
    before = snapshot(run_dir)
    result = render(run_dir, "--force", "--set", "name=renamed")
    assert result.exit_code == 2
    assert f"{script} changed since gdnctl rendered it, so --force will not replace it" in result.stderr
    assert snapshot(run_dir) == before | {LOCK_FILE: b""}


def test_an_edited_manifest_cannot_point_force_at_other_files(tmp_path):
    run_dir = tmp_path / "run"
    assert render(run_dir).exit_code == 0
    (tmp_path / "victim").write_text("mine\n")
    (run_dir / "metrics.jsonl").write_text("{}\n")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["files"] += [{"path": "../victim"}, {"path": "metrics.jsonl"}, {"path": str(tmp_path / "victim")}]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    assert render(run_dir, "--force").exit_code == 0
    assert (tmp_path / "victim").read_text() == "mine\n" and (run_dir / "metrics.jsonl").read_text() == "{}\n"


def test_force_refuses_while_a_local_job_holds_the_run_dir_and_admits_after(tmp_path):
    fake = fake_torchrun(tmp_path / "bin")
    run_dir = tmp_path / "run"
    assert render(run_dir, "--set", f"launch.python={fake}").exit_code == 0
    job = subprocess.Popen(["bash", str(run_dir / "launch_local.sh")], start_new_session=True)
    pids = started_pids(tmp_path / "bin")
    try:
        before = snapshot(run_dir)
        result = render(run_dir, "--force", "--set", "name=renamed")
        assert result.exit_code == 2
        assert (
            f"{run_dir} is in use by a running job (launch_local.sh holds {run_dir / LOCK_FILE}); stop the job "
            "or wait for it to end, or choose another run dir."
        ) in result.stderr
        assert snapshot(run_dir) == before
        # A second launch into the same run dir is refused by the script itself.
        second = subprocess.run(["bash", str(run_dir / "launch_local.sh")], capture_output=True, text=True)
        assert second.returncode == 75 and "another job is running in" in second.stderr
        assert len((tmp_path / "bin" / "pids").read_text().split()) == 5  # it started nothing
    finally:
        os.killpg(job.pid, signal.SIGTERM)  # the session this test started: the fake torchrun and its ranks
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        job.wait()
    assert render(run_dir, "--force", "--set", "name=renamed").exit_code == 0


def test_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path):
    run_dir = tmp_path / "run"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    assert render(run_dir, "--set", f"launch.python={recorder(tmp_path / 'bin')}").exit_code == 0
    (run_dir / LOCK_FILE).symlink_to(victim)
    result = render(run_dir, "--force")
    assert result.exit_code == 2
    assert (
        f"{run_dir / LOCK_FILE} is a symbolic link; gdnctl does not write through links in a run dir: remove it "
        f"(rm {run_dir / LOCK_FILE}) and run again."
    ) in result.stderr
    script = subprocess.run(["bash", str(run_dir / "launch_local.sh")], capture_output=True, text=True)
    assert script.returncode == 2 and f"{run_dir / LOCK_FILE} is not a regular file (a symbolic link?)" in script.stderr
    assert recorded_calls(tmp_path / "bin") == []
    assert victim.read_text() == "precious\n" and (run_dir / LOCK_FILE).is_symlink()


def test_a_link_as_the_run_dir_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "real-run"
    assert render(target).exit_code == 0
    (target / "metrics.jsonl").write_text("{}\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for link, points_to in ((tmp_path / "link", target), (tmp_path / "link-to-empty", empty)):
        link.symlink_to(points_to)
        before = snapshot(points_to)
        for args in ([], ["--force"]):
            result = render(link, *args)
            assert result.exit_code == 2, result.output
            assert (
                f"{link} is a symbolic link (to {points_to}); gdnctl never renders through a link, which would "
                f"replace what it points to: pass the directory itself ({points_to}), or remove the link."
            ) in result.stderr
            assert snapshot(points_to) == before and link.is_symlink()


def test_launches_in_the_same_second_get_run_dirs_of_their_own(tmp_path):
    fake = recorder(tmp_path / "bin")
    launches = [
        subprocess.Popen(
            [sys.executable, "-m", "gdnctl", "launch", SELFTEST, "--set", f"launch.python={fake}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    for launch in launches:
        _, stderr = launch.communicate(timeout=120)
        assert launch.returncode == 0, stderr
    run_dirs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(run_dirs) == 6 and len(recorded_calls(tmp_path / "bin")) == 6
    assert all(re.fullmatch(r"selftest-cpu-\d{8}-\d{6}-[0-9a-f]{4}", name) for name in run_dirs), run_dirs


def test_a_default_run_dir_is_created_exclusively(tmp_path):
    """The name a launch drew is refused once it exists, even empty: render draws another."""
    result = validate(SELFTEST)
    rendered = build(result, tmp_path / "taken")
    (tmp_path / "taken").mkdir()
    with pytest.raises(RunDirTaken):
        write(rendered, exclusive=True)
    write(rendered)  # an empty directory given by name is rendered into
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == [
        "engine.yaml",
        "launch_local.sh",
        "launch_slurm.sbatch",
        "logs",
        "manifest.json",
    ]


def test_force_refuses_recorded_slurm_jobs_when_squeue_cannot_say(tmp_path):
    run_dir = tmp_path / "run"
    assert render(run_dir).exit_code == 0
    (run_dir / SLURM_JOBS_FILE).write_text("41\n")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "gdnctl", "render", SELFTEST, "-o", str(run_dir), "--force"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "Slurm job(s) 41 were submitted from this run dir and squeue is not on PATH to tell whether they have ended"
    ) in proc.stderr


@pytest.mark.slurm
def test_force_refuses_while_a_slurm_job_of_the_run_dir_is_queued_or_running(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    fake = fake_torchrun(tmp_path / "bin")
    run_dir = tmp_path / "run"
    jobs = []

    def gdnctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gdnctl", *args], env=env, capture_output=True, text=True, timeout=120
        )

    try:
        # Held: a queued job reads engine.yaml only when it starts, so a --force now would change what it runs.
        held = gdnctl(
            "launch",
            SELFTEST,
            "--slurm",
            "--run-dir",
            str(run_dir),
            "--set",
            f"launch.python={fake}",
            "--set",
            "launch.slurm.extra_sbatch=[--hold]",
        )
        assert held.returncode == 0, held.stderr
        jobs = (run_dir / SLURM_JOBS_FILE).read_text().split()
        refused = gdnctl("launch", SELFTEST, "--slurm", "--run-dir", str(run_dir), "--force")
        assert refused.returncode == 2
        assert (
            f"{run_dir} belongs to Slurm job {jobs[0]} (PENDING), which would run with the new engine.yaml; "
            f"scancel {jobs[0]} or wait for it to end, or choose another run dir."
        ) in refused.stderr
        subprocess.run(["scontrol", "release", jobs[0]], env=env, check=True)
        started_pids(tmp_path / "bin")
        running = gdnctl("render", SELFTEST, "-o", str(run_dir), "--force")
        assert running.returncode == 2 and f"belongs to Slurm job {jobs[0]} (RUNNING)" in running.stderr
        assert f"launch.python={fake}" in json.dumps(json.loads((run_dir / "manifest.json").read_text()))
    finally:
        for job_id in jobs:
            subprocess.run(["scancel", job_id], env=env, check=False)
            wait_for_job(job_id, env)
    assert gdnctl("render", SELFTEST, "-o", str(run_dir), "--force").returncode == 0
