"""The rule set. Importing this package registers every rule in `gdnctl.findings.RULES`."""

from __future__ import annotations

from gdnctl.findings import RULES, Finding, sort_findings
from gdnctl.rules import bridge, comm, heads, kernels, launch, layout, memory, parallel, rollout, train  # noqa: F401,E501


def check(run) -> list[Finding]:
    findings = []
    for info in RULES.values():
        if info.check is not None:
            findings.extend(info.run(run))
    return sort_findings(findings)
