"""What every command promises whatever happens: --json is one JSON object on stdout for every outcome, a
crash is told apart from an invalid preset, and --force never replaces a directory gdnctl did not write."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnctl import cli
from gdnctl.cli import INTERNAL_ERROR_EXIT, app

runner = CliRunner()
# TP 4 over qwen3.5-35b-a3b-grpo's 2 KV heads, which megatron-bridge 0.4's Qwen3.5 provider refuses: HEAD002, an error
TP4 = ["--set", "parallel.tp=4", "--set", "runtime.megatron_bridge=0.4.1"]


def _one_json_object(stdout: str) -> dict:
    data = json.loads(stdout)  # raises unless stdout is exactly one JSON document
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    "args, exit_code",
    [
        (["validate", "qwen3.5-35b-a3b-grpo", *TP4], 1),
        (["validate", "no-such-preset.yaml"], 2),
        (["explain", "qwen3.5-35b-a3b-grpo", *TP4], 1),
        (["explain", "no-such-preset.yaml"], 2),
        (["render", "qwen3.5-35b-a3b-grpo", "-o", "{tmp}/run", *TP4], 1),
        (["render", "no-such-preset.yaml", "-o", "{tmp}/run"], 2),
        (["launch", "qwen3.5-35b-a3b-grpo", "--dry-run", *TP4], 1),
        (["launch", "selftest-cpu", "--then-run"], 2),  # --then-run without --smoke
        (["prewarm", "qwen3.5-35b-a3b-grpo", *TP4], 1),
        (["prewarm", "selftest-cpu"], 2),
        (["rules", "NOPE001"], 2),
        (["comm-report", "{tmp}/nothing-here"], 2),
        (["doctor", "no-such-preset.yaml"], 2),
        (["validate"], 2),  # a usage error: missing argument
    ],
)
def test_json_is_one_object_on_stdout_for_every_outcome(tmp_path, args, exit_code):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == exit_code, result.output
    data = _one_json_object(result.stdout)
    assert data["ok"] is False
    if "error" in data:
        assert data["exit_code"] == exit_code and data["error"]


def test_render_json_with_errors_carries_the_findings(tmp_path):
    result = runner.invoke(app, ["render", "qwen3.5-35b-a3b-grpo", "-o", str(tmp_path / "run"), *TP4, "--json"])
    data = _one_json_object(result.stdout)
    assert [f["code"] for f in data["findings"] if f["severity"] == "error"] == ["HEAD002"]
    assert "nothing was rendered" in data["error"]
    assert not (tmp_path / "run").exists()


def test_a_crash_exits_with_its_own_code_and_asks_for_a_bug_report(monkeypatch):
    """A bug (here: an exception planted in the pipeline) is neither 1 (invalid preset) nor 2 (bad input)."""

    def broken(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr("gdnctl.validate.validate", broken)
    result = runner.invoke(app, ["validate", "selftest-cpu"])
    assert result.exit_code == INTERNAL_ERROR_EXIT
    assert "internal error (ZeroDivisionError): this is a bug in gdnctl" in result.stderr
    assert "Traceback" in result.stderr
    as_json = runner.invoke(app, ["validate", "selftest-cpu", "--json"])
    assert as_json.exit_code == INTERNAL_ERROR_EXIT
    assert _one_json_object(as_json.stdout)["internal_error"] is True


def test_the_installed_command_exits_70_on_a_crash(tmp_path):
    """The same through the real entry point, in a fresh interpreter (no test runner in between)."""
    code = (
        "import sys, gdnctl.validate as v\n"
        "def broken(*a, **k):\n    raise KeyError('planted')\n"
        "v.validate = broken\n"
        "from gdnctl.cli import main\nsys.argv = ['gdnctl', 'validate', 'selftest-cpu']\nmain()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == INTERNAL_ERROR_EXIT, proc.stderr
    assert "this is a bug in gdnctl" in proc.stderr


def _source_tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "model.py").write_text("print('mine')\n")
    (root / "notes.txt").write_text("notes\n")
    return root


def test_force_refuses_a_directory_gdnctl_did_not_write(tmp_path):
    tree = _source_tree(tmp_path / "project")
    result = runner.invoke(app, ["render", "selftest-cpu", "-o", str(tree), "--force"])
    assert result.exit_code == 2
    assert "is not a gdnctl run dir" in result.stderr
    assert (tree / "src" / "model.py").read_text() == "print('mine')\n"
    assert (tree / "notes.txt").exists()
    assert sorted(p.name for p in tree.iterdir()) == ["notes.txt", "src"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging dir left behind


def test_force_refuses_the_current_directory_of_a_source_tree(tmp_path, monkeypatch):
    tree = _source_tree(tmp_path / "project")
    monkeypatch.chdir(tree)
    result = runner.invoke(app, ["render", "selftest-cpu", "-o", ".", "--force"])
    assert result.exit_code == 2 and (tree / "src" / "model.py").exists()


def test_force_replaces_a_run_dir_gdnctl_rendered(tmp_path):
    run_dir = tmp_path / "run"
    assert runner.invoke(app, ["render", "selftest-cpu", "-o", str(run_dir)]).exit_code == 0
    (run_dir / "logs" / "old.out").write_text("from the last job\n")
    again = runner.invoke(app, ["render", "selftest-cpu", "-o", str(run_dir), "--force", "--set", "name=renamed"])
    assert again.exit_code == 0, again.output
    assert json.loads((run_dir / "manifest.json").read_text())["resolved"]["name"] == "renamed"
    assert (run_dir / "logs" / "old.out").read_text() == "from the last job\n"  # the job's, not gdnctl's to delete


def test_force_refuses_a_forged_manifest_that_is_not_gdnctls(tmp_path):
    tree = _source_tree(tmp_path / "project")
    (tree / "manifest.json").write_text(json.dumps({"name": "someone else's"}))
    result = runner.invoke(app, ["render", "selftest-cpu", "-o", str(tree), "--force"])
    assert result.exit_code == 2 and (tree / "src").exists()


def test_cli_module_reports_one_exit_code_per_outcome():
    assert len({0, 1, 2, INTERNAL_ERROR_EXIT}) == 4 and cli.INTERNAL_ERROR_EXIT == 70
