"""The wheel ships what the shipped presets need: every local path a preset gives relative to itself is in it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from gdnctl.validate.loader import PATH_FIELDS

REPO = Path(__file__).resolve().parents[1]


def test_every_relative_path_of_a_shipped_preset_is_in_the_wheel(tmp_path):
    # No build isolation: hatchling comes with the test extra, so this builds offline.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("gdnctl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "site")
    presets = tmp_path / "site" / "gdnctl" / "_data" / "presets"
    shipped = sorted(presets.glob("*.yaml"))
    assert {path.name for path in shipped} == {path.name for path in (REPO / "presets").glob("*.yaml")}
    relative = []
    for preset in shipped:
        data = yaml.safe_load(preset.read_text())
        for section, key in PATH_FIELDS:
            value = (data.get(section) or {}).get(key)
            if isinstance(value, str) and not value.startswith(("/", "~")):
                relative.append((preset.name, f"{section}.{key}", value))
    assert relative, "no shipped preset names a local file any more: this test checks nothing"
    missing = [(name, field, value) for name, field, value in relative if not (presets / value).exists()]
    assert missing == [], f"the wheel lacks what these presets point at: {missing}"
