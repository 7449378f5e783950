"""Training data for the Megatron trainer: local files (or synthetic tokens) in, micro-batches out.

    records --read_documents/synthetic_documents--> Documents --DataPipeline--> each rank's MicroBatches

Nothing here downloads anything: data and tokenizer are local files, and `tokenizers` / `pyarrow` are
imported only when a text record or a .parquet file needs them.

Records, one JSON object per line of a `.jsonl` file or one row of a `.parquet` file; the first form a
record has is used (a field that is null counts as absent, as parquet fills missing columns with nulls):
- `{"input_ids": [...], "loss_mask": [...]}`: token ids used as given, no EOS added (whoever tokenized
  decided the ending). `loss_mask` is optional (default all 1), one 0/1 per id: 1 trains the model to
  predict that token. The first token's value is unused: nothing predicts it.
- `{"text": "..."}`: tokenized, EOS appended, every token trained.
- `{"prompt": "...", "response": "..."}` (SFT): prompt and response tokenized separately, so their boundary
  is exact, then concatenated and EOS appended; only the response tokens and the EOS are trained. The
  prompt is used verbatim: apply a chat template before writing the file.

EOS rule: the `eos_token` of `tokenizer_config.json` next to tokenizer.json when that file names one,
otherwise the first of `EOS_FALLBACK_TOKENS` in the vocabulary, otherwise none (nothing is appended). It is
not appended when the text already ends with it. The tokenizer's post-processor (BOS/CLS templates) is not
applied: Qwen tokenizers add none, and a decoder only needs the EOS to learn where a text stops.

Next-token alignment (Megatron's): a document of n tokens gives n - 1 positions, inputs `t[:-1]` and
labels `t[1:]`; a label is IGNORE_INDEX (-100) and its loss mask 0 where that token is not trained.

Samples: `global_batch_size` and `consumed_samples` count samples, as Megatron does. A BSHD sample is one
sequence padded to seq_length; a THD sample is one packed row of at most seq_length tokens (Megatron's own
pretraining samples are packed rows too). Epochs follow one another without a break, each shuffled with
its own seed, so a global batch may span two epochs and no sample is ever dropped or repeated.

Packing (THD): `whole` keeps each document in one row and truncates one longer than the row; `fill` cuts the
documents, epoch after epoch in each epoch's order, at row ends, so every row is exactly the row's length with no
padding (a row may run from one epoch into the next) and no token is dropped: what Megatron's GPT dataset does
with pretraining text
(megatron/core/datasets/gpt_dataset.py, megatron-core 0.19.2, line 381: each sample runs from a (document,
offset) pair to the next, across consecutive documents).
Each piece stays its own sequence in cu_seqlens, so no token attends across a document boundary.

Packing `concat` (pretraining text, Megatron's default): the documents, epoch after epoch in each epoch's order, are
one stream of tokens, and row r is its tokens r·S to r·S + S (S positions: inputs are the first S tokens, labels the
last S), so each row's last label is the next row's first input, as in Megatron's GPT dataset
(`add_extra_token_to_sequence`). Nothing marks where a document ends but its EOS token: attention and the GDN state
run across it (Megatron's `--reset-attention-mask` off), a document's first token is predicted from the one before
it (and trained where its `trained` flag is set: always for text records), and the rows are full, so they need no
padding and no offsets (BSHD), or one sequence each where context parallelism packs them (THD).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, read_json, read_text
from gdnctl.runtime.data.context_parallel import context_parallel_positions
from gdnctl.runtime.data.layout import IGNORE_INDEX, BshdBatch, ThdBatch, TokenSequence, pack, to_bshd

if TYPE_CHECKING:
    from gdnctl.schema import EngineConfig, EngineParallel

Layout = Literal["thd", "bshd"]
Packing = Literal["whole", "fill", "concat"]
# A stretch of one document a sample holds: (document index, first position, end position). Positions count
# next-token predictions: a document of n tokens has n - 1.
Piece = tuple[int, int, int]

# Padded positions are masked out of the loss and, being after the real tokens under a causal mask, never
# seen by them, so any id works; 0 is inside every vocabulary.
PAD_TOKEN_ID = 0
EOS_FALLBACK_TOKENS = ("<|endoftext|>", "</s>", "<eos>")
# THD packing keeps this many rows open (first fit among them). On 50k sequences of log-normal length
# (median ~1100 tokens) into 8192-token rows it fills 99% of the rows where next fit (one open row) fills
# 82%, at most 16 comparisons per sequence (1-2 s per epoch of a million sequences).
PACKING_WINDOW = 16
# Past any tokenizer.json (Qwen's is 11 MiB) or tokenizer_config.json (chat templates included): bounds on what
# is read of them, so a device or a wrong file is refused rather than read into memory.
MAX_TOKENIZER_BYTES = 1024**3
MAX_TOKENIZER_CONFIG_BYTES = 64 * 1024**2


class DataError(GdnctlError):
    """The training data or its tokenizer cannot be used as given."""


@dataclass(frozen=True)
class Document:
    """One training text as token ids, and per token whether the model is trained to predict it."""

    token_ids: torch.Tensor  # int32 [n], n >= 2; int32 halves the memory of a dataset every rank holds
    # bool [n]; trained[0] is unused (nothing predicts a document's first token) except with packing concat, where
    # the previous document's last token does
    trained: torch.Tensor

    def __post_init__(self) -> None:
        if self.token_ids.dim() != 1 or self.token_ids.shape != self.trained.shape or len(self) < 2:
            raise ValueError("A Document needs token_ids and trained as 1-D tensors of one length, at least 2.")

    def __len__(self) -> int:
        return self.token_ids.numel()


@dataclass(frozen=True)
class LocalTokenizer:
    """A `tokenizers.Tokenizer` read from a local file, and its EOS id by the EOS rule above (None: none)."""

    backend: Any
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)

    def with_eos(self, ids: list[int]) -> list[int]:
        if self.eos_id is None or (ids and ids[-1] == self.eos_id):
            return ids
        return [*ids, self.eos_id]


def load_tokenizer(path: str | Path) -> LocalTokenizer:
    """The tokenizer in `path` (a directory holding tokenizer.json, or the file itself)."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    fix = "set model.tokenizer to a local tokenizer directory or tokenizer.json (nothing is downloaded)"
    if not file.exists():
        raise DataError(f"tokenizer {file} does not exist; {fix}.")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("reading text records needs the `tokenizers` package; pip install tokenizers.") from None
    try:
        text = read_text(file, MAX_TOKENIZER_BYTES)
    except UnreadableFile as error:
        raise DataError(f"tokenizer {error}; {fix}.") from None
    try:
        backend = Tokenizer.from_str(text)
    except Exception as error:  # noqa: BLE001 - tokenizers raises a bare Exception for a malformed file
        raise DataError(
            f"tokenizer {file} cannot be read ({error}); point model.tokenizer at a tokenizers-format tokenizer.json."
        ) from None
    return LocalTokenizer(backend, _eos_id(backend, file.parent))


def _eos_id(backend: Any, directory: Path) -> int | None:
    named = _configured_eos_token(directory)
    if named is None:
        fallback_ids = (backend.token_to_id(name) for name in EOS_FALLBACK_TOKENS)
        return next((token_id for token_id in fallback_ids if token_id is not None), None)
    eos_id = backend.token_to_id(named)
    if eos_id is None:
        raise DataError(
            f"{directory / 'tokenizer_config.json'} names eos_token {named!r}, which is not in "
            f"{directory / 'tokenizer.json'}; fix the eos_token or use the matching tokenizer."
        )
    return eos_id


def _configured_eos_token(directory: Path) -> str | None:
    config_file = directory / "tokenizer_config.json"
    if not config_file.exists():
        return None
    fix = f"fix it or remove it (EOS then comes from the tokens {', '.join(EOS_FALLBACK_TOKENS)})"
    try:
        config = read_json(config_file, MAX_TOKENIZER_CONFIG_BYTES)
    except UnreadableFile as error:
        raise DataError(f"{error}; {fix}.") from None
    if not isinstance(config, dict):
        raise DataError(f"{config_file} is not a JSON object; {fix}.")
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos  # HF writes a string or an AddedToken dict
    if eos is not None and not isinstance(eos, str):
        raise DataError(f"{config_file} names eos_token {eos!r}, which is not a token's text; {fix}.")
    return eos


class _TokenizerOnFirstUse:
    """Loads the tokenizer at the first record with text, so data of token ids needs none."""

    def __init__(self, path: str | Path | None) -> None:
        self._path = path
        self._tokenizer: LocalTokenizer | None = None

    def __call__(self, where: str) -> LocalTokenizer:
        if self._tokenizer is None:
            if self._path is None:
                raise DataError(
                    f"{where} has text but model.tokenizer is not set; set it to a local "
                    "tokenizer directory or tokenizer.json, or give input_ids instead of text."
                )
            self._tokenizer = load_tokenizer(self._path)
        return self._tokenizer


def read_documents(path: str | Path, *, vocab_size: int, tokenizer_path: str | Path | None = None) -> list[Document]:
    """Every record of a local .jsonl or .parquet file, tokenized and validated.

    Read eagerly, so a bad record stops the job at start-up instead of hours into training; every rank
    holds the whole dataset (4 bytes per token), which suits SFT- and RL-sized data."""
    path = Path(path)
    fix = "set train.data_path to a local .jsonl or .parquet file"
    if not path.exists():
        raise DataError(f"data file {path} does not exist; {fix}.")
    if not path.is_file():  # a FIFO would block the reading rank; a device never ends
        raise DataError(f"data file {path} is not a regular file; {fix}.")
    tokenizer = _TokenizerOnFirstUse(tokenizer_path)
    documents = [_document(record, where, tokenizer, vocab_size) for where, record in _records(path)]
    if not documents:
        raise DataError(f"data file {path} holds no records; write one JSON object per line (or parquet row).")
    return documents


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) pairs; `where` names the file and line (or row) for error messages."""
    if path.suffix == ".jsonl":
        return _jsonl_records(path)
    if path.suffix == ".parquet":
        return _parquet_records(path)
    raise DataError(f"data file {path} is neither .jsonl nor .parquet; convert it to one of them.")


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        with path.open("rb") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():  # a blank line (an editor's trailing one, say) holds no record
                    yield f"{path} line {number}", _json_record(line, f"{path} line {number}")
    except OSError as error:
        raise DataError(
            f"data file {path} cannot be read ({error.strerror or error}); check the file and its permissions."
        ) from None


def _json_record(line: bytes, where: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(
            f"{where} is not valid JSON ({error.msg} at column {error.colno}); write one JSON object per line."
        ) from None
    except UnicodeDecodeError:
        raise DataError(f"{where} is not UTF-8 text; write the file as UTF-8.") from None
    except RecursionError:
        raise DataError(f"{where} nests its JSON deeper than a reader can follow; write flat records.") from None
    except ValueError as error:  # an integer of more than 4,300 digits
        raise DataError(f"{where} is not usable JSON ({error}); write token ids as ordinary integers.") from None


def _parquet_records(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise DataError(f"reading {path} needs pyarrow, which is not installed; pip install pyarrow.") from None
    # iter_batches reads lazily: a damaged row group fails while the rows are read, not when the file is opened.
    try:
        batches = pyarrow.parquet.ParquetFile(path).iter_batches()
        rows = (record for batch in batches for record in batch.to_pylist())
        for number, record in enumerate(rows, start=1):
            yield f"{path} row {number}", record
    except (pyarrow.ArrowException, OSError) as error:
        raise DataError(f"{path} cannot be read as parquet ({error}); write it with pyarrow or pandas.") from None


def _document(record: Any, where: str, tokenizer: _TokenizerOnFirstUse, vocab_size: int) -> Document:
    if not isinstance(record, dict):
        raise DataError(f"{where} is a JSON {type(record).__name__}, not an object; write one object per record.")
    if record.get("input_ids") is not None:
        ids, trained = _ids_record(record, where)
        source = "input_ids"
    elif record.get("text") is not None:
        ids, trained = _text_record(record, where, tokenizer(where))
        source = "the tokenizer"
    elif record.get("prompt") is not None or record.get("response") is not None:
        ids, trained = _chat_record(record, where, tokenizer(where))
        source = "the tokenizer"
    else:
        raise DataError(f"{where} has none of input_ids, text, or prompt and response; give every record one of them.")
    if len(ids) < 2:
        raise DataError(
            f"{where} has {len(ids)} token(s); a training sequence needs at least 2 (one to read, the next to predict)."
        )
    try:
        token_ids = torch.tensor(ids, dtype=torch.int64)
    except (ValueError, RuntimeError, OverflowError):  # an id past int64: outside every vocabulary
        raise DataError(
            f"{where} has a token id beyond 64-bit integers (from {source}), outside the model's "
            f"vocabulary [0, {vocab_size}); use ids (or a tokenizer) made for this model."
        ) from None
    _check_vocabulary(token_ids, where, vocab_size, source)
    return Document(token_ids.to(torch.int32), torch.tensor(trained, dtype=torch.bool))


def _ids_record(record: dict, where: str) -> tuple[list[int], list[bool]]:
    ids, mask = record["input_ids"], record.get("loss_mask")
    if not _all_integers(ids):
        raise DataError(f"{where} has input_ids that are not a list of integers; write token ids as integers.")
    if mask is None:
        return ids, [True] * len(ids)
    if not _all_integers(mask) or not set(mask) <= {0, 1}:
        raise DataError(
            f"{where} has a loss_mask that is not a list of 0/1 values; write 1 for each trained "
            "token and 0 for the others."
        )
    if len(mask) != len(ids):
        raise DataError(f"{where} has {len(mask)} loss_mask values for {len(ids)} input_ids; give one 0/1 per token.")
    return ids, [bool(value) for value in mask]


def _all_integers(values: Any) -> bool:
    # bool is an int subclass, and JSON true/false is never meant as a token id or mask value here
    return isinstance(values, list) and all(isinstance(value, int) and not isinstance(value, bool) for value in values)


def _text_record(record: dict, where: str, tokenizer: LocalTokenizer) -> tuple[list[int], list[bool]]:
    ids = tokenizer.with_eos(tokenizer.encode(_string_field(record, "text", where)))
    return ids, [True] * len(ids)


def _chat_record(record: dict, where: str, tokenizer: LocalTokenizer) -> tuple[list[int], list[bool]]:
    prompt = tokenizer.encode(_string_field(record, "prompt", where))
    response = tokenizer.with_eos(tokenizer.encode(_string_field(record, "response", where)))
    return prompt + response, [False] * len(prompt) + [True] * len(response)


def _string_field(record: dict, name: str, where: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        given = f"no {name}" if value is None else f"a {name} that is not a string"
        raise DataError(f"{where} has {given}; give {name} as a string (prompt and response come together).")
    return value


def _check_vocabulary(token_ids: torch.Tensor, where: str, vocab_size: int, source: str) -> None:
    outside = ((token_ids < 0) | (token_ids >= vocab_size)).nonzero()
    if outside.numel():
        position = int(outside[0])
        raise DataError(
            f"{where} has token id {int(token_ids[position])} (position {position}, from {source}) "
            f"outside the model's vocabulary [0, {vocab_size}); use ids (or a tokenizer) made for "
            "this model."
        )


def synthetic_documents(
    num_documents: int, *, vocab_size: int, min_length: int, max_length: int, seed: int
) -> list[Document]:
    """Deterministic random documents for benchmarks, every token trained.

    Lengths (in tokens; a document of n tokens fills n - 1 positions) are log-uniform in
    [min_length, max_length]: many short documents and few long ones, as in real corpora. Equal bounds give
    one fixed length (`seq_length + 1` fills a row exactly). Ids are uniform over the vocabulary."""
    if num_documents < 1 or not 2 <= min_length <= max_length:
        raise ValueError(
            f"synthetic_documents got {num_documents} documents of {min_length}..{max_length} "
            "tokens; ask for at least one document and 2 <= min_length <= max_length."
        )
    generator = torch.Generator().manual_seed(seed)
    log_lengths = torch.empty(num_documents, dtype=torch.float64).uniform_(
        math.log(min_length), math.log(max_length + 1), generator=generator
    )
    lengths = log_lengths.exp().floor().clamp(min_length, max_length).long().tolist()
    token_ids = torch.randint(vocab_size, (sum(lengths),), generator=generator, dtype=torch.int32)
    return [
        Document(ids, torch.ones(length, dtype=torch.bool))
        for ids, length in zip(token_ids.split(lengths), lengths, strict=True)
    ]


# Synthetic documents: lengths log-uniform between these fractions of seq_length.
SYNTHETIC_LENGTH_FRACTIONS = (0.125, 1.0)


def training_documents(config: EngineConfig) -> list[Document]:
    """The documents a job trains: train.data_path's, or where it has none the synthetic ones of the job's seed (its
    vocabulary, lengths from an eighth of seq_length to all of it). benchmarks/megatron_bridge_loop.py feeds the same
    rows to Megatron-Bridge's loop, so that the two loops train one token stream."""
    train, arch = config.train, config.model
    if train.data_path:
        return read_documents(train.data_path, vocab_size=arch.vocab_size, tokenizer_path=train.tokenizer_path)
    low, high = (max(2, int(train.seq_length * f)) for f in SYNTHETIC_LENGTH_FRACTIONS)
    count = max(64, 4 * train.global_batch_size)
    return synthetic_documents(count, vocab_size=arch.vocab_size, min_length=low, max_length=high + 1, seed=train.seed)


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward's input, 2-D as Megatron's GPTModel takes it: THD is one packed row ([1, T]
    tensors, with cu_seqlens); BSHD is [micro_batch_size, seq_length].

    Under context parallelism `cp_positions` are the row positions this CP rank holds (context_parallel.py):
    the per-token tensors are those positions only, while cu_seqlens, max_seqlen, `row_length` and the token
    counts stay the whole row's, as Megatron-Core expects them."""

    batch: ThdBatch | BshdBatch
    cp_positions: torch.Tensor | None = None
    # Indices into the pipeline's documents (train.data_path's records in file order), for messages about this
    # micro-batch such as a non-finite step.
    documents: tuple[int, ...] = ()

    @property
    def is_packed(self) -> bool:
        return isinstance(self.batch, ThdBatch)

    def on_context_parallel_rank(self, cp_size: int, cp_rank: int) -> MicroBatch:
        """This micro-batch as CP rank `cp_rank` of `cp_size` feeds it to the model (itself when cp_size is 1)."""
        if cp_size == 1:
            return self
        if not self.is_packed:
            raise ValueError(
                "context parallelism is built for packed (THD) micro-batches; use layout thd with "
                "cp > 1 (validate's LAY004 says the same)."
            )
        return MicroBatch(
            self.batch, context_parallel_positions(self.batch.padded_seq_lens, cp_size, cp_rank), self.documents
        )

    def _rows(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.cp_positions is not None:
            tensor = tensor.index_select(0, self.cp_positions)
        return tensor.unsqueeze(0) if self.is_packed else tensor

    @property
    def row_length(self) -> int:
        """Positions in the whole row (every CP rank's together): Megatron's seq_length for this micro-batch."""
        return int(self.batch.input_ids.shape[-1])

    @property
    def tokens(self) -> torch.Tensor:
        return self._rows(self.batch.input_ids)

    @property
    def labels(self) -> torch.Tensor:
        return self._rows(self.batch.labels)

    @property
    def loss_mask(self) -> torch.Tensor:
        return self._rows(self.batch.loss_mask)

    @property
    def position_ids(self) -> torch.Tensor:
        return self._rows(self.batch.position_ids)

    @property
    def cu_seqlens(self) -> torch.Tensor | None:
        """int32 [N + 1] offsets of the real tokens (THD only)."""
        return self.batch.cu_seqlens if self.is_packed else None

    @property
    def cu_seqlens_padded(self) -> torch.Tensor | None:
        """int32 [N + 1] offsets of the padded sequences in the row (THD only)."""
        return self.batch.cu_seqlens_padded if self.is_packed else None

    @property
    def max_seqlen(self) -> int | None:
        return self.batch.max_seqlen if self.is_packed else None

    @property
    def num_real_tokens(self) -> int:
        """Positions that are not padding, for tokens/s."""
        return int(self.batch.seq_lens.sum())

    @property
    def num_loss_tokens(self) -> int:
        """Positions the loss is taken on, for per-token loss averaging."""
        return int(self.batch.loss_mask.sum())


# TE's FP8 GEMMs need the tokens of a call (the product of the leading dims) divisible by 8 and the hidden size
# by 16 (transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec); a packed row of 995 tokens stopped the
# first FP8 step on an H100. Padding every sequence to a multiple of 16 keeps every row and micro-batch whole.
FP8_TOKEN_MULTIPLE = 16


def sequence_padding_multiple(parallel: EngineParallel, precision: str = "bf16") -> int:
    """What each packed sequence's length must be a multiple of.

    Under context parallelism Megatron's GDN needs a multiple of cp, and TE's THD attention (every 4th
    Qwen3.5 layer) splits each sequence into 2·cp chunks for causal load balance, so 2·cp; sequence
    parallelism splits the tokens over tp. AReaL and verl pad THD sequences to tp·cp·2 (tp without cp) in
    `preprocess_packed_seqs_context_parallel`. FP8 adds FP8_TOKEN_MULTIPLE."""
    multiple = (2 * parallel.cp if parallel.cp > 1 else 1) * (parallel.tp if parallel.sequence_parallel else 1)
    return math.lcm(multiple, FP8_TOKEN_MULTIPLE) if precision == "fp8" else multiple


def first_fit_rows(lengths: Sequence[int], capacity: int, window: int = PACKING_WINDOW) -> list[list[int]]:
    """Indices into `lengths`, grouped into rows of at most `capacity`: each length goes into the first of
    the last `window` rows with room, else a new row. Deterministic, and close to the given order."""
    rows: list[list[int]] = []
    room: list[int] = []
    first_open = 0
    for index, length in enumerate(lengths):
        row = next((row for row in range(first_open, len(rows)) if room[row] >= length), None)
        if row is None:
            rows.append([])
            room.append(capacity)
            row = len(rows) - 1
            first_open = max(first_open, len(rows) - window)
        rows[row].append(index)
        room[row] -= length
    return rows


def filled_rows(documents: Iterable[tuple[int, int]], capacity: int, multiple: int = 1) -> Iterator[list[Piece]]:
    """Rows of `capacity` positions cut from (index, positions) documents in the order given: a document that
    reaches a row's end goes on in the next row. Each piece takes its length padded to `multiple`; with capacity a
    multiple of it every cut lands on a multiple, so only a document's last piece is padded and every row is exactly
    `capacity`. A finite input's last row may be short."""
    if capacity < 1 or capacity % multiple:
        raise ValueError(f"filled_rows got capacity {capacity}; pass a positive multiple of {multiple}.")
    row: list[Piece] = []
    room = capacity
    for index, length in documents:
        start = 0
        while start < length:
            take = min(length - start, room)
            row.append((index, start, start + take))
            room -= -(-take // multiple) * multiple
            start += take
            if room == 0:
                yield row
                row, room = [], capacity
    if row:
        yield row


def concatenated_rows(documents: Iterable[tuple[int, int]], positions: int) -> Iterator[list[Piece]]:
    """Rows of `positions` next-token predictions from (index, tokens) documents joined end to end: each row is
    positions + 1 consecutive tokens of the stream as (document, first token, end token) pieces, and the next row
    starts at this row's last token (its last label, the next row's first input). Needs an endless input: the
    stream's last row is only yielded once the row after it has started."""
    rows = filled_rows(documents, positions)
    current = next(rows, None)
    for following in rows:
        index, start, _ = following[0]
        yield [*current, (index, start, start + 1)]
        current = following


def _epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed per (seed, epoch): a hash, so neighbouring seeds and epochs give unrelated orders."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{epoch}".encode()).digest()[:8], "little") >> 1


class DataPipeline:
    """Each data-parallel rank's micro-batches of a list of documents, reproducible from the seed alone.

    Per epoch the documents are shuffled with `_epoch_seed(seed, epoch)`; THD then packs them, in that order,
    into rows (`first_fit_rows`), BSHD takes them one per sample. The sample stream is consumed in chunks of
    micro_batch_size x dp samples, rank r taking the r-th micro-batch of each chunk (Megatron's pretraining
    sampler), so a global batch is num_microbatches consecutive chunks.

    With packing `whole`, documents longer than the row are truncated to its first `max_positions` positions
    (seq_length rounded down to the padding multiple, the same in both layouts so a layout switch trains the same
    tokens). Truncation rather than splitting: a split-off tail starts mid-text without its context, and for SFT
    it would train response tokens without their prompt. `truncated_documents` counts them, for the log. With
    packing `fill` (THD, pretraining text) nothing is truncated: rows are cut from the documents one after the
    other, epoch after epoch, each exactly `max_positions` long (`filled_rows`), so a row may hold the end of one
    epoch and the start of the next; `consumed_samples` still counts rows. Packing `concat` cuts rows the same way
    from the documents joined into one stream (`concatenated_rows`), each row one sequence."""

    def __init__(
        self,
        documents: Iterable[Document],
        *,
        layout: Layout,
        seq_length: int,
        micro_batch_size: int,
        global_batch_size: int,
        dp: int,
        seed: int,
        pad_sequences_to_multiple_of: int = 1,
        cp: int = 1,
        packing: Packing = "whole",
    ) -> None:
        self.documents = tuple(documents)
        self.cp = cp
        self.layout = layout
        self.packing = packing
        self.seq_length = seq_length
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = global_batch_size
        self.dp = dp
        self.seed = seed
        self.pad_sequences_to_multiple_of = pad_sequences_to_multiple_of
        self.max_positions = seq_length - seq_length % pad_sequences_to_multiple_of
        self._check_settings()
        # whole truncates a long document to the row; fill and concat cut it across rows and keep every position
        self._positions = [
            len(document) - 1 if packing != "whole" else min(len(document) - 1, self.max_positions)
            for document in self.documents
        ]
        multiple = pad_sequences_to_multiple_of
        self._padded_positions = [-(-positions // multiple) * multiple for positions in self._positions]
        self.truncated_documents = sum(
            len(document) - 1 > positions for document, positions in zip(self.documents, self._positions, strict=True)
        )
        self._cached_epoch: tuple[int, list[tuple[Piece, ...]]] | None = None

    @classmethod
    def from_engine_config(cls, config: EngineConfig, documents: Iterable[Document]) -> DataPipeline:
        train = config.train
        return cls(
            documents,
            layout=config.layout,
            seq_length=train.seq_length,
            micro_batch_size=train.micro_batch_size,
            global_batch_size=train.global_batch_size,
            dp=config.parallel.dp,
            seed=train.seed,
            pad_sequences_to_multiple_of=sequence_padding_multiple(config.parallel, train.precision),
            cp=config.parallel.cp,
            packing=config.packing,
        )

    def _check_settings(self) -> None:
        if self.layout not in ("thd", "bshd"):
            raise ValueError(f"layout is {self.layout!r}; pass 'thd' or 'bshd'.")
        if self.packing not in ("whole", "fill", "concat"):
            raise ValueError(f"packing is {self.packing!r}; pass 'whole', 'fill' or 'concat'.")
        if self.packing == "fill" and self.layout != "thd":
            raise ValueError(
                "packing 'fill' cuts documents into packed rows and needs layout thd; a padded (BSHD) "
                "row holds one document, so use packing 'whole' with it."
            )
        if self.layout == "thd" and self.micro_batch_size != 1:
            raise ValueError(
                f"THD packs one row per micro-batch but micro_batch_size is {self.micro_batch_size}; "
                "use micro_batch_size 1 (Megatron's GDN needs batch 1 with packed sequences)."
            )
        if min(self.micro_batch_size, self.dp, self.cp, self.pad_sequences_to_multiple_of) < 1:
            raise ValueError("micro_batch_size, dp, cp and pad_sequences_to_multiple_of must be positive integers.")
        if self.cp > 1 and (self.layout != "thd" or self.pad_sequences_to_multiple_of % (2 * self.cp)):
            raise ValueError(
                f"cp {self.cp} needs layout thd and sequences padded to a multiple of 2 x cp; build the "
                "pipeline with pad_sequences_to_multiple_of=sequence_padding_multiple(parallel)."
            )
        if self.global_batch_size < 1 or self.global_batch_size % (self.micro_batch_size * self.dp):
            raise ValueError(
                f"global_batch_size {self.global_batch_size} is not a positive multiple of "
                f"micro_batch_size x dp = {self.micro_batch_size * self.dp}; make it one."
            )
        if self.max_positions < 1:
            raise ValueError(
                f"seq_length {self.seq_length} is shorter than the sequence padding multiple "
                f"{self.pad_sequences_to_multiple_of}; make seq_length at least that."
            )
        if not self.documents:
            raise ValueError("DataPipeline got no documents; pass at least one.")

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per rank per global batch."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    def samples_in_epoch(self, epoch: int) -> int:
        """THD whole: packed rows (the packing, and so the count, changes with the epoch's order); BSHD: documents.
        Filled rows run across epochs and have no such count."""
        return len(self.epoch_samples(epoch))

    def epoch_order(self, epoch: int) -> list[int]:
        """The documents' order in this epoch (its own seed)."""
        generator = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
        return torch.randperm(len(self.documents), generator=generator).tolist()

    def epoch_samples(self, epoch: int) -> list[tuple[Piece, ...]]:
        """The epoch's samples in order, each the pieces of documents it holds (one whole document for BSHD). With
        packing fill or concat rows run across epochs: `filled_samples` / `concatenated_samples` are their streams."""
        if self.packing != "whole":
            raise ValueError(
                f"{self.packing} rows run from one epoch into the next; read them with filled_samples() or "
                "concatenated_samples()."
            )
        if self._cached_epoch is None or self._cached_epoch[0] != epoch:
            order = self.epoch_order(epoch)
            samples: list[tuple[Piece, ...]]
            if self.layout == "bshd":
                samples = [(self._whole(index),) for index in order]
            else:
                rows = first_fit_rows([self._padded_positions[index] for index in order], self.seq_length)
                samples = [tuple(self._whole(order[position]) for position in row) for row in rows]
            self._cached_epoch = (epoch, samples)
        return self._cached_epoch[1]

    @property
    def row_width(self) -> int:
        """Positions of a padded (BSHD) row: seq_length, or max_positions for concatenated rows, which are full."""
        return self.max_positions if self.packing == "concat" else self.seq_length

    def _documents_in_order(self, length: Callable[[int], int]) -> Iterator[tuple[int, int]]:
        """(index, length(index)) of every document, epoch after epoch in each epoch's order, without end."""
        return ((index, length(index)) for epoch in itertools.count() for index in self.epoch_order(epoch))

    def filled_samples(self) -> Iterator[tuple[Piece, ...]]:
        """packing fill: every row of the job in order, without end, each exactly `max_positions` positions."""
        documents = self._documents_in_order(self._positions.__getitem__)
        return (tuple(row) for row in filled_rows(documents, self.max_positions, self.pad_sequences_to_multiple_of))

    def concatenated_samples(self) -> Iterator[tuple[Piece, ...]]:
        """packing concat: every row of the job in order, without end, each `max_positions` positions: pieces in
        tokens (document, first token, end token), max_positions + 1 tokens a row (concatenated_rows)."""
        documents = self._documents_in_order(lambda index: len(self.documents[index]))
        return (tuple(row) for row in concatenated_rows(documents, self.max_positions))

    def _whole(self, index: int) -> Piece:
        return (index, 0, self._positions[index])

    def micro_batches(self, dp_rank: int, consumed_samples: int = 0, cp_rank: int = 0) -> Iterator[MicroBatch]:
        """Rank `dp_rank`'s micro-batches, without end, after the first `consumed_samples` samples of the
        whole job (all ranks): a requeued job passes its checkpoint's count and goes on in the same order.
        Megatron's forward-backward calls next() num_microbatches times per step. The CP ranks of one
        data-parallel rank share its micro-batches, each holding its own tokens of every row."""
        self._check_position(dp_rank, consumed_samples)
        if not 0 <= cp_rank < self.cp:
            raise ValueError(f"cp_rank {cp_rank} is outside [0, {self.cp}); pass this rank's context-parallel rank.")
        return (
            batch.on_context_parallel_rank(self.cp, cp_rank) for batch in self._micro_batches(dp_rank, consumed_samples)
        )

    def _check_position(self, dp_rank: int, consumed_samples: int) -> None:
        if not 0 <= dp_rank < self.dp:
            raise ValueError(f"dp_rank {dp_rank} is outside [0, {self.dp}); pass this rank's data-parallel rank.")
        chunk = self.micro_batch_size * self.dp
        if consumed_samples < 0 or consumed_samples % chunk:
            raise ValueError(
                f"consumed_samples {consumed_samples} is not a non-negative multiple of "
                f"micro_batch_size x dp = {chunk}; resume from a checkpoint of this batch layout."
            )

    def _micro_batches(self, dp_rank: int, consumed_samples: int) -> Iterator[MicroBatch]:
        chunk = self.micro_batch_size * self.dp
        samples = self._samples_after(consumed_samples)
        share = slice(dp_rank * self.micro_batch_size, (dp_rank + 1) * self.micro_batch_size)
        while True:
            yield self._micro_batch(list(itertools.islice(samples, chunk))[share])

    def _samples_after(self, consumed_samples: int) -> Iterator[tuple[Piece, ...]]:
        if self.packing != "whole":
            # A resume re-cuts the rows before it: a few pieces a row, a second or so per million rows.
            stream = self.filled_samples() if self.packing == "fill" else self.concatenated_samples()
            yield from itertools.islice(stream, consumed_samples, None)
            return
        first_epoch, offset = 0, consumed_samples
        while offset >= self.samples_in_epoch(first_epoch):
            offset -= self.samples_in_epoch(first_epoch)
            first_epoch += 1
        for epoch in itertools.count(first_epoch):
            yield from itertools.islice(self.epoch_samples(epoch), offset, None)
            offset = 0

    def _micro_batch(self, samples: list[tuple[Piece, ...]]) -> MicroBatch:
        pieces = [piece for sample in samples for piece in sample]
        documents = tuple(dict.fromkeys(index for index, _, _ in pieces))
        if self.packing == "concat":
            sequences = [self._stream_sequence(sample) for sample in samples]
        else:
            sequences = [self._token_sequence(piece) for piece in pieces]
        packed = pack(
            sequences, pad_sequences_to_multiple_of=self.pad_sequences_to_multiple_of, pad_token_id=PAD_TOKEN_ID
        )
        if self.layout == "thd":
            return MicroBatch(packed, documents=documents)
        # Every padded sequence fits in seq_length, so rounding the widest up to it gives exactly seq_length:
        # the fixed shape Megatron's seq_length (and pipeline-parallel transfers) expect. Concatenated rows are
        # all max_positions long, so they are exactly that wide (row_width).
        return MicroBatch(to_bshd(packed, pad_to_multiple_of=self.row_width), documents=documents)

    def _stream_sequence(self, pieces: tuple[Piece, ...]) -> TokenSequence:
        """A concatenated row: its pieces' tokens joined, inputs all but the last token, labels all but the first."""
        tokens = torch.cat([self.documents[index].token_ids[start:end] for index, start, end in pieces]).long()
        trained = torch.cat([self.documents[index].trained[start:end] for index, start, end in pieces])[1:]
        return TokenSequence(tokens[:-1], torch.where(trained, tokens[1:], IGNORE_INDEX), trained.float())

    def _token_sequence(self, piece: Piece) -> TokenSequence:
        index, start, end = piece
        document = self.documents[index]
        tokens = document.token_ids[start : end + 1].long()
        trained = document.trained[start + 1 : end + 1]
        labels = torch.where(trained, tokens[1:], IGNORE_INDEX)
        return TokenSequence(tokens[:-1], labels, trained.float())
