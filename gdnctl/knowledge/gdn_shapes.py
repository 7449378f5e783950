"""The GDN kernel shapes one rank of a preset's job calls (no torch: doctor, prewarm and benchmarks use it).

Megatron-Core shards GDN heads over TP, and under context parallel an all-to-all trades the sequence shard
for a head shard, so each rank runs heads / (tp x cp) key and value heads over the whole sequence. A packed
(THD) micro-batch is one row of several sequences (varlen, `cu_seqlens`); a padded (BSHD) one is fixed-length.

Megatron-Core (0.16 through 0.19) repeats the q/k heads up to the value-head count before it calls the kernel
(`repeat_interleave` in GatedDeltaNet), so the kernel sees as many q/k heads as value heads. TileLang compiles
per head count, so prewarm must use these shapes: the native grouped shape (fewer q/k heads) is a different
kernel that training never calls.
"""

from __future__ import annotations

from dataclasses import dataclass

# How a packed micro-batch is split when the doctor or prewarm needs a representative varlen call.
VARLEN_PIECES = 4


@dataclass(frozen=True)
class RankShape:
    name: str
    qk_heads: int
    v_heads: int
    head_dim: int
    seq_lens: tuple[int, ...]
    packed: bool

    @property
    def tokens(self) -> int:
        return sum(self.seq_lens)


def kernel_heads(model, tp: int, cp: int) -> int:
    """Heads per kernel call on one rank, for q/k and v alike (Megatron expands q/k; see the docstring)."""
    return model.linear_num_value_heads // (tp * cp)


def per_rank_shapes(model, *, tp: int, cp: int, seq_length: int, micro_batch_size: int, layout: str) -> list[RankShape]:
    """A fixed-length call of one sequence, and for the packed layout a varlen call of a whole micro-batch."""
    qk = v = kernel_heads(model, tp, cp)
    dim = model.linear_key_head_dim
    tokens = seq_length * (micro_batch_size if layout == "bshd" else 1)
    label = f"tp{tp}" + (f"cp{cp}" if cp > 1 else "")
    shapes = [RankShape(f"{label}-1x{seq_length}", qk, v, dim, (seq_length,), packed=False)]
    if layout == "thd":
        piece = tokens // VARLEN_PIECES
        lens = tuple([piece] * (VARLEN_PIECES - 1) + [tokens - piece * (VARLEN_PIECES - 1)])
        shapes.append(RankShape(f"{label}-varlen-{VARLEN_PIECES}x{piece}", qk, v, dim, lens, packed=True))
    return shapes
