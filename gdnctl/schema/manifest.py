"""RUN_DIR/manifest.json as gdnctl reads it back: the parts `status`, `logs`, `cancel`, `runs`, `resume` and
`render --force` go on to use, each of the type they use it as.

launch/render.py writes the whole manifest (the preset's files and overrides, the resolved preset, the findings);
a reader checks these fields against this shape (files.typed) before it takes any, so a manifest edited by hand,
or a file at that name that gdnctl never wrote, is a sentence naming the field and not a crash further on.
Extra keys are allowed: the manifest holds more than its readers need.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints

MANIFEST_FILE = "manifest.json"
# The Slurm job name the scripts and the log files carry (launch/render.py's slurm_job_name): a log is found as
# logs/JOB_NAME-JOBID.out, so a name with a slash in it would point elsewhere.
JobName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ManifestResolved(_Part):
    name: str = "?"
    job: str = "?"


class ManifestLaunch(_Part):
    executor: Literal["local", "slurm"] = "local"
    job_name: JobName | None = None


class ManifestFile(_Part):
    path: str
    sha256: str | None = None


class RunManifest(_Part):
    gdnctl_version: str
    engine_config_sha256: str
    resolved: ManifestResolved = ManifestResolved()
    # Run dirs rendered before the manifest recorded these have none: local, and the name made from the preset's.
    launch: ManifestLaunch = ManifestLaunch()
    files: list[ManifestFile] | None = None
