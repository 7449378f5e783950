"""The Megatron trainer: the tiny Qwen3.5 presets launched for real (`gdnctl launch`), TE-free.

- the HF checkpoint writer gives transformers' logits and reloads bit-identically (hf_roundtrip_check.py);
- the loss falls on a learnable synthetic task with FLA and with FlashQLA, and the two curves agree;
- a run resumed from its HF checkpoint continues the uninterrupted run's loss curve;
- on 2 GPUs (skipped with fewer), the TP2 preset's loss falls on the same task.

Needs a CUDA GPU, megatron-core and FLA (FlashQLA for its case; its TileLang compile takes minutes cold, so
set TILELANG_CACHE_DIR). GDNCTL_GPU_LOG_DIR, when set, receives the loss curves as JSON for BENCHMARKS.md and
each launch's console output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
]

HERE = Path(__file__).parent
# The megatron-bridge builder's stack, for the GPU tests that also run it.
NEEDS_BRIDGE_STACK = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None or importlib.util.find_spec("megatron.bridge") is None,
    reason="needs Transformer Engine and megatron-bridge",
)
PRESET = "tiny-qwen3.5-sft"
TWO_GPU_PRESET = "tiny-qwen3.5-sft-2gpu"
STEPS = 20
# Loss curves of two GDN kernels over 20 bf16 steps: the same seed and data, different summation orders.
CURVE_TOLERANCE = 0.02  # max |a - b| / b per step


def _patterned_data(path: Path, documents: int = 512, vocab: int = 4096, positions_multiple: int = 1) -> Path:
    """Token sequences a model can learn: arithmetic progressions modulo 512 with a random start and stride,
    so each next token follows from the two before it. positions_multiple > 1 shortens each document so its
    positions (length - 1) are a multiple of it: the pipeline's per-sequence padding (2 x cp under context
    parallel) is then a no-op, and runs that differ only in cp pack the same rows."""
    rng = random.Random(0)
    with path.open("w") as handle:
        for _ in range(documents):
            start, stride, length = rng.randrange(512), rng.randrange(1, 9), rng.randrange(64, 512)
            length -= (length - 1) % positions_multiple
            ids = [1000 + (start + i * stride) % 512 for i in range(length)]
            assert max(ids) < vocab
            handle.write(json.dumps({"input_ids": ids}) + "\n")
    return path


@dataclass
class _Started:
    """A `gdnctl launch` running in the background; its console goes to files beside the run directory, so two
    launches never block on a full pipe while the test waits for the other."""

    process: subprocess.Popen
    run_dir: Path
    log_name: str


def _start(run_dir: Path, *sets: str, preset: str = PRESET, builder: str = "te-free") -> _Started:
    """Start `gdnctl launch` of the preset; builder "te-free" pins gdnctl's TE-free spec
    (runtime.transformer_engine: none), "megatron-bridge" leaves the preset's Transformer Engine."""
    te_free = ["--set", "runtime.transformer_engine=none"] if builder == "te-free" else []
    command = [
        sys.executable,
        "-m",
        "gdnctl",
        "launch",
        preset,
        "-o",
        str(run_dir),
        "--force",
        *te_free,
        *(arg for value in sets for arg in ("--set", value)),
    ]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with _console(run_dir, "stdout").open("w") as stdout, _console(run_dir, "stderr").open("w") as stderr:
        # Its own session: a failed wait stops torchrun and the trainer ranks with it (_stop).
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, start_new_session=True)
    return _Started(process, run_dir, f"{preset}-{run_dir.name}")


def _finish(started: _Started, timeout: float = 1200) -> list[dict]:
    """Wait for a started launch; its metrics, one dict a step, after asserting it succeeded."""
    try:
        started.process.wait(timeout=timeout)
    finally:
        _stop(started.process)
    stdout, stderr = (_console(started.run_dir, stream).read_text() for stream in ("stdout", "stderr"))
    _record_log(started.log_name, stdout + stderr)
    assert started.process.returncode == 0, stdout[-4000:] + stderr[-4000:]
    assert "Traceback" not in stderr
    return [json.loads(line) for line in (started.run_dir / "metrics.jsonl").read_text().splitlines()]


def _finish_all(started: dict[str, _Started]) -> dict[str, list[dict]]:
    """Wait for launches started side by side; if one fails, the others are stopped before the failure shows."""
    try:
        return {name: _finish(run) for name, run in started.items()}
    finally:
        for run in started.values():
            _stop(run.process)


def _stop(process: subprocess.Popen) -> None:
    """Kill what is left of the launch's session: `gdnctl launch`, torchrun and the ranks (any may outlive the
    others)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole session has exited
    process.wait()


def _launch(run_dir: Path, *sets: str, preset: str = PRESET, builder: str = "te-free") -> list[dict]:
    """`gdnctl launch` the preset and wait for it (see _start)."""
    return _finish(_start(run_dir, *sets, preset=preset, builder=builder))


def _console(run_dir: Path, stream: str) -> Path:
    return run_dir.parent / f"{run_dir.name}.{stream}"


def _record(name: str, document: dict) -> None:
    _write_log(f"{name}.json", json.dumps(document, indent=1))


def _record_log(name: str, text: str) -> None:
    _write_log(f"{name}.log", text)


def _write_log(file_name: str, text: str) -> None:
    log_dir = os.environ.get("GDNCTL_GPU_LOG_DIR")
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        (Path(log_dir) / file_name).write_text(text)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    return _patterned_data(tmp_path_factory.mktemp("data") / "progressions.jsonl")


def test_hf_checkpoint_matches_transformers_and_reloads(tmp_path):
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    proc = subprocess.run(
        [sys.executable, str(HERE / "hf_roundtrip_check.py"), str(tmp_path), "gdnctl/tiny-qwen3.5", "te-free"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    _record("hf_roundtrip", result)
    assert result["before_reload_max_abs_diff"] > 0.1  # the second model really started different
    assert result["reload_max_abs_diff"] == 0.0
    assert result["transformers_relative_error"] < 0.02
    assert result["transformers_argmax_agreement"] > 0.98


@pytest.fixture(scope="module")
def curves(tmp_path_factory, data_file) -> dict[str, list[dict]]:
    """The same 20 steps with each installed GDN kernel, launched side by side (one GPU holds both)."""
    runs = tmp_path_factory.mktemp("runs")
    backends = ["fla"] + (["flashqla"] if importlib.util.find_spec("flash_qla") is not None else [])
    found = _finish_all(
        {
            backend: _start(
                runs / backend,
                f"kernels.gdn_backend={backend}",
                f"train.data_path={data_file}",
                f"train.train_iters={STEPS}",
            )
            for backend in backends
        }
    )
    _record("loss_curves", {backend: [step["loss"] for step in steps] for backend, steps in found.items()})
    return found


@pytest.mark.xdist_group("trainer-curves")  # one worker launches the curves once for the three tests (pytest -n)
@pytest.mark.parametrize("backend", ["fla", "flashqla"])
def test_loss_falls(curves, backend):
    if backend not in curves:
        pytest.skip(f"{backend} is not installed")
    losses = [step["loss"] for step in curves[backend]]
    assert len(losses) == STEPS
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.xdist_group("trainer-curves")
def test_fla_and_flashqla_curves_agree(curves):
    if "flashqla" not in curves:
        pytest.skip("flash-qla is not installed")
    fla, flashqla = ([step["loss"] for step in curves[b]] for b in ("fla", "flashqla"))
    worst = max(abs(a - b) / b for a, b in zip(flashqla, fla, strict=True))
    _record("curve_agreement", {"max_relative_difference": worst})
    assert worst < CURVE_TOLERANCE, list(zip(fla, flashqla, strict=True))


def test_resume_from_the_hf_checkpoint_continues_the_run(tmp_path, data_file):
    common = ["kernels.gdn_backend=fla", f"train.data_path={data_file}", "train.train_iters=6", "train.save_interval=3"]
    whole = _launch(tmp_path / "whole", *common, f"train.save_dir={tmp_path / 'whole-ckpt'}")
    # Keep only the step-3 checkpoint, as if the job had died during step 4.
    partial_dir = tmp_path / "partial-ckpt"
    shutil.copytree(tmp_path / "whole-ckpt" / "iter_0000003", partial_dir / "iter_0000003")
    (partial_dir / "latest").write_text("iter_0000003\n")
    resumed = _launch(tmp_path / "resumed", *common, f"train.save_dir={partial_dir}")
    assert [step["iteration"] for step in resumed] == [4, 5, 6]
    expected = [step["loss"] for step in whole[3:]]
    got = [step["loss"] for step in resumed]
    _record("resume", {"uninterrupted": expected, "resumed": got})
    assert all(abs(a - b) / b < 0.01 for a, b in zip(got, expected, strict=True)), (expected, got)
    config = json.loads((partial_dir / "iter_0000006" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_2gpu_tp2_loss_falls_and_every_rank_writes_its_comm_profile(tmp_path, data_file):
    steps = _launch(
        tmp_path / "tp2",
        f"train.data_path={data_file}",
        f"train.train_iters={STEPS}",
        "comm.profile=true",
        preset=TWO_GPU_PRESET,
    )
    losses = [step["loss"] for step in steps]
    _record("loss_curve_tp2", {"fla_tp2": losses, "seconds": [step["seconds"] for step in steps]})
    assert len(losses) == STEPS
    assert losses[-1] < 0.5 * losses[0], losses
    # The job takes the guard out when it ends, which writes each rank's profile; TP2 reduces activations
    # with all_reduce (no sequence parallel) or reduce_scatter/all_gather (sequence parallel) every layer.
    for rank in (0, 1):
        profile = json.loads((tmp_path / "tp2" / "comm_profile" / f"comm_profile_rank{rank}.json").read_text())
        assert sum(op["calls"] for op in profile["ops"].values()) >= STEPS, profile["ops"].keys()
    report = subprocess.run(
        [sys.executable, "-m", "gdnctl", "comm-report", str(tmp_path / "tp2")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert report.returncode == 0, report.stderr
    assert "recommended comm.skip_ops" in report.stdout
