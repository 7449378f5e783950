"""What users read says only what they can check.

Docs, `--help`, the schema's descriptions and `gdnctl rules` carry no work-log labels ("session 4"), none of this
project's issue numbers and no file users do not have (upstream citations such as "slime PR #1947" are sources and
stay); every YAML block in README.md and docs/ parses, and each that is a preset validates.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.validate.codes import RETIRED
from gdnctl.validate.findings import RULES

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

# A work-log label ("session 10"), this project's own issue numbers ("issue 15"; an upstream one is cited with its
# repository and '#'), a file that lives outside the repository, and a machine path.
FORBIDDEN = {
    "work-log label": re.compile(r"\bsessions? \d+", re.IGNORECASE),
    "this project's issue number": re.compile(r"\bissues? \d+", re.IGNORECASE),
    # (spelled with a class so that a grep of the repository for the file's name finds no user-visible text here)
    "a file users do not have": re.compile(r"F[A]CTS(\.md)?\b|\bseeds?/"),
    "a machine path": re.compile(r"/work/|\.\./shared/"),
}


def _doc_files() -> list[Path]:
    names = ["README.md", "BENCHMARKS.md", "ARCHITECTURE.md", "CONTRIBUTING.md"]
    return (
        [ROOT / n for n in names if (ROOT / n).exists()]
        + sorted((ROOT / "docs").glob("*.md"))
        + sorted((ROOT / "benchmarks" / "results").rglob("*.md"))
    )


def _help_texts() -> dict[str, str]:
    """`--help` of gdnctl and of every command and sub-command, as a user sees it."""
    texts = {"gdnctl --help": runner.invoke(app, ["--help"]).output}

    def walk(command, path: list[str]) -> None:
        # typer's groups (its own click) and click's both keep their sub-commands in `commands`.
        for name, sub in getattr(command, "commands", {}).items():
            texts[" ".join(["gdnctl", *path, name, "--help"])] = runner.invoke(app, [*path, name, "--help"]).output
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return texts


def _user_texts() -> dict[str, str]:
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in _doc_files()}
    texts.update(_help_texts())
    texts["gdnctl schema"] = runner.invoke(app, ["schema"]).output
    for info in RULES.values():
        texts[f"gdnctl rules {info.code}"] = f"{info.summary}\n{info.doc}"
    texts["retired codes"] = "\n".join(RETIRED.values())
    return texts


def test_user_visible_text_cites_only_what_users_can_check():
    found = []
    for where, text in _user_texts().items():
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{where}:{line}: {what}: {match.group(0)!r}")
    assert not found, "user-visible text names what users cannot check:\n" + "\n".join(found)


def test_the_scan_sees_every_command_help():
    helps = _help_texts()
    assert "gdnctl validate --help" in helps and "gdnctl presets cp --help" in helps
    assert all(text.startswith("Usage:") for text in helps.values()), "a --help did not print its usage"


def _yaml_blocks() -> list[tuple[str, int, str]]:
    blocks = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for match in re.finditer(r"^```ya?ml\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            blocks.append((str(path.relative_to(ROOT)), text.count("\n", 0, match.start()) + 1, match.group(1)))
    return blocks


def test_the_docs_have_yaml_blocks():
    assert any(where == "README.md" for where, _, _ in _yaml_blocks())


@pytest.mark.parametrize(("where", "line", "block"), _yaml_blocks(), ids=lambda v: str(v)[:40])
def test_every_yaml_block_parses_and_each_preset_validates(where, line, block, tmp_path):
    data = yaml.safe_load(block)
    assert isinstance(data, dict), f"{where}:{line}: a YAML block that is not a mapping"
    if not ({"base", "model"} & data.keys()):
        return  # a fragment (one section of a preset), not a preset
    preset = tmp_path / "preset.yaml"
    preset.write_text(block)
    result = runner.invoke(app, ["validate", str(preset)])
    assert result.exit_code == 0, f"{where}:{line}: the preset does not validate:\n{result.output}"


# The smoke run's example in docs/smoke.md is a real run's output. Its measured values (times, memory, losses,
# gaps) depend on the machine and its float reductions, so they are compared as "#"; everything else (what was
# checked, how many syncs, parameters and tensors, the verdicts) must be what the command prints today. How many
# of the parameters vLLM's CPU build shows whole depends on the CPU too: its kernels pack some weights only where
# the instruction set has what they need (24 of the tiny model's 43 on one host, all 43 on another), so that
# count and its note are compared as "#" as well.
VLLM_PYTHON = os.environ.get("GDNCTL_TEST_VLLM_PYTHON")
_MEASURED = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")  # a loss near 0 prints in exponent form (-7.45e-10)
_VISIBLE_PARAMETERS = re.compile(r"\d+ of (\d+) parameters match( \(the other \d+ are not visible whole[^)]*\))?")


def _smoke_lines(text: str) -> list[str]:
    return [
        _MEASURED.sub("#", _VISIBLE_PARAMETERS.sub(r"# of \1 parameters match", line))
        for line in text.splitlines()
        if line.startswith("smoke: ")
    ]


def _documented_smoke() -> str:
    page = (ROOT / "docs" / "smoke.md").read_text()
    return page[page.index("```\nsmoke: ") + 4 : page.index("```", page.index("```\nsmoke: ") + 4)]


def test_the_documented_smoke_example_has_every_check():
    lines = _smoke_lines(_documented_smoke())
    assert [line.split(" ok ")[0] for line in lines[:5]] == [
        "smoke: job start",
        "smoke: weight sync",
        "smoke: step-0 log-prob gap",
        "smoke: optimizer steps",
        "smoke: checkpoint save+load",
    ]
    assert lines[-1].startswith("smoke: green: 5 ok")


@pytest.mark.skipif(not VLLM_PYTHON, reason="GDNCTL_TEST_VLLM_PYTHON is not set (no vLLM CPU venv)")
def test_the_documented_smoke_example_is_what_the_smoke_run_prints(rl_smoke_run):
    # The run tests/launch/test_smoke.py reads too (tests/conftest.py): the command, with a train.save_dir that the
    # smoke leaves untouched and its lines do not name.
    _, _, done = rl_smoke_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _smoke_lines(done.stdout) == _smoke_lines(_documented_smoke()), (
        "docs/smoke.md's example is not what `gdnctl launch tiny-qwen3.5-rl-cpu --smoke` prints: paste a new run"
    )


def test_the_documented_compile_lines_are_what_gdnctl_prints():
    """docs/doctor.md's compile example, line by line, from the functions that print those lines (the seconds and
    counts in the example are its arguments)."""
    from gdnctl.runtime.kernels.compile_log import COMPILE_LOG_NAME
    from gdnctl.runtime.kernels.compile_progress import (
        compile_estimate,
        expected_kernels,
        kernel_progress_line,
        shape_ready_line,
    )

    page = (ROOT / "docs" / "doctor.md").read_text()
    start = page.index("```\nFlashQLA kernels for ") + 4
    lines = [line for line in page[start : page.index("```", start)].splitlines() if line != "..."]
    cache = Path("/shared/tilelang")
    expected = expected_kernels(qk_heads=8, v_heads=8)
    assert lines == [
        compile_estimate(2, cache, 0, "gdnctl prewarm tiny-qwen3.5-sft"),
        f"compiler output goes to {cache / COMPILE_LOG_NAME}",
        "[1/2] tp1-1x1024: 8 q/k heads, 8 v heads, 1024 tokens",
        kernel_progress_line("tp1-1x1024", 1, expected, "chunk_local_cumsum", 2),
        kernel_progress_line("tp1-1x1024", 2, expected, "kkt_solve", 9),
        kernel_progress_line("tp1-1x1024", expected + 1, expected, "prepare_dh", 96),
        shape_ready_line("tp1-1x1024", 11, 127),
    ]


def test_the_readme_states_the_python_versions_that_pyproject_and_doctor_hold():
    """The CLI's floor is pyproject's requires-python; the trainer's is the one doctor asks for (megatron-core >= 0.17
    and megatron-bridge need 3.12), so the set-up paragraph cannot drift from either."""
    import tomllib

    from gdnctl.doctor.checks import MEGATRON_PYTHON

    readme = (ROOT / "README.md").read_text()
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert floor.startswith(">=") and f"Python >= {floor.removeprefix('>=')}" in readme
    assert f"the GPU trainer's pinned stack needs {MEGATRON_PYTHON}" in readme


# --- where measured figures are cited -----------------------------------------------------------------------------
# A campaign's file under benchmarks/results/ is cited by its path, which never changes; BENCHMARKS.md's sections are
# not cited by title (a title is rewritten when a campaign is superseded).
RESULTS = ROOT / "benchmarks" / "results"
CITED_CAMPAIGN = re.compile(r"results/([A-Za-z0-9._-]+\.md)")
SECTION_TITLE_CITATION = re.compile(r"BENCHMARKS\.md,?\s+\"")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _repository_texts() -> dict[str, str]:
    paths = [
        p for part in ("gdnctl", "tests", "benchmarks", "docs", "templates", "tools") for p in (ROOT / part).rglob("*")
    ]
    paths += [ROOT / name for name in ("README.md", "BENCHMARKS.md", "ARCHITECTURE.md", "CONTRIBUTING.md")]
    texts = {}
    for path in paths:
        if (
            path.is_file()
            and path.suffix in {".py", ".md", ".sh", ".j2", ".yaml", ".toml"}
            and "__pycache__" not in path.parts
        ):
            texts[str(path.relative_to(ROOT))] = path.read_text(errors="replace")
    return texts


def test_every_cited_benchmark_campaign_exists():
    missing = [
        f"{where}: {match.group(1)}"
        for where, text in _repository_texts().items()
        for match in CITED_CAMPAIGN.finditer(text)
        if not (RESULTS / match.group(1)).is_file()
    ]
    assert missing == []


def test_nothing_cites_a_benchmarks_section_by_its_title():
    found = [
        f"{where}:{text.count(chr(10), 0, match.start()) + 1}"
        for where, text in _repository_texts().items()
        if where != "tests/test_docs.py"
        for match in SECTION_TITLE_CITATION.finditer(text)
    ]
    assert found == [], "cite the campaign's file under benchmarks/results/ instead"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_the_benchmark_pages_links_resolve():
    pages = [
        ROOT / "BENCHMARKS.md",
        ROOT / "README.md",
        *sorted(RESULTS.rglob("*.md")),
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    broken = []
    for page in pages:
        for match in MARKDOWN_LINK.finditer(page.read_text()):
            target = match.group(1)
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists() or (anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_each_campaign_file_names_its_date():
    undated = [
        page.name
        for page in RESULTS.glob("*.md")
        if page.name != "README.md"
        and not (re.search(r"\d{4}-\d{2}-\d{2}", page.name) and re.search(r"\d{4}-\d{2}-\d{2}", page.read_text()))
    ]
    assert undated == []
