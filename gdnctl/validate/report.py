"""Human-readable text for findings, explanations and rule docs. Returns strings; the CLI prints them."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import typer

from gdnctl.validate.findings import Finding, RuleInfo, Severity

if TYPE_CHECKING:
    from gdnctl.plan import Derived, MemoryEstimate

_COLOURS = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_HEADINGS = {Severity.ERROR: "errors", Severity.WARNING: "warnings", Severity.INFO: "notes"}


def _style(text: str, colour: bool, **kwargs) -> str:
    return typer.style(text, **kwargs) if colour else text


def format_findings(findings: list[Finding], colour: bool) -> str:
    lines: list[str] = []
    for severity in Severity:
        group = [f for f in findings if f.severity is severity]
        if not group:
            continue
        lines.append(_style(f"{_HEADINGS[severity]} ({len(group)})", colour, fg=_COLOURS[severity], bold=True))
        for f in group:
            code = _style(f.code, colour, fg=_COLOURS[severity], bold=True)
            lines.append(f"  {code} {f.path}: {f.message}")
            lines.append(f"         fix: {f.hint}")
            if f.location:
                lines.append(f"         at:  {f.location}")
    return "\n".join(lines)


def summary_line(preset: str, errors: int, warnings: int, notes: int, colour: bool, strict: bool = False) -> str:
    """The verdict agrees with the exit code: under --strict a warning fails the preset, and the line says so."""
    failed = errors or (strict and warnings)
    verdict = "invalid" if errors else "fails --strict (warnings count as errors)" if failed else "valid"
    text = f"{preset}: {verdict} ({errors} error(s), {warnings} warning(s), {notes} note(s))"
    return _style(text, colour, fg="red" if failed else "green", bold=True)


def format_derived(items: list[Derived]) -> str:
    width = max(len(item.name) for item in items)
    lines = []
    for item in items:
        value = ", ".join(item.value) if isinstance(item.value, list) else str(item.value)
        lines.append(f"  {item.name:<{width}}  {value}")
        lines.append(f"  {'':<{width}}  why: {item.reason}")
    return "\n".join(lines)


def format_memory(estimate: MemoryEstimate) -> str:
    lines = [f"  {'component':<12} {'GiB':>8}  note"]
    for row in estimate.rows:
        lines.append(f"  {row.name:<12} {row.gib:>8.1f}  {row.note}")
    lines.append(f"  {'total':<12} {estimate.total_gib:>8.1f}  of {estimate.capacity_gib:g} GiB ({estimate.usage:.0%})")
    return "\n".join(lines)


def format_rule_list(rules: list[RuleInfo]) -> str:
    lines = []
    concern = None
    for info in rules:
        if info.concern != concern:
            concern = info.concern
            lines.append(f"{concern}:")
        lines.append(f"  {info.code:<8} {info.severity.value:<8} {info.summary}")
    return "\n".join(lines)


def format_rule_table(rules: list[RuleInfo]) -> str:
    """The README's rule table (Markdown): one row per rule in the order given, pipes in the text escaped."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| code | severity | checks | source |", "|---|---|---|---|"]
    lines += [f"| {info.code} | {info.severity.value} | {cell(info.summary)} | {cell(info.source)} |" for info in rules]
    return "\n".join(lines)


def format_rule_doc(info: RuleInfo) -> str:
    paragraphs = [textwrap.fill(" ".join(par.split()), 100) for par in info.doc.split("\n\n")]
    return f"{info.code} ({info.name}, {info.severity.value}): {info.summary}\n\n" + "\n\n".join(paragraphs)
