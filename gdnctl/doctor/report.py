"""Assemble the doctor's answer: probe (or load) facts, run the checks, optionally the kernel checks."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import typer

from gdnctl.doctor import checks as machine_checks
from gdnctl.doctor.checks import Check, Status
from gdnctl.doctor.facts import MachineFacts
from gdnctl.errors import GdnctlError

_COLOURS = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "red", Status.SKIP: "bright_black"}


@dataclass
class DoctorResult:
    facts: MachineFacts
    checks: list[Check]
    preset: str | None = None
    bench: list[dict] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status is Status.FAIL for c in self.checks)

    def to_json(self) -> dict:
        return {
            "preset": self.preset,
            "ok": not self.failed,
            "summary": machine_checks.summary(self.checks),
            "checks": [c.to_json() for c in self.checks],
            "bench": self.bench,
            "facts": self.facts.to_json(),
        }

    def text(self, colour: bool) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = []
        for c in self.checks:
            status = f"{c.status.value:<4}"
            if colour:
                status = typer.style(status, fg=_COLOURS[c.status], bold=c.status is Status.FAIL)
            lines.append(f"{status}  {c.name:<{width}}  {c.found}")
            if c.fix and c.status is not Status.OK:
                lines.append(f"      {'':<{width}}  fix: {c.fix}")
        if self.bench:
            from gdnctl.doctor.kernels import format_bench

            lines += ["", format_bench(self.bench)]
        counts = machine_checks.summary(self.checks)
        lines.append(
            f"\n{counts['passed']} passed, {counts['warnings']} warnings, {counts['failed']} failed, "
            f"{counts['skipped']} skipped"
        )
        return "\n".join(lines)


def doctor_report(
    preset: str | None,
    overrides: list[str],
    *,
    facts_file: Path | None = None,
    save_facts: Path | None = None,
    kernels: bool = False,
    bench: bool = False,
    chart: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> DoctorResult:
    run = None
    if preset is not None:
        from gdnctl.validate import validate

        result = validate(preset, overrides)
        if result.run is None:
            raise GdnctlError(
                f"{preset} cannot be resolved ({result.findings[0].message}); gdnctl validate {preset} shows why."
            )
        run = result.run
    if facts_file is not None:
        facts = MachineFacts.load(facts_file)
    else:
        from gdnctl.doctor.probes import gather
        from gdnctl.validate import preset_interpreters

        kernel_cache = run.preset.launch.kernel_cache_dir if run is not None else None
        rollout = run.preset.rollout if run is not None and run.preset.job == "rl" else None
        facts = gather(
            kernel_cache,
            rollout.python if rollout is not None else None,
            preset_interpreters(run.preset) if run is not None else [],
        )
    if save_facts is not None:
        save_facts.write_text(json.dumps(facts.to_json(), indent=2) + "\n")
    checks = machine_checks.run_checks(facts, run)
    doctor = DoctorResult(facts, checks, preset)
    if kernels or bench:
        if run is None or preset is None:
            raise GdnctlError("--kernels and --bench need a PRESET: they run at its per-rank GDN shapes.")
        preset_args = shlex.join([preset, *(word for override in overrides for word in ("--set", override))])
        _run_kernels(doctor, run, preset_args, kernels=kernels, bench=bench, chart=chart, progress=progress)
    return doctor


def _run_kernels(
    doctor: DoctorResult,
    run,
    preset_args: str,
    *,
    kernels: bool,
    bench: bool,
    chart: Path | None,
    progress: Callable[[str], None] | None,
) -> None:
    from gdnctl.doctor import kernels as kernel_checks

    facts = doctor.facts
    # Use the kernel cache the job's scripts use (and prewarm fills), or FlashQLA compiles from scratch.
    if facts.kernel_cache is not None:
        os.environ.setdefault("TILELANG_CACHE_DIR", facts.kernel_cache.path)
    with kernel_checks.kernels_compiled(run, facts, preset_args, progress) as say:
        if kernels:
            doctor.checks += kernel_checks.parity_checks(run, facts, say)
        if bench:
            doctor.bench = kernel_checks.bench(run, facts, say)
    if chart is not None and doctor.bench:
        kernel_checks.save_chart(doctor.bench, chart)
