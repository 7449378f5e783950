"""The rule set: one module per concern. Importing this package registers every rule in `RULES`
(`gdnctl.validate.findings`); each code belongs to the module its prefix names (`codes.py`)."""

from __future__ import annotations

from gdnctl.validate.findings import RULES, Finding, sort_findings
from gdnctl.validate.rules import (  # noqa: F401
    bridge,
    comm,
    heads,
    images,
    kernels,
    launch,
    layout,
    memory,
    parallel,
    rollout,
    train,
    user_code,
)

__all__ = ["check"]


def check(run) -> list[Finding]:
    findings: list[Finding] = []
    for info in RULES.values():
        if info.check is not None:
            findings.extend(info.run(run))
    return sort_findings(findings)
