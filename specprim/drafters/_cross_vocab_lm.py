"""A draft model with another tokenizer than the target's, drafting the tokens both share (TLI, lossless)."""

from __future__ import annotations

import dataclasses

import torch

from specprim._types import DraftRequest
from specprim.drafters._cross_vocab import CrossVocab
from specprim.trees import TreeDraftModel

KEEP_BACK = 4
"""Draft tokens before the end of the previous context that are encoded again with the new text (a token at the
end may merge with what follows)."""


class CrossVocabDraftModel:
    """`TreeDraftModel` over the target's vocabulary made of a `TreeDraftModel` over the draft's own vocabulary (e.g.
    an :class:`LMDraftModel`) and the :class:`CrossVocab` of the two tokenizers.

    Context: the committed target ids are decoded to text and encoded with the draft's tokenizer (incrementally:
    the draft ids of the previous context are kept up to a few tokens before its end, :data:`KEEP_BACK`, when the
    new text extends their text, and only the rest is encoded; the draft model's own cache then keeps its longest
    common prefix). Drafted nodes: their target ids are shared tokens, fed to the draft as the matching draft ids.

    Logits: the draft's logits on the shared tokens, at their target ids, ``-inf`` elsewhere
    (:meth:`CrossVocab.to_target_logits`), so the tree builder samples from, and reports as ``q``, the draft's
    distribution restricted to the shared tokens and renormalised: the q-contract holds and a lossless acceptance
    rule stays lossless. Batch size 1.
    """

    def __init__(self, draft: TreeDraftModel, vocab: CrossVocab) -> None:
        if not isinstance(draft, TreeDraftModel):
            raise TypeError(f"{type(draft).__name__} does not implement TreeDraftModel (begin / extend)")
        if not isinstance(vocab, CrossVocab):
            raise TypeError(f"vocab must be a CrossVocab, got {type(vocab).__name__}")
        self.draft = draft
        self.vocab = vocab
        self.draft_vocab_size = int(getattr(draft, "vocab_size", len(vocab.draft_tokenizer)))
        self._retokenizer = Retokenizer(vocab)
        self._target_vocab = 0

    def __repr__(self) -> str:
        return f"CrossVocabDraftModel({self.draft!r}, {self.vocab!r})"

    @property
    def model(self) -> object:
        """The draft's language model (for reports)."""
        return getattr(self.draft, "model", self.draft)

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        if request.input_ids.shape[0] != 1:
            raise ValueError("cross-tokenizer drafting drafts for batch size 1")
        self._target_vocab = request.vocab_size
        draft_ids = self._retokenizer.draft_ids(request.input_ids[0].tolist())
        draft_request = dataclasses.replace(
            request, input_ids=torch.tensor([draft_ids], dtype=torch.long), vocab_size=self.draft_vocab_size,
            features=None)
        logits = self.draft.begin(draft_request)  # (1, V_d)
        return self.vocab.to_target_logits(logits, self._target_vocab)  # (1, V)

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.draft.extend(parents, self.vocab.draft_tokens(tokens))  # (1, M, V_d)
        return self.vocab.to_target_logits(logits, self._target_vocab)  # (1, M, V)


class Retokenizer:
    """Target ids -> the draft tokenizer's ids of the same text, remembering the previous call's result.

    The draft's ids start with its BOS when its tokenizer adds one. When the draft tokenizer does not encode text
    pieces independently (one that adds a prefix space to every text it encodes), every call encodes the whole text.
    """

    def __init__(self, vocab: CrossVocab) -> None:
        self.target = vocab.target_tokenizer
        self.draft = vocab.draft_tokenizer
        bos = self.draft.bos_token_id
        plain = self.draft("a", add_special_tokens=False).input_ids
        self._start = [bos] if bos is not None and self.draft("a").input_ids[:1] == [bos] != plain[:1] else []
        self._incremental = self._decode(self._encode("a b")) == "a b"
        self._ids: list[int] = []  # the draft's ids of self._text, without the start

    def draft_ids(self, target_ids: list[int]) -> list[int]:
        """The draft's ids (start included, never empty) of the text of ``target_ids``."""
        text = self.target.decode(target_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        keep = max(len(self._ids) - KEEP_BACK, 0) if self._incremental else 0
        kept_text = self._decode(self._ids[:keep]) if keep else ""
        if not text.startswith(kept_text):
            keep, kept_text = 0, ""
        self._ids = self._ids[:keep] + self._encode(text[len(kept_text):])
        ids = self._start + self._ids
        return ids or [self.draft.eos_token_id or 0]

    def _encode(self, text: str) -> list[int]:
        return self.draft(text, add_special_tokens=False).input_ids if text else []

    def _decode(self, ids: list[int]) -> str:
        return self.draft.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
