"""A parallel drafter (after PARD, arXiv 2504.18583, and DFlash, arXiv 2602.06036): ``K`` draft distributions from
ONE forward of a head that reads the target's features.

Notation: ``d`` the target's hidden size, ``V`` its vocabulary, ``V_d`` the draft vocabulary, ``K`` the number of
drafted positions (``num_draft``), ``T`` the root's position.

The head is an EAGLE-3 head (:class:`~specprim.drafters.EagleHead`, ``version=3``) plus ``K - 1`` learned
*placeholder* slots. The head's sequence holds the committed pairs (fused target feature at ``t``, token at
``t + 1``) for ``t = 0 .. T - 1``, exactly as EAGLE-3's does; the last pair ``(f_{T-1}, root)`` gives ``q_1``, the
distribution of the root's child, as EAGLE-3's first depth does. Placeholder ``j`` (``j = 1 .. K - 1``) is a pair of
learned vectors (a token embedding and a feature, one pair per ``j``) at position ``T - 1 + j``; it attends to every
committed pair and to the placeholders before it (a plain causal mask), and its output gives ``q_{j+1}``, the
distribution of the token at depth ``j + 1``. All ``K`` distributions come from one forward over the newly
committed pairs and the placeholders; none depends on the tokens drafted above it.

That independence is what keeps the drafter honest about its ``q``: as a `TreeDraftModel`, ``extend`` runs nothing
and returns ``q_{d+1}`` for every node of depth ``d``, whatever its tokens. A builder that draws a node's children
from the logits ``extend`` returned declares exactly the distribution they were drawn from, so every lossless
acceptance rule stays lossless with any builder (a chain, a static tree, a dynamic tree, sampled trees).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from specprim._types import DraftRequest, TargetFeatures
from specprim.drafters._checkpoint import load_head, register_head, save_head
from specprim.drafters._eagle_head import EagleHead
from specprim.drafters._vocab import check_d2t

__all__ = ["ParallelDraftModel", "ParallelHead"]


def _check_num_draft(num_draft: object) -> int:
    if not isinstance(num_draft, int) or isinstance(num_draft, bool) or num_draft < 1:
        raise ValueError(f"num_draft must be a positive int (the positions drafted per forward), got {num_draft!r}")
    return num_draft


@register_head
class ParallelHead(nn.Module):
    """An EAGLE-3 head with ``num_draft - 1`` learned placeholder slots: ``num_draft`` distributions per forward.

    Own weights: the EAGLE-3 head ``eagle`` (fused features, one decoder layer, final norm, reduced-vocabulary LM
    head ``d2t``) and ``placeholder_tokens`` / ``placeholder_features``, (K - 1, d) each. The target's input
    embeddings are read by reference through ``eagle`` (never copied, never saved).

    Build one with :meth:`from_eagle` (a trained EAGLE-3 head's weights, copied: ``q_1`` is then that head's first
    depth exactly, and training only has to teach the placeholders), :meth:`from_target` (random) or
    :meth:`from_pretrained`; draft with ``TreeDrafter(ParallelDraftModel(head), Chain(head.num_draft))``.
    """

    def __init__(self, eagle: EagleHead, num_draft: int) -> None:
        super().__init__()
        if not isinstance(eagle, EagleHead) or eagle.config.version != 3:
            raise TypeError(f"ParallelHead extends an EAGLE-3 EagleHead, got {eagle!r:.80}")
        self.num_draft = _check_num_draft(num_draft)
        self.eagle = eagle
        size, weight = eagle.config.hidden_size, eagle.fc.weight
        std = float(getattr(eagle.layer_config, "initializer_range", 0.02))
        self.placeholder_tokens = nn.Parameter(torch.randn(num_draft - 1, size).mul_(std).to(weight))  # (K-1, d)
        self.placeholder_features = nn.Parameter(torch.randn(num_draft - 1, size).mul_(std).to(weight))  # (K-1, d)
        # A tuple is not registered by nn.Module: the trainer finds the target's module here and freezes it.
        self._target_modules = (eagle.target_embeddings,)

    def __repr__(self) -> str:
        return f"ParallelHead(num_draft={self.num_draft}, eagle={self.eagle.config!r})"

    # ----------------------------------------------------------------------------------------- construction
    @classmethod
    def from_eagle(cls, eagle: EagleHead, num_draft: int) -> ParallelHead:
        """A head whose EAGLE-3 part is a copy of ``eagle`` (same target), with fresh placeholders (from the global
        RNG)."""
        return cls(copy.deepcopy(eagle), num_draft)

    @classmethod
    def from_target(cls, target: PreTrainedModel, num_draft: int, **eagle_options: Any) -> ParallelHead:
        """A randomly initialised head for ``target``; ``eagle_options`` go to :meth:`EagleHead.from_target`
        (``version`` is 3)."""
        return cls(EagleHead.from_target(target, version=3, **eagle_options), num_draft)

    @classmethod
    def from_config(cls, config: dict[str, Any], target: PreTrainedModel) -> ParallelHead:
        """A head with placeholder weights for a saved ``config`` (used by :meth:`from_pretrained`)."""
        if not isinstance(config.get("eagle"), dict):
            raise ValueError("a ParallelHead config needs its EAGLE-3 head's config under 'eagle'")
        return cls(EagleHead.from_config(config["eagle"], target), config.get("num_draft"))

    def config_dict(self) -> dict[str, Any]:
        """What :meth:`save_pretrained` records: the target's dimensions, ``num_draft`` and the EAGLE-3 config."""
        eagle = self.eagle.config
        return {"hidden_size": eagle.hidden_size, "vocab_size": eagle.vocab_size, "num_draft": self.num_draft,
                "eagle": eagle.to_dict()}

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write ``config.json`` and ``model.safetensors`` (own weights, ``d2t`` included) to ``directory``."""
        save_head(self, self.config_dict(), directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], target: PreTrainedModel) -> ParallelHead:
        """Load a head saved with :meth:`save_pretrained` onto ``target``; ``ValueError`` for another target or
        another kind of head."""
        head = load_head(cls, directory, target)
        check_d2t(head.eagle.d2t, head.eagle.config.vocab_size)
        return head

    # ---------------------------------------------------------------------------------------------- forward
    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.eagle.config.feature_layers

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, d) the target's embeddings, in the head's dtype."""
        embeddings = self.eagle.target_embeddings
        weight = self.eagle.fc.weight
        return embeddings(tokens.to(embeddings.weight.device)).to(device=weight.device, dtype=weight.dtype)

    def placeholders(self, batch: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Placeholders ``first .. first + count - 1`` (1-based) for a batch: (B, count, d) token embeddings and
        (B, count, d) features."""
        rows = slice(first - 1, first - 1 + count)
        tokens = self.placeholder_tokens[rows].expand(batch, -1, -1)
        features = self.placeholder_features[rows].expand(batch, -1, -1)
        return tokens, features

    def predict(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """EAGLE-3's layers over given input embeddings (token embeddings or placeholders).

        Args:
            embeds: (B, T, d) the token-side input of every slot.
            hidden: (B, T, d) the feature-side input (fused target features or placeholder features).
            position_ids: (T,) or (B, T) long.
            attention_mask: (B, 1, T, past + T) additive float mask; default causal over the cache and the new slots.
            cache: the KV cache the new slots are appended to, or ``None``.
        Returns:
            (B, T, d) the predicted features; :meth:`draft_logits` / :meth:`logits` score them.
        """
        return self.eagle.predict_embedded(embeds, hidden, position_ids=position_ids, attention_mask=attention_mask,
                                           cache=cache)

    def draft_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., V_d) logits over the draft vocabulary (``d2t`` order)."""
        return self.eagle.draft_logits(predicted)

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., V) float32 logits over the target vocabulary, ``-inf`` outside ``d2t``."""
        return self.eagle.logits(predicted)

    def new_cache(self) -> DynamicCache:
        return self.eagle.new_cache()


class ParallelDraftModel:
    """`ParallelHead` as a `TreeDraftModel`: one head forward per draft, whatever the tree.

    ``begin`` drops the previous placeholders from the KV cache and runs ONE forward over the newly committed pairs
    (``request.features``) and the ``K - 1`` placeholders; it keeps the ``K`` distributions and returns the first
    (the root's children). ``extend`` runs nothing: a node at depth ``d`` gets ``q_{d+1}`` (the same row for every
    node of that depth), so a tree deeper than ``K`` raises ``ValueError`` (draft with ``Chain(K)`` or a tree of
    depth ``<= K``). Logits are float32 over the target vocabulary, ``-inf`` outside the head's ``d2t``.
    ``request.step == 0`` resets the cache; a one-token prompt drafts from a zero feature (still lossless).
    Raises ``ValueError`` when a request carries no features, skips committed positions or has another
    vocabulary size.
    """

    def __init__(self, head: ParallelHead) -> None:
        if not isinstance(head, ParallelHead):
            raise TypeError(f"ParallelDraftModel drafts with a ParallelHead, got {type(head).__name__}")
        self.head = head
        self.feature_layers: tuple[int, ...] = head.feature_layers
        self._cache: DynamicCache | None = None
        self._num_pairs = 0  # committed pairs in the cache
        self._depth_logits = torch.empty(0)  # (B, K, V) q_1 .. q_K of the current root
        self._scratch_depths: list[int] = []

    def __repr__(self) -> str:
        return f"ParallelDraftModel(num_draft={self.head.num_draft}, feature_layers={self.feature_layers})"

    @property
    def max_depth(self) -> int:
        """The deepest tree this model drafts (``K``): tools that choose trees (``specprim tune``) stay within it."""
        return self.head.num_draft

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        """Commit the new pairs and draft all ``K`` depths in one forward; return (B, V) logits of the root's
        children."""
        features = self._check_request(request)
        if request.step == 0 or self._cache is None:
            self._cache, self._num_pairs = self.head.new_cache(), 0
        if features.start != self._num_pairs:
            raise ValueError(
                f"request.features starts at position {features.start} but the head holds {self._num_pairs} "
                "committed positions: every request must carry the features committed since the previous one"
            )
        self._scratch_depths = []
        count = features.token_ids.shape[1]
        if count == 0 and self._num_pairs > 0 and self._depth_logits.numel():
            return self._depth_logits[:, 0]  # nothing new committed: the same context, the same draft
        extra = self._cache.get_seq_length() - self._num_pairs
        if extra > 0:
            self._cache.crop(-extra)  # drop the previous placeholders (and a zero-feature pair)
        head, ids = self.head, request.input_ids
        if count:
            tokens = ids[:, features.start + 1 : features.start + count + 1]  # (B, n) token after each feature
            hidden = head.eagle.fuse([h.to(head.eagle.fc.weight.device) for h in features.hidden_states])
        else:  # one-token prompt: a zero feature paired with the root at position 0
            tokens = ids[:, -1:]
            hidden = head.eagle.fc.weight.new_zeros(ids.shape[0], 1, head.eagle.config.hidden_size)
        start = features.start if count else 0
        slot_tokens, slot_features = head.placeholders(ids.shape[0], 1, head.num_draft - 1)  # (B, K - 1, d) each
        embeds = torch.cat([head.embed(tokens), slot_tokens], dim=1)  # (B, n + K - 1, d)
        inputs = torch.cat([hidden, slot_features], dim=1)  # (B, n + K - 1, d)
        positions = torch.arange(start, start + embeds.shape[1])  # committed pairs, then placeholders
        out = head.predict(embeds, inputs, position_ids=positions, cache=self._cache)  # (B, n + K - 1, d)
        self._num_pairs += count
        self._depth_logits = head.logits(out[:, tokens.shape[1] - 1 :])  # (B, K, V): last pair + placeholders
        return self._depth_logits[:, 0]

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Add ``M`` scratch nodes; return (B, M, V): ``q_{d+1}`` for a node of depth ``d`` (no forward runs)."""
        if not self._depth_logits.numel():
            raise ValueError("call begin() before extend()")
        batch, before = self._depth_logits.shape[0], len(self._scratch_depths)
        new_parents = [int(p) for p in parents.tolist()]
        if tokens.dim() != 2 or tuple(tokens.shape) != (batch, len(new_parents)):
            raise ValueError(f"tokens must have shape (B, M) = ({batch}, {len(new_parents)}), "
                             f"got {tuple(tokens.shape)}")
        depths = []
        for parent in new_parents:
            if not -1 <= parent < before:
                raise ValueError(f"parent {parent} is not the root (-1) or a scratch node of an earlier call "
                                 f"(there are {before})")
            depths.append(1 if parent == -1 else self._scratch_depths[parent] + 1)
        deepest = max(depths, default=0)
        if deepest >= self.head.num_draft:
            raise ValueError(
                f"the parallel head drafts {self.head.num_draft} positions: a node at depth {deepest} has no draft "
                f"distribution for its children; use a tree no deeper than {self.head.num_draft}"
            )
        self._scratch_depths += depths
        return self._depth_logits[:, depths]  # (B, M, V)

    def _check_request(self, request: DraftRequest) -> TargetFeatures:
        features = request.features
        if features is None:
            raise ValueError(
                "ParallelDraftModel needs request.features (the target's hidden states); draft through a drafter "
                "that declares feature_layers, e.g. TreeDrafter(ParallelDraftModel(head), Chain(head.num_draft))"
            )
        if request.vocab_size != self.head.eagle.config.vocab_size:
            raise ValueError(f"the head drafts over {self.head.eagle.config.vocab_size} target ids, the target has "
                             f"{request.vocab_size}")
        if len(features.hidden_states) != len(self.feature_layers):
            raise ValueError(f"expected {len(self.feature_layers)} feature tensors (layers {self.feature_layers}), "
                             f"got {len(features.hidden_states)}")
        if features.start + features.token_ids.shape[1] + 1 != request.input_ids.shape[1]:
            raise ValueError("request.features must cover every committed position but the root")
        return features

