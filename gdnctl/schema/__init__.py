"""Every file format gdnctl reads or writes: the preset (what users write), the engine config (what the
runtime reads), the communication ops the guard knows, the comm guard's profile files, a smoke run's report,
and how a local run ended."""

from gdnctl.schema import comm_ops
from gdnctl.schema.comm_profile import (
    DEFAULT_PROFILE_SUBDIR,
    PROFILE_FILE_PATTERN,
    PROFILE_FORMAT,
    PROFILE_VERSION,
    CommProfile,
    ProfiledOp,
)
from gdnctl.schema.engine import (
    ENGINE_CONFIG_VERSION,
    EngineComm,
    EngineConfig,
    EngineDynamicSampling,
    EngineEstimate,
    EngineEval,
    EngineGrpo,
    EngineKernels,
    EngineLora,
    EngineMetrics,
    EngineOverlong,
    EngineParallel,
    EngineRollout,
    EngineSelftest,
    EngineSpeed,
    EngineTrain,
)
from gdnctl.schema.local_exit import LOCAL_EXIT_FILE, LocalExit
from gdnctl.schema.preset import SBATCH_SAFE, SBATCH_SAFE_TEXT, Preset
from gdnctl.schema.smoke import SMOKE_DIR, SMOKE_FILE, SmokeCheck, SmokeMeasured, SmokeReport

__all__ = [
    "CommProfile",
    "DEFAULT_PROFILE_SUBDIR",
    "ENGINE_CONFIG_VERSION",
    "EngineComm",
    "EngineConfig",
    "EngineDynamicSampling",
    "EngineEstimate",
    "EngineEval",
    "EngineGrpo",
    "EngineKernels",
    "EngineLora",
    "EngineMetrics",
    "EngineOverlong",
    "EngineParallel",
    "EngineRollout",
    "EngineSelftest",
    "EngineSpeed",
    "EngineTrain",
    "LOCAL_EXIT_FILE",
    "LocalExit",
    "PROFILE_FILE_PATTERN",
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "Preset",
    "ProfiledOp",
    "SBATCH_SAFE",
    "SBATCH_SAFE_TEXT",
    "SMOKE_DIR",
    "SMOKE_FILE",
    "SmokeCheck",
    "SmokeMeasured",
    "SmokeReport",
    "comm_ops",
]
