"""`gdnctl comm-report RUN_DIR`: merge the comm guard's per-rank profiles and say which ops may skip the check.

The runtime (`gdnctl.runtime.comm`, profiling on) writes one `comm_profile_rank{R}.json` per rank. This
module reads them without torch, merges them per op into the table of slime PR #1947 (calls, checks,
steady-state and first-use free-memory drop, verdict) and recommends a skip set for the workload profiled.
First use is per process group: each group's first collective sets up its communicator (version 2; version 1
counted only an op's first call as first use, so a later group's set-up read as steady state).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, read_json, read_yaml
from gdnctl.schema import (
    DEFAULT_PROFILE_SUBDIR,
    PROFILE_FILE_PATTERN,
    PROFILE_FORMAT,
    PROFILE_VERSION,
    CommProfile,
    ProfiledOp,
)

# An op is skip-safe when its steady-state calls move free memory by less than this. The driver and the
# caching allocator work in 2 MiB pages and 2/20 MiB segments, so a few segments of movement is bookkeeping,
# not a per-call footprint; and 64 MiB is ~2% of slime's 3 GiB threshold, so an unchecked call this small
# cannot take free memory from comfortably above the threshold to an out-of-memory error. The ops slime PR
# #1947 skipped measured ~0 in steady state; first-use setup (GiB-sized) is excluded on purpose.
SKIP_SAFE_THRESHOLD_MIB = 64.0

MIB = 1024**2
# A rank's profile is a few KiB (one entry per op), an engine.yaml a few; these bound what is read.
MAX_PROFILE_BYTES = 16 * MIB
MAX_ENGINE_YAML_BYTES = 16 * MIB
SKIP_SAFE = "skip-safe"
KEEP_CHECKED = "keep-checked"


class CommReportError(GdnctlError):
    """The run dir holds no readable comm profile, or the threshold is not a number of MiB."""


@dataclass(frozen=True)
class OpVerdict:
    """One op merged over all ranks; the memory columns are maxima over ranks."""

    op: str
    calls: int
    checks: int
    clears: int
    guard_seconds: float
    steady_state_max_drop_mib: float | None  # None: no rank called the op more than once
    steady_state_max_allocator_mib: float | None  # larger of the allocated and reserved deltas
    first_use_drop_mib: float  # largest drop over every group's first call
    groups: int  # most process groups one rank ran the op on
    verdict: str
    reason: str


@dataclass(frozen=True)
class CommReport:
    profile_dir: Path
    ranks: tuple[int, ...]
    world_size: int
    missing_ranks: tuple[int, ...]
    probe: str
    threshold_mib: float
    skip_ops: tuple[str, ...]  # the skip set the profiled run used
    ops: tuple[OpVerdict, ...]
    recommended_skip_ops: tuple[str, ...]


def find_profile_dir(run_dir: str | Path) -> Path:
    """The first of (the profile_dir engine.yaml names, RUN_DIR/comm_profile, RUN_DIR) holding rank files."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CommReportError(f"Run dir {run_dir} does not exist; pass the directory `gdnctl render` wrote.")
    candidates = [run_dir / DEFAULT_PROFILE_SUBDIR, run_dir]
    configured = _configured_profile_dir(run_dir)
    if configured is not None:
        candidates.insert(0, configured)
    for candidate in candidates:
        if any(candidate.glob(PROFILE_FILE_PATTERN.format(rank="*"))):
            return candidate
    searched = ", ".join(str(candidate) for candidate in dict.fromkeys(candidates))
    raise CommReportError(
        f"No {PROFILE_FILE_PATTERN.format(rank='*')} files in {searched}; run the job with "
        "comm.profile: true in the preset, then run gdnctl comm-report again."
    )


def _configured_profile_dir(run_dir: Path) -> Path | None:
    engine_yaml = run_dir / "engine.yaml"
    if not engine_yaml.is_file():
        return None
    try:
        document = read_yaml(engine_yaml, MAX_ENGINE_YAML_BYTES)
    except UnreadableFile as error:
        raise CommReportError(
            f"{error}; render the run dir again with `gdnctl render`, or move engine.yaml away "
            "to read the profiles in RUN_DIR/comm_profile."
        ) from None
    comm = document.get("comm") if isinstance(document, dict) else None
    profile_dir = comm.get("profile_dir") if isinstance(comm, dict) else None
    if profile_dir is not None and not isinstance(profile_dir, str):
        raise CommReportError(
            f"{engine_yaml}: comm.profile_dir is {profile_dir!r}, not a directory name; render "
            "the run dir again with `gdnctl render`."
        )
    return None if profile_dir is None else run_dir / profile_dir


_RANK_FILE = re.compile(re.escape(PROFILE_FILE_PATTERN).replace(re.escape("{rank}"), r"(\d+)"))


def load_profile(path: Path) -> CommProfile:
    """One rank's profile, every field of the type the runtime writes; CommReportError naming the file and the
    field otherwise."""
    fix = "delete it and profile the run again"
    try:
        document = read_json(path, MAX_PROFILE_BYTES)
    except UnreadableFile as error:
        raise CommReportError(f"{error}; {fix}.") from None
    if (
        not isinstance(document, dict)
        or document.get("format") != PROFILE_FORMAT
        or document.get("version") != PROFILE_VERSION
    ):
        raise CommReportError(
            f"{path} is not a version {PROFILE_VERSION} gdnctl comm profile; profile the run "
            "again with this gdnctl version."
        )
    try:
        profile = CommProfile.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        raise CommReportError(
            f"{path} is not a comm profile gdnctl wrote ({where}: {first['msg'].lower()}); {fix}."
        ) from None
    named = _RANK_FILE.fullmatch(path.name)
    if named is None or int(named.group(1)) != profile.rank:
        raise CommReportError(f"{path} holds the profile of rank {profile.rank}, not of the rank its name says; {fix}.")
    return profile


def load_profiles(profile_dir: Path) -> list[CommProfile]:
    return [load_profile(path) for path in sorted(profile_dir.glob(PROFILE_FILE_PATTERN.format(rank="*")))]


def build_report(run_dir: str | Path, threshold_mib: float = SKIP_SAFE_THRESHOLD_MIB) -> CommReport:
    _check_threshold(threshold_mib)
    profile_dir = find_profile_dir(run_dir)
    return merge_profiles(load_profiles(profile_dir), profile_dir, threshold_mib)


def _check_threshold(threshold_mib: float) -> None:
    """A NaN threshold would call every op skip-safe: every comparison with NaN is false."""
    if not math.isfinite(threshold_mib) or threshold_mib < 0:
        raise CommReportError(
            f"--threshold-mib is {threshold_mib}; give a finite number of MiB, 0 or more (the "
            f"default is {SKIP_SAFE_THRESHOLD_MIB:g})."
        )


def merge_profiles(
    profiles: list[CommProfile], profile_dir: Path, threshold_mib: float = SKIP_SAFE_THRESHOLD_MIB
) -> CommReport:
    """Merge per-rank profiles (of one run: one world size) into one verdict per op."""
    _check_threshold(threshold_mib)
    if not profiles:
        raise CommReportError(f"No comm profiles to merge from {profile_dir}; run the job with comm.profile: true.")
    sizes = sorted({profile.world_size for profile in profiles})
    if len(sizes) > 1:
        raise CommReportError(
            f"The profiles in {profile_dir} come from runs of {' and '.join(map(str, sizes))} "
            "ranks; keep one run's profiles there (or profile the run again)."
        )
    world_size = sizes[0]
    ranks = tuple(sorted(profile.rank for profile in profiles))
    skip_ops = tuple(sorted({op for profile in profiles for op in profile.skip_ops}))
    names = sorted({op for profile in profiles for op in profile.ops})
    verdicts = tuple(
        _merge_op(op, [profile.ops[op] for profile in profiles if op in profile.ops], threshold_mib) for op in names
    )
    safe = {verdict.op for verdict in verdicts if verdict.verdict == SKIP_SAFE}
    # Skipped ops this run never called keep their place: the profile says nothing against them.
    unobserved_skips = set(skip_ops) - set(names)
    return CommReport(
        profile_dir=profile_dir,
        ranks=ranks,
        world_size=world_size,
        missing_ranks=tuple(sorted(set(range(world_size)) - set(ranks))),
        probe=", ".join(sorted({profile.probe for profile in profiles})),
        threshold_mib=threshold_mib,
        skip_ops=skip_ops,
        ops=verdicts,
        recommended_skip_ops=tuple(sorted(safe | unobserved_skips)),
    )


def _merge_op(op: str, per_rank: list[ProfiledOp], threshold_mib: float) -> OpVerdict:
    steady = [stats.steady_state_max for stats in per_rank if stats.steady_state_max is not None]
    steady_drop = max((s.driver_drop_bytes for s in steady), default=None)
    steady_allocator = max((max(s.allocated_delta_bytes, s.reserved_delta_bytes) for s in steady), default=None)
    first_drop = max(stats.first_use_max.driver_drop_bytes for stats in per_rank)
    steady_drop_mib = None if steady_drop is None else steady_drop / MIB
    steady_allocator_mib = None if steady_allocator is None else steady_allocator / MIB
    if steady_drop_mib is None:
        verdict, reason = KEEP_CHECKED, "one call per rank and group: no steady-state sample"
    elif steady_drop_mib >= threshold_mib:
        verdict, reason = KEEP_CHECKED, f"steady-state free-memory drop {steady_drop_mib:.1f} MiB"
    elif steady_allocator_mib is not None and steady_allocator_mib >= threshold_mib:
        verdict, reason = KEEP_CHECKED, f"steady-state allocator growth {steady_allocator_mib:.1f} MiB"
    else:
        verdict, reason = SKIP_SAFE, f"steady state below {threshold_mib:g} MiB"
    return OpVerdict(
        op=op,
        calls=sum(stats.calls for stats in per_rank),
        checks=sum(stats.checks for stats in per_rank),
        clears=sum(stats.clears for stats in per_rank),
        guard_seconds=sum(stats.guard_seconds for stats in per_rank),
        steady_state_max_drop_mib=steady_drop_mib,
        steady_state_max_allocator_mib=steady_allocator_mib,
        first_use_drop_mib=first_drop / MIB,
        groups=max(stats.groups for stats in per_rank),
        verdict=verdict,
        reason=reason,
    )


def report_as_dict(report: CommReport) -> dict[str, Any]:
    """The report as JSON-ready data (`gdnctl comm-report --json`)."""
    data = asdict(report)
    data["profile_dir"] = str(report.profile_dir)
    return data


def format_table(report: CommReport) -> str:
    header = (
        "op",
        "calls",
        "checks",
        "groups",
        "steady max drop MiB",
        "first-use drop MiB",
        "guard us/check",
        "verdict",
        "why",
    )
    rows = [header] + [
        (
            verdict.op,
            str(verdict.calls),
            str(verdict.checks),
            str(verdict.groups),
            _mib(verdict.steady_state_max_drop_mib),
            _mib(verdict.first_use_drop_mib),
            f"{verdict.guard_seconds / verdict.checks * 1e6:.1f}" if verdict.checks else "-",
            verdict.verdict,
            verdict.reason,
        )
        for verdict in report.ops
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    numeric = range(1, 7)

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(width) if column in numeric else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    lines = [
        f"comm profile: {report.profile_dir} (ranks {_ranks(report.ranks)} of {report.world_size}, "
        f"{report.probe} memory probe)"
    ]
    if report.missing_ranks:
        lines.append(f"missing ranks {_ranks(report.missing_ranks)}: their files were not written or were removed")
    if "host" in report.probe:
        lines.append("host memory probe: this was a CPU run, so drops include other processes on the machine")
    lines += [line(rows[0])] + [line(row) for row in rows[1:]]
    current, recommended = set(report.skip_ops), set(report.recommended_skip_ops)
    lines.append(f"recommended comm.skip_ops: [{', '.join(report.recommended_skip_ops)}]")
    changes = [
        f"{label} {', '.join(sorted(names))}"
        for label, names in (("adds", recommended - current), ("removes", current - recommended))
        if names
    ]
    lines.append(f"  vs the profiled run: {'; '.join(changes) if changes else 'no change'}")
    return "\n".join(lines)


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ranks(ranks: tuple[int, ...]) -> str:
    return ", ".join(str(rank) for rank in ranks)
