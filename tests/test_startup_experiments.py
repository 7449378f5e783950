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
    assert load_experiments().parse("eager:a.b:f, a.b:C.g ; triton_key") == ([("a.b", "f"), ("a.b", "C.g")], True)


def test_a_value_it_cannot_read_stops_the_process_before_it_runs(tmp_path):
    done = run_with(tmp_path, "eagr:toy_fused:kept", check=False)
    assert done.returncode != 0 and done.stdout == ""
    assert "startup experiment: GDNCTL_STARTUP_EXPERIMENT: 'eagr:toy_fused:kept' is neither" in done.stderr


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
