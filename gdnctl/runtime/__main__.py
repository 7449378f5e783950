"""`python -m gdnctl.runtime --config engine.yaml [--smoke]`, started by torchrun on every rank.

Order matters: the config is read and checked before torch is imported, and its `env` entries are applied
before the import too, because NCCL and CUDA read theirs when they initialise.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from datetime import timedelta
from pathlib import Path

import yaml
from pydantic import ValidationError

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, printable, read_text
from gdnctl.schema import ENGINE_CONFIG_VERSION, EngineConfig

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# The selftest's collectives take milliseconds; a rank still waiting after this is in a hang, and gloo's
# default (30 minutes) would hide it.
SELFTEST_COLLECTIVE_TIMEOUT = timedelta(minutes=5)
DEFAULT_COLLECTIVE_TIMEOUT = timedelta(minutes=30)  # torch's default for gloo and NCCL process groups
# An engine.yaml is a few KiB; a file past this, a FIFO or a device is not one (reading it would block or take
# the node's memory).
MAX_ENGINE_CONFIG_BYTES = 16 * 1024**2


class RuntimeSetupError(GdnctlError):
    """The engine config or the launch environment cannot run a job."""


def load_config(path: Path) -> EngineConfig:
    try:
        text = read_text(path, MAX_ENGINE_CONFIG_BYTES)
    except UnreadableFile as error:
        if not path.exists():
            raise RuntimeSetupError(
                f"engine config {path} does not exist; pass the engine.yaml that `gdnctl "
                "render` wrote into the run dir."
            ) from None
        raise RuntimeSetupError(f"engine config {error}; render the run dir again with `gdnctl render`.") from None
    try:
        document = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError, TypeError, KeyError, AttributeError) as error:
        # Beside YAML's own errors: nesting deeper than PyYAML's recursion, and the plain errors its scalar
        # constructors raise on some malformed scalars (`!!int x`, `0b_`).
        raise RuntimeSetupError(
            f"engine config {path} cannot be read ({type(error).__name__}); render the run "
            "dir again with `gdnctl render`."
        ) from None
    version = document.get("version") if isinstance(document, dict) else None
    if version is not None and version != ENGINE_CONFIG_VERSION:
        raise RuntimeSetupError(
            f"engine config {path} has version {version} but this gdnctl reads version "
            f"{ENGINE_CONFIG_VERSION}; render it with the gdnctl version that runs it."
        )
    try:
        return EngineConfig.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        raise RuntimeSetupError(
            f"engine config {path} is invalid at {where} ({first['msg']}); render the run "
            "dir again with `gdnctl render`."
        ) from None


def check_job(config: EngineConfig) -> None:
    if config.job == "selftest" and config.selftest is None:
        raise RuntimeSetupError(
            "the engine config has job 'selftest' but no selftest section; render the run "
            "dir again with `gdnctl render`."
        )


def check_launch(config: EngineConfig) -> None:
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise RuntimeSetupError(
            f"torchrun's variables {', '.join(missing)} are missing; launch this with the run "
            "dir's torchrun script (or `torchrun ... -m gdnctl.runtime --config ...`)."
        )
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size != config.parallel.world_size:
        raise RuntimeSetupError(
            f"torchrun started {world_size} ranks but the engine config was compiled for "
            f"parallel.world_size {config.parallel.world_size}; launch it with the run dir's "
            "script or render the preset for this many GPUs."
        )


def apply_env(env: dict[str, str]) -> None:
    """Set the config's environment variables that the launch did not set already (the launch wins)."""
    for name, value in env.items():
        os.environ.setdefault(name, value)


def collective_timeout(config: EngineConfig) -> timedelta | None:
    """How long a rank may wait in a collective; None: torch's default (30 minutes)."""
    if config.job == "selftest":
        return SELFTEST_COLLECTIVE_TIMEOUT
    if config.job == "rl":
        # While rank 0 waits on the rollout server (start, generate, reload: each up to rollout.timeout_s),
        # the other ranks wait in a broadcast; they must outlast it, so rank 0's clear timeout fires first.
        return DEFAULT_COLLECTIVE_TIMEOUT + timedelta(seconds=3 * config.rollout.timeout_s)
    return None


def run_job(config: EngineConfig, config_path: Path, smoke: bool = False) -> int:
    """smoke: run the job's smoke run (runtime/smoke) instead of the job."""
    from gdnctl.runtime.launcher import keep_unused_imports_out

    keep_unused_imports_out()  # before anything imports Transformer Engine
    import torch
    import torch.distributed as dist

    from gdnctl.runtime import selftest
    from gdnctl.runtime.comm import CommGuardPolicy
    from gdnctl.runtime.comm import guard as comm_guard

    # Built before the process group: a wrong skip_ops list stops every rank with its sentence at once, whatever
    # the rendezvous does.
    policy = CommGuardPolicy.from_engine(config.comm, base_dir=config_path.parent)
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeSetupError(
                "the engine config says device cuda but torch sees no CUDA device here; run "
                "on a GPU node, or set cluster.gpu: cpu in the preset for a CPU run and launch "
                "it again."
            )
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        # Initialised now so the comm guard picks the CUDA memory probe.
        torch.cuda.init()
    # On GPUs the default group gets gloo for CPU tensors beside NCCL for CUDA ones: the selftest's comm checks
    # use CPU tensors so that they run the same on every node, and CUDA collectives still go to NCCL.
    backend = "gloo" if config.device == "cpu" else "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend=backend, timeout=collective_timeout(config))
    try:
        if smoke:
            from gdnctl.runtime.smoke import prepare_smoke, run_smoke

            smoke_run = prepare_smoke(config, config_path)
            # Its comm profile, like everything else of the smoke, goes into the smoke's own run dir.
            return run_smoke(
                smoke_run, CommGuardPolicy.from_engine(smoke_run.config.comm, base_dir=smoke_run.config_path.parent)
            )
        if config.job == "selftest":
            return selftest.run(config, policy, config_path.parent)
        if config.job == "rl":
            from gdnctl.runtime.rl import job as rl

            return rl.run(config, config_path, policy)
        if config.device == "cpu":
            from gdnctl.runtime.train import cpu_sft

            return cpu_sft.run(config, config_path)
        from gdnctl.runtime.train import trainer

        return trainer.run(config, config_path, policy)
    finally:
        # Jobs install the guard themselves; taking it out writes this rank's comm profile when profiling.
        comm_guard.uninstall()
        # The job's objects sit in reference cycles (DDP's reducer and its hooks hold the default group): collected
        # here, the groups go while the interpreter is whole. Left to interpreter shutdown, a CPU rl rank's gloo
        # group went there and aborted the rank ("terminate called without an active exception", no Python frame;
        # about 1 run in 6 of the tensor-parallel-rollout broadcast test on a 2-core machine).
        gc.collect()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gdnctl.runtime", description="Run the job an engine.yaml describes (under torchrun)."
    )
    parser.add_argument("--config", required=True, type=Path, help="engine.yaml written by gdnctl render")
    parser.add_argument(
        "--role",
        choices=("trainer", "rollout"),
        default="trainer",
        help="rollout: the separate vLLM step of an rl job (the Slurm script starts it)",
    )
    parser.add_argument(
        "--engine",
        type=int,
        default=None,
        metavar="K",
        help="with --role rollout: serve rollout engine K (the trainer passes it to the servers it "
        "starts); without it, start this node's engines (the Slurm script's rollout step)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the job's smoke run instead of the job: a few steps of its layout in RUN_DIR/smoke, "
        "verdicts in RUN_DIR/smoke.json (with --role rollout: serve the smoke run)",
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        if args.engine is not None and args.role != "rollout":
            raise RuntimeSetupError(
                "--engine names the rollout engine a rollout server serves; pass it with "
                "--role rollout, or leave it out."
            )
        if args.role == "rollout" and config.job != "rl":
            raise RuntimeSetupError(
                f"--role rollout belongs to rl jobs, but this engine config runs "
                f"'{config.job}'; start it without --role."
            )
        check_job(config)
        if args.role == "rollout":
            # The rollout server is no torchrun rank: it runs in vLLM's environment and needs no process group.
            from gdnctl.runtime.rl.rollout import server as rollout_server

            run_dir = args.config.resolve().parent
            if args.smoke:
                from gdnctl.runtime.smoke import smoke_config, smoke_run_dir

                config, run_dir = smoke_config(config, run_dir), smoke_run_dir(run_dir)
            if args.engine is None:
                return rollout_server.serve_node(
                    config,
                    run_dir,
                    relaunch=["--config", str(args.config), "--role", "rollout", *(["--smoke"] if args.smoke else [])],
                )
            return rollout_server.serve(config, run_dir, args.engine)
        check_launch(config)
        apply_env(config.env)
        return run_job(config, args.config.resolve(), smoke=args.smoke)
    except GdnctlError as error:
        # Every rank says what stopped it: a problem one node alone has (its copy of the run dir, its GPU, its
        # checkpoint files) shows on that rank only. The other ranks name themselves; rank 0's line stays plain.
        rank = os.environ.get("RANK", "0")
        # One write with its newline: the ranks share the terminal or log, and print's separate write of the
        # newline let another rank's line land in the middle of this one. A sentence may quote a name a file gave
        # (a tensor's file in an index, a checkpoint's name): nothing in it reaches a terminal as a control.
        sys.stderr.write(f"gdnctl runtime{'' if rank == '0' else f' (rank {rank})'}: {printable(str(error))}\n")
        sys.stderr.flush()
        return error.exit_code


if __name__ == "__main__":
    from gdnctl.runtime.launcher import exit_without_teardown

    code = main()
    if code != 0:
        # A failing rank exits the ordinary (slower) way: torchrun stops the other ranks once one has exited, and
        # each of them should have said what stopped it by then.
        sys.exit(code)
    exit_without_teardown(code)
