"""The user's code a preset names, as validate sees it (gdnctl/validate/user_code.py, the USR rules): paths made
absolute by the loader, the forms of grpo.reward, modules found without importing them, the signatures ast can
check, and the launch scripts' check that the files are there."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gdnctl.launch.render import build
from gdnctl.validate import validate
from gdnctl.validate.loader import load_preset
from gdnctl.validate.user_code import locate_module
from tests.validate.helpers import codes

RL_CPU = "tiny-qwen3.5-rl-cpu"  # a local job, run with this interpreter
SCORE = "def score(prompt, response, response_ids, record):\n    return 1.0\n"


def reward(path, name: str = "score") -> dict:
    return {"grpo": {"reward": {"function": f"{path}:{name}"}}}


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_files_path_is_made_absolute_from_the_preset_and_a_modules_name_is_left_as_written(tmp_path, monkeypatch):
    preset = write(
        tmp_path / "presets" / "mine.yaml",
        f"base: {RL_CPU}\ngrpo:\n  reward: {{function: ../code/rewards.py:score}}\n"
        "rollout:\n  environment: {class: my_envs.tools:Env}\n",
    )
    loaded = load_preset(preset)
    assert loaded.preset.grpo.reward.function == f"{tmp_path}/code/rewards.py:score"
    assert loaded.preset.rollout.environment.class_ == "my_envs.tools:Env"
    monkeypatch.chdir(tmp_path)
    assert (
        load_preset(preset, ["grpo.reward.function=here.py:f"]).preset.grpo.reward.function == f"{tmp_path}/here.py:f"
    )
    whole = load_preset(preset, ["grpo.reward={function: there.py:g, timeout_s: 5}"]).preset.grpo.reward
    assert whole.function == f"{tmp_path}/there.py:g" and whole.timeout_s == 5


@pytest.mark.parametrize(
    "value, path, said",
    [
        ("{function: rewards.py}", "grpo.reward.function", "names no code"),
        ("{function: rewards.py:2x}", "grpo.reward.function", "is not a Python name"),
        ("{url: ftp://host/score}", "grpo.reward.url", "is not an http:// or https:// url with a host"),
        ("{url: http://host/score, retry: 2}", "grpo.reward.retry", "Did you mean 'retries'?"),
        ("nearest", "grpo.reward", "Input should be 'math_exact', 'digit_fraction' or 'digit_answer'"),
        ("3", "grpo.reward", "The reward is a shipped reward's name"),
    ],
)
def test_a_reward_of_the_wrong_form_is_a_sentence_at_its_field(value, path, said):
    result = validate(RL_CPU, [f"grpo.reward={value}"])
    (finding,) = [f for f in result.findings if f.code in ("PRE001", "PRE002")]
    assert finding.path == path and said in finding.message + finding.hint


def test_a_module_is_found_along_the_path_without_running_its_package(tmp_path, monkeypatch):
    write(tmp_path / "pkg" / "__init__.py", "raise SystemExit('imported')\n")
    module = write(tmp_path / "pkg" / "rewards.py", SCORE)
    assert locate_module("pkg.rewards", [str(tmp_path)]) == module
    assert locate_module("pkg", [str(tmp_path)]) == tmp_path / "pkg" / "__init__.py"
    assert locate_module("pkg.nothing", [str(tmp_path)]) is None
    monkeypatch.syspath_prepend(str(tmp_path))
    found = codes({"grpo": {"reward": {"function": "pkg.rewards:score"}}}, base=RL_CPU)
    assert {code for code in found if code.startswith("USR")} == {
        "USR001"
    } and f"({module} on this interpreter's path)" in found["USR001"][0].message
    assert "pkg" not in sys.modules


def test_a_module_this_interpreter_lacks_is_an_error_only_where_it_runs_the_job():
    here = codes({"grpo": {"reward": {"function": "no_such_pkg.rewards:score"}}}, base=RL_CPU)["USR002"]
    assert here[0].severity.value == "error"
    elsewhere = codes(
        {"grpo": {"reward": {"function": "no_such_pkg.rewards:score"}}, "launch": {"python": "/opt/env/bin/python"}},
        base=RL_CPU,
    )["USR002"]
    assert elsewhere[0].severity.value == "warning" and "the job's interpreter may have it" in elsewhere[0].message


@pytest.mark.parametrize(
    "source, problem",
    [
        (SCORE, None),
        ("def score(**everything):\n    return 1\n", None),
        ("async def score(prompt, response, response_ids, record, extra=1):\n    return 1\n", None),
        ("@cache\ndef score(x):\n    return 1\n", None),  # a decorator may change what it takes: left to the job
        ("from helpers import score\n", None),
        ("if True:\n    def score(**kw):\n        return 1\n", None),
        ("def score(prompt, response, response_ids, record, /):\n    return 1\n", "by position only"),
        ("def score(prompt, response):\n    return 1\n", "takes no response_ids, record"),
        ("def score(prompt, response, response_ids, record, tests):\n    return 1\n", "needs tests"),
        ("class score:\n    pass\n", "score is a class"),
    ],
)
def test_a_reward_function_must_take_the_four_keywords(tmp_path, source, problem):
    found = codes(reward(write(tmp_path / "rewards.py", source)), base=RL_CPU)
    if problem is None:
        assert "USR004" not in found and "USR003" not in found, found
    else:
        assert problem in found["USR004"][0].message


ENV_BASE = "    def start(self):\n        return 'go'\n    def step(self, response):\n        return 1.0\n"


@pytest.mark.parametrize(
    "source, problem",
    [
        ("class Env:\n    def __init__(self, record):\n        pass\n" + ENV_BASE, None),
        ("from gdnctl.runtime.rl.environments import Environment\nclass Env(Environment):\n" + ENV_BASE, None),
        ("class Env(SomeoneElses):\n    pass\n", None),  # its methods may come from the base
        ("class Env:\n" + ENV_BASE, "Env has no __init__(self, record)"),
        (
            "class Env:\n    def __init__(self):\n        pass\n" + ENV_BASE,
            "Env.__init__ cannot be called as Env(record)",
        ),
        (
            "class Env:\n    def __init__(self, record):\n        pass\n    def start(self):\n        return 'go'\n",
            "no step",
        ),
        (
            "class Env:\n    def __init__(self, record):\n        pass\n    def start(self):\n        return 'go'\n"
            "    def step(self):\n        return 1\n",
            "Env.step cannot be called as step(response)",
        ),
        ("def Env(record):\n    return None\n", "Env is a function"),
    ],
)
def test_an_environment_class_must_be_made_from_a_record_and_start_and_step(tmp_path, source, problem):
    path = write(tmp_path / "env.py", source)
    found = codes({"rollout": {"environment": {"class": f"{path}:Env"}}}, base=RL_CPU)
    if problem is None:
        assert "USR004" not in found, found["USR004"]
    else:
        assert problem in found["USR004"][0].message


def test_a_link_into_a_world_writable_directory_is_code_another_user_could_replace(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    target = write(shared / "rewards.py", SCORE)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "rewards.py").symlink_to(target)
    (finding,) = codes(reward(mine / "rewards.py"), base=RL_CPU)["USR005"]
    assert f"{shared} is writable by every user" in finding.message


def test_reward_workers_beside_a_reward_that_is_no_function_is_named_as_unused():
    (finding,) = codes({"grpo": {"reward_workers": 2}}, base=RL_CPU)["USR006"]
    assert finding.path == "grpo.reward_workers"


def test_the_scripts_check_the_code_files_are_there_with_the_paths_quoted(tmp_path):
    code = write(tmp_path / "my rewards" / "score $HOME.py", SCORE)
    result = validate(RL_CPU, [f"grpo.reward={{function: '{code}:score'}}"])
    assert result.ok, result.findings
    rendered = build(result, tmp_path / "run")
    for script in ("launch_local.sh", "launch_slurm.sbatch"):
        text = rendered.files[script]
        assert f"[[ -f '{code}' ]] || {{ printf" in text and "grpo.reward.function" in text
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
