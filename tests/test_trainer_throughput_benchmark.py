"""benchmarks/trainer_throughput.py: its context-parallel arms are presets `gdnctl validate` accepts on 2 H200s, and
its comparison with Megatron-Bridge's loop (benchmarks/peer_compare/) is like for like: each side's steady window,
the same GDN kernel paired, gdnctl's switches and token stream on the peer, alternating rounds and their spread,
one FLOPs count, and a report recomputed from recorded step logs gives the figures published from them."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gdnctl.cli import app

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPT = BENCHMARKS / "trainer_throughput.py"
PEER = BENCHMARKS / "megatron_bridge_loop.py"
DEVICE_SCRIPT = BENCHMARKS / "device" / "fair_compare.sh"
# The like-for-like run on one H200 (2026-12-01): gdnctl's metrics.jsonl and the peer's summary per arm.
RECORDED = BENCHMARKS / "results" / "h200-like-for-like-2026-12-01"
RECORDED_DOC = BENCHMARKS / "results" / "trainer-vs-megatron-bridge-h200-2026-12-01.md"
# The campaign the fair harness itself recorded on a GPU host (benchmarks/device/fair_compare.sh).
FAIR = BENCHMARKS / "results" / "h200-fair-compare-2026-12-01"
FAIR_DOC = BENCHMARKS / "results" / "trainer-vs-megatron-bridge-fair-h200-2026-12-01.md"
# The device script runs `python3`: this interpreter's, with gdnctl's dependencies.
PATH = f"{Path(sys.executable).parent}:/usr/bin:/bin"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import peer_compare as their sibling, as when run as scripts

from peer_compare import plan, report, steps, switches  # noqa: E402
from peer_compare.campaign import Campaign  # noqa: E402


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_benchmark():
    return load(SCRIPT)


@pytest.fixture(scope="module")
def recorded() -> dict:
    return report.report_directory(RECORDED)


def _arm(result: dict, name: str) -> dict:
    return next(arm for arm in result["arms"] if arm["name"] == name)


@pytest.mark.parametrize("cp", [1, 2])
def test_each_context_parallel_arm_validates_on_two_h200s(cp):
    benchmark = load_benchmark()
    args = argparse.Namespace(set=["cluster.gpu=h200"], gpus=2, seq_length=32768, steps=6)
    sets = benchmark.context_parallel_sets(args, cp)
    assert f"parallel.cp={cp}" in sets and "train.layout=thd" in sets
    options = [option for value in sets for option in ("--set", value)]
    result = CliRunner().invoke(app, ["validate", benchmark.PRESET, *options, "--json"])
    assert result.exit_code == 0, result.output
    findings = json.loads(result.stdout)["findings"]
    assert not [f for f in findings if f["severity"] == "error"], findings


def test_each_measured_step_under_pressure_follows_an_unmeasured_step_of_its_own_variant():
    """The guard's clear path empties the allocator cache and the next step pays to refill it: a pressured variant's
    measured step must not inherit that cost from a neighbour that cleared."""
    benchmark = load_benchmark()
    names = ["fla/guard-off", "fla/guard-always", "fla/guard-off/pressure", "fla/guard-always/pressure"]
    step_plan = benchmark.step_plan([benchmark.Variant.parse(name) for name in names], rounds=3)
    for name in names:
        assert sum(step.measured for step in step_plan if step.variant.name == name) == 3
    for before, step in itertools.pairwise(step_plan):
        if step.measured and step.variant.pressure:
            assert before == benchmark.PlannedStep(step.variant, measured=False)
    # Unpressured steps leave the cache alone: one warm-up round, then every step counts.
    unpressured = [step for step in step_plan if not step.variant.pressure]
    assert [step.measured for step in unpressured] == [False] * 2 + [True] * 6
    # Pressured steps come after every unpressured one.
    assert all(not step.variant.pressure for step in step_plan[: len(unpressured)])


def test_speed_options_mode_turns_off_every_option_the_plan_decides():
    from gdnctl.plan.speed import SPEED_OPTIONS

    assert list(load_benchmark().SPEED_OFF) == list(SPEED_OPTIONS)


# --- the comparison with Megatron-Bridge's loop -------------------------------------------------------------------
def test_each_sides_window_starts_two_steps_after_its_own_graph_capture(recorded):
    """gdnctl captures after speed.cuda_graph_warmup_steps (1) eager steps, before step 2; Megatron-Bridge's tuned
    recipe after 3, before step 4: their windows start at steps 4 and 6, and at 3 where nothing is captured."""
    assert [steps.first_steady_step(w) for w in (1, 3, None)] == [4, 6, 3]
    golden = yaml.safe_load((ROOT / "tests/golden/qwen3.5-35b-a3b-proxy-bench/engine.yaml").read_text())
    assert golden["speed"]["cuda_graphs"] and golden["speed"]["cuda_graph_warmup_steps"] == 1
    # The peer's own summary counts the same steps: it leaves out the 5 before its window (2 without graphs).
    peer = load(PEER)
    assert peer.parse_args(["--mode", "tuned", "--steps", "30"]).skip == 5
    assert peer.parse_args(["--mode", "tuned", "--cuda-graph-modules", "none"]).skip == 2
    assert peer.TUNED_CUDA_GRAPH_WARMUP_STEPS == 3
    for arm in recorded["arms"]:
        expected = {"gdnctl": (2, 4, 17), "peer": (4, 6, 15)}[arm["side"]]
        window = arm["window"]
        assert (arm["graphs_captured_before_step"], window["first_step"], window["steps"]) == expected, arm["name"]
        assert window["last_step"] == 20


def test_the_peaks_are_those_of_the_steady_graphed_steps(recorded):
    """The peer allocates 49.3-50.5 GiB in its eager steps 2-3 and 44.09 GiB once graphed, as gdnctl does: the
    eager peak must not stand for its steady one."""
    eager = json.loads((RECORDED / "arms/p-02-p-fla.json").read_text())["train_step_timer"]["per_step"]
    assert round(eager[1]["peak_gib"], 2) == 50.49
    for kernel, reserved in (("fla", 53.73), ("flashqla", 53.81)):
        comparison = recorded["kernels"][kernel]
        assert {side: round(v, 2) for side, v in comparison["allocated_peak_gib"].items()} == {
            "gdnctl": 44.09,
            "peer": 44.09,
        }
        # The reserved peak where it was recorded (gdnctl); the reference peer of this run did not record it.
        assert round(comparison["reserved_peak_gib"]["gdnctl"], 2) == reserved
        assert comparison["reserved_peak_gib"]["peer"] is None
    counted = [steps.Step(1, 9.0, 10, 60.0, 70.0), steps.Step(2, 1.0, 10, 40.0, None), steps.Step(3, 1.0, 10, 41.0, 50)]
    window = steps.steady_window(counted, first_step=2)
    assert (window.allocated_peak_gib, window.reserved_peak_gib, window.steps) == (41.0, None, 2)
    with pytest.raises(steps.EmptyWindow, match="before the steady window's first step 4"):
        steps.steady_window(counted, first_step=4)


def test_the_recorded_run_gives_the_published_ratios(recorded):
    """FLA 0.94 / 0.95 / 1.02 / 1.02 and FlashQLA 1.02 / 0.97 / 0.97, each gdnctl's tokens/s over the peer's on the
    same kernel in the same round."""
    published = {
        "fla": [(48385, 51589, 0.94), (49188, 51612, 0.95), (51428, 50343, 1.02), (50620, 49837, 1.02)],
        "flashqla": [(53174, 52388, 1.02), (51834, 53239, 0.97), (53518, 54916, 0.97)],
    }
    for kernel, rows in published.items():
        pairs = recorded["kernels"][kernel]["rounds"]
        got = [(round(p["gdnctl_tokens_per_s"]), round(p["peer_tokens_per_s"]), round(p["ratio"], 2)) for p in pairs]
        assert got == rows, kernel
        assert [p["round"] for p in pairs] == list(range(1, len(rows) + 1))
    fla, flashqla = recorded["kernels"]["fla"]["ratio"], recorded["kernels"]["flashqla"]["ratio"]
    assert (fla["rounds"], round(fla["median"], 2), round(fla["min"], 2), round(fla["max"], 2)) == (4, 0.98, 0.94, 1.02)
    assert (flashqla["rounds"], round(flashqla["median"], 2), round(flashqla["max"], 2)) == (3, 0.97, 1.02)


def test_the_spread_is_the_least_and_largest_ratio_of_the_rounds(recorded):
    for comparison in recorded["kernels"].values():
        ratios = [pair["ratio"] for pair in comparison["rounds"]]
        assert (comparison["ratio"]["min"], comparison["ratio"]["max"]) == (min(ratios), max(ratios))
    assert report._ratio_line(report._spread([1.0, 0.9])).endswith("(under 3 rounds: the spread says little)")


def test_both_sides_tflops_come_from_one_flops_count(recorded):
    """gdnctl's count (6.461 GFLOPs a token for the proxy at 8,192 tokens, 0.5% above Megatron-Bridge's own 6.429)
    on both sides' tokens/s: the TFLOPS ratio is the tokens/s ratio."""
    per_token = recorded["flops_per_token"]["count"]
    assert round(per_token / 1e9, 3) == 6.461
    peer = json.loads((RECORDED / "arms/p-02-p-fla.json").read_text())["flops_per_token"]
    assert round(peer["megatron_bridge"] / 1e9, 3) == 6.429
    for arm in recorded["arms"]:
        assert arm["tflops_per_gpu"] == pytest.approx(arm["tokens_per_s"] * per_token / 1e12)
        assert arm["mfu"] == pytest.approx(arm["tflops_per_gpu"] / 989.0)


def test_ratios_pair_the_same_kernel_and_a_cross_kernel_figure_is_only_shown_labelled(recorded):
    arms = {arm["name"]: arm for arm in recorded["arms"]}
    for kernel, comparison in recorded["kernels"].items():
        for pair in comparison["rounds"]:
            assert arms[pair["gdnctl"]]["kernel"] == arms[pair["peer"]]["kernel"] == kernel
    assert recorded["kernels"]["flashqla"]["peer_env"] == {"FLA_FLASH_QLA": "1"}
    assert recorded["kernels"]["fla"]["peer_env"] == {"FLA_FLASH_QLA": "0"}
    assert "cross_kernel" not in recorded and "not like for like" not in report.table(recorded)
    crossed = report.report_directory(RECORDED, cross_kernel=True)
    assert "not like for like" in crossed["cross_kernel"]["label"]
    assert [(arms[p["gdnctl"]]["kernel"], arms[p["peer"]]["kernel"]) for p in crossed["cross_kernel"]["rounds"]] == [
        ("flashqla", "fla")
    ] * 3
    assert "cross-kernel, not like for like" in report.table(crossed)


def test_arms_alternate_gdnctl_then_the_peer_on_each_kernel_round_after_round():
    arms = plan.plan_arms(["fla", "flashqla"], 3)
    assert [arm.name for arm in arms[:4]] == ["01-gdnctl-fla", "02-peer-fla", "03-gdnctl-flashqla", "04-peer-flashqla"]
    assert [(arm.round, arm.kernel, arm.side) for arm in arms] == [
        (r, k, s) for r in (1, 2, 3) for k in ("fla", "flashqla") for s in ("gdnctl", "peer")
    ]
    with pytest.raises(ValueError, match="at least one round"):
        plan.plan_arms(["fla"], 0)
    with pytest.raises(ValueError, match="name GDN kernels from fla, flashqla"):
        plan.plan_arms(["flash-qla"], 3)
    args = load_benchmark().parse_args(["compare"])
    assert (args.rounds, args.steps, args.kernels, args.gpus) == (3, 30, ["fla", "flashqla"], 1)


def test_the_campaigns_time_is_estimated_with_each_sides_cold_compiles_once():
    """The device script's documented duration is what the estimate says for its default campaign."""
    arms = plan.plan_arms(["fla", "flashqla"], 3)
    estimate = plan.estimate_seconds(arms, steps=30)
    assert estimate["cold_s"] == sum(plan.COLD_S.values())  # one compile per loop and kernel, not per arm
    assert estimate["warm_s"] == pytest.approx(6 * (45 + 19.5) + 6 * (52 + 19.5))
    minutes = re.search(r"about\s+(\d+) min on one H200 from cold kernel caches, (\d+) of them compiling", _doc())
    assert (int(minutes[1]), int(minutes[2])) == (round(estimate["total_s"] / 60), round(estimate["cold_s"] / 60))


def _doc() -> str:
    return " ".join(line.lstrip("# ") for line in DEVICE_SCRIPT.read_text().splitlines())


def test_the_peer_gets_every_switch_gdnctl_sets_and_its_own_kernel_cache():
    env = yaml.safe_load((ROOT / "tests/golden/qwen3.5-35b-a3b-proxy-bench/engine.yaml").read_text())["env"]
    assert env["NVTE_USE_CUTLASS_GROUPED_GEMM"] == "1"
    given = switches.peer_environment(env, "/peer-cache", "flashqla")
    for name, value in env.items():
        if name not in switches.CACHE_LOCATIONS:
            assert given[name] == value, name
    assert {name: given[name] for name in switches.CACHE_LOCATIONS if name in given} == {
        "TILELANG_CACHE_DIR": "/peer-cache",
        "TRITON_CACHE_DIR": "/peer-cache/triton",
        "TORCHINDUCTOR_CACHE_DIR": "/peer-cache/inductor",
    }
    assert given["FLA_FLASH_QLA"] == "1" and switches.peer_environment(env, "/p", "fla")["FLA_FLASH_QLA"] == "0"
    difference = switches.switch_difference(env, given)
    assert difference["gdnctl_only"] == {} and difference["different"] == {}
    assert "NVTE_USE_CUTLASS_GROUPED_GEMM" in difference["both"]


def test_the_report_names_the_switches_one_side_ran_without(recorded):
    """The recorded run gave the peer gdnctl's CUTLASS switch only; its record says what else gdnctl alone had."""
    difference = recorded["kernels"]["fla"]["switches"]
    assert difference["both"]["NVTE_USE_CUTLASS_GROUPED_GEMM"] == "1"
    assert set(difference["gdnctl_only"]) == {
        "OMP_NUM_THREADS",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TRITON_CACHE_AUTOTUNING",
    }
    assert set(difference["peer_only"]) == {"CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_AVOID_RECORD_STREAMS"}


def test_a_failed_arm_is_reported_with_its_log_tail_and_the_other_arms_still_are(tmp_path):
    campaign_dir = tmp_path / "campaign"
    shutil.copytree(RECORDED, campaign_dir)
    campaign = Campaign.load(campaign_dir)
    failed = next(arm for arm in campaign.arms if arm.name == "p-06-p-fla")
    failed.status, failed.exit_code, failed.note, failed.log = "failed", 1, "exit 1", "arms/p-06-p-fla.log"
    (campaign_dir / failed.log).write_text("".join(f"line {n}\n" for n in range(40)) + "CUDA error: out of memory\n")
    short = next(arm for arm in campaign.arms if arm.name == "09-g-fq")
    lines = (campaign_dir / short.steps_file).read_text().splitlines()
    (campaign_dir / short.steps_file).write_text("\n".join(lines[:3]) + "\n")  # it stopped after step 3
    campaign.save(campaign_dir)
    result = report.report_directory(campaign_dir)
    assert result["failed_arms"] == ["p-06-p-fla", "09-g-fq"]
    tail = _arm(result, "p-06-p-fla")["log_tail"].splitlines()
    assert len(tail) == report.LOG_TAIL_LINES and tail[-1] == "CUDA error: out of memory"
    assert "before the steady window's first step 4" in _arm(result, "09-g-fq")["note"]
    assert [p["round"] for p in result["kernels"]["fla"]["rounds"]] == [1, 2, 4]
    assert [p["round"] for p in result["kernels"]["flashqla"]["rounds"]] == [1, 3]
    text = report.table(result)
    assert "p-06-p-fla failed: exit 1" in text and "    CUDA error: out of memory" in text
    assert "(under 3 rounds: the spread says little)" in text


def test_the_published_campaign_is_its_report_recomputed_from_its_logs(recorded):
    """benchmarks/results/ shows the recorded campaign's report as the report prints it from the logs beside it."""
    text = RECORDED_DOC.read_text()
    start = text.index("```text\n", text.index("<!-- report -->")) + len("```text\n")
    assert text[start : text.index("```", start)].rstrip("\n") == report.table(recorded)


def test_the_fair_campaign_gives_its_published_ratios_and_page():
    """The harness's own record from one H200: FLA 0.99 / 1.03 / 0.98 over three rounds of 30 steps, with one token
    stream and every switch on both sides, the steady peaks equal; its page shows the report recomputed."""
    result = report.report_directory(FAIR)
    assert list(result["kernels"]) == ["fla"]
    fla = result["kernels"]["fla"]
    got = [
        (round(p["gdnctl_tokens_per_s"]), round(p["peer_tokens_per_s"]), round(p["ratio"], 2)) for p in fla["rounds"]
    ]
    assert got == [(49780, 50361, 0.99), (52598, 51147, 1.03), (49334, 50450, 0.98)]
    ratio = fla["ratio"]
    assert (ratio["rounds"], round(ratio["median"], 2), round(ratio["min"], 2), round(ratio["max"], 2)) == (
        3,
        0.99,
        0.98,
        1.03,
    )
    assert fla["switches"]["gdnctl_only"] == {}
    text = FAIR_DOC.read_text()
    start = text.index("```text\n", text.index("<!-- report -->")) + len("```text\n")
    assert text[start : text.index("```", start)].rstrip("\n") == report.table(result)


def test_compare_refuses_a_kernel_name_it_cannot_run_before_any_launch():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "compare", "--kernels", "fla,flash-qla"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "'fla,flash-qla': name GDN kernels from fla, flashqla" in done.stderr
    assert "[1/" not in done.stderr  # no arm was started


def test_a_campaign_here_reports_each_failed_arm_with_its_log_and_keeps_the_record(tmp_path):
    """On this CPU host gdnctl's launch refuses a GPU preset and the peer misses megatron-bridge: both arms fail,
    the campaign goes on past the first, and the report carries each one's log tail, not the harness's traceback."""
    campaign_dir = tmp_path / "campaign"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "compare", "--kernels", "fla", "--rounds", "1", "--steps", "6", "--json"]
        + ["--campaign", str(campaign_dir), "--peer-cache-dir", str(tmp_path / "peer-cache")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "[1/2] round 1, fla, gdnctl: 01-gdnctl-fla" in done.stderr and "[2/2]" in done.stderr
    result = json.loads(done.stdout)
    assert result["failed_arms"] == ["01-gdnctl-fla", "02-peer-fla"]
    assert "torch sees no CUDA device" in _arm(result, "01-gdnctl-fla")["log_tail"]
    assert "No module named 'megatron.bridge'" in _arm(result, "02-peer-fla")["log_tail"]
    recorded_campaign = Campaign.load(campaign_dir)
    assert [arm.status for arm in recorded_campaign.arms] == ["failed", "failed"]
    peer_env = recorded_campaign.arms[1].env
    assert peer_env["NVTE_USE_CUTLASS_GROUPED_GEMM"] == "1" and peer_env["FLA_FLASH_QLA"] == "0"
    assert peer_env["TILELANG_CACHE_DIR"] == str(tmp_path / "peer-cache")
    assert result["explain_memory"]["total_gib"] > 0
    assert json.loads(done.stdout) == report.report_directory(campaign_dir)


def test_the_peer_trains_the_rows_gdnctls_trainer_trains(tmp_path):
    """Megatron-Core's mock GPT dataset, built as Megatron-Bridge builds it, hands out gdnctl's rows: the same
    tokens and labels as the trainer's micro-batches, sample after sample."""
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
    from peer_compare.token_stream import serve_gdnctl_rows

    from gdnctl.runtime.__main__ import load_config
    from gdnctl.runtime.data import DataPipeline, training_documents

    run_dir = tmp_path / "render"
    rendered = CliRunner().invoke(app, ["render", "qwen3.5-35b-a3b-proxy-bench", "-o", str(run_dir)])
    assert rendered.exit_code == 0, rendered.output
    engine = run_dir / "engine.yaml"
    original = MockGPTDataset._query_document_sample_shuffle_indices
    try:
        serve_gdnctl_rows(engine, 8192)
        config = GPTDatasetConfig(
            random_seed=1234,
            sequence_length=8192,
            blend=None,
            blend_per_split=None,
            split="9999,8,2",
            tokenizer=NullTokenizer(248320),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
        )
        train, _, _ = BlendedMegatronDatasetBuilder(MockGPTDataset, [8, None, None], lambda: True, config).build()
        samples = [train[i] for i in range(8)]
    finally:
        MockGPTDataset._query_document_sample_shuffle_indices = original
    engine_config = load_config(engine)
    pipeline = DataPipeline.from_engine_config(engine_config, training_documents(engine_config))
    batches = pipeline.micro_batches(0)
    for sample in samples:
        batch = next(batches)
        assert torch.equal(sample["tokens"], batch.tokens[0]) and torch.equal(sample["labels"], batch.labels[0])
        assert bool(sample["loss_mask"].all()) and torch.equal(sample["position_ids"], torch.arange(8192))
    with pytest.raises(ValueError, match="trains rows of 8192 tokens, the peer 4096"):
        serve_gdnctl_rows(engine, 4096)


# --- the device script ---------------------------------------------------------------------------------------------
def test_the_device_script_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is part of the test set-up (tools/test.sh installs it)"
    done = subprocess.run([shellcheck, str(DEVICE_SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["start", "--round", "3"], "start takes --rounds, --steps, --kernels and --stop-after-s, not '--round'"),
        (["start", "--steps"], "--steps needs a value"),
        (["poll", "soon"], "poll takes a number of seconds to wait, not 'soon'"),
        (["poll", "10", "20"], "poll takes at most one argument"),
        (["start"], "does not exist: install the GPU stack there first"),
    ],
)
def test_the_device_script_refuses_what_it_cannot_run_with_a_sentence(arguments, message, tmp_path):
    env = {"PATH": PATH, "FAIR_COMPARE_DIR": str(tmp_path), "GDN_SITE": str(tmp_path / "none")}
    done = subprocess.run(["bash", str(DEVICE_SCRIPT), *arguments], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "proj").exists()


def test_the_device_scripts_poll_reports_a_recorded_campaign_and_packs_it(tmp_path):
    state, out = tmp_path / "state", tmp_path / "out"
    out.mkdir()
    shutil.copytree(RECORDED, state / "campaign")
    (state / "exit_code").write_text("0\n")
    (state / "run.log").write_text("[14/14] round 4, fla, peer: p-14-p-fla\n    ok in 60 s\n")
    env = {"PATH": PATH, "FAIR_COMPARE_DIR": str(state), "OUT": str(out), "PYTHONPATH": str(ROOT)}
    help_text = subprocess.run(["bash", str(DEVICE_SCRIPT), "--help"], capture_output=True, text=True, env=env)
    assert help_text.returncode == 0 and help_text.stdout.startswith("gdnctl's defaults against Megatron-Bridge")
    done = subprocess.run(
        ["bash", str(DEVICE_SCRIPT), "poll", "0"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "    ok in 60 s" in done.stdout and done.stdout.rstrip().endswith("DONE (exit 0)")
    assert "| 1 | 48,385 | 51,589 | 0.94 |" in done.stdout and "| 3 | 53,518 | 54,916 | 0.97 |" in done.stdout
    assert json.loads((state / "report.json").read_text()) == report.report_directory(state / "campaign")
    listed = subprocess.run(["tar", "-tzf", str(out / "fair-compare.tgz")], capture_output=True, text=True).stdout
    assert {"campaign/campaign.json", "run.log", "report.json", "exit_code"} <= set(listed.split())
