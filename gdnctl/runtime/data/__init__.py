"""Training data: documents from jsonl / parquet / synthetic tokens, packed (THD) or padded (BSHD) micro-batches,
sharded over data-parallel ranks and resumable; records with images as the vision-language class's inputs."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "DataPipeline": "pipeline",
    "PAD_TOKEN_ID": "pipeline",
    "MicroBatch": "pipeline",
    "load_tokenizer": "pipeline",
    "read_documents": "pipeline",
    "sequence_padding_multiple": "pipeline",
    "synthetic_documents": "pipeline",
    "training_documents": "pipeline",
    "IGNORE_INDEX": "layout",
    "BshdBatch": "layout",
    "ThdBatch": "layout",
    "TokenSequence": "layout",
    "pack": "layout",
    "to_bshd": "layout",
}
__all__ = [
    "BshdBatch",
    "DataPipeline",
    "IGNORE_INDEX",
    "images",
    "MicroBatch",
    "PAD_TOKEN_ID",
    "ThdBatch",
    "TokenSequence",
    "layout",
    "load_tokenizer",
    "pack",
    "pipeline",
    "read_documents",
    "sequence_padding_multiple",
    "synthetic_documents",
    "to_bshd",
    "training_documents",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
