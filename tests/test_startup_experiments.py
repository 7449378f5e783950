"""benchmarks/startup_profile/gdnctl_startup_experiments.py: start-up ideas a launch switches on by environment
(GDNCTL_STARTUP_EXPERIMENT), tried here on CPU with torch.compile's eager backend and a stand-in Triton."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "benchmarks" / "startup_profile"


def load_experiments():
    spec = importlib.util.spec_from_file_location(
        "gdnctl_startup_experiments", FOLDER / "gdnctl_startup_experiments.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOY = """
import torch

@torch.compile(backend="eager")
def costly_to_trace(x):
    return torch.sigmoid(x) * x

class Router:
    @torch.compile(backend="eager")
    def gate(self, x):
        return torch.softmax(x, dim=-1)

@torch.compile(backend="eager")
def kept(x):
    return torch.tanh(x) + 1
"""

CALLS = """
import importlib.util
importlib.util.find_spec("toy_fused")  # a lookup alone must not use up the experiment
import torch, toy_fused
import torch._dynamo.utils as dynamo_utils
x = torch.ones(4)
toy_fused.costly_to_trace(x); toy_fused.Router().gate(x); toy_fused.kept(x)
print(dynamo_utils.counters["stats"]["unique_graphs"])
"""


def run_with(tmp_path: Path, experiment: str, check: bool = True) -> subprocess.CompletedProcess:
    (tmp_path / "toy_fused.py").write_text(textwrap.dedent(TOY))
    env = {
        **os.environ,
        "GDNCTL_STARTUP_EXPERIMENT": experiment,
        "PYTHONPATH": os.pathsep.join([str(FOLDER), str(tmp_path)]),
    }
    env.pop("GDNCTL_STARTUP_PROFILE", None)
    return subprocess.run(
        [sys.executable, "-c", CALLS], env=env, capture_output=True, text=True, timeout=180, check=check
    )


def test_named_compiled_functions_run_eagerly_and_the_others_stay_compiled(tmp_path):
    done = run_with(tmp_path, "eager:toy_fused:costly_to_trace,toy_fused:Router.gate")
    assert done.stdout.split() == ["1"]  # only `kept` was traced
    assert "startup experiment: eager toy_fused:costly_to_trace: Dynamo skips it" in done.stderr
    assert "startup experiment: eager toy_fused:Router.gate: Dynamo skips it" in done.stderr
    everything = run_with(tmp_path, "eager:toy_fused:nothing_by_this_name")
    assert everything.stdout.split() == ["3"]
    assert "eager toy_fused:nothing_by_this_name: not done (AttributeError" in everything.stderr


def test_the_triton_key_is_hashed_on_a_thread_when_its_trigger_starts_importing(tmp_path, monkeypatch):
    experiments = load_experiments()
    marker = tmp_path / "hashed"
    fake = tmp_path / "triton" / "runtime"
    fake.mkdir(parents=True)
    (tmp_path / "triton" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "cache.py").write_text(f"def triton_key():\n    open({str(marker)!r}, 'w').write('key')\n")
    (tmp_path / "toy_trigger.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(experiments, "TRITON_KEY_TRIGGER", "toy_trigger")
    stand_ins = ("triton", "triton.runtime", "triton.runtime.cache", "toy_trigger")
    for name in stand_ins:
        monkeypatch.delitem(sys.modules, name, raising=False)
    meta_path = list(sys.meta_path)
    try:
        experiments.install("triton_key")
        assert not marker.exists()  # nothing until the trigger's import starts
        import toy_trigger  # noqa: F401

        for thread in [t for t in __import__("threading").enumerate() if t.name == "triton-key"]:
            thread.join(timeout=10)
        assert marker.read_text() == "key"
    finally:
        sys.meta_path[:] = meta_path
        for name in stand_ins:  # the stand-in Triton must not outlive this test in this process
            sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "text",
    ["eager:no_qualname", "faster", "eager:m:f;sometimes"],
)
def test_an_experiment_it_cannot_read_is_refused_with_its_text(text):
    with pytest.raises(ValueError, match="GDNCTL_STARTUP_EXPERIMENT"):
        load_experiments().parse(text)


def test_experiments_are_read_from_their_text():
    assert load_experiments().parse("eager:a.b:f, a.b:C.g ; triton_key;qwen_bridges") == (
        [("a.b", "f"), ("a.b", "C.g")],
        {"triton_key", "qwen_bridges"},
    )


def test_a_value_it_cannot_read_stops_the_process_before_it_runs(tmp_path):
    done = run_with(tmp_path, "eagr:toy_fused:kept", check=False)
    assert done.returncode != 0 and done.stdout == ""
    assert "startup experiment: GDNCTL_STARTUP_EXPERIMENT: 'eagr:toy_fused:kept' is none of" in done.stderr


def test_an_experiment_that_fails_says_so_and_the_import_goes_on(tmp_path, monkeypatch, capsys):
    experiments = load_experiments()
    (tmp_path / "toy_plain.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_plain", raising=False)

    def broken(*_):
        raise RuntimeError("no GPU here")

    hooks = experiments._OnImport()
    hooks.before["toy_plain"] = [broken]
    hooks.after["toy_plain"] = [broken]
    sys.meta_path.insert(0, hooks)
    try:
        import toy_plain

        assert toy_plain.VALUE == 7
    finally:
        sys.meta_path.remove(hooks)
        sys.modules.pop("toy_plain", None)
    assert capsys.readouterr().err.count("startup experiment: broken: failed (RuntimeError: no GPU here)") == 2


# A package laid out like megatron-bridge 0.6.2 for `qwen_bridges` (megatron-bridge needs Python 3.12 and
# Transformer Engine); each module says when it runs.
BRIDGE_TREE = {
    "megatron/bridge/__init__.py": """
        import megatron.bridge.models
        from megatron.bridge.models.conversion.auto_bridge import AutoBridge
        __version__ = "0.6.2"
        print("megatron.bridge's __init__")
    """,
    "megatron/bridge/models/__init__.py": """
        import megatron.bridge.models.other_models
        import megatron.bridge.models.qwen
        from megatron.bridge.models.gpt_provider import GPTModelProvider
        print("megatron.bridge.models's __init__")
    """,
    "megatron/bridge/models/other_models.py": 'print("every other model")\n',
    "megatron/bridge/models/gpt_provider.py": "class GPTModelProvider:\n    pass\n",
    "megatron/bridge/models/conversion/__init__.py": "",
    "megatron/bridge/models/conversion/model_bridge.py": "REGISTRY = []\n",
    "megatron/bridge/models/conversion/auto_bridge.py": """
        from megatron.bridge.models.conversion.model_bridge import REGISTRY
        from megatron.bridge.models.gpt_provider import GPTModelProvider
        class AutoBridge:
            registry = REGISTRY
    """,
    "megatron/bridge/models/qwen/__init__.py": """
        from megatron.bridge.models.conversion.model_bridge import REGISTRY
        REGISTRY.append("Qwen3_5MoeForCausalLM")
        print("the qwen bridges")
    """,
    "megatron/bridge/training/__init__.py": "",
    "megatron/bridge/training/config.py": "from megatron.bridge.models import GPTModelProvider\n",
}


def run_with_bridges(tmp_path: Path, code: str) -> list[str]:
    """`code` in a fresh interpreter with `qwen_bridges` on and the stand-in megatron-bridge first on its path;
    what it printed, and the experiment's line on stderr checked."""
    for path, source in BRIDGE_TREE.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source))
    env = {
        **os.environ,
        "GDNCTL_STARTUP_EXPERIMENT": "qwen_bridges",
        "PYTHONPATH": os.pathsep.join([str(FOLDER), str(tmp_path)]),
    }
    env.pop("GDNCTL_STARTUP_PROFILE", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "startup experiment: qwen_bridges: megatron-bridge's package imports wait" in done.stderr
    return done.stdout.splitlines()


def test_qwen_bridges_serves_auto_bridge_with_the_qwen_bridges_and_nothing_else(tmp_path):
    said = run_with_bridges(
        tmp_path,
        """
        import megatron.bridge  # what a check that megatron-bridge imports does
        from megatron.bridge import AutoBridge
        print("registry", AutoBridge.registry)
        """,
    )
    assert said == ["the qwen bridges", "registry ['Qwen3_5MoeForCausalLM']"]


def test_qwen_bridges_runs_a_package_init_when_one_of_its_names_is_needed(tmp_path):
    said = run_with_bridges(
        tmp_path,
        """
        from megatron.bridge import AutoBridge
        import megatron.bridge.training.config as config  # from megatron.bridge.models import GPTModelProvider
        import megatron.bridge.models.gpt_provider as gpt_provider
        print("same class", config.GPTModelProvider is gpt_provider.GPTModelProvider)
        from megatron.bridge import __version__
        import sys
        print("version", __version__, sys.modules["megatron.bridge"].AutoBridge is AutoBridge)
        """,
    )
    assert said == [
        "the qwen bridges",
        "every other model",
        "megatron.bridge.models's __init__",
        "same class True",
        "megatron.bridge's __init__",
        "version 0.6.2 True",
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "from megatron.bridge.models import qwen",
        "import megatron.bridge.models.qwen",
        "import inspect, megatron.bridge; inspect.unwrap(megatron.bridge)",  # probes __wrapped__
    ],
)
def test_qwen_bridges_leaves_the_inits_waiting_for_a_submodule_or_a_probe(tmp_path, statement):
    assert run_with_bridges(tmp_path, f"{statement}\nprint('still waiting')\n")[-1:] == ["still waiting"]
    assert "every other model" not in run_with_bridges(tmp_path, statement)


def test_qwen_bridges_says_why_not_where_megatron_bridge_is_not_installed(tmp_path):
    env = {**os.environ, "GDNCTL_STARTUP_EXPERIMENT": "qwen_bridges", "PYTHONPATH": str(FOLDER)}
    env.pop("GDNCTL_STARTUP_PROFILE", None)
    code = "import importlib.util; print(importlib.util.find_spec('megatron.bridge') is None)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    if done.stdout.strip() != "True":
        pytest.skip("this interpreter has megatron-bridge installed")  # CI's Python 3.11 cannot
    assert "startup experiment: qwen_bridges_only: failed (ImportError: megatron.bridge is not an installed" in (
        done.stderr
    )
