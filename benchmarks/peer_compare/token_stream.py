"""One token stream for both loops: Megatron-Core's mock GPT dataset hands out the rows gdnctl's trainer trains.

Left alone, the two loops train different tokens. gdnctl's pretrain job without train.data_path trains synthetic
documents whose ids are uniform over the vocabulary (gdnctl/runtime/data/pipeline.py training_documents), joined
into one stream and cut into full rows (packing concat). Megatron-Bridge's loop on mock data trains Megatron-Core's
MockGPTLowLevelDataset documents, 1, 2, 3, ... up to the document's length and then the end-of-document id
(megatron/core/datasets/gpt_dataset.py), so its tokens are the first few thousand ids of the vocabulary over and
over. With random weights the tokens decide how the router spreads them over the experts, and so how even the
experts' grouped GEMMs are.

So the peer is made to train gdnctl's rows, the same ids at the same positions, not gdnctl's to train Megatron's:
gdnctl's rows are what a gdnctl user's benchmark trains, and the change stays inside the benchmark's peer, which
already runs Megatron-Bridge's own code everywhere else. Megatron-Core's GPTDataset builds each sample from
`_query_document_sample_shuffle_indices(idx)`, seq_length + 1 token ids (inputs are the first seq_length, labels
the last; `add_extra_token_to_sequence`), and Megatron-Bridge's pretraining sampler reads the samples in order,
rank r taking the r-th micro-batch of each data-parallel chunk, as gdnctl's pipeline does. Replacing that one
method of MockGPTDataset with row `idx` of gdnctl's stream keeps every other part of Megatron's sample (its
position ids, its masks, its loss mask) as Megatron makes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy


class GdnctlRows:
    """Row `idx` of the stream gdnctl's trainer trains for an engine config (its concatenated rows, in order)."""

    def __init__(self, engine_yaml: Path, seq_length: int) -> None:
        from gdnctl.runtime.__main__ import load_config
        from gdnctl.runtime.data import DataPipeline, training_documents

        config = load_config(Path(engine_yaml))
        if config.packing != "concat" or config.layout != "bshd":
            raise ValueError(
                f"{engine_yaml} trains packing {config.packing} on layout {config.layout}: Megatron's mock rows are "
                "full rows of one token stream, which gdnctl trains with packing concat on layout bshd; render the "
                "engine config with those"
            )
        if config.train.seq_length != seq_length:
            raise ValueError(
                f"{engine_yaml} trains rows of {config.train.seq_length} tokens, the peer {seq_length}: pass the "
                "engine config's train.seq_length as --seq"
            )
        self.pipeline = DataPipeline.from_engine_config(config, training_documents(config))
        self._samples = self.pipeline.concatenated_samples()
        self._rows: list[tuple] = []

    def text(self, idx: int) -> numpy.ndarray:
        """The row's seq_length + 1 token ids, as Megatron's GPTDataset takes a sample's text."""
        while len(self._rows) <= idx:
            self._rows.append(next(self._samples))
        documents = self.pipeline.documents
        pieces = [documents[index].token_ids[start:end].numpy() for index, start, end in self._rows[idx]]
        return numpy.concatenate(pieces).astype(numpy.int64)

    def document_ids(self, idx: int) -> numpy.ndarray:
        self.text(idx)
        return numpy.array([index for index, _, _ in self._rows[idx]], dtype=numpy.int64)

    def document_lengths(self, idx: int) -> numpy.ndarray:
        """How many of the row's tokens each of its documents' pieces holds, in order."""
        self.text(idx)
        return numpy.array([end - start for _, start, end in self._rows[idx]], dtype=numpy.int64)


def serve_gdnctl_rows(engine_yaml: Path, seq_length: int) -> GdnctlRows:
    """Make megatron-core's MockGPTDataset return gdnctl's rows for `engine_yaml`; call before Megatron-Bridge
    builds its datasets (its data loader's worker inherits the change)."""
    import inspect

    from megatron.core.datasets import gpt_dataset

    rows = GdnctlRows(engine_yaml, seq_length)
    # megatron-core 0.16 unpacks (text, document ids) from the method; 0.19 (text, document ids, document lengths).
    with_lengths = "document_lengths" in inspect.getsource(gpt_dataset.GPTDataset.__getitem__)

    def query(dataset, idx: int) -> tuple[numpy.ndarray, ...]:
        length = dataset.config.sequence_length + dataset.config.add_extra_token_to_sequence
        text = rows.text(idx)
        if len(text) != length:
            raise ValueError(f"gdnctl's row {idx} holds {len(text)} tokens, Megatron's sample {length}")
        if with_lengths:
            return text, rows.document_ids(idx), rows.document_lengths(idx)
        return text, rows.document_ids(idx)

    gpt_dataset.MockGPTDataset._query_document_sample_shuffle_indices = query
    return rows
