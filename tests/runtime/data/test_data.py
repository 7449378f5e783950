"""The trainer's data pipeline: reading and validating local files, and the micro-batch stream (hypothesis)."""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import pyarrow
import pyarrow.parquet  # noqa: F401  (registers pyarrow.parquet for the parquet test)
import pytest
import tokenizers
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdnctl.runtime.data import layout
from gdnctl.runtime.data import pipeline as data
from gdnctl.runtime.data.layout import IGNORE_INDEX
from gdnctl.runtime.data.pipeline import DataError, DataPipeline, Document
from tests.runtime.engine_fixture import tiny_engine_config

SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the answer is four", "what is two plus two"]
VOCAB_SIZE = 64


def _train_tokenizer(directory: Path, special_tokens: list[str]) -> Path:
    """A real WordLevel tokenizer over SENTENCES, saved as directory/tokenizer.json."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["<unk>", *special_tokens])
    tokenizer.train_from_iterator(SENTENCES, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train_tokenizer(tmp_path_factory.mktemp("tokenizer"), ["<|endoftext|>", "<|im_end|>"])


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def _ids(tokenizer_dir: Path, text: str) -> list[int]:
    return data.load_tokenizer(tokenizer_dir).encode(text)


# Reading files


def test_every_record_form_becomes_a_document(tmp_path, tokenizer_dir):
    path = _write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"input_ids": [5, 6, 7]},
            {"input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]},
            {"text": "the cat sat"},
            {"prompt": "what is two plus two", "response": "four"},
        ],
    )
    (tmp_path / "train.jsonl").write_text(path.read_text() + "\n")  # a trailing blank line holds no record
    documents = data.read_documents(path, vocab_size=VOCAB_SIZE, tokenizer_path=tokenizer_dir)
    eos = data.load_tokenizer(tokenizer_dir).eos_id
    prompt, response = _ids(tokenizer_dir, "what is two plus two"), _ids(tokenizer_dir, "four")
    assert [document.token_ids.tolist() for document in documents] == [
        [5, 6, 7],
        [5, 6, 7, 8],
        [*_ids(tokenizer_dir, "the cat sat"), eos],
        [*prompt, *response, eos],
    ]
    assert [document.trained.tolist() for document in documents] == [
        [True] * 3,
        [False, False, True, True],
        [True] * 4,
        [False] * len(prompt) + [True] * (len(response) + 1),
    ]
    assert documents[0].token_ids.dtype == torch.int32


def test_parquet_reads_like_jsonl(tmp_path, tokenizer_dir):
    records = [
        {"input_ids": [1, 2, 3], "loss_mask": [1, 0, 1]},
        {"text": "a dog ran"},
        {"prompt": "the answer is", "response": "four"},
    ]
    ids, text = pyarrow.list_(pyarrow.int64()), pyarrow.string()
    schema = pyarrow.schema(
        [("input_ids", ids), ("loss_mask", ids), ("text", text), ("prompt", text), ("response", text)]
    )
    table = pyarrow.Table.from_pylist(records, schema=schema)  # a row's missing fields are nulls: read as absent
    pyarrow.parquet.write_table(table, tmp_path / "train.parquet")
    from_parquet = data.read_documents(tmp_path / "train.parquet", vocab_size=VOCAB_SIZE, tokenizer_path=tokenizer_dir)
    from_jsonl = data.read_documents(
        _write_jsonl(tmp_path / "train.jsonl", records), vocab_size=VOCAB_SIZE, tokenizer_path=tokenizer_dir
    )
    assert [(doc.token_ids.tolist(), doc.trained.tolist()) for doc in from_parquet] == [
        (doc.token_ids.tolist(), doc.trained.tolist()) for doc in from_jsonl
    ]
    bad = pyarrow.Table.from_pylist([{"input_ids": [1, 2]}, {"input_ids": [1, VOCAB_SIZE]}])
    pyarrow.parquet.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=f"{tmp_path / 'bad.parquet'} row 2 has token id {VOCAB_SIZE}"):
        data.read_documents(tmp_path / "bad.parquet", vocab_size=VOCAB_SIZE)


def test_eos_comes_from_tokenizer_config_then_known_names_then_nowhere(tmp_path, tokenizer_dir):
    assert data.load_tokenizer(tokenizer_dir).eos_id == _ids(tokenizer_dir, "<|endoftext|>")[0]
    configured = _train_tokenizer(tmp_path / "configured", ["<|endoftext|>", "<|im_end|>"])
    (configured / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    tokenizer = data.load_tokenizer(configured / "tokenizer.json")
    assert tokenizer.eos_id == tokenizer.backend.token_to_id("<|im_end|>")
    assert tokenizer.with_eos([3, tokenizer.eos_id]) == [3, tokenizer.eos_id]  # not doubled
    none = data.load_tokenizer(_train_tokenizer(tmp_path / "none", []))
    assert none.eos_id is None and none.with_eos([3, 4]) == [3, 4]
    (configured / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<missing>"}))
    with pytest.raises(DataError, match="names eos_token '<missing>'"):
        data.load_tokenizer(configured)


ERROR_CASES = {
    "bad json": ('{"input_ids": [1, 2', "is not valid JSON"),
    "not an object": ("[1, 2, 3]", "is a JSON list, not an object"),
    "no field": ('{"tokens": [1, 2]}', "has none of input_ids, text, or prompt and response"),
    "id too large": (f'{{"input_ids": [1, {VOCAB_SIZE}]}}', f"token id {VOCAB_SIZE} .position 1, from input_ids"),
    "negative id": ('{"input_ids": [-1, 2]}', r"token id -1 .position 0"),
    "empty": ('{"input_ids": []}', r"has 0 token\(s\)"),
    "one token": ('{"input_ids": [3]}', r"has 1 token\(s\); a training sequence needs at least 2"),
    "mask length": ('{"input_ids": [1, 2, 3], "loss_mask": [1, 1]}', "has 2 loss_mask values for 3 input_ids"),
    "mask values": ('{"input_ids": [1, 2], "loss_mask": [1, 2]}', "not a list of 0/1 values"),
    "float ids": ('{"input_ids": [1.5, 2]}', "not a list of integers"),
    "no response": ('{"prompt": "the cat"}', "has no response"),
    "text not a string": ('{"text": 5}', "has a text that is not a string"),
    "empty text, no eos": ('{"text": ""}', r"has 0 token\(s\)"),
}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_bad_records_are_refused_naming_the_file_and_line(tmp_path, case):
    line, message = ERROR_CASES[case]
    path = tmp_path / "train.jsonl"
    path.write_text('{"input_ids": [1, 2]}\n\n' + line + "\n")
    tokenizer = _train_tokenizer(tmp_path / "no_eos", [])
    with pytest.raises(DataError, match=message) as raised:
        data.read_documents(path, vocab_size=VOCAB_SIZE, tokenizer_path=tokenizer)
    assert str(raised.value).startswith(f"{path} line 3 ")


def test_text_without_a_tokenizer_and_missing_files_are_refused(tmp_path, tokenizer_dir):
    path = _write_jsonl(tmp_path / "train.jsonl", [{"input_ids": [1, 2]}, {"text": "the cat"}])
    with pytest.raises(DataError, match=f"{path} line 2 has text but model.tokenizer is not set"):
        data.read_documents(path, vocab_size=VOCAB_SIZE)
    with pytest.raises(DataError, match="tokenizer .*nope.json does not exist"):
        data.read_documents(path, vocab_size=VOCAB_SIZE, tokenizer_path=tmp_path / "nope.json")
    text_only = _write_jsonl(tmp_path / "text.jsonl", [{"text": "the cat"}])
    with pytest.raises(DataError, match=rf"{text_only} line 1 has token id \d+ \(position 0, from the tokenizer\)"):
        data.read_documents(text_only, vocab_size=3, tokenizer_path=tokenizer_dir)  # ids 0-2: special tokens
    with pytest.raises(DataError, match="does not exist; set train.data_path"):
        data.read_documents(tmp_path / "missing.jsonl", vocab_size=VOCAB_SIZE)
    (tmp_path / "train.csv").write_text("1,2\n")
    with pytest.raises(DataError, match="neither .jsonl nor .parquet"):
        data.read_documents(tmp_path / "train.csv", vocab_size=VOCAB_SIZE)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="holds no records"):
        data.read_documents(tmp_path / "empty.jsonl", vocab_size=VOCAB_SIZE)


def test_missing_optional_packages_are_named(tmp_path, tokenizer_dir, monkeypatch):
    (tmp_path / "train.parquet").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` raise ImportError
    with pytest.raises(DataError, match="needs pyarrow, which is not installed; pip install pyarrow"):
        data.read_documents(tmp_path / "train.parquet", vocab_size=VOCAB_SIZE)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(DataError, match="pip install tokenizers"):
        data.load_tokenizer(tokenizer_dir)


def test_synthetic_documents_are_seeded_and_in_range():
    def make(seed):
        return data.synthetic_documents(200, vocab_size=VOCAB_SIZE, min_length=3, max_length=50, seed=seed)

    first, again, other = make(7), make(7), make(8)
    assert all(torch.equal(a.token_ids, b.token_ids) for a, b in zip(first, again, strict=True))
    assert any(not torch.equal(a.token_ids, b.token_ids) for a, b in zip(first, other, strict=True))
    lengths = [len(document) for document in first]
    assert min(lengths) >= 3 and max(lengths) <= 50 and len(set(lengths)) > 10
    assert all(int(doc.token_ids.min()) >= 0 and int(doc.token_ids.max()) < VOCAB_SIZE for doc in first)
    fixed = data.synthetic_documents(3, vocab_size=VOCAB_SIZE, min_length=9, max_length=9, seed=0)
    assert [len(document) for document in fixed] == [9, 9, 9]


# The micro-batch stream


def _expected_sequence(document: Document, max_positions: int) -> tuple:
    """What a document must train on, computed here with plain lists: (inputs, labels, loss mask)."""
    tokens, trained = document.token_ids.tolist(), document.trained.tolist()
    positions = min(len(tokens) - 1, max_positions)
    labels = [tokens[i + 1] if trained[i + 1] else IGNORE_INDEX for i in range(positions)]
    return tuple(tokens[:positions]), tuple(labels), tuple(float(t) for t in trained[1 : positions + 1])


def _sample_sequences(micro_batch: data.MicroBatch) -> list[list[tuple]]:
    """The samples of a micro-batch (THD: the one row; BSHD: each row), each as its sequences."""
    thd = micro_batch.batch if micro_batch.is_packed else layout.to_thd(micro_batch.batch)
    sequences = [
        (tuple(s.input_ids.tolist()), tuple(s.labels.tolist()), tuple(s.loss_mask.tolist())) for s in layout.unpack(thd)
    ]
    return [sequences] if micro_batch.is_packed else [[sequence] for sequence in sequences]


def _global_samples(pipeline: DataPipeline, count: int, consumed_samples: int = 0) -> list[list[tuple]]:
    """The first `count` samples after `consumed_samples`, put back in global order from every rank's stream."""
    streams = [pipeline.micro_batches(rank, consumed_samples) for rank in range(pipeline.dp)]
    samples: list[list[tuple]] = []
    while len(samples) < count:
        for stream in streams:
            samples += _sample_sequences(next(stream))
    return samples[:count]


@st.composite
def pipelines(draw, layout_name=None) -> DataPipeline:
    lengths = draw(st.lists(st.integers(2, 30), min_size=1, max_size=14))
    documents = [
        Document(
            torch.tensor(draw(st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=n, max_size=n)), dtype=torch.int32),
            torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n))),
        )
        for n in lengths
    ]
    layout_name = layout_name or draw(st.sampled_from(["thd", "bshd"]))
    micro_batch_size = 1 if layout_name == "thd" else draw(st.integers(1, 3))
    dp = draw(st.integers(1, 3))
    return DataPipeline(
        documents,
        layout=layout_name,
        seq_length=draw(st.integers(8, 40)),
        micro_batch_size=micro_batch_size,
        global_batch_size=micro_batch_size * dp * draw(st.integers(1, 3)),
        dp=dp,
        seed=draw(st.integers(0, 2**32)),
        pad_sequences_to_multiple_of=draw(st.sampled_from([1, 2, 4])),
    )


@settings(max_examples=40, deadline=None)
@given(pipelines())
def test_every_document_is_trained_exactly_once_per_epoch_across_ranks(pipeline):
    expected = Counter(_expected_sequence(document, pipeline.max_positions) for document in pipeline.documents)
    epochs = [pipeline.epoch_samples(epoch) for epoch in range(2)]
    for samples in epochs:
        trained = [
            _expected_sequence(pipeline.documents[index], pipeline.max_positions)
            for sample in samples
            for index, _, _ in sample
        ]
        assert Counter(trained) == expected
    # and the ranks' micro-batches, put back in order, are exactly those epochs one after the other
    planned = [
        [_expected_sequence(pipeline.documents[index], pipeline.max_positions) for index, _, _ in sample]
        for samples in epochs
        for sample in samples
    ]
    assert _global_samples(pipeline, len(planned)) == planned


@settings(max_examples=40, deadline=None)
@given(pipelines())
def test_micro_batches_fit_the_row_and_line_labels_up_with_tokens(pipeline):
    multiple, stream = pipeline.pad_sequences_to_multiple_of, pipeline.micro_batches(pipeline.dp - 1)
    for micro_batch in (next(stream) for _ in range(6)):
        tokens, labels, loss_mask = micro_batch.tokens, micro_batch.labels, micro_batch.loss_mask
        assert tokens.shape == labels.shape == loss_mask.shape == micro_batch.position_ids.shape
        if micro_batch.is_packed:
            assert tokens.shape[0] == 1 and tokens.shape[1] <= pipeline.seq_length
            assert micro_batch.cu_seqlens.dtype == torch.int32
            assert int(micro_batch.cu_seqlens_padded[-1]) == tokens.shape[1]
            assert not bool((micro_batch.batch.padded_seq_lens % multiple).any())
        else:
            assert tokens.shape == (pipeline.micro_batch_size, pipeline.seq_length)
            assert micro_batch.cu_seqlens is None
        assert torch.equal(labels == IGNORE_INDEX, loss_mask == 0)
        assert micro_batch.num_loss_tokens == int((labels != IGNORE_INDEX).sum())
        sequences = [sequence for sample in _sample_sequences(micro_batch) for sequence in sample]
        assert micro_batch.num_real_tokens == sum(len(inputs) for inputs, _, _ in sequences)
        for inputs, sequence_labels, _ in sequences:
            assert len(inputs) <= pipeline.max_positions
            # a trained label is the next input token of the same sequence
            assert all(
                label in (IGNORE_INDEX, following)
                for label, following in zip(sequence_labels, inputs[1:], strict=False)
            )


@settings(max_examples=30, deadline=None)
@given(pipelines(), st.integers(0, 10))
def test_resuming_from_consumed_samples_continues_the_same_stream(pipeline, chunks):
    chunk = pipeline.micro_batch_size * pipeline.dp
    uninterrupted = _global_samples(pipeline, (chunks + 3) * chunk)
    resumed = _global_samples(pipeline, 3 * chunk, consumed_samples=chunks * chunk)
    assert resumed == uninterrupted[chunks * chunk :]
    fresh = DataPipeline(
        pipeline.documents,
        layout=pipeline.layout,
        seq_length=pipeline.seq_length,
        micro_batch_size=pipeline.micro_batch_size,
        global_batch_size=pipeline.global_batch_size,
        dp=pipeline.dp,
        seed=pipeline.seed,
        pad_sequences_to_multiple_of=pipeline.pad_sequences_to_multiple_of,
    )
    assert _global_samples(fresh, 3 * chunk, consumed_samples=chunks * chunk) == resumed  # a requeued process


@settings(max_examples=40, deadline=None)
@given(pipelines(layout_name="thd"), st.integers(1, 3))
def test_thd_and_bshd_train_the_same_tokens(thd, micro_batch_size):
    bshd = DataPipeline(
        thd.documents,
        layout="bshd",
        seq_length=thd.seq_length,
        micro_batch_size=micro_batch_size,
        global_batch_size=micro_batch_size * thd.dp,
        dp=thd.dp,
        seed=thd.seed,
        pad_sequences_to_multiple_of=thd.pad_sequences_to_multiple_of,
    )

    def trained_in_two_epochs(pipeline):
        count = pipeline.samples_in_epoch(0) + pipeline.samples_in_epoch(1)
        return Counter(sequence for sample in _global_samples(pipeline, count) for sequence in sample)

    assert trained_in_two_epochs(thd) == trained_in_two_epochs(bshd)


def test_order_depends_on_the_seed_and_changes_each_epoch():
    documents = data.synthetic_documents(40, vocab_size=VOCAB_SIZE, min_length=2, max_length=6, seed=0)

    def pipeline(seed):
        return DataPipeline(
            documents, layout="bshd", seq_length=8, micro_batch_size=1, global_batch_size=1, dp=1, seed=seed
        )

    assert pipeline(1).epoch_samples(0) == pipeline(1).epoch_samples(0)
    assert pipeline(1).epoch_samples(0) != pipeline(2).epoch_samples(0)
    assert pipeline(1).epoch_samples(0) != pipeline(1).epoch_samples(1)


def test_long_documents_are_truncated_to_the_padded_row():
    documents = [
        Document(torch.arange(30, dtype=torch.int32), torch.ones(30, dtype=torch.bool)),
        Document(torch.arange(5, dtype=torch.int32), torch.ones(5, dtype=torch.bool)),
    ]
    pipeline = DataPipeline(
        documents,
        layout="thd",
        seq_length=18,
        micro_batch_size=1,
        global_batch_size=1,
        dp=1,
        seed=0,
        pad_sequences_to_multiple_of=4,
    )
    assert pipeline.max_positions == 16 and pipeline.truncated_documents == 1
    lengths = sorted(int(next(pipeline.micro_batches(0, consumed)).batch.seq_lens.sum()) for consumed in (0, 1))
    assert lengths == [4, 16]  # the long one keeps its first 16 positions; 16 + 4 would not fit in 18


def _random_documents(draw, longest: int, most: int) -> list[Document]:
    """1 to `most` documents of 2 to `longest` random tokens, each token trained or not as drawn."""
    lengths = draw(st.lists(st.integers(2, longest), min_size=1, max_size=most))
    return [
        Document(
            torch.randint(VOCAB_SIZE, (n,), dtype=torch.int32),
            torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n))),
        )
        for n in lengths
    ]


@st.composite
def filled_pipelines(draw) -> DataPipeline:
    documents = _random_documents(draw, longest=60, most=12)
    dp = draw(st.integers(1, 3))
    return DataPipeline(
        documents,
        layout="thd",
        packing="fill",
        seq_length=draw(st.integers(8, 40)),
        micro_batch_size=1,
        global_batch_size=dp * draw(st.integers(1, 3)),
        dp=dp,
        seed=draw(st.integers(0, 2**32)),
        pad_sequences_to_multiple_of=draw(st.sampled_from([1, 2, 4])),
    )


@settings(max_examples=40, deadline=None)
@given(filled_pipelines())
def test_filled_rows_are_one_length_and_cut_the_epochs_documents_in_order(pipeline):
    """fill: every micro-batch is exactly max_positions long, including where a row runs from one epoch into the
    next; nothing is truncated; and the rows' pieces, read in order, are epoch 0's documents whole and in its order,
    then epoch 1's: every token trained once per epoch."""
    multiple = pipeline.pad_sequences_to_multiple_of
    assert pipeline.truncated_documents == 0
    rows = list(itertools.islice(pipeline.filled_samples(), 3 * len(pipeline.documents) + 3))
    assert all(
        sum(-(-(end - start) // multiple) * multiple for _, start, end in row) == pipeline.max_positions for row in rows
    )
    pieces = [piece for row in rows for piece in row]
    expected = (index for epoch in itertools.count() for index in pipeline.epoch_order(epoch))
    position = 0
    for index in expected:  # each document's pieces follow one another and cover it
        if position == len(pieces):
            break
        covered = 0
        while position < len(pieces) and pieces[position][0] == index and pieces[position][1] == covered:
            covered = pieces[position][2]
            position += 1
        assert covered == len(pipeline.documents[index]) - 1 or position == len(pieces)
    assert position == len(pieces)
    stream = pipeline.micro_batches(0)
    for micro_batch in (next(stream) for _ in range(4)):
        assert micro_batch.tokens.shape == (1, pipeline.max_positions)
        assert int(micro_batch.cu_seqlens_padded[-1]) == pipeline.max_positions
        assert not bool((micro_batch.batch.padded_seq_lens % multiple).any())


@settings(max_examples=30, deadline=None)
@given(filled_pipelines(), st.integers(0, 10))
def test_filled_rows_train_the_pieces_planned_and_resume_where_they_stopped(pipeline, chunks):
    """The ranks' micro-batches, put back in global order, are the planned rows' pieces (inputs, labels and mask of
    each document's stretch), and a job resumed after `chunks` chunks of samples goes on with the same rows."""
    chunk = pipeline.micro_batch_size * pipeline.dp
    count = (chunks + 3) * chunk
    planned = [
        [_expected_piece(pipeline.documents[index], start, end) for index, start, end in row]
        for row in itertools.islice(pipeline.filled_samples(), count)
    ]
    uninterrupted = _global_samples(pipeline, count)
    assert uninterrupted == planned
    assert _global_samples(pipeline, 3 * chunk, consumed_samples=chunks * chunk) == uninterrupted[chunks * chunk :]


def _expected_piece(document: Document, start: int, end: int) -> tuple:
    """The stretch [start, end) of a document's positions, computed with plain lists: (inputs, labels, mask)."""
    tokens, trained = document.token_ids.tolist(), document.trained.tolist()
    labels = [tokens[i + 1] if trained[i + 1] else IGNORE_INDEX for i in range(start, end)]
    return tuple(tokens[start:end]), tuple(labels), tuple(float(t) for t in trained[start + 1 : end + 1])


def test_filled_rows_cut_on_the_padding_multiple():
    rows = list(data.filled_rows(enumerate([5, 9, 3]), capacity=8, multiple=2))
    assert rows == [[(0, 0, 5), (1, 0, 2)], [(1, 2, 9)], [(2, 0, 3)]]  # 5 takes 6, the cut piece 2; 7 takes 8
    assert list(data.filled_rows([(0, 20)], capacity=8)) == [[(0, 0, 8)], [(0, 8, 16)], [(0, 16, 20)]]
    with pytest.raises(ValueError, match="multiple of 4"):
        list(data.filled_rows([(0, 3)], capacity=6, multiple=4))
    documents = data.synthetic_documents(4, vocab_size=VOCAB_SIZE, min_length=2, max_length=9, seed=0)
    filled = DataPipeline(
        documents, layout="thd", packing="fill", seq_length=8, micro_batch_size=1, global_batch_size=1, dp=1, seed=0
    )
    with pytest.raises(ValueError, match="filled_samples"):
        filled.epoch_samples(0)


def test_fill_needs_packed_rows():
    documents = data.synthetic_documents(4, vocab_size=VOCAB_SIZE, min_length=2, max_length=9, seed=0)
    with pytest.raises(ValueError, match="needs layout thd"):
        DataPipeline(
            documents,
            layout="bshd",
            packing="fill",
            seq_length=8,
            micro_batch_size=1,
            global_batch_size=1,
            dp=1,
            seed=0,
        )


def test_the_engine_config_sets_layout_batches_and_cp_padding():
    config = tiny_engine_config()  # THD, cp 2, dp 1, global batch 2 of micro-batch 1
    documents = data.synthetic_documents(
        10, vocab_size=config.model.vocab_size, min_length=2, max_length=20, seed=config.train.seed
    )
    pipeline = DataPipeline.from_engine_config(config, documents)
    assert (pipeline.layout, pipeline.num_microbatches, pipeline.pad_sequences_to_multiple_of) == ("thd", 2, 4)
    micro_batch = next(pipeline.micro_batches(0))
    assert not bool((micro_batch.batch.padded_seq_lens % 4).any())
    parallel = config.parallel.model_copy(update={"cp": 1, "tp": 2, "sequence_parallel": True})
    assert data.sequence_padding_multiple(parallel) == 2


def test_inconsistent_settings_are_refused():
    documents = data.synthetic_documents(4, vocab_size=VOCAB_SIZE, min_length=2, max_length=6, seed=0)
    settings_ = {"layout": "bshd", "seq_length": 8, "micro_batch_size": 2, "global_batch_size": 4, "dp": 2, "seed": 0}
    with pytest.raises(ValueError, match="micro_batch_size 1"):
        DataPipeline(documents, **{**settings_, "layout": "thd"})
    with pytest.raises(ValueError, match="not a positive multiple of micro_batch_size x dp = 4"):
        DataPipeline(documents, **{**settings_, "global_batch_size": 6})
    with pytest.raises(ValueError, match="shorter than the sequence padding multiple"):
        DataPipeline(documents, **settings_, pad_sequences_to_multiple_of=16)
    pipeline = DataPipeline(documents, **settings_)
    with pytest.raises(ValueError, match="consumed_samples 2 is not a non-negative multiple"):
        pipeline.micro_batches(0, consumed_samples=2)
    with pytest.raises(ValueError, match="dp_rank 2 is outside"):
        pipeline.micro_batches(2)


@st.composite
def concatenated_pipelines(draw) -> DataPipeline:
    documents = _random_documents(draw, longest=40, most=10)
    layout_name = draw(st.sampled_from(["thd", "bshd"]))
    micro_batch_size = 1 if layout_name == "thd" else draw(st.integers(1, 3))
    dp = draw(st.integers(1, 3))
    return DataPipeline(
        documents,
        layout=layout_name,
        packing="concat",
        seq_length=draw(st.integers(4, 30)),
        micro_batch_size=micro_batch_size,
        global_batch_size=micro_batch_size * dp * draw(st.integers(1, 3)),
        dp=dp,
        seed=draw(st.integers(0, 2**32)),
    )


def _concatenated_stream(pipeline: DataPipeline, tokens: int) -> tuple[list[int], list[bool]]:
    """The first `tokens` tokens of the documents joined epoch after epoch, and their trained flags."""
    ids: list[int] = []
    trained: list[bool] = []
    for index in (index for epoch in itertools.count() for index in pipeline.epoch_order(epoch)):
        if len(ids) >= tokens:
            return ids[:tokens], trained[:tokens]
        ids += pipeline.documents[index].token_ids.tolist()
        trained += pipeline.documents[index].trained.tolist()
    raise AssertionError("unreachable: the epochs never end")


@settings(max_examples=40, deadline=None)
@given(concatenated_pipelines(), st.integers(0, 6))
def test_concatenated_rows_are_windows_of_one_token_stream_and_resume_where_they_stopped(pipeline, chunks):
    """concat: sample r is positions r*S .. r*S+S-1 of the documents joined epoch after epoch (inputs those tokens,
    labels the next ones, masked where the label token is not trained), so each row's last label is the next row's
    first input and a document's first token is predicted from the one before it. Every row is one full sequence
    (no padding, positions 0..S-1), in either layout, and a job resumed after `chunks` chunks of samples goes on
    with the same rows."""
    width = pipeline.max_positions
    chunk = pipeline.micro_batch_size * pipeline.dp
    count = (chunks + 2) * chunk
    ids, trained = _concatenated_stream(pipeline, count * width + 1)
    expected = [
        [
            (
                tuple(ids[r * width : (r + 1) * width]),
                tuple(ids[i] if trained[i] else IGNORE_INDEX for i in range(r * width + 1, (r + 1) * width + 1)),
                tuple(float(trained[i]) for i in range(r * width + 1, (r + 1) * width + 1)),
            )
        ]
        for r in range(count)
    ]
    assert pipeline.truncated_documents == 0
    assert _global_samples(pipeline, count) == expected
    assert _global_samples(pipeline, 2 * chunk, consumed_samples=chunks * chunk) == expected[chunks * chunk :]
    micro_batch = next(pipeline.micro_batches(0))
    assert micro_batch.tokens.shape == (1 if micro_batch.is_packed else pipeline.micro_batch_size, width)
    assert micro_batch.num_real_tokens == micro_batch.tokens.numel()
    assert micro_batch.position_ids.tolist() == [list(range(width))] * micro_batch.tokens.shape[0]
    if micro_batch.is_packed:
        assert micro_batch.cu_seqlens.tolist() == [0, width]


def test_concatenated_rows_overlap_by_the_token_that_is_one_rows_label_and_the_nexts_input():
    rows = data.concatenated_rows(((index, length) for index, length in itertools.cycle(enumerate([5, 3]))), 4)
    assert list(itertools.islice(rows, 3)) == [
        [(0, 0, 4), (0, 4, 5)],
        [(0, 4, 5), (1, 0, 3), (0, 0, 1)],
        [(0, 0, 4), (0, 4, 5)],
    ]
    documents = data.synthetic_documents(4, vocab_size=VOCAB_SIZE, min_length=2, max_length=9, seed=0)
    concatenated = DataPipeline(
        documents, layout="bshd", packing="concat", seq_length=8, micro_batch_size=2, global_batch_size=2, dp=1, seed=0
    )
    with pytest.raises(ValueError, match="concatenated_samples"):
        concatenated.epoch_samples(0)
