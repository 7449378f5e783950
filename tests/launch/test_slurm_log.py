"""What `launch --slurm --wait` reads from a job's log when the job did not succeed (gdnctl/launch/submit.py
first_failure): the first failed rank of the log's last run, which across nodes is the failure that made srun stop
the other nodes' tasks."""

from __future__ import annotations

from gdnctl.launch.submit import first_failure
from gdnctl.runtime.launcher.torchrun import failure_sentence

START = "gdnctl: job 7 on 2 node(s) (a b), rendezvous on a, restart {}\n"


def test_the_first_failed_rank_of_the_last_run_is_named(tmp_path):
    log = tmp_path / "job.out"
    log.write_text(
        START.format(0)
        + failure_sentence(0, 1, "a", 1)
        + "\n"  # the first run's failure: the job was requeued after it
        + START.format(1)
        + "step 3/12 | ...\n"
        + failure_sentence(1, 3, "b", 1)
        + "\n"
        + "gdnctl: torchrun on a got SIGTERM and stopped its ranks.\n"
        + failure_sentence(0, -9, "a", 2)
        + "\n"
    )
    assert first_failure(log) == "rank 1 on b exited with code 3"


def test_a_log_without_a_failed_rank_or_without_a_log_names_none(tmp_path):
    log = tmp_path / "job.out"
    log.write_text(START.format(0) + "srun: error: Unable to create step for job 7\n")
    assert first_failure(log) is None
    assert first_failure(tmp_path / "missing.out") is None
