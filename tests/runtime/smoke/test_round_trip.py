"""The checkpoint round trip and the first-minute memory watch on a real (one-rank gloo) process group.

The Megatron trainer whose state reload_in_place compares needs a GPU (tests/gpu/test_smoke_gpu.py runs it); here
a CPU stand-in holds a torch model and AdamW, saves its optimizer state with the checkpoint writer the trainer uses
and loads it back with the reader a resume uses, so the comparison itself is what is tested: a load that misses
something must show up as a difference, never as a pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from gdnctl.plan import compile_engine_config
from gdnctl.runtime.checks.first_minute import FirstMinuteWatch
from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.smoke import round_trip
from gdnctl.schema import EngineConfig, EngineEstimate
from gdnctl.validate import validate

WEIGHTS = "weights.safetensors"


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class CpuTrainer:
    """What reload_in_place reads of the trainer: model, optimizer, iteration, reload(directory)."""

    def __init__(self, load_optimizer: bool = True) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.iteration = 0
        self.load_optimizer = load_optimizer

    def step(self) -> None:
        self.model(torch.randn(5, 8)).square().mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.iteration += 1

    def save(self, save_dir: Path) -> Path:
        directory = save_dir / checkpoint.checkpoint_name(self.iteration)
        directory.mkdir(parents=True)
        save_file({name: p.detach().clone() for name, p in self.model.named_parameters()}, str(directory / WEIGHTS))
        checkpoint.save_training_state(directory, self.optimizer, {"iteration": self.iteration}, {})
        return directory

    def reload(self, directory: Path) -> None:
        saved = load_file(str(directory / WEIGHTS))
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.copy_(saved[name])
        if self.load_optimizer:
            checkpoint.load_training_state(directory, self.optimizer, device="cpu")


def cpu_config(estimate: EngineEstimate) -> EngineConfig:
    """The CPU selftest's engine config as render compiles it, with explain's estimate replaced."""
    return compile_engine_config(validate("selftest-cpu").run).model_copy(update={"estimate": estimate})


def trained(tmp_path: Path, **kwargs) -> tuple[CpuTrainer, Path]:
    trainer = CpuTrainer(**kwargs)
    trainer.step()
    trainer.step()
    return trainer, trainer.save(tmp_path / "checkpoints")


def test_a_complete_load_gives_back_every_tensor(tmp_path, gloo):
    trainer, directory = trained(tmp_path)
    result = round_trip.gathered(round_trip.reload_in_place(trainer, directory))
    assert result.problems == ()
    assert result.checkpoint == "iter_0000002" and result.step == 2
    assert result.weights == 4  # two weights, two biases
    assert result.optimizer > 8  # each parameter's step, exp_avg, exp_avg_sq, and the hyper-parameters


def test_a_load_that_skips_the_optimizer_state_is_caught(tmp_path, gloo):
    trainer, directory = trained(tmp_path, load_optimizer=False)
    problems = round_trip.reload_in_place(trainer, directory).problems
    assert problems and all(problem.startswith("optimizer[0].state_dict.state.") for problem in problems)
    assert any(".exp_avg_sq differs" in problem for problem in problems)


def test_a_checkpoint_of_other_weights_or_another_step_is_caught(tmp_path, gloo):
    trainer, directory = trained(tmp_path)
    other = load_file(str(directory / WEIGHTS))
    other["1.bias"] = other["1.bias"] + 1e-3
    save_file(other, str(directory / WEIGHTS))
    trainer.iteration = 3
    problems = round_trip.reload_in_place(trainer, directory).problems
    assert problems[0] == "the checkpoint resumes at step 2, not at step 3"
    assert problems[1].startswith("weights/1.bias differs")


def test_the_first_minute_line_comes_after_the_second_step(gloo, capsys):
    lines: list[str] = []
    watch = FirstMinuteWatch(cpu_config(EngineEstimate(peak_memory_gib=None, overhead_gib=None)), lines.append)
    watch.after_step()
    assert lines == [] and watch.peak_gib is None
    watch.after_step()
    assert watch.peak_gib > 0
    assert lines == [
        f"first minute: peak memory after 2 optimizer steps {watch.peak_gib:.2f} GiB (peak RSS of the "
        "process, most loaded rank; explain makes no memory estimate for this job)"
    ]
    assert capsys.readouterr().err == ""


def test_a_peak_past_the_estimate_warns_with_the_fields_to_change(gloo, capsys):
    lines: list[str] = []
    watch = FirstMinuteWatch(cpu_config(EngineEstimate(peak_memory_gib=3.5, overhead_gib=3.0)), lines.append)
    watch.after_step(step_peak_gib=0.25)
    watch.after_step(step_peak_gib=1.5)  # the second step's peak is the larger: the watch keeps the maximum
    assert watch.peak_gib == 1.5 and watch.verdict().status == "warn"
    assert lines == [
        "first minute: peak memory after 2 optimizer steps 1.50 GiB (peak RSS of the process, most "
        "loaded rank) vs explain's 0.50 GiB for the same (+200%; its 3.50 GiB per GPU less 3 GiB for "
        "the CUDA context, NCCL buffers and allocator slack)"
    ]
    warning = capsys.readouterr().err
    assert warning.startswith(
        "gdnctl warning: after 2 optimizer steps the most loaded rank had 1.50 GiB allocated, "
        "1.00 GiB (200%) more than explain's estimate of 0.50 GiB"
    )
    assert "train.micro_batch_size" in warning
    measured = watch.measured(step_seconds=0.5)
    assert (measured.estimate_peak_memory_gib, measured.estimate_allocated_gib) == (3.5, 0.5)
