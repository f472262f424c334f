"""Where a greedy output first differs from the baseline's, and whether that is rounding or a real disagreement."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import torch

from specprim.hf import input_device

DivergenceKind = Literal["numerical", "disagreement", "length"]
FP32_RELATIVE_TOLERANCE = 2.0**-13  # accumulated fp32 error of a forward is far above one ulp (2^-23)


def relative_tolerance(dtype: torch.dtype) -> float:
    """The relative logit gap still explained by rounding: the dtype's machine epsilon (bf16 2^-7, fp16 2^-10),
    and at least 2^-13 (fp32)."""
    return max(torch.finfo(dtype).eps, FP32_RELATIVE_TOLERANCE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Divergence:
    """The first position where a method's greedy output differs from the baseline's.

    Attributes:
        turn: the 0-based conversation turn; ``position``: the 0-based index among that turn's new tokens.
        reference_token / method_token: the baseline's and the method's token there (``None`` past an end).
        reference_logit / method_logit: the target's logits of both tokens, recomputed by one forward over the
            turn's input and the common prefix, in the target's dtype.
        tolerance: ``relative_tolerance(dtype) * max(|reference_logit|, |method_logit|)``.
        recomputed_argmax: the target's argmax in that recomputation.
        kind: ``"numerical"`` when ``|reference_logit - method_logit| <= tolerance`` (the two candidates are tied
            within rounding), ``"disagreement"`` otherwise, ``"length"`` when one output is a prefix of the other.
    """

    turn: int
    position: int
    reference_token: int | None
    method_token: int | None
    reference_logit: float | None
    method_logit: float | None
    tolerance: float | None
    recomputed_argmax: int | None
    kind: DivergenceKind

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def first_difference(reference: Sequence[torch.Tensor], candidate: Sequence[torch.Tensor]) -> tuple[int, int] | None:
    """``(turn, position)`` of the first differing token of two per-turn outputs ((n,) tensors), else ``None``."""
    for turn, (ref, out) in enumerate(zip(reference, candidate, strict=True)):
        common = min(len(ref), len(out))
        differs = (ref[:common] != out[:common]).nonzero()
        if differs.numel():
            return turn, int(differs[0, 0])
        if len(ref) != len(out):
            return turn, common
    return None


@torch.no_grad()
def classify_divergence(
    target: torch.nn.Module, context: torch.Tensor, reference_token: int | None, method_token: int | None,
    *, turn: int, position: int,
) -> Divergence:
    """Recompute the target's logits after ``context`` (1, T) — the turn's input plus the common prefix — and
    classify the divergence between ``reference_token`` and ``method_token`` there (tolerance from the dtype of
    the target's weights)."""
    if reference_token is None or method_token is None:
        return Divergence(turn=turn, position=position, reference_token=reference_token, method_token=method_token,
                          reference_logit=None, method_logit=None, tolerance=None, recomputed_argmax=None,
                          kind="length")
    ids = context.to(input_device(target))
    logits = target(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1]  # (V,)
    ref, out = float(logits[reference_token]), float(logits[method_token])
    dtype = target.get_input_embeddings().weight.dtype  # the weights' dtype, even if logits are upcast
    tolerance = relative_tolerance(dtype) * max(abs(ref), abs(out))
    return Divergence(
        turn=turn, position=position, reference_token=reference_token, method_token=method_token,
        reference_logit=ref, method_logit=out, tolerance=tolerance, recomputed_argmax=int(logits.argmax()),
        kind="numerical" if abs(ref - out) <= tolerance else "disagreement",
    )
