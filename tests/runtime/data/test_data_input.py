"""The trainer's data readers on files that break them: every failure is a DataError naming the file (and the
line or row), never a raw ValueError, RecursionError, RuntimeError or pyarrow error, and no FIFO blocks a rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest
import tokenizers

from gdnctl.runtime.data import pipeline as data
from gdnctl.runtime.data.pipeline import DataError

VOCAB_SIZE = 64


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["the cat sat"], tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>"]))
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("[" * 100_000, "nests its JSON deeper than a reader can follow"),
        ('{"input_ids": [' + "9" * 5000 + "]}", "is not usable JSON"),
        ('{"input_ids": [1, ' + str(2**70) + "]}", r"has a token id beyond 64-bit integers \(from input_ids\)"),
        ('{"input_ids": [1, ' + str(-(2**70)) + "]}", "has a token id beyond 64-bit integers"),
    ],
)
def test_a_record_no_reader_can_take_is_named_by_its_line(tmp_path, line, said):
    path = tmp_path / "train.jsonl"
    path.write_text('{"input_ids": [1, 2]}\n' + line + "\n")
    with pytest.raises(DataError, match=said) as raised:
        data.read_documents(path, vocab_size=VOCAB_SIZE)
    assert str(raised.value).startswith(f"{path} line 2 ")


def test_a_data_path_that_is_no_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=f"data file {fifo} is not a regular file; set train.data_path"):
        data.read_documents(fifo, vocab_size=VOCAB_SIZE)
    directory = tmp_path / "dir.jsonl"
    directory.mkdir()
    with pytest.raises(DataError, match="is not a regular file"):
        data.read_documents(directory, vocab_size=VOCAB_SIZE)


def _parquet(path: Path, row_groups: int) -> Path:
    table = pyarrow.table({"input_ids": [[1, 2, 3, 4, 5, 6, 7, 8]] * 64})
    pyarrow.parquet.write_table(table, path, row_group_size=64 // row_groups, compression="NONE", use_dictionary=False)
    return path


def test_a_parquet_file_damaged_past_its_footer_is_named(tmp_path):
    path = _parquet(tmp_path / "train.parquet", row_groups=2)
    metadata = pyarrow.parquet.ParquetFile(path).metadata
    second = metadata.row_group(1).column(0)
    raw = bytearray(path.read_bytes())
    start = second.data_page_offset
    raw[start : start + 24] = b"\xff" * 24  # the second row group's page header: read only after the first's rows
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=f"{path} cannot be read as parquet"):
        data.read_documents(path, vocab_size=VOCAB_SIZE)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"eos_token": 5}, "names eos_token 5, which is not a token's text"),
        ({"eos_token": {"content": ["</s>"]}}, r"names eos_token \['</s>'\]"),
        ("[" * 100_000, "nests its JSON deeper than a reader can follow"),
        (b'{"eos_token": "\xff"}', "is not UTF-8 text"),
    ],
)
def test_a_tokenizer_config_no_reader_can_take_is_named(tmp_path, tokenizer_file, config, said):
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    text = config if isinstance(config, (str, bytes)) else json.dumps(config)
    (directory / "tokenizer_config.json").write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(DataError, match=said) as raised:
        data.load_tokenizer(directory)
    assert str(directory / "tokenizer_config.json") in str(raised.value)


def test_tokenizer_files_that_are_no_regular_files_are_refused(tmp_path, tokenizer_file):
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "tokenizer.json")
    with pytest.raises(DataError, match="is a named pipe .FIFO., not a regular file; set model.tokenizer"):
        data.load_tokenizer(fifo_dir)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(DataError, match="is a device, not a regular file"):
        data.load_tokenizer(zero)
    config_fifo = tmp_path / "config_fifo"
    config_fifo.mkdir()
    (config_fifo / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    os.mkfifo(config_fifo / "tokenizer_config.json")
    with pytest.raises(DataError, match="tokenizer_config.json is a named pipe"):
        data.load_tokenizer(config_fifo)
