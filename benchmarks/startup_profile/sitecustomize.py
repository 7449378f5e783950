"""Where a launch's time to its first step goes, function by function: a sampling profile of rank 0's threads
from the process's start, for any launch and with nothing in it changed. (With GDNCTL_STARTUP_EXPERIMENT set, this
file also loads gdnctl_startup_experiments.py beside it: ideas for the start-up tried without changing gdnctl.)

Python imports `sitecustomize` at start-up from the first folder on its path that has one, so putting this folder
first on PYTHONPATH loads it into every process a launch starts. In the process torchrun starts as rank 0 (RANK=0),
a daemon thread reads every thread's stack every INTERVAL_MS milliseconds (sys._current_frames) for SECONDS
seconds, or until the process ends if that comes first, then writes OUT_DIR/TAG.startup-profile.txt:

    GDNCTL_STARTUP_PROFILE=OUT_DIR:TAG[:SECONDS[:INTERVAL_MS]] PYTHONPATH=benchmarks/startup_profile:$PYTHONPATH \\
        gdnctl launch ...

Three tables, in seconds (each sample weighs the time since the one before): the module imports that took
longest (cumulative: a module's own `<module>` code with everything it imported), the functions that took longest
(cumulative: anything under them), and the functions the thread was inside at each sample (self: where the time
was spent, C calls counted to the Python function that made them). Two more tables do the same for every other
thread that was running Python at a sample: the autograd engine runs a CUDA backward, and with it every Python
`backward` (a Triton kernel's launch and its first-call loading), on a thread of its own while the main thread
waits in `run_backward`. A thread waiting in Python (a pool's idle worker) counts there too: read its frames. Then,
for each start-up phase of the trainer (the phase marks of gdnctl/runtime/train/startup.py: "after 'data'" is step
1), its seconds and where they went, self, on the main thread and on the others, threads idle in a known wait left
out (threading's and a queue's waits, inductor's compile-worker reader and timer, a selector). Last, torch.compile's
time by the function it compiled (any thread): the samples inside Dynamo's `_compile`
(torch/_dynamo/convert_frame.py), charged to the code object it was given: tracing and the forward's compile.
AOTAutograd compiles a backward lazily, at its first call on the autograd engine's thread outside `_compile`: that
part is in the other threads' tables, not here. The
sampler needs the GIL to look: work in C that holds it (compiling a module's source, a garbage collection, a
module body's C calls) is charged to the frame the main thread is in when it next lets go, often a file read in
the import system or a Python callback that runs after it; the cumulative tables are sound. Pick SECONDS a
little past the end of step 1 (startup.json says when). Sampling costs the traced thread a few per cent;
time a launch without it.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time

SPEC = os.environ.get("GDNCTL_STARTUP_PROFILE")
TOP = 60
TOP_PER_PHASE = 15
# Innermost frames of threads that are waiting, not working: (the file's path ends with, function).
IDLE = {
    ("threading.py", "wait"),
    ("queue.py", "get"),
    ("compile_worker/subproc_pool.py", "_recv_msg"),
    ("compile_worker/timer.py", "check"),
    ("selectors.py", "select"),
    ("concurrent/futures/thread.py", "_worker"),  # a pool's idle worker blocks in C under this frame
}
BEFORE_THE_TRAINER = "before the trainer's first mark"
DYNAMO_COMPILE_FILE = os.path.join("torch", "_dynamo", "convert_frame.py")


def _phase() -> str:
    """The trainer's start-up phase in progress, named after the mark that ended the one before it."""
    clock = sys.modules.get("gdnctl.runtime.train.startup")
    done = getattr(clock, "last_mark", None)
    return BEFORE_THE_TRAINER if done is None else f"after {done!r}"


def _idle(frame) -> bool:
    code = frame.f_code
    return any(code.co_filename.endswith(suffix) and code.co_name == name for suffix, name in IDLE)


def _where(code) -> str:
    return f"{code.co_filename}:{code.co_firstlineno} {code.co_name}"


def _module_name(filename: str) -> str:
    """site-packages/megatron/core/__init__.py -> megatron.core (the path from the last site-packages or repo)."""
    for root in sorted(sys.path, key=len, reverse=True):
        if root and filename.startswith(root.rstrip("/") + "/"):
            parts = filename[len(root.rstrip("/")) + 1 :].removesuffix(".py").split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join(parts)
    return filename


def _compiled_code(frame):
    """The code object Dynamo's `_compile` frame is compiling (its first argument, `code`), or None."""
    code = frame.f_code
    if code.co_name != "_compile" or not code.co_filename.endswith(DYNAMO_COMPILE_FILE):
        return None
    compiled = frame.f_locals.get("code")
    return compiled if hasattr(compiled, "co_firstlineno") else None


def _count_stack(frame, weight: float, cumulative, own, imports=None, compiled=None) -> None:
    """Charge one sample of a thread's stack: its innermost function (self), every function on it once
    (cumulative, so recursion counts once) and, given counters for them, the module bodies being run and the
    function torch.compile is compiling."""
    own[_where(frame.f_code)] += weight
    seen: set = set()
    charged_compile = False
    while frame is not None:
        code = frame.f_code
        if code not in seen:
            seen.add(code)
            cumulative[_where(code)] += weight
            if imports is not None and code.co_name == "<module>":
                imports[_module_name(code.co_filename)] += weight
        if compiled is not None and not charged_compile:
            target = _compiled_code(frame)
            if target is not None:  # the innermost `_compile`: a nested compile is charged to its own function
                # The qualified name (Class.method) is what GDNCTL_STARTUP_EXPERIMENT's eager: takes.
                compiled[f"{target.co_filename}:{target.co_firstlineno} {target.co_qualname}"] += weight
                charged_compile = True
        frame = frame.f_back


def _sample(main_id: int, seconds: float, interval: float, out_path: str, stop: threading.Event) -> None:
    cumulative: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    imports: collections.Counter = collections.Counter()
    others_cumulative: collections.Counter = collections.Counter()
    others_own: collections.Counter = collections.Counter()
    compiled: collections.Counter = collections.Counter()
    me = threading.get_ident()
    # phase -> [seconds, main thread self, other threads self]
    phases: dict[str, list] = {}
    samples, traced = 0, 0.0
    last = time.monotonic()
    end = last + seconds
    while last < end and not stop.wait(interval):
        frames = sys._current_frames()
        frame = frames.get(main_id)
        if frame is None:
            break
        # Each sample stands for the time since the previous one: the thread waits for the GIL, so a busy main
        # thread stretches the interval.
        now = time.monotonic()
        weight, last = now - last, now
        samples += 1
        traced += weight
        phase = phases.setdefault(_phase(), [0.0, collections.Counter(), collections.Counter()])
        phase[0] += weight
        phase[1][_where(frame.f_code)] += weight
        _count_stack(frame, weight, cumulative, own, imports, compiled)
        for ident, other in frames.items():
            if ident not in (main_id, me):
                _count_stack(other, weight, others_cumulative, others_own, compiled=compiled)
                if not _idle(other):
                    phase[2][_where(other.f_code)] += weight
    lines = [f"{samples} samples of the main thread over {traced:.1f} s (every {interval * 1000:.0f} ms or more)"]
    for title, counter in (
        ("module imports, cumulative", imports),
        ("functions, cumulative", cumulative),
        ("functions, self", own),
        ("other threads: functions, cumulative", others_cumulative),
        ("other threads: functions, self", others_own),
    ):
        lines += ["", f"## {title} (s)"]
        lines += [f"{spent:8.2f}  {name}" for name, spent in counter.most_common(TOP)]
    for name, (seconds, main_self, others_self) in phases.items():
        lines += ["", f"## phase {name}: {seconds:.2f} s"]
        lines += ["main thread, self (s):"]
        lines += [f"{spent:8.2f}  {where}" for where, spent in main_self.most_common(TOP_PER_PHASE)]
        lines += ["other threads at work, self (s):"]
        lines += [f"{spent:8.2f}  {where}" for where, spent in others_self.most_common(TOP_PER_PHASE)]
    lines += ["", f"## torch.compile, by the function it compiled: {sum(compiled.values()):.2f} s"]
    lines += [f"{spent:8.2f}  {where}" for where, spent in compiled.most_common(TOP)]
    with open(out_path, "w") as out:
        out.write("\n".join(lines) + "\n")


# The processes rank 0 starts (compile workers) inherit its environment: the marker keeps the profile to rank 0 itself.
if SPEC and os.environ.get("RANK") == "0" and not os.environ.get("GDNCTL_STARTUP_PROFILE_TAKEN"):
    os.environ["GDNCTL_STARTUP_PROFILE_TAKEN"] = "1"
    out_dir, tag, *rest = SPEC.split(":")
    seconds = float(rest[0]) if rest else 60.0
    interval = float(rest[1]) / 1000 if len(rest) > 1 else 0.005
    os.makedirs(out_dir, exist_ok=True)
    stop_sampling = threading.Event()
    sampler = threading.Thread(
        target=_sample,
        args=(
            threading.main_thread().ident,
            seconds,
            interval,
            os.path.join(out_dir, f"{tag}.startup-profile.txt"),
            stop_sampling,
        ),
        daemon=True,
        name="startup-profile",
    )
    sampler.start()

    @atexit.register
    def _write_before_exit() -> None:
        """A job shorter than SECONDS still gets its tables: the interpreter kills daemon threads at exit."""
        stop_sampling.set()
        sampler.join(timeout=30)


# Start-up experiments (gdnctl_startup_experiments.py beside this file), in every process of the launch.
if os.environ.get("GDNCTL_STARTUP_EXPERIMENT"):
    try:
        import gdnctl_startup_experiments  # noqa: F401  (installs itself from the variable)
    except ValueError as error:
        # `site` would print this and go on; a launch that ran without its experiment must not look like one.
        sys.exit(f"startup experiment: {error}")
