"""Distillation of a small causal LM (a draft model sharing the target's tokenizer) on cached target outputs."""

from __future__ import annotations

import os

import torch
from torch import nn
from transformers import PreTrainedModel

from specprim.hf import check_causal_lm
from specprim.hf import vocab_size as logits_width
from specprim.train._features import FeatureBatch
from specprim.train._losses import greedy_accuracy, soft_cross_entropy
from specprim.train._protocol import LossOn, ObjectiveOutput, check_loss_on, loss_mask

__all__ = ["DistillObjective"]


class DistillObjective(nn.Module):
    """Train a causal LM ``draft`` (e.g. the model of a :class:`~specprim.drafters.ModelDrafter`) to match the
    target's next-token distributions, read from the feature cache; no hidden states are needed (``layers = ()``).

    The draft runs over the batch's token ids with its ``attention_mask`` (right padding); its logits at position
    ``t`` are scored against the target's cached distribution at ``t`` (``topk_*[:, t]``, the token at ``t + 1``)
    with the soft cross-entropy over the target's top-K (its top-1 only when ``greedy``), averaged over the loss
    mask (:func:`~specprim.train._protocol.loss_mask`). Metrics: ``loss`` and ``acc_1`` (top-1 agreement).

    Vocabularies: the draft's ids must be the target's. A draft whose logits are wider than the target's
    vocabulary (a padded embedding matrix) is trained on its first ``vocab_size`` logits when ``vocab_size`` is
    given (the extra ids then get no probability during training); a narrower draft is fine as long as every
    token id of a batch, input or label, is below its width, otherwise ``forward`` raises ``ValueError``.

    Args:
        draft: a Hugging Face causal LM; its parameters are the objective's, and ``save_pretrained`` writes it
            as a regular checkpoint (reload with ``AutoModelForCausalLM.from_pretrained``).
        loss_on: ``"all"`` real positions or only ``"assistant"`` ones.
        greedy: train on the target's top-1 token as a hard label instead of its top-K distribution.
        vocab_size: the target's vocabulary size ``V`` (``None``: use all of the draft's logits).
    """

    def __init__(self, draft: PreTrainedModel, *, loss_on: LossOn = "all", greedy: bool = False,
                 vocab_size: int | None = None) -> None:
        super().__init__()
        check_causal_lm(draft)
        check_loss_on(loss_on)
        if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                       or vocab_size < 1):
            raise ValueError(f"vocab_size must be a positive int or None, got {vocab_size!r}")
        self.module = draft
        self.layers = ()
        self.loss_on, self.greedy = loss_on, greedy
        width = logits_width(draft)
        self.width = width if vocab_size is None else min(width, vocab_size)  # logits scored: [0, width)
        self.input_width = int(draft.get_input_embeddings().weight.shape[0])

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the draft module with its own ``save_pretrained``."""
        self.module.save_pretrained(directory)

    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        """Loss and metrics of one batch; ``ValueError`` when it holds a token id the draft cannot read or score."""
        real = batch.attention_mask  # (B, T)
        mask = loss_mask(batch, self.loss_on)  # (B, T)
        top_ids = batch.topk_ids[..., :1] if self.greedy else batch.topk_ids  # (B, T, K') labels used
        self._check_ids(batch.input_ids[real], "input", self.input_width)
        self._check_ids(top_ids[mask], "label", self.width)
        out = self.module(input_ids=batch.input_ids, attention_mask=real.long(), use_cache=False)
        logits = out.logits[mask][:, : self.width]  # (N, V_s) only the labelled positions
        ids, logprobs = batch.topk_ids[mask], batch.topk_logprobs[mask]  # (N, K)
        valid = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
        loss = soft_cross_entropy(logits, ids, logprobs, valid, greedy=self.greedy)
        accuracy, _ = greedy_accuracy(logits.detach(), ids, valid)
        return ObjectiveOutput(loss=loss, metrics={"loss": float(loss.detach()), "acc_1": accuracy})

    def _check_ids(self, ids: torch.Tensor, kind: str, width: int) -> None:
        if ids.numel() and int(ids.max()) >= width:
            raise ValueError(f"the batch holds {kind} token id {int(ids.max())}, but the draft model has only {width} "
                             f"token ids; distil a draft that shares the target's tokenizer and vocabulary")
