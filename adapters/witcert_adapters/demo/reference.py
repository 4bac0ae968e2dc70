"""The uncompressed reference: a greedy continuation per prompt and its next-token logits.

The compressed runs replay these token sequences with teacher forcing, so every scheme
sees the same tokens and the KL and top-1 measurements compare like with like.

Main declarations
-----------------
- :class:`Reference`, :func:`greedy_references`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final

import torch

__all__ = ["Reference", "greedy_references"]


@final
@dataclass(frozen=True, slots=True)
class Reference:
    """One prompt's uncompressed greedy continuation.

    Attributes:
        prompt: the prompt text.
        tokens: prompt and continuation token ids ``[1, P + continuation]``.
        logits: the uncompressed model's logits at every position ``[P + continuation, V]``.
        prompt_len: ``P``, the prompt's token count.
        continuation_text: the decoded continuation.
    """

    prompt: str
    tokens: torch.Tensor
    logits: torch.Tensor
    prompt_len: int
    continuation_text: str

    @property
    def processed(self) -> int:
        """Tokens a replay processes: the prompt and every decode step (the last token is
        never fed back)."""
        return int(self.tokens.shape[1]) - 1

    @property
    def step_logits(self) -> torch.Tensor:
        """The reference logits at the decode steps ``[continuation - 1, V]``."""
        return self.logits[self.prompt_len:self.processed]


def greedy_references(model: Any, tokenizer: Any, prompts: Sequence[str], *,
                      continuation: int) -> list[Reference]:
    """Decode ``continuation`` greedy tokens per prompt with the uncompressed model.

    Args:
        model: the transformers causal LM.
        tokenizer: its tokenizer.
        prompts: the prompts, in order.
        continuation: tokens to decode per prompt.

    Returns:
        One :class:`Reference` per prompt.

    Example:
        >>> # refs = greedy_references(model, tok, ["The capital of France is"], continuation=9)
        >>> # refs[0].continuation_text
    """
    refs: list[Reference] = []
    with torch.no_grad():
        for prompt in prompts:
            ids: torch.Tensor = tokenizer(prompt, return_tensors="pt").input_ids
            seq = ids
            for _ in range(continuation):
                nxt = model(seq).logits[:, -1:].argmax(-1)
                seq = torch.cat([seq, nxt], dim=-1)
            prompt_len = int(ids.shape[1])
            refs.append(Reference(prompt, seq, model(seq).logits[0], prompt_len,
                                  str(tokenizer.decode(seq[0, prompt_len:]))))
    return refs
