"""Every prompt of the rl dataset encoded and length-checked before step 1.

A prompt the rollout cannot take (longer than its context leaves after the response's room) would otherwise stop
the job at the step that first draws it, and every resume at that same step, since the prompt schedule is a pure
function of (seed, step). Checked up front instead: such prompts are left out of the schedule and named (their
count and first lines), or, with rollout.overlong_prompts: refuse, the job stops before it starts. A prompt the
tokenizer cannot encode stops the job with its line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.prompts.dataset import PromptRecord

# Lines named in a message; the count says how many more there are.
NAMED_LINES = 5


class PromptCheckError(GdnctlError):
    """A prompt of the rl dataset cannot be rolled out."""


@dataclass(frozen=True)
class CheckedPrompts:
    records: tuple[PromptRecord, ...]  # the prompts the schedule draws from, in file order
    encoded: dict[int, list[int]]  # line -> token ids, for every kept prompt
    dropped: tuple[tuple[int, int], ...]  # (line, tokens) of each prompt left out
    limit: int  # the longest prompt the rollout takes


def check_prompts(
    records: Sequence[PromptRecord],
    encode: Callable[[PromptRecord], list[int]],
    *,
    max_model_len: int,
    max_response_tokens: int,
    refuse: bool,
    where: str,
) -> CheckedPrompts:
    """Encode every record (`encode` raises a GdnctlError naming the line, or anything else, which is wrapped with
    the line here) and keep those of at most max_model_len - max_response_tokens tokens. `where` names the dataset
    in messages. Raises PromptCheckError for an over-long prompt when `refuse`, and when none is left."""
    limit = max_model_len - max_response_tokens
    kept, encoded, dropped = [], {}, []
    for record in records:
        try:
            ids = encode(record)
        except GdnctlError:
            raise
        except Exception as error:  # the tokenizer's or chat template's own error, whatever its type
            raise PromptCheckError(
                f"{where}:{record.line}: the prompt cannot be encoded ({type(error).__name__}: "
                f"{error}); fix or remove that line."
            ) from None
        if len(ids) > limit:
            dropped.append((record.line, len(ids)))
            continue
        kept.append(record)
        encoded[record.line] = ids
    if dropped and refuse:
        raise PromptCheckError(
            f"{describe(dropped, len(records), where, limit, max_model_len, max_response_tokens)}; "
            "rollout.overlong_prompts is refuse, so the job stops before step 1. Shorten or "
            "remove those lines, raise rollout.max_model_len, lower rollout.max_response_tokens, "
            "or set rollout.overlong_prompts: drop to leave them out."
        )
    if not kept:
        raise PromptCheckError(
            f"{describe(dropped, len(records), where, limit, max_model_len, max_response_tokens)}, "
            "which leaves no prompt to train on; raise rollout.max_model_len or lower "
            "rollout.max_response_tokens."
        )
    return CheckedPrompts(tuple(kept), encoded, tuple(dropped), limit)


def describe(
    dropped: Sequence[tuple[int, int]], total: int, where: str, limit: int, max_model_len: int, max_response_tokens: int
) -> str:
    """'3 of 200 prompts in FILE are longer than ... (lines 4 (812 tokens), ...)' without a final period."""
    named = ", ".join(f"{line} ({tokens} tokens)" for line, tokens in dropped[:NAMED_LINES])
    more = f" and {len(dropped) - NAMED_LINES} more" if len(dropped) > NAMED_LINES else ""
    return (
        f"{len(dropped)} of {total} prompts in {where} are longer than the {limit} tokens the rollout takes "
        f"(rollout.max_model_len {max_model_len} - rollout.max_response_tokens {max_response_tokens}): "
        f"line{'s' if len(dropped) > 1 else ''} {named}{more}"
    )
