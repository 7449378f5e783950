"""Shipped presets are clean under `gdnctl validate --strict`, or carry the reason they are not: a
`# strict: CODE - reason` line for each code of warning they raise, and none for a code they no longer raise."""

from __future__ import annotations

import re

import pytest

from gdnctl.resources import presets_dir
from gdnctl.validate import Severity, validate

SHIPPED = sorted(presets_dir().glob("*.yaml"))
REASON = re.compile(r"^# strict: ([A-Z]+[0-9]{3}) - (\S.*)$", re.MULTILINE)


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_shipped_preset_is_strict_clean_or_says_why(path):
    result = validate(str(path))
    warned = {finding.code for finding in result.findings if finding.severity == Severity.WARNING}
    explained = {code for code, _ in REASON.findall(path.read_text())}
    assert warned <= explained, (
        f"{path.name} warns {sorted(warned - explained)} under --strict with no reason: "
        "add a `# strict: CODE - reason` line, or fix the preset"
    )
    assert explained <= warned, f"{path.name} explains {sorted(explained - warned)}, which it no longer raises"
