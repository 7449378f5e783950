"""rl on one GPU with the rollout on GPU vLLM, colocated: vLLM sleeps while the trainer steps, and the weights
reach it through CUDA IPC (or the disk directory), checked by checksums and the probe after every sync.

GDNCTL_TEST_VLLM_PYTHON names an interpreter whose environment has a CUDA vLLM and gdnctl (on the lent GPU
machines: a wrapper that puts /opt/site-vllm and the checkout on PYTHONPATH); the trainer runs in this one
(megatron-core, FLA).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.runtime.rl.test_rl_vllm import first_and_last_rewards, metrics

VLLM_PYTHON = os.environ.get("GDNCTL_TEST_VLLM_PYTHON")
PRESET = "tiny-qwen3.5-rl-cpu"
# The CPU preset's tiny byte-level models and toy task, on an H100 with the TE-free trainer and FLA. A fixed KV
# cache: vLLM's memory profiling fails when another process frees GPU memory meanwhile (the other GPU tests under
# pytest -n). 2 GiB is room for the tiny models' rollouts and keeps what these engines move small beside
# MEMORY_READINGS' 16 GiB.
ON_GPU = (
    "cluster.gpu=h100",
    "runtime.transformer_engine=none",
    "runtime.vllm=0.26.0",
    "kernels.gdn_backend=fla",
    "rollout.gpu_memory_utilization=0.1",
    "rollout.kv_cache_gib=2",
    "rollout.enforce_eager=true",
    "rollout.gdn_prefill_backend=triton",
)
# The tests that read the GPU's memory in use as a whole while vLLM sleeps and wakes: what their engine frees stays
# far above what a neighbouring test's 2 GiB engine or trainer moves meanwhile.
MEMORY_READINGS = ("rollout.gpu_memory_utilization=0.3", "rollout.kv_cache_gib=16")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
    pytest.mark.skipif(not VLLM_PYTHON, reason="GDNCTL_TEST_VLLM_PYTHON is not set (no GPU vLLM environment)"),
]
# Two engines at a time under pytest -n: the tests split over two workers, about the same time each on an H100
# (benchmarks/results/rollout-learning-signal-2026-11-25.md).
FIRST_WORKER = pytest.mark.xdist_group("gpu-vllm-1")
SECOND_WORKER = pytest.mark.xdist_group("gpu-vllm-2")


def command(run_dir: Path, *sets: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gdnctl",
        "launch",
        PRESET,
        "-o",
        str(run_dir),
        "--force",
        "--set",
        f"rollout.python={VLLM_PYTHON}",
        *(arg for value in (*ON_GPU, *sets) for arg in ("--set", value)),
    ]


def launch(run_dir: Path, *sets: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command(run_dir, *sets), text=True, capture_output=True, timeout=1500, check=False)
    _keep_log(run_dir, done.stdout + done.stderr)
    return done


def _keep_log(run_dir: Path, text: str) -> None:
    log_dir = os.environ.get("GDNCTL_GPU_LOG_DIR")
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        (Path(log_dir) / f"rl_vllm_{run_dir.name}.log").write_text(text)
        if (run_dir / "metrics.jsonl").is_file():
            (Path(log_dir) / f"rl_vllm_{run_dir.name}.metrics.jsonl").write_text(
                (run_dir / "metrics.jsonl").read_text()
            )


def _kill_the_rollout_after_step_3(run_dir: Path, *sets: str) -> tuple[subprocess.Popen, str, str, float]:
    """Launch the rl job, SIGKILL its rollout server once step 3's metrics are written, and wait for the job to
    end; returns the job, its stdout and stderr (kept as the run's log) and the seconds from the kill to its end."""
    job = subprocess.Popen(command(run_dir, *sets), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 1200
        while not (run_dir / "metrics.jsonl").is_file() or len(metrics(run_dir)) < 3:
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the job did not reach step 3"
            time.sleep(0.2)
        server = json.loads((run_dir / "rollout" / "address.json").read_text())["pid"]
        os.kill(server, signal.SIGKILL)
        killed = time.monotonic()
        stdout, stderr = job.communicate(timeout=600)
        seconds_to_stop = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.kill()
    _keep_log(run_dir, stdout + stderr)
    return job, stdout, stderr, seconds_to_stop


@FIRST_WORKER
def test_colocated_rl_sleeps_between_phases_and_syncs_through_cuda_ipc(tmp_path):
    run_dir = tmp_path / "colocated"
    done = launch(run_dir, "model.id=gdnctl/tiny-qwen3-next-bytes", *MEMORY_READINGS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 21))
    first, last = first_and_last_rewards(steps)
    # The same seeds learn at different speeds from run to run (vLLM's sampling and the kernels' autotuned configs
    # differ under other GPU work): the last five steps' mean over the first five's went 0.052 -> 0.187 alone on an
    # H100 and 0.054 -> 0.091 beside seven other test workers. 0.02 is over twice that difference's noise where
    # nothing learns (this reward varies by ~0.014 from step to step early on: ~0.009 for a difference of two
    # five-step means).
    assert last > first + 0.02, [round(s["reward_mean"], 3) for s in steps]
    # The engine starts from the directory; every later sync goes through GPU memory, checked the same way.
    assert {s["weight_transport"] for s in steps} == {"cuda_ipc"}
    assert all(s["synced_parameters"] > 0 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.05 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]
    # vLLM gave its memory back after every rollout, and the GPU held less while the trainer stepped.
    assert all(s["sleep_freed_gib"] > 1.0 for s in steps), [s["sleep_freed_gib"] for s in steps]
    assert all(s["gpu_used_gib_train"] < s["gpu_used_gib_rollout"] for s in steps)


@SECOND_WORKER
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: one for the trainer, one for the rollout")
def test_separate_rl_broadcasts_the_weights_over_nccl_to_the_rollout_gpu(tmp_path):
    """Separate placement on one node: the trainer on GPU 0, vLLM on GPU 1 (the rollout server's
    CUDA_VISIBLE_DEVICES), the weights broadcast from trainer rank 0 to the vLLM worker over NCCL."""
    run_dir = tmp_path / "separate"
    done = launch(
        run_dir,
        "model.id=gdnctl/tiny-qwen3-next-bytes",
        "rollout.colocate=false",
        "cluster.gpus_per_node=2",
        "rollout.num_gpus=1",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "weight group up: trainer rank 0 and 1 rollout worker(s) of 1 engine(s) over nccl" in done.stdout
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 21))
    first, last = first_and_last_rewards(steps)
    assert last > first + 0.05, [round(s["reward_mean"], 3) for s in steps]
    assert {s["weight_transport"] for s in steps} == {"broadcast"}
    assert all(s["synced_parameters"] > 0 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.05 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]
    # Nothing sleeps: the rollout has its GPU to itself.
    assert all(s["sleep_freed_gib"] is None for s in steps)


@SECOND_WORKER
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: one for the trainer, one for the rollout")
def test_separate_qwen35_broadcasts_into_the_vision_language_class(tmp_path):
    """The tiny Qwen3.5 on separate GPUs: the broadcast names the language model as vLLM 0.26's vision-language
    class does. (Its reward rose 0.034 -> 0.063 over 20 colocated steps on an H100: rising, by less than the
    Qwen3-Next's margin above.)"""
    run_dir = tmp_path / "separate-qwen35"
    done = launch(run_dir, "rollout.colocate=false", "cluster.gpus_per_node=2", "rollout.num_gpus=1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 21))
    first, last = first_and_last_rewards(steps)
    assert last > first
    assert {s["weight_transport"] for s in steps} == {"broadcast"}
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.05 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]


@FIRST_WORKER
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for vLLM tensor parallel 2")
def test_a_tensor_parallel_rollout_colocated_takes_each_gpus_weights_through_cuda_ipc(tmp_path):
    """rollout.tp 2 colocated on 2 GPUs: two trainer ranks (data parallel) and two vLLM workers share the GPUs;
    each worker opens the bucket of the trainer rank on its own GPU (by UUID) and keeps its shard."""
    run_dir = tmp_path / "colocated-tp2"
    done = launch(
        run_dir,
        "model.id=gdnctl/tiny-qwen3-next-bytes",
        "cluster.gpus_per_node=2",
        "rollout.tp=2",
        "train.train_iters=5",
        *MEMORY_READINGS,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 6))
    assert {s["weight_transport"] for s in steps} == {"cuda_ipc"}
    assert all(s["synced_parameters"] > 0 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.05 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]
    assert all(s["sleep_freed_gib"] > 1.0 for s in steps)


@SECOND_WORKER
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for two rollout engines")
def test_two_colocated_engines_each_take_their_gpus_weights_through_cuda_ipc(tmp_path):
    """Two GPUs at rollout.tp 1, colocated: two engines, each a server on its own GPU; a step's prompts split
    between them, and every sync reaches both through CUDA IPC (each engine's worker opens the bucket of the
    trainer rank on its GPU), each checked by its checksums and the probe."""
    run_dir = tmp_path / "colocated-two-engines"
    done = launch(
        run_dir,
        "model.id=gdnctl/tiny-qwen3-next-bytes",
        "cluster.gpus_per_node=2",
        "train.train_iters=5",
        *MEMORY_READINGS,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "rollout engines: 2 of rollout.tp 1 (colocated with the trainer)" in done.stdout
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 6))
    assert [s["rollout_engines"] for s in steps] == [2] * 5
    assert {s["weight_transport"] for s in steps} == {"cuda_ipc"}
    assert all(s["synced_parameters"] > 0 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.05 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]
    assert all(s["sleep_freed_gib"] > 1.0 for s in steps)


@FIRST_WORKER
@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="needs 3 GPUs: one for the trainer, two rollout engines")
def test_separate_engines_all_receive_one_nccl_broadcast(tmp_path):
    """Two separate engines beside a one-GPU trainer: trainer rank 0 drives both and one broadcast per bucket
    reaches both engines' workers (group ranks 1 and 2)."""
    run_dir = tmp_path / "separate-two-engines"
    done = launch(
        run_dir,
        "model.id=gdnctl/tiny-qwen3-next-bytes",
        "rollout.colocate=false",
        "cluster.gpus_per_node=3",
        "rollout.num_gpus=2",
        "train.train_iters=5",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "weight group up: trainer rank 0 and 2 rollout worker(s) of 2 engine(s) over nccl" in done.stdout
    steps = metrics(run_dir)
    assert [s["rollout_engines"] for s in steps] == [2] * 5
    assert {s["weight_transport"] for s in steps} == {"broadcast"}
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.05 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]


@FIRST_WORKER
@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 GPUs: two for the trainer, two rollout engines")
def test_a_two_gpu_trainer_and_two_separate_engines_sync_every_step_over_nccl(tmp_path):
    """Two GPU pairs: a data-parallel trainer on GPUs 0-1, two TP1 engines on GPUs 2-3, 20 GRPO steps of tiny
    Qwen3.5 with every sync one NCCL broadcast from trainer rank 0, each engine checked. (How fast the reward rises
    is the single-engine tests' concern: over these 20 steps it went 0.039 -> 0.056 on four H100s.)"""
    run_dir = tmp_path / "two-pairs"
    done = launch(run_dir, "rollout.colocate=false", "cluster.gpus_per_node=4", "rollout.num_gpus=2")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "weight group up: trainer rank 0 and 2 rollout worker(s) of 2 engine(s) over nccl" in done.stdout
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 21))
    assert [s["rollout_engines"] for s in steps] == [2] * 20
    assert {s["weight_transport"] for s in steps} == {"broadcast"}
    assert all(s["synced_parameters"] > 0 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.05 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]


@SECOND_WORKER
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: one for the trainer, one for the rollout")
def test_a_separate_rollout_killed_mid_run_fails_the_job_in_bounded_time(tmp_path):
    """The rollout on its own GPU, killed after step 3: whatever the trainer waits on next (a request, or a
    broadcast its workers will never receive), it notices the dead server and stops with a sentence instead of
    waiting on NCCL, and `latest` stays on a checkpoint."""
    run_dir, save_dir = tmp_path / "killed-separate", tmp_path / "checkpoints"
    job, stdout, stderr, seconds_to_stop = _kill_the_rollout_after_step_3(
        run_dir,
        "model.id=gdnctl/tiny-qwen3-next-bytes",
        "rollout.colocate=false",
        "cluster.gpus_per_node=2",
        f"train.save_dir={save_dir}",
        "train.save_interval=2",
    )
    assert job.returncode != 0
    sentence = next(line for line in stderr.splitlines() if line.startswith("gdnctl runtime:"))
    assert "rollout" in sentence and "resumes from the last checkpoint" in sentence, sentence
    # The rollout's default timeout is far longer: the trainer saw the dead server, not a timeout.
    assert seconds_to_stop < 120, (seconds_to_stop, sentence)
    latest = (save_dir / "latest").read_text().strip()
    assert (save_dir / latest / "trainer_state.json").is_file()


@SECOND_WORKER
def test_the_disk_sync_serves_qwen35_through_the_vision_language_class(tmp_path):
    """vLLM 0.26 has Qwen3.5 only as Qwen3_5ForConditionalGeneration: the sync names the language model as that
    class does, and the engine builds no vision tower."""
    run_dir = tmp_path / "disk-vl"
    done = launch(run_dir, "rollout.weight_sync=disk", "train.train_iters=3")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert {s["weight_transport"] for s in steps} == {"disk"}
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps)
    config = json.loads((run_dir / "rollout" / "weights" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]


@SECOND_WORKER
def test_qwen35_syncs_through_cuda_ipc_into_the_vision_language_class(tmp_path):
    run_dir = tmp_path / "ipc-vl"
    done = launch(run_dir, "train.train_iters=3")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = metrics(run_dir)
    assert {s["weight_transport"] for s in steps} == {"cuda_ipc"}
    assert all(s["probe_logprob_abs_diff"] < 0.05 for s in steps)


@FIRST_WORKER
def test_a_rollout_killed_mid_run_fails_the_job_and_keeps_the_last_checkpoint(tmp_path):
    run_dir, save_dir = tmp_path / "killed", tmp_path / "checkpoints"
    job, stdout, stderr, _ = _kill_the_rollout_after_step_3(
        run_dir, "model.id=gdnctl/tiny-qwen3-next-bytes", f"train.save_dir={save_dir}", "train.save_interval=2"
    )
    assert job.returncode != 0
    sentence = next(line for line in stderr.splitlines() if line.startswith("gdnctl runtime:"))
    assert "the rollout server was killed by SIGKILL" in sentence and "resumes from the last checkpoint" in sentence
    latest = (save_dir / "latest").read_text().strip()
    assert latest in ("iter_0000002", "iter_0000004")
    assert (save_dir / latest / "trainer_state.json").is_file()


@FIRST_WORKER
def test_the_rl_smoke_runs_green_on_the_gpu_with_the_rollout_colocated(tmp_path):
    """`gdnctl launch --smoke` of the rl job on the GPU: two optimizer steps, a checkpoint save and load, weight
    syncs checked (the later ones through CUDA IPC), with vLLM sleeping between phases."""
    from gdnctl.schema import SmokeReport

    run_dir, save_dir = tmp_path / "smoke", tmp_path / "checkpoints"
    proc = subprocess.run(
        [*command(run_dir, "model.id=gdnctl/tiny-qwen3-next-bytes", f"train.save_dir={save_dir}"), "--smoke"],
        text=True,
        capture_output=True,
        timeout=1500,
        check=False,
    )
    _keep_log(run_dir, proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = SmokeReport.model_validate_json((run_dir / "smoke.json").read_text())
    assert report.green and report.count("FAIL") == 0, report.lines()
    checks = {check.name: check for check in report.checks}
    assert checks["weight sync"].detail.startswith("3 syncs checked"), checks["weight sync"].detail
    assert (run_dir / "smoke" / "checkpoints" / "latest").read_text().strip() == "iter_0000002"
    assert not save_dir.exists()
