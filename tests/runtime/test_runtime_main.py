"""`python -m gdnctl.runtime`: the selftest job end to end under torchrun, and the one-sentence failures."""

from __future__ import annotations

import os
import socket

import pytest
import yaml

from gdnctl.runtime.__main__ import TORCHRUN_VARIABLES, apply_env, main
from gdnctl.schema.engine import ENGINE_CONFIG_VERSION

from .conftest import torchrun
from .engine_fixture import WORLD_SIZE, tiny_engine_config, write_engine_yaml


def test_selftest_passes_on_two_gloo_ranks(tmp_path):
    config_path = write_engine_yaml(tmp_path, tiny_engine_config())
    completed = torchrun("-m", "gdnctl.runtime", "--config", str(config_path), cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    lines = [line for line in completed.stdout.splitlines() if line.startswith("selftest: ")]
    assert lines[-1] == f"selftest: passed: 7 ok, 0 failed, 0 skipped on {WORLD_SIZE} ranks (gloo)"
    assert lines[-2] == f"selftest: where the ranks ran: ranks 0-{WORLD_SIZE - 1} on {socket.gethostname()}"
    assert len(lines) == 9 and all(" ok (" in line for line in lines[:-2]), lines
    assert any(
        line.startswith("selftest: gdn kernel backend ok (flashqla unavailable (expected on CPU)") for line in lines
    )
    for rank in range(WORLD_SIZE):
        assert (tmp_path / "comm_profile" / f"comm_profile_rank{rank}.json").is_file()


def test_the_hosts_line_gives_each_run_of_ranks_on_one_host_once():
    from gdnctl.runtime.selftest import hosts_line

    assert hosts_line(["a", "b"]) == "selftest: where the ranks ran: rank 0 on a, rank 1 on b"
    assert (
        hosts_line(["a", "a", "b", "b", "a"])
        == "selftest: where the ranks ran: ranks 0-1 on a, ranks 2-3 on b, rank 4 on a"
    )


def test_an_unknown_skip_op_stops_every_rank_with_one_sentence(tmp_path):
    comm = tiny_engine_config().comm.model_copy(update={"skip_ops": ("all_reduse",)}).model_dump()
    config_path = write_engine_yaml(tmp_path, tiny_engine_config(comm=comm))
    completed = torchrun("-m", "gdnctl.runtime", "--config", str(config_path), cwd=tmp_path)
    assert completed.returncode != 0
    messages = [line for line in completed.stderr.splitlines() if line.startswith("gdnctl runtime: ")]
    assert messages == [
        "gdnctl runtime: comm.skip_ops names unknown ops all_reduse (did you mean all_reduce?); use "
        "torch.distributed collective or ProcessGroup method names, which `gdnctl rules COM001` "
        "lists."
    ], completed.stderr[-4000:]
    assert "Traceback (most recent call last)" not in completed.stdout


@pytest.fixture
def outside_torchrun(monkeypatch):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_bad_configs_exit_2_with_a_sentence(tmp_path, capsys, outside_torchrun):
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist; pass the engine.yaml" in capsys.readouterr().err

    broken = tmp_path / "broken.yaml"
    broken.write_text("job: [unclosed\n")
    assert main(["--config", str(broken)]) == 2
    assert "cannot be read (ParserError); render the run dir again" in capsys.readouterr().err

    document = tiny_engine_config().model_dump(mode="json")
    document["parallel"]["cp"] = "two"
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump(document))
    assert main(["--config", str(invalid)]) == 2
    assert "is invalid at parallel.cp" in capsys.readouterr().err

    newer = write_engine_yaml(tmp_path, tiny_engine_config(version=ENGINE_CONFIG_VERSION + 1))
    assert main(["--config", str(newer)]) == 2
    assert (
        f"has version {ENGINE_CONFIG_VERSION + 1} but this gdnctl reads version {ENGINE_CONFIG_VERSION}"
        in capsys.readouterr().err
    )


def test_launch_outside_torchrun_or_with_the_wrong_rank_count(tmp_path, capsys, outside_torchrun):
    config_path = write_engine_yaml(tmp_path, tiny_engine_config())
    assert main(["--config", str(config_path)]) == 2
    assert "torchrun's variables RANK, WORLD_SIZE" in capsys.readouterr().err

    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        outside_torchrun.setenv(name, value)
    assert main(["--config", str(config_path)]) == 2
    assert (
        "torchrun started 4 ranks but the engine config was compiled for parallel.world_size 2"
        in capsys.readouterr().err
    )


def test_config_env_fills_only_unset_variables(monkeypatch):
    monkeypatch.setenv("GDNCTL_TEST_SET_BY_LAUNCH", "launch")
    monkeypatch.delenv("GDNCTL_TEST_FROM_CONFIG", raising=False)
    apply_env({"GDNCTL_TEST_SET_BY_LAUNCH": "config", "GDNCTL_TEST_FROM_CONFIG": "config"})
    assert os.environ["GDNCTL_TEST_SET_BY_LAUNCH"] == "launch"
    assert os.environ["GDNCTL_TEST_FROM_CONFIG"] == "config"


def test_rl_ranks_wait_longer_than_the_rollout_server_may_take():
    from datetime import timedelta

    from gdnctl.runtime.__main__ import collective_timeout
    from gdnctl.schema.engine import EngineConfig

    base = tiny_engine_config()
    assert collective_timeout(base) == timedelta(minutes=5)  # the selftest fixture
    rollout = {
        "engine": "vllm",
        "tp": 1,
        "num_gpus": 1,
        "colocate": True,
        "gdn_prefill_backend": None,
        "gpu_memory_utilization": 0.5,
        "kv_cache_gib": None,
        "max_model_len": 256,
        "n_samples_per_prompt": 2,
        "prompts_per_step": 1,
        "max_response_tokens": 16,
        "temperature": 1.0,
        "timeout_s": 1200.0,
        "probe_tolerance": 0.1,
        "max_step0_logprob_gap": 0.05,
        "python": None,
        "enforce_eager": False,
        "weight_transport": "disk",
        "weight_transport_reason": "CPU",
        "sleep_between_phases": False,
        "vision_language_class": False,
    }
    rl = EngineConfig.model_validate(
        {**base.model_dump(mode="json"), "job": "rl", "selftest": None, "rollout": rollout}
    )
    assert collective_timeout(rl) == timedelta(minutes=30 + 60)
