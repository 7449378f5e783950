"""The validation pipeline: load -> resolve facts -> run rules. Pure: returns data, prints nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gdnctl.errors import GdnctlError
from gdnctl.knowledge import ModelNotFound
from gdnctl.plan import Run, resolve
from gdnctl.validate import rules
from gdnctl.validate.findings import Finding, Severity, register_load_code, sort_findings
from gdnctl.validate.loader import LoadedPreset, SourceMap, load_preset

MODEL_UNAVAILABLE = register_load_code(
    "PRE003",
    "model-unavailable",
    "The model id is unknown or the checkpoint's config.json is unusable",
    """
    What it checks: model.id names a catalog model (`gdnctl presets list` shows the shipped presets; the
    catalog holds the released Qwen3.5 sizes and Qwen3-Next-80B-A3B), or model.path is a directory whose
    config.json describes a Gated DeltaNet model. A model.path that is not on this machine is read on the cluster
    when the job goes to Slurm and model.id names a catalog model (LCH008); otherwise it is this error.

    Why: every other rule needs the architecture (layers, heads, experts).

    Source: gdnctl's catalog (gdnctl/knowledge/catalog.yaml, docs/sources.md "Models") and the bounds a checkpoint's
    config.json must meet (gdnctl/knowledge/model_arch.py).

    Fix: correct the id (a did-you-mean is given), or point model.path at the checkpoint directory; for a checkpoint
    on the cluster, launch with --slurm and set model.id to its architecture's catalog id.
    """,
)


@dataclass
class ValidationResult:
    loaded: LoadedPreset
    run: Run | None
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not any(f.severity is Severity.ERROR for f in self.findings)

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)

    def resolved(self) -> dict:
        run = self.run
        if run is None:
            return {}
        return {
            "name": run.preset.name,
            "job": run.preset.job,
            "model": run.model.label,
            "gpu": run.gpu.name,
            "world_size": run.world_size.value,
            "dp": run.dp,
            "layout": run.layout.value,
            "sequence_parallel": run.sequence_parallel.value,
            "gdn_backend": run.preset.kernels.gdn_backend,
            "rollout_gpus": run.rollout_gpus.value,
            "rollout_engines": run.rollout_engines.value,
            "stack": run.stack,
        }

    def to_json(self) -> dict:
        return {
            "preset": self.loaded.source,
            "ok": self.ok,
            "findings": [f.to_json() for f in self.findings],
            "resolved": self.resolved(),
        }


class PresetHasErrors(GdnctlError):
    """The preset was read but has errors, so the command did nothing (exit 1). The CLI prints the findings."""

    exit_code = 1

    def __init__(self, result: ValidationResult, not_done: str) -> None:
        self.result = result
        source = result.loaded.source
        errors = result.count(Severity.ERROR)
        super().__init__(f"{source} has {errors} error(s); {not_done} (gdnctl validate {source} shows them).")


def _path_tuple(path: str) -> tuple:
    parts: list = []
    for token in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        parts.append(int(token[1:-1]) if token.startswith("[") else token)
    return tuple(parts)


def _with_locations(findings: list[Finding], sources: SourceMap) -> list[Finding]:
    located = []
    for finding in findings:
        if finding.location is None:
            where = sources.locate(_path_tuple(finding.path))
            if where is not None:
                finding = Finding(finding.code, finding.severity, finding.path, finding.message, finding.hint, where)
        located.append(finding)
    return located


def validate(reference: str | Path, overrides: list[str] | None = None) -> ValidationResult:
    """Raises PresetLoadError when the preset cannot be read at all (exit 2)."""
    loaded = load_preset(reference, overrides)
    if loaded.preset is None:
        return ValidationResult(loaded, None, sort_findings(loaded.findings))
    try:
        run = resolve(loaded.preset)
    except ModelNotFound as err:
        path = "model.path" if loaded.preset.model.path else "model.id"
        finding = Finding(
            MODEL_UNAVAILABLE.code,
            Severity.ERROR,
            path,
            str(err),
            err.hint or "Use a catalog id or a checkpoint directory with a config.json.",
            loaded.sources.locate(_path_tuple(path)),
        )
        return ValidationResult(loaded, None, [finding])
    return ValidationResult(loaded, run, _with_locations(rules.check(run), loaded.sources))
