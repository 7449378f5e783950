"""What LCH004 assumes of sbatch, on a real Slurm (tools/local-slurm.sh): the #SBATCH lines are one command line,
so a later line wins, a long option may be abbreviated, and an option without `=` takes the next line as its value
(gdnctl/knowledge/slurm.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.slurm_cluster import slurm_env

pytestmark = pytest.mark.slurm


def test_a_later_abbreviated_line_wins_and_a_bare_export_takes_the_next_line(local_slurm, tmp_path: Path):
    script = tmp_path / "probe.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --output={tmp_path}/gdnctl.out\n"
        "#SBATCH --time=00:01:00\n"
        f"#SBATCH --outp={tmp_path}/elsewhere.out\n"
        "#SBATCH --export\n"
        "#SBATCH --x,GDNCTL_PROBE=reached\n"
        'echo "probe=${GDNCTL_PROBE:-unset}"\n'
    )
    proc = subprocess.run(
        ["sbatch", "--wait", "--parsable", str(script)],
        env=slurm_env(local_slurm),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "gdnctl.out").exists()
    assert (tmp_path / "elsewhere.out").read_text().strip() == "probe=reached"
