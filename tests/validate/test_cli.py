"""The compiler's commands as a user runs them: exit codes, JSON shape, rules, schema, presets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.resources import presets_dir
from gdnctl.validate.findings import RULES

runner = CliRunner()
SHIPPED = sorted(p.stem for p in presets_dir().glob("*.yaml"))


def invoke(*args):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_presets_are_valid(name):
    result = invoke("validate", name, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, data["findings"]
    assert data["ok"] is True and not [f for f in data["findings"] if f["severity"] == "error"]


def test_validate_json_shape():
    result = invoke("validate", "qwen3.5-35b-a3b-grpo", "--set", "parallel.tp=3", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert set(data) == {"preset", "ok", "findings", "resolved"} and data["ok"] is False
    assert {"dp", "layout", "world_size"} <= set(data["resolved"])
    for finding in data["findings"]:
        assert {"code", "severity", "path", "message", "hint"} <= set(finding)
        assert finding["severity"] in ("error", "warning", "info")


def test_validate_text_groups_by_severity():
    result = invoke("validate", "qwen3.5-35b-a3b-grpo", "--set", "parallel.tp=3", "--set", "rollout.python=null")
    out = result.stdout
    assert result.exit_code == 1
    assert out.index("errors (") < out.index("notes (")
    assert "HEAD002" in out and "fix:" in out and "invalid" in out.splitlines()[-1]


def test_strict_fails_on_warnings():
    args = ("validate", "qwen3.5-35b-a3b-grpo", "--set", "rollout.gdn_prefill_backend=null")
    assert invoke(*args).exit_code == 0
    result = invoke(*args, "--strict", "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["ok"] is False


def test_unreadable_file_exits_2(tmp_path):
    result = invoke("validate", str(tmp_path / "missing.yaml"))
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_bad_arguments_exit_2():
    assert invoke("validate").exit_code == 2
    assert invoke("validate", "selftest-cpu", "--bogus").exit_code == 2


def test_explain_reasons_and_memory():
    result = invoke("explain", "qwen3.5-35b-a3b-grpo", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0
    derived = {d["name"]: d for d in data["derived"]}
    # rl trains padded rows whatever train.layout says; sft takes the layout megatron-core allows.
    assert derived["layout"]["value"] == "padded rows (bshd)" and "not read" in derived["layout"]["reason"]
    assert derived["dp"]["value"] == 4
    assert {r["name"] for r in data["memory"]["rows"]} >= {"weights", "gradients", "optimizer", "activations"}
    sft = {d["name"]: d for d in json.loads(invoke("explain", "qwen3.5-35b-a3b-sft", "--json").stdout)["derived"]}
    assert sft["layout"]["value"] == "thd" and "0.18" in sft["layout"]["reason"]
    text = invoke(
        "explain",
        "qwen3.5-35b-a3b-sft",
        "--set",
        "runtime.megatron_core=0.17.0",
        "--set",
        "runtime.megatron_bridge=0.4.0",
    ).stdout
    assert "bshd" in text and "NotImplementedError" in text and "memory per GPU" in text


def test_rules_list_and_doc():
    listing = invoke("rules", "--json")
    assert {r["code"] for r in json.loads(listing.stdout)} == set(RULES)
    doc = invoke("rules", "head002")
    assert doc.exit_code == 0 and "megatron-bridge >= 0.5" in " ".join(doc.stdout.split()) and "Fix:" in doc.stdout
    missing = invoke("rules", "HEAD02")
    assert missing.exit_code == 2 and "Did you mean" in missing.stderr


def test_schema_is_json_schema():
    data = json.loads(invoke("schema").stdout)
    assert data["type"] == "object" and "parallel" in data["properties"] and "base" in data["properties"]


def test_presets_list_show_cp(tmp_path):
    listing = json.loads(invoke("presets", "list", "--json").stdout)
    assert {r["name"] for r in listing} == set(SHIPPED)
    assert "job: rl" in invoke("presets", "show", "qwen3.5-35b-a3b-grpo").stdout
    assert invoke("presets", "cp", "selftest-cpu", str(tmp_path)).exit_code == 0
    assert (tmp_path / "selftest-cpu.yaml").is_file()
    again = invoke("presets", "cp", "selftest-cpu", str(tmp_path))
    assert again.exit_code == 2 and "--force" in again.stderr
    assert invoke("presets", "show", "nope").exit_code == 2


def test_example_builds_on_a_shipped_preset():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "my-35b-grpo.yaml"
    data = json.loads(invoke("validate", str(example), "--json").stdout)
    assert data["ok"] and data["resolved"]["model"] == "Qwen/Qwen3.5-35B-A3B"


def test_validate_imports_no_heavy_package():
    code = (
        "import sys\nfrom gdnctl.cli import main\nsys.argv=['gdnctl','validate','qwen3.5-35b-a3b-grpo']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy=[m for m in ('torch','megatron','fla','flash_qla','vllm','transformers','tilelang') "
        "if m in sys.modules]\nprint('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_docs_rule_table_is_the_generated_one():
    """docs/rules.md's rule table is `gdnctl rules --markdown`'s output, so it cannot drift from the rules' code and
    docs; after changing a rule, paste that output over the table."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text().splitlines()
    start = page.index("| code | severity | checks | source |")
    end = next((i for i in range(start, len(page)) if not page[i].startswith("|")), len(page))
    result = invoke("rules", "--markdown")
    assert result.exit_code == 0
    assert "\n".join(page[start:end]) == result.stdout.strip(), (
        "docs/rules.md's rules table differs from `gdnctl rules --markdown`: replace it with that output"
    )


def test_rules_markdown_table():
    lines = invoke("rules", "--markdown").stdout.strip().splitlines()
    assert lines[:2] == ["| code | severity | checks | source |", "|---|---|---|---|"]
    codes = [line.split(" | ")[0].removeprefix("| ") for line in lines[2:]]
    assert codes == sorted(RULES)
    assert all(line.count(" | ") == 3 for line in lines[2:])  # pipes inside the text are escaped
    assert "vllm #38916" in lines[2 + codes.index("RLT004")]
    assert invoke("rules", "HEAD002", "--markdown").exit_code == 2
    listing = json.loads(invoke("rules", "--json").stdout)
    assert {r["code"]: r["source"] for r in listing} == {code: info.source for code, info in RULES.items()}


def test_rule_table_escapes_pipes():
    from gdnctl.validate import format_rule_table
    from gdnctl.validate.findings import RuleInfo, Severity

    info = RuleInfo("X001", "x", Severity.INFO, "a | b", "c", "Why: y.\n\nSource: s|t\n  u.\n\nFix: f.", None)
    assert info.source == "s|t u."
    assert format_rule_table([info]).splitlines()[-1] == r"| X001 | info | a \| b | s\|t u. |"
