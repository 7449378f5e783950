"""The Slurm trainer step's rendezvous port is the job's own (gdnctl/runtime/launcher/rendezvous.py): on the real
one-node Slurm, a store another process opened on the port the job's id used to give (29500 + id % 1000, so two
jobs 1,000 ids apart on one first node shared it) is never joined, and the job runs on a port its first node's
launcher holds."""

from __future__ import annotations

import re
import subprocess
from datetime import timedelta

import pytest

from tests.launch.test_launch import SELFTEST, gdnctl
from tests.slurm_cluster import slurm_env, wait_for_job

pytestmark = pytest.mark.slurm


def test_a_store_on_the_port_the_job_id_used_to_give_is_never_joined(tmp_path, local_slurm):
    dist = pytest.importorskip("torch.distributed")
    env = slurm_env(local_slurm)
    run_dir = tmp_path / "run"
    rendered = gdnctl("render", SELFTEST, "-o", str(run_dir), "--set", "selftest.steps=1")
    assert rendered.returncode == 0, rendered.stderr
    # Held until the other store is open on the port its id gives.
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--hold", "launch_slurm.sbatch"],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.strip().split(";")[0])
    predicted = 29500 + job_id % 1000
    # Another job's store (or anyone's) on that port, opened before the job starts.
    other = dist.TCPStore("0.0.0.0", predicted, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    keys = other.num_keys()
    subprocess.run(["scontrol", "release", str(job_id)], env=env, timeout=30, check=True)
    state, code, _ = wait_for_job(job_id, env, timeout=300)
    log = (run_dir / "logs" / f"selftest-cpu-{job_id}.out").read_text()
    assert (state, code) == ("COMPLETED", 0), log[-3000:]
    assert other.num_keys() == keys, "the job wrote its rendezvous into another process's store"
    held = re.search(r"gdnctl: rendezvous on \S+:(\d+) \(a port this launcher holds\)", log)
    assert held and int(held.group(1)) != predicted, log[-3000:]
    assert "selftest: passed" in log
