"""Shared fixtures (the local Slurm cluster, golden-file updates) and how tests spread over xdist workers."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.slurm_cluster import NODES_DIR, ensure_local_slurm, local_slurm_running, stop_local_slurm

# Hypothesis profiles (HYPOTHESIS_PROFILE picks one; .ci/run sets ci). Tests keep their own max_examples.
# ci: derandomized, so every CI run tries the same examples and a failure reproduces from its commit alone;
# no example database (a clean clone has none to replay) and no deadline (a loaded 2-core machine is slow).
# dev (the default): fresh random examples on each run, which is how a developer's runs find new cases.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Fixtures that own one machine-wide thing or one run that several tests read: every test using one runs on the
# same xdist worker (`--dist loadgroup`), so the thing is set up once (a fixture is set up once per worker that
# needs it) and no two workers race to start or stop it.
SHARED_FIXTURE_GROUPS = {
    "local_slurm": "slurm",  # one slurmctld/slurmd pair on fixed loopback ports, one state dir
    # two nodes in network namespaces: their own state dir, ports and network, so beside the one-node cluster on a
    # worker of their own (tools/local-slurm.sh serializes the clusters' starts and stops, which share munged)
    "local_slurm_nodes": "slurm-nodes",
    "gloo_run": "gloo",  # one 2-rank torchrun whose output both the comm guard and comm-report tests read
    "rl_smoke_run": "rl-smoke",  # one rl smoke run with vLLM that the smoke and docs tests both read
    "ppo_run": "rl-ppo",  # one PPO rl job at temperature 0.7 that the PPO and temperature tests both read
    "coverage_run": "gloo-coverage",  # one 2-rank torchrun that the comm guard coverage tests read
    "nonfinite_run": "rl-nonfinite",  # one rl job stopped by a non-finite step: the non-finite and process tests
    "streaming_run": "rl-streaming",  # one rollout server that the partial-rollout and long-prompt tests read
}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker more than the cores this process may run on. Much of the suite waits rather than
    computes (a Slurm job for slurmctld's next time-limit check, a vLLM server or torchrun starting), and a worker
    that waits leaves its core idle; on the 2-core CI machine 2 workers kept the cores 73% busy. Measured there:
    pytest 611 s with 2 workers, 528 s with 3. PYTEST_XDIST_AUTO_NUM_WORKERS and `-n logical` keep xdist's own
    meaning (None hands the choice back to it)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.option.numprocesses == "logical":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + 1


def pytest_configure(config: pytest.Config) -> None:
    """OpenMP threads that wait sleep instead of spinning, in this process and every process it starts; each
    xdist worker's torch gets its share of the cores for its intra-op threads, not all of them.

    torch starts one OpenMP thread per core in every process; with `-n auto` every worker does, so on 2 cores two
    workers ran 4 threads that spin-wait at each parallel op for a thread the other worker had preempted: the
    in-process torch tests (data layout, weight sharding, LoRA merges) took about twice the CPU time they take
    with one thread each. Only the thread count changes there; a subprocess (torchrun ranks, the CLI) keeps its
    own, as the rendered scripts decide it (OMP_NUM_THREADS=2 on CPU).

    The subprocesses spun too: two rl jobs side by side (the trainer's 2 threads each, vLLM's workers) trained
    20-40 times slower than one alone (60-160 tok/s instead of ~2,500; 2026-11-26, 2 cores) and took 3 minutes
    instead of 45 s. With OMP_WAIT_POLICY=PASSIVE (libgomp's waiting threads block at once) the pair took 60 s,
    and a job alone took what it took before. The variable is inherited (the scripts do not set it), so it
    reaches the torchrun ranks, the rollout servers and vLLM's engine processes, locally and as Slurm jobs (sbatch
    exports the submitter's environment); thread counts, and so every result, stay as they were. A value already
    set wins.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if not os.environ.get("PYTEST_XDIST_WORKER") or workers < 1:
        return
    try:
        import torch
    except ImportError:  # a machine with gdnctl alone: the runtime tests skip (RUNTIME_PACKAGES below)
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


# The `slow` mark, kept in one place so the inner loop's contents (`pytest -m "not slow"`, at most 2 minutes on
# 2 cores) are read and changed here: modules whose every test starts processes, and single tests that take
# seconds (measured with --durations on a 2-core machine). Tests marked slurm or gpu, and tests that use a
# shared fixture (SHARED_FIXTURE_GROUPS: the local Slurm, a gloo or rl run), are slow as well.
SLOW_MODULES = {
    # gdnctl launch, a job, a Slurm submission or doctor's probes in subprocesses
    "tests/runtime/train/test_cpu_sft_images.py",
    "tests/launch/test_launch.py",
    "tests/launch/test_requeue.py",
    "tests/launch/test_run_dir_safety.py",
    "tests/launch/test_run_dir_readers.py",
    "tests/launch/test_smoke.py",
    "tests/launch/test_stop.py",
    "tests/doctor/test_doctor_cli.py",
    "tests/doctor/test_doctor_compile.py",
    "tests/doctor/test_doctor_input.py",
    "tests/doctor/test_doctor_secrets.py",
    "tests/test_cli_environment.py",
    "tests/test_local_slurm.py",
    "tests/validate/test_sbatch_premises.py",
    "tests/test_wheel_contents.py",
    "tests/runtime/train/test_metrics.py",
    "tests/test_walkthrough.py",
    "tests/launch/test_launch_seams.py",
    # a real 2-rank gloo run (torchrun) and what reads it
    "tests/launch/test_comm_report.py",
    "tests/launch/test_comm_report_input.py",
    "tests/runtime/comm/test_comm_guard.py",
    "tests/runtime/comm/test_comm_guard_coverage.py",
    # the runtime started in subprocesses: jobs, rollout servers, vLLM CPU, policy steps
    "tests/runtime/test_runtime_main.py",
    "tests/runtime/test_runtime_input.py",
    "tests/runtime/kernels/test_compile_output.py",
    "tests/runtime/model/test_checkpoint_durability.py",
    "tests/runtime/model/test_save_lock.py",
    "tests/runtime/model/test_resume_choice.py",
    "tests/runtime/rl/test_checkpoint_full_disk.py",
    "tests/runtime/rl/test_rl_vllm.py",
    "tests/runtime/rl/test_rl_images.py",
    "tests/runtime/rl/test_rollout_processes.py",
    "tests/runtime/rl/test_rl_async.py",
    "tests/runtime/rl/test_policy_contract.py",
    "tests/runtime/rl/test_rl_requeue.py",
    "tests/runtime/rl/test_hf_export.py",
    "tests/runtime/rl/test_torch_policy.py",
    "tests/runtime/rl/test_step0_gap.py",
    "tests/runtime/rl/test_rollout_protocol.py",
    "tests/runtime/rl/test_updates.py",
    "tests/runtime/rl/test_prompt_check.py",
    "tests/runtime/rl/test_chat_template.py",
    "tests/runtime/rl/test_rl_user_code.py",
    # reward worker processes, an HTTP server on loopback with its retries' backoff, episodes over the example's config
    "tests/runtime/rl/test_reward_pool.py",
    "tests/runtime/rl/test_reward_server.py",
    "tests/runtime/rl/test_episodes.py",
    # generated inputs by the thousand (hypothesis)
    "tests/validate/test_fuzz.py",
    "tests/validate/test_hostile_input.py",
    "tests/runtime/model/test_config_agreement.py",
    "tests/test_file_readers.py",
}
SLOW_TESTS = {  # module path -> test function names (every parametrization)
    "tests/launch/test_render.py": {"test_scripts_pass_bash_n_and_shellcheck"},
    "tests/runtime/data/test_context_parallel.py": {
        "test_the_ranks_hold_every_position_once_and_equal_shares_of_each_sequence",
        "test_a_cp_rank_is_handed_its_tokens_and_the_whole_rows_metadata",
    },
    "tests/runtime/data/test_data.py": {
        "test_resuming_from_consumed_samples_continues_the_same_stream",
        "test_every_document_is_trained_exactly_once_per_epoch_across_ranks",
        "test_thd_and_bshd_train_the_same_tokens",
        "test_micro_batches_fit_the_row_and_line_labels_up_with_tokens",
        "test_filled_rows_are_one_length_and_cut_the_epochs_documents_in_order",
        "test_filled_rows_train_the_pieces_planned_and_resume_where_they_stopped",
        "test_concatenated_rows_are_windows_of_one_token_stream_and_resume_where_they_stopped",
    },
    "tests/runtime/data/test_layout.py": {"test_padding_follows_the_documented_values", "test_round_trips_are_exact"},
    "tests/runtime/rl/test_broadcast.py": {
        "test_every_bucket_reaches_every_engines_worker_byte_for_byte",
        "test_a_worker_that_never_joins_stops_rank_0_with_a_sentence_at_the_deadline",
    },  # waits out its 2 s
    "tests/launch/test_follow_runs.py": {"test_status_and_logs_of_a_rendered_run_dir_and_of_no_run_dir"},  # 11 CLIs
    "tests/runtime/model/test_hf_weights.py": {
        "test_qwen3_next_is_qwen35_moe_up_to_the_gdn_projection_layout",
        "test_qwen3_next_regrouping_matches_transformers_split",
        "test_every_tensor_survives_sharding_and_gathering",
    },
    "tests/runtime/model/test_lora_adapters.py": {
        "test_hf_adapters_merge_into_what_the_megatron_adapter_merges_into",
        "test_peft_loads_the_written_adapter_and_gives_the_merged_models_logits",
        "test_peft_cannot_load_a_qwen3_next_shared_expert_adapter",
    },
    "tests/runtime/model/test_passthrough.py": {
        "test_save_hf_gives_back_the_source_checkpoint_and_a_resume_carries_it_on",
        "test_save_hf_from_random_weights_writes_the_text_only_class_and_nothing_else",
    },
    "tests/test_gpu_suite_benchmark.py": {"test_the_result_names_each_workers_time_and_the_outcomes"},
    "tests/test_trainer_throughput_benchmark.py": {  # a campaign, megatron-core's dataset, the script in subprocesses
        "test_a_campaign_here_reports_each_failed_arm_with_its_log_and_keeps_the_record",
        "test_the_peer_trains_the_rows_gdnctls_trainer_trains",
        "test_the_device_scripts_poll_reports_a_recorded_campaign_and_packs_it",
        "test_compare_refuses_a_kernel_name_it_cannot_run_before_any_launch",
    },
    "tests/runtime/rl/test_grpo.py": {"test_toy_policy_learns_the_rewarded_answer"},
}


def _is_slow(item: pytest.Item) -> bool:
    if item.get_closest_marker("slurm") or item.get_closest_marker("gpu"):
        return True
    # A shared fixture starts a cluster or a job (SHARED_FIXTURE_GROUPS): whatever module its test is in, the test
    # waits for that (the docs test that reads the rl smoke run would otherwise start a vLLM job in the inner loop).
    if any(fixture in item.fixturenames for fixture in SHARED_FIXTURE_GROUPS):
        return True
    module = item.path.relative_to(item.config.rootpath).as_posix()
    name = getattr(item, "originalname", item.name)
    return module in SLOW_MODULES or name in SLOW_TESTS.get(module, ())


# tryfirst: xdist's worker reads the xdist_group marks in its own pytest_collection_modifyitems (it appends the
# group to each test's id, which is what --dist loadgroup sends by); a mark added after that is ignored, and
# the tests of a group would spread over the workers, each setting the shared fixture up again.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
        groups = {group for fixture, group in SHARED_FIXTURE_GROUPS.items() if fixture in item.fixturenames}
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid} uses fixtures of several xdist groups: {sorted(groups)}")
        if groups and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(groups.pop()))


# The runtime extra's packages (pyproject's `runtime` and `test` extras). Without them a runtime test module
# cannot import; it is skipped with the reason rather than failing collection, so the rest of the suite runs on
# a machine that installed only `gdnctl` (CI installs them all, so nothing skips there for this).
RUNTIME_PACKAGES = frozenset(
    {"torch", "numpy", "megatron", "transformers", "safetensors", "tokenizers", "pyarrow", "tensorboard", "wandb"}
)


class _RuntimeTestModule(pytest.Module):
    def _getobj(self):
        try:
            return super()._getobj()
        except self.CollectError as error:
            missing = error.__cause__
            if isinstance(missing, ModuleNotFoundError) and (missing.name or "").split(".")[0] in RUNTIME_PACKAGES:
                raise pytest.skip.Exception(
                    f"needs {missing.name}, not installed (pip install -e '.[test]')", allow_module_level=True
                ) from None
            raise


def pytest_pycollect_makemodule(module_path, parent):
    return _RuntimeTestModule.from_parent(parent, path=module_path)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="Rewrite tests/golden from the current templates instead of comparing against it.",
    )


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@contextlib.contextmanager
def _slurm_users(shared: Path, cluster: str) -> Iterator[dict]:
    """The pytest processes of this run that hold the cluster, and whether the run started it, in a file every
    xdist worker sees, read and written under an exclusive lock."""
    with open(shared / f"{cluster}-users.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = shared / f"{cluster}-users.json"
        state = json.loads(record.read_text()) if record.exists() else {"users": 0, "started_here": False}
        yield state
        record.write_text(json.dumps(state))


def _held_cluster(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, cluster: str, state_dir: str | None, nodes: int
) -> Iterator[dict[str, str]]:
    """Start (or reuse) a local cluster for as long as a worker of this run needs it; the env to submit with."""
    if os.environ.get("GDNCTL_SLURM_TESTS") == "0":
        pytest.skip("GDNCTL_SLURM_TESTS=0")
    # The run's own temporary root: the workers' basetemps are its children, a run without xdist uses its own.
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    with _slurm_users(shared, cluster) as state:
        if state["users"] == 0 and not state["started_here"]:
            state["started_here"] = not local_slurm_running(state_dir)
        env = ensure_local_slurm(state_dir, nodes=nodes)
        state["users"] += 1
    yield env
    with _slurm_users(shared, cluster) as state:
        state["users"] -= 1
        if state["users"] == 0 and state["started_here"] and os.environ.get("GDNCTL_KEEP_SLURM") != "1":
            stop_local_slurm(state_dir)
            state["started_here"] = False


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[dict[str, str]]:
    """A real single-node Slurm cluster (tools/local-slurm.sh); the env to submit with.

    Each xdist worker that needs it holds it, so the last of them to finish stops it, and only when this run
    started it (a worker stopping it while another still submitted jobs failed a test with "Unable to contact
    slurm controller"). GDNCTL_SLURM_TESTS=0 skips the tests that need it; GDNCTL_KEEP_SLURM=1 leaves a cluster
    this run started running afterwards (one that was already up is always left running).
    """
    yield from _held_cluster(tmp_path_factory, worker_id, "local-slurm", None, nodes=1)


@pytest.fixture(scope="session")
def local_slurm_nodes(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[dict[str, str]]:
    """A real two-node Slurm cluster (tools/local-slurm.sh start --nodes 2 in tests/slurm_cluster.py NODES_DIR):
    each node a network namespace with its own address and host name, on this machine's file system; the env to
    submit with. Held and stopped as local_slurm is, beside it (its own ports, state dir and network)."""
    yield from _held_cluster(tmp_path_factory, worker_id, "local-slurm-nodes", NODES_DIR, nodes=2)


@pytest.fixture(scope="session")
def rl_smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """`gdnctl launch tiny-qwen3.5-rl-cpu --smoke` with a real vLLM (GDNCTL_TEST_VLLM_PYTHON) and a
    train.save_dir: its run dir, that save dir and the launch's result. Run once for the tests that read it (what
    the smoke checks and leaves untouched, tests/launch/test_smoke.py; that docs/smoke.md's example is what it
    prints, tests/test_docs.py), each a vLLM engine start fewer."""
    from tests.runtime.rl.test_rl_vllm import PRESET, VLLM_PYTHON, vllm_env

    base = tmp_path_factory.mktemp("rl-smoke")
    run_dir, save_dir = base / "run", base / "checkpoints"
    command = [sys.executable, "-m", "gdnctl", "launch", PRESET, "--smoke", "--run-dir", str(run_dir)]
    command += ["--set", f"rollout.python={VLLM_PYTHON}", "--set", f"train.save_dir={save_dir}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=vllm_env(), check=False)
    return run_dir, save_dir, done


@pytest.fixture(scope="session")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """(output dir, per-rank results) of one 2-rank gloo launch of tests/runtime/gloo_scenarios.py, run once per
    session for the comm guard tests (tests/runtime/comm) and the comm report's (tests/launch). Defined here, once:
    the same function imported into tests/launch/conftest.py was a second fixture, and the launch ran twice."""
    from tests.runtime.conftest import torchrun
    from tests.runtime.engine_fixture import WORLD_SIZE

    out_dir = tmp_path_factory.mktemp("gloo_scenarios")
    scenarios = Path(__file__).parent / "runtime" / "gloo_scenarios.py"
    completed = torchrun(str(scenarios), str(out_dir), cwd=out_dir)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    results = [json.loads((out_dir / f"results_rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]
    return out_dir, results
