"""Where the rollout's engines run and which trainer rank drives each (runtime/rl/rollout/engine_layout.py)."""

from __future__ import annotations

import pytest

from gdnctl.runtime.rl.rollout.engine_layout import (
    EngineLayoutError,
    EngineSlot,
    driven_slots,
    drivers,
    node_slots,
    shares,
)

EIGHT = [str(index) for index in range(8)]


def test_colocated_engines_are_driven_by_the_first_rank_of_their_node():
    # 2 nodes x 8 GPUs, rollout.tp 4: engines 0 and 1 on the first node, 2 and 3 on the second.
    assert drivers(4, tp=4, colocate=True, ranks_per_node=8) == [0, 0, 8, 8]
    assert driven_slots(count=4, tp=4, colocate=True, rank=8, ranks_per_node=8, visible=EIGHT, spawn=True) == [
        EngineSlot(2, "0,1,2,3"),
        EngineSlot(3, "4,5,6,7"),
    ]
    assert driven_slots(count=4, tp=4, colocate=True, rank=0, ranks_per_node=8, visible=EIGHT, spawn=True) == [
        EngineSlot(0, "0,1,2,3"),
        EngineSlot(1, "4,5,6,7"),
    ]
    assert driven_slots(count=4, tp=4, colocate=True, rank=3, ranks_per_node=8, visible=EIGHT, spawn=True) == []


def test_colocated_engines_take_the_gpus_the_node_lists():
    slots = driven_slots(count=2, tp=1, colocate=True, rank=0, ranks_per_node=2, visible=["6", "7"], spawn=True)
    assert slots == [EngineSlot(0, "6"), EngineSlot(1, "7")]


def test_separate_engines_take_the_gpus_after_the_trainers_and_rank_0_drives_them():
    assert drivers(2, tp=2, colocate=False, ranks_per_node=4) == [0, 0]
    assert driven_slots(count=2, tp=2, colocate=False, rank=0, ranks_per_node=4, visible=EIGHT, spawn=True) == [
        EngineSlot(0, "4,5"),
        EngineSlot(1, "6,7"),
    ]
    assert driven_slots(count=2, tp=2, colocate=False, rank=1, ranks_per_node=4, visible=EIGHT, spawn=True) == []


def test_servers_another_step_starts_and_cpu_servers_get_no_devices():
    assert driven_slots(count=2, tp=4, colocate=False, rank=0, ranks_per_node=8, visible=EIGHT, spawn=False) == [
        EngineSlot(0),
        EngineSlot(1),
    ]
    assert driven_slots(count=2, tp=1, colocate=True, rank=0, ranks_per_node=2, visible=None, spawn=True) == [
        EngineSlot(0),
        EngineSlot(1),
    ]


def test_too_few_gpus_is_a_sentence_with_the_fix():
    with pytest.raises(
        EngineLayoutError,
        match=r"separate rollout engine 1 beside 6 trainer rank\(s\) needs GPUs "
        r"8\.\.9 of this node, but it shows 8 .*lower rollout\.num_gpus",
    ):
        driven_slots(count=2, tp=2, colocate=False, rank=0, ranks_per_node=6, visible=EIGHT, spawn=True)


def test_the_slurm_rollout_step_starts_each_nodes_engines_on_their_gpus():
    assert node_slots(count=4, tp=4, gpus_per_node=8, node=1, visible=EIGHT) == [
        EngineSlot(2, "0,1,2,3"),
        EngineSlot(3, "4,5,6,7"),
    ]
    assert node_slots(count=3, tp=4, gpus_per_node=8, node=1, visible=EIGHT) == [EngineSlot(2, "0,1,2,3")]
    assert node_slots(count=1, tp=8, gpus_per_node=8, node=0, visible=None) == [EngineSlot(0)]


@pytest.mark.parametrize(
    ("prompts", "count", "sizes"), [(8, 2, [4, 4]), (7, 3, [3, 2, 2]), (1, 2, [1, 0]), (5, 1, [5])]
)
def test_a_steps_prompts_split_into_contiguous_near_equal_shares(prompts, count, sizes):
    parts = shares(prompts, count)
    assert [len(part) for part in parts] == sizes
    assert [index for part in parts for index in part] == list(range(prompts))


def test_a_server_started_for_an_engine_the_rollout_lacks_stops_with_a_sentence(engine, tmp_path, capsys):
    from gdnctl.runtime.__main__ import main

    config_path = tmp_path / "run" / "engine.yaml"
    assert engine.rollout.num_gpus // engine.rollout.tp == 1
    assert main(["--config", str(config_path), "--role", "rollout", "--engine", "1"]) == 2
    assert (
        "--engine 1 names no engine of this rollout (it runs 1: rollout.num_gpus / rollout.tp); pass 0 to 0."
        in capsys.readouterr().err
    )


def test_a_rollout_step_node_past_the_engines_starts_none(engine, tmp_path, capsys, monkeypatch):
    from gdnctl.runtime.__main__ import main

    monkeypatch.setenv("SLURM_PROCID", "1")
    assert main(["--config", str(tmp_path / "run" / "engine.yaml"), "--role", "rollout"]) == 0
    assert "node 1 of the rollout step has no engine to run" in capsys.readouterr().out
    assert not (tmp_path / "run" / "rollout").exists()  # nothing listened, nothing was published


def test_engine_without_the_rollout_role_is_refused(engine, tmp_path, capsys):
    from gdnctl.runtime.__main__ import main

    assert main(["--config", str(tmp_path / "run" / "engine.yaml"), "--engine", "0"]) == 2
    assert (
        "--engine names the rollout engine a rollout server serves; pass it with --role rollout"
        in capsys.readouterr().err
    )
