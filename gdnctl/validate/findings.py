"""Findings and the rule registry.

A rule is a small pure function of the resolved run (`gdnctl.plan.Run`) that yields `Issue`s; the
registry stamps each with the rule's stable code and default severity. The rule's docstring is its
documentation (`gdnctl rules CODE`): What it checks / Why / Source / Fix, ruff-style.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

from gdnctl.validate import codes

if TYPE_CHECKING:
    from gdnctl.plan import Run


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 0, "warning": 1, "info": 2}[self.value]


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    path: str
    message: str
    hint: str
    location: str | None = None  # file:line:column where the offending value was written, when known

    def to_json(self) -> dict:
        data = {
            "code": self.code,
            "severity": self.severity.value,
            "path": self.path,
            "message": self.message,
            "hint": self.hint,
        }
        if self.location:
            data["location"] = self.location
        return data


class Issue(NamedTuple):
    """What a rule yields: the field path, one sentence, and the fix. Severity defaults to the rule's."""

    path: str
    message: str
    hint: str
    severity: Severity | None = None


@dataclass(frozen=True)
class RuleInfo:
    code: str
    name: str
    severity: Severity
    summary: str
    concern: str
    doc: str
    # None for codes reported while loading the preset (schema errors), before any rule can run.
    check: Callable[[Run], Iterable[Issue]] | None

    @property
    def source(self) -> str:
        """The docstring's Source: section on one line (what the rule rests on); "" when it has none."""
        for paragraph in self.doc.split("\n\n"):
            if paragraph.startswith("Source:"):
                return " ".join(paragraph.removeprefix("Source:").split())
        return ""

    def run(self, run: Run) -> Iterator[Finding]:
        assert self.check is not None
        for issue in self.check(run):
            yield Finding(self.code, issue.severity or self.severity, issue.path, issue.message, issue.hint)


RULES: dict[str, RuleInfo] = {}


def rule(code: str, severity: Severity, summary: str):
    """Register a rule function under a stable code."""

    def register(check: Callable[[Run], Iterable[Issue]]):
        if code in RULES:
            raise RuntimeError(f"rule code {code} registered twice")
        concern = check.__module__.rsplit(".", 1)[-1]
        codes.check_registration(code, check.__name__, concern)
        RULES[code] = RuleInfo(
            code, check.__name__, severity, summary, concern, inspect.cleandoc(check.__doc__ or ""), check
        )
        return check

    return register


def register_load_code(code: str, name: str, summary: str, doc: str) -> RuleInfo:
    """Register a code the preset loader reports (always an error: the preset cannot be compiled)."""
    codes.check_registration(code, name, "preset")
    info = RuleInfo(code, name, Severity.ERROR, summary, "preset", inspect.cleandoc(doc), None)
    RULES[code] = info
    return info


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (f.severity.rank, f.code, f.path))
