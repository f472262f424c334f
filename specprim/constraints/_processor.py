"""Plain constrained decoding with ``model.generate``: a logits processor that masks every step to what a
constraint allows (the baseline speculation under a constraint is compared with)."""

from __future__ import annotations

import torch

from specprim._types import DraftTree
from specprim.constraints._protocol import Constraint

_EMPTY = DraftTree(tokens=torch.zeros(1, 0, dtype=torch.long), parents=torch.zeros(0, dtype=torch.long))


class ConstrainedLogits:
    """A ``transformers`` logits processor for one sequence: the logits of tokens ``constraint`` forbids after the
    tokens generated so far (those after the first ``prompt_length``) become ``-inf``."""

    def __init__(self, constraint: Constraint, prompt_length: int) -> None:
        self.state, self.seen = constraint.begin(), prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``input_ids`` (1, T), ``scores`` (1, V) -> the masked scores."""
        if input_ids.shape[0] != 1:
            raise ValueError("a constraint applies to one sequence")
        if not self.state.finished:
            self.state.advance(input_ids[0, self.seen:].tolist())
        self.seen = input_ids.shape[1]
        if self.state.finished:  # complete: generate stops on its EOS, or runs out its budget
            return scores
        allowed = self.state.allowed(_EMPTY)[1][0]  # (V,)
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))
