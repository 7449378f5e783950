"""The smoke's verdicts and the memory comparison are functions of numbers: each pass, warn and failure here."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from pydantic import ValidationError

from gdnctl.runtime.checks import verdicts
from gdnctl.runtime.checks.verdicts import MEMORY_MARGIN, Checklist, ExplainedMemory
from gdnctl.schema import SmokeCheck, SmokeMeasured, SmokeReport

NOTHING_MEASURED = SmokeMeasured(
    step_seconds=None,
    peak_memory_gib=None,
    memory_source=None,
    estimate_peak_memory_gib=None,
    estimate_allocated_gib=None,
)


def test_cuda_allocations_are_compared_with_explains_total_less_its_overhead_row():
    """Measured on the tiny sft preset on an H100: 0.30 GiB allocated, explain's total 3.21 GiB with 3 GiB of it
    for the CUDA context, NCCL buffers and allocator slack, which CUDA's allocation counter does not see."""
    estimate = ExplainedMemory(total_gib=3.21, overhead_gib=3.0)
    check = verdicts.peak_memory(0.30, "CUDA max allocated, most loaded rank", estimate)
    assert check.line() == (
        "smoke: peak memory ok (0.30 GiB (CUDA max allocated, most loaded rank) vs explain's "
        "0.21 GiB for the same (+43%; its 3.21 GiB per GPU less 3 GiB for the CUDA context, NCCL "
        "buffers and allocator slack), within the margin (10% and 0.5 GiB))"
    )


def test_a_peak_past_both_margins_is_a_warning_not_a_failure():
    estimate = ExplainedMemory(total_gib=61.0, overhead_gib=3.0)
    assert verdicts.peak_memory(71.3, "CUDA max allocated", estimate).status == "warn"
    assert not verdicts.over_estimate(58.0 + 5.8, estimate)  # at the 10% margin
    assert MEMORY_MARGIN == 0.10
    assert not verdicts.over_estimate(0.9, ExplainedMemory(total_gib=3.5, overhead_gib=3.0))  # +80%, but 0.4 GiB
    assert verdicts.over_estimate(1.2, ExplainedMemory(total_gib=3.5, overhead_gib=3.0))  # +140%, 0.7 GiB


def test_without_an_estimate_memory_is_a_measurement_only():
    check = verdicts.peak_memory(0.57, "peak RSS of the process", None)
    assert check.line() == (
        "smoke: peak memory 0.57 GiB (peak RSS of the process; explain makes no memory estimate for this job)"
    )
    assert not verdicts.over_estimate(1e9, None)


def test_the_memory_warning_names_the_numbers_and_the_fields_to_change():
    sentence = verdicts.memory_warning(71.3, ExplainedMemory(total_gib=61.0, overhead_gib=3.0), 2)
    assert "71.30 GiB allocated, 13.30 GiB (23%) more than explain's estimate of 58.00 GiB" in sentence
    for field in ("train.micro_batch_size", "train.recompute", "parallel.tp"):
        assert field in sentence


def test_optimizer_steps_need_every_step_finite_and_taken():
    ok = verdicts.optimizer_steps([8.37, 8.12], [1.5, 1.2])
    assert ok.line() == "smoke: optimizer steps ok (2 steps, loss 8.37 -> 8.12, grad norm 1.5 -> 1.2, finite)"
    assert verdicts.optimizer_steps([8.37], [1.5]).detail == "1 of 2 steps ran"
    assert "non-finite values" in verdicts.optimizer_steps([8.37, math.nan], [1.5, 1.2]).detail
    assert "non-finite values" in verdicts.optimizer_steps([8.37, 8.1], [1.5, math.inf]).detail
    assert verdicts.optimizer_steps([8.37, 8.1], [1.5, 1.2], skipped=1).status == "FAIL"


def test_a_round_trip_with_differences_fails_and_names_the_first_ones():
    problems = [f"weights/layer{i}.weight differs" for i in range(6)]
    check = verdicts.checkpoint_round_trip("iter_0000002", 10, 20, 2, problems)
    assert check.status == "FAIL" and "layer3.weight differs and 2 more" in check.detail
    assert verdicts.checkpoint_round_trip("iter_0000002", 10, 20, 2, []).status == "ok"


def test_weight_sync_reports_the_worst_sync():
    check = verdicts.weight_sync([(43, 43, 0.0017), (40, 43, 0.0021), (43, 43, 0.0012)], 0.1)
    assert check.detail == (
        "3 syncs checked: 40 of 43 parameters match (the other 3 are not visible whole in the "
        "rollout, e.g. packed by vLLM's kernels or tensor-parallel shards; the probe covers them), "
        "probe gap 0.0021 <= 0.1 nats/token"
    )
    whole = verdicts.weight_sync([(43, 43, 0.0017)], 0.1)
    assert whole.detail == "1 sync checked: 43 of 43 parameters match, probe gap 0.0017 <= 0.1 nats/token"


def test_the_step0_gap_is_a_check_or_a_measurement_when_the_check_is_off():
    check = verdicts.step0_logprob_gap(0.0015, 0.05)
    assert check.line() == "smoke: step-0 log-prob gap ok (0.0015 <= 0.05 nats/token)"
    assert verdicts.step0_logprob_gap(0.0015, None).status == "info"


def test_step_time_says_there_is_no_estimate_to_compare_with():
    line = verdicts.step_time(0.41, 2, "rollout 0.2 s", 0.375).line()
    assert line == "smoke: step time 0.41 s (step 2; rollout 0.2 s; 37.5% MFU; explain makes no step-time estimate)"


def test_a_stopped_checklist_skips_what_it_did_not_reach():
    checklist = Checklist(["job start", "weight sync", "optimizer steps"])
    checklist.decide(verdicts.started("ready in 1.0 s"))
    checklist.fail("weight sync", RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore text"))
    report = checklist.report("rl", 2)
    assert [check.status for check in report.checks] == ["ok", "FAIL", "skipped"]
    assert report.checks[1].detail == "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"
    assert report.checks[2].detail == "not reached: the smoke stopped at the weight sync check"
    assert not report.green
    assert report.summary() == "smoke: FAILED: 1 ok, 0 warned, 1 failed, 1 skipped (rl on 2 ranks)"
    with pytest.raises(KeyError, match="not one of this smoke's checks"):
        checklist.decide(verdicts.started("again").model_copy(update={"name": "no such check"}))


def test_a_report_cannot_call_a_failure_green():
    failing = SmokeCheck(name="weight sync", status="FAIL", detail="probe gap 0.3")
    with pytest.raises(ValidationError, match="green must be true exactly when no check has status FAIL"):
        SmokeReport(job="rl", ranks=1, green=True, checks=(failing,), measured=NOTHING_MEASURED)
    report = SmokeReport(job="rl", ranks=1, green=True, checks=(verdicts.started("x"),), measured=NOTHING_MEASURED)
    assert SmokeReport.model_validate_json(report.model_dump_json()) == report


def test_the_verdicts_and_the_smoke_config_import_no_torch():
    """The rollout server derives the smoke config in vLLM's environment, and the verdicts are pure functions."""
    code = (
        "import sys, gdnctl.runtime.checks.verdicts, gdnctl.runtime.smoke.config\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0
