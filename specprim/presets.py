"""Named speculative-decoding methods as short compositions of primitives.

Each preset returns a `Method`: the drafter (a draft model and a tree shape) and the acceptance rule that
`speculative_generate` takes. Every preset verifies with `SpeculativeSampling`, which is lossless for greedy
and sampled decoding alike (`Method.generate` runs the equivalent, cheaper `Greedy` under greedy decoding).
`from_name` builds a preset from command-line style options; a name joining presets with ``+`` (e.g.
``eagle3+prompt-lookup``) drafts with all of them at once (:func:`union`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

from specprim._loop import GenerateOutput, speculative_generate
from specprim._names import METHODS, is_name
from specprim.acceptance import AcceptanceRule, Greedy, SpeculativeSampling
from specprim.drafters import (
    CrossVocab,
    Datastore,
    DatastoreLookup,
    Drafter,
    EagleHead,
    EarlyExit,
    MedusaDraftModel,
    MedusaHeads,
    ModelDrafter,
    MTPDraftModel,
    MTPHead,
    ParallelDraftModel,
    ParallelHead,
    PromptLookup,
    SuffixDecoding,
    TreeDrafter,
    TreeShaped,
    UnionDrafter,
    eagle_drafter,
    lm_draft_vocab,
)
from specprim.hf import num_layers
from specprim.models import (
    head_path,
    known_datastores,
    known_heads,
    known_name,
    load_datastore,
    pack_like,
    shipped_head,
)
from specprim.trees import Chain, TreeBuilder, parse_tree


@dataclasses.dataclass(frozen=True)
class Method:
    """A drafter and an acceptance rule: everything :func:`specprim.speculative_generate` needs."""

    drafter: Drafter
    acceptance: AcceptanceRule

    def generate(self, target: torch.nn.Module, input_ids: torch.Tensor, **kwargs: Any) -> GenerateOutput:
        """``speculative_generate(target, input_ids, drafter=..., acceptance=..., **kwargs)``.

        Under greedy decoding (``temperature`` 0 or absent) a plain :class:`SpeculativeSampling` rule is replaced by
        :class:`Greedy`: for the deterministic, distinct-sibling trees greedy drafting builds, both accept the same
        path and the same next token, and ``Greedy`` costs a quarter of the time (one argmax instead of a walk of
        vocabulary-wide residuals). Any other rule, including one with steps of its own (``steps=``,
        ``without_rejected=``), is used as given.
        """
        acceptance = self.acceptance
        if acceptance == SpeculativeSampling() and not kwargs.get("temperature"):  # the plain rule, nothing replaced
            acceptance = Greedy()
        return speculative_generate(target, input_ids, drafter=self.drafter, acceptance=acceptance, **kwargs)


def leviathan(
    draft_model: torch.nn.Module, k: int = 4, tree: TreeBuilder | None = None, draft_vocab_size: int | None = None,
    cross_vocab: CrossVocab | None = None,
) -> Method:
    """An independent small LM drafting a chain of ``k`` (Leviathan et al., 2023), or any ``tree``;
    ``draft_vocab_size`` restricts it to that many ids (:func:`specprim.drafters.lm_draft_vocab`: the special ids
    plus the smallest others); ``cross_vocab`` for a draft with another tokenizer (see
    :class:`specprim.drafters.CrossVocab`)."""
    d2t = None if draft_vocab_size is None else lm_draft_vocab(draft_model, draft_vocab_size)
    return Method(ModelDrafter(draft_model, tree=tree or Chain(k), d2t=d2t, cross_vocab=cross_vocab),
                  SpeculativeSampling())


def prompt_lookup(num_tokens: int = 8, max_matches: int = 4, max_ngram: int = 3) -> Method:
    """Prompt-lookup decoding: n-gram matches over the context merged into a deterministic tree."""
    return Method(PromptLookup(max_ngram=max_ngram, num_tokens=num_tokens, max_matches=max_matches),
                  SpeculativeSampling())


def datastore(store: Datastore, num_tokens: int = 4, num_nodes: int = 4) -> Method:
    """Retrieval drafting (REST): the ``num_nodes`` most frequent continuation prefixes (at most ``num_tokens``
    deep) of the context's longest suffix found in ``store`` (:class:`specprim.drafters.DatastoreLookup`)."""
    return Method(DatastoreLookup(datastore=store, num_tokens=num_tokens, num_nodes=num_nodes), SpeculativeSampling())


def suffix(max_tokens: int = 16, alpha: float = 1.0, max_stored: int = 65536) -> Method:
    """Suffix decoding (SuffixDecoding): frequency-scored trees of up to ``min(max_tokens, alpha * match length)``
    nodes from the longest suffix match in the request and in this drafter's earlier outputs (at most ``max_stored``
    tokens kept; :class:`specprim.drafters.SuffixDecoding`)."""
    return Method(SuffixDecoding(max_tokens=max_tokens, alpha=alpha, max_stored=max_stored), SpeculativeSampling())


def early_exit(target: torch.nn.Module, exit_layer: int, k: int = 4, tree: TreeBuilder | None = None) -> Method:
    """Self-speculation with the target's first ``exit_layer`` layers (training-free, no weight copy)."""
    return Method(EarlyExit(target, exit_layer, tree=tree or Chain(k)), SpeculativeSampling())


def medusa(heads: MedusaHeads, tree: TreeBuilder | None = None) -> Method:
    """Medusa heads on the target's last hidden state, verified over a static tree (default: the heads')."""
    return Method(TreeDrafter(MedusaDraftModel(heads), tree or heads.default_tree()), SpeculativeSampling())


def eagle(head: EagleHead, tree: TreeBuilder | None = None) -> Method:
    """An EAGLE-1 feature head with an EAGLE-2 dynamic tree by default."""
    _check_version(head, 1)
    return Method(eagle_drafter(head, tree), SpeculativeSampling())


def eagle3(head: EagleHead, tree: TreeBuilder | None = None) -> Method:
    """An EAGLE-3 head (fused low/mid/high features, reduced draft vocabulary) with a dynamic tree by default."""
    _check_version(head, 3)
    return Method(eagle_drafter(head, tree), SpeculativeSampling())


def mtp(head: MTPHead, k: int = 3, tree: TreeBuilder | None = None) -> Method:
    """A DeepSeek-V3 style multi-token-prediction module chained for ``k`` tokens (or any ``tree``)."""
    return Method(TreeDrafter(MTPDraftModel(head), tree or Chain(k)), SpeculativeSampling())


def parallel(head: ParallelHead, k: int | None = None, tree: TreeBuilder | None = None) -> Method:
    """The parallel drafter: ONE forward of a :class:`~specprim.drafters.ParallelHead` drafts a chain of ``k``
    tokens (default and at most ``head.num_draft``), or any ``tree`` no deeper than ``head.num_draft``."""
    k = head.num_draft if k is None else k
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= head.num_draft:
        raise ValueError(f"the parallel head drafts 1 .. {head.num_draft} tokens per forward, got k={k!r}")
    return Method(TreeDrafter(ParallelDraftModel(head), tree or Chain(k)), SpeculativeSampling())


def union(*methods: Method, max_nodes: int | None = None) -> Method:
    """The methods' drafters at once (:class:`specprim.drafters.UnionDrafter`: their trees merged into one trie per
    step, cut to its first ``max_nodes`` nodes when given), verified by the first method's rule. Every drafter must
    draft deterministically (greedy, top-k or dynamic trees, prompt lookup, datastore lookup). Raises ``ValueError``
    for fewer than two methods or different acceptance rules."""
    if len(methods) < 2:
        raise ValueError(f"union needs at least two methods, got {len(methods)}")
    rules = {repr(m.acceptance) for m in methods}
    if len(rules) > 1:
        raise ValueError(f"the methods verify with different rules ({', '.join(sorted(rules))}); a union verifies "
                         "one tree with one rule")
    return Method(UnionDrafter(*(m.drafter for m in methods), max_nodes=max_nodes), methods[0].acceptance)


def _check_version(head: EagleHead, version: int) -> None:
    if head.config.version != version:
        raise ValueError(f"this preset needs an EAGLE-{version} head, got EAGLE-{head.config.version}")


def from_name(
    name: str,
    *,
    target: torch.nn.Module,
    draft: torch.nn.Module | None = None,
    head: str | None = None,
    num_draft: int | None = None,
    exit_layer: int | None = None,
    tree: TreeBuilder | str | None = None,
    draft_vocab_size: int | None = None,
    datastore: Datastore | str | os.PathLike[str] | None = None,
    max_nodes: int | None = None,
    cross_vocab: CrossVocab | None = None,
) -> Method:
    """Build the preset called ``name`` (see :data:`NAMES`) for ``target``, as command-line tools do.

    ``draft`` is the draft model for ``"leviathan"``; ``head`` a directory saved by a head's
    ``save_pretrained``, or a shipped head's name (:func:`specprim.models.known_heads`), for ``"medusa"``,
    ``"eagle"``, ``"eagle3"`` and ``"mtp"`` (default: the head of that kind shipped for ``target``, when it was
    loaded by a known name: :func:`specprim.models.shipped_head`) (its linears packed when the target's are:
    :func:`specprim.models.pack_like`); ``num_draft`` overrides the draft length of chain presets;
    ``exit_layer`` the early-exit layer (default: half the target's layers); ``draft_vocab_size`` a reduced
    vocabulary for the draft model of ``"leviathan"`` and ``cross_vocab`` its tokenizer's map to the target's when
    they differ (see :func:`leviathan`); ``tree`` replaces the preset's tree
    shape (a builder or a spec string for :func:`specprim.trees.parse_tree`, e.g. one chosen by ``specprim tune``);
    ``datastore`` the corpus of ``"datastore"`` (a :class:`specprim.drafters.Datastore`, a file written by its
    ``save``, or a shipped datastore's name, :func:`specprim.models.known_datastores`), drafting ``num_draft``
    (default 4) tokens deep.
    A name of presets joined by ``+`` (``"eagle3+prompt-lookup"``) builds each with the same options and returns
    their :func:`union`, cut to ``max_nodes`` nodes when given; ``tree`` then shapes the parts that draft with a
    tree, and a prompt-lookup part drafts only its most recent match, ``num_draft`` (default 6) tokens long (the
    other parts provide the breadth; on MT-bench with the shipped EAGLE-3 head this beat the 8-token, 4-match
    standalone default; see docs/generate.md).
    Raises ``ValueError`` for an unknown name, a missing draft model, head or datastore, a tree for prompt lookup
    alone, or ``max_nodes`` for a single method.
    """
    if not is_name(name):
        raise ValueError(f"unknown method {name!r}; known: {list(NAMES)}, or distinct ones joined by '+'")
    parts = name.split("+")
    if max_nodes is not None and len(parts) == 1:
        raise ValueError(f"max_nodes caps a union's merged tree; {name!r} is a single method")
    options = _Options(target, draft, head, num_draft, exit_layer, draft_vocab_size, datastore, cross_vocab)
    builders = _BY_NAME if len(parts) == 1 else {**_BY_NAME, "prompt-lookup": _union_prompt_lookup}
    methods = [builders[part](options) for part in parts]
    if tree is not None:
        if not any(isinstance(m.drafter, TreeShaped) for m in methods):
            raise ValueError(f"{name!r} does not draft with a tree shape; it takes no tree")
        shape = parse_tree(tree) if isinstance(tree, str) else tree
        methods = [with_tree(m, shape) if isinstance(m.drafter, TreeShaped) else m for m in methods]
    return methods[0] if len(methods) == 1 else union(*methods, max_nodes=max_nodes)


def with_tree(method: Method, tree: TreeBuilder) -> Method:
    """``method`` drafting ``tree`` instead of its own shape. The new drafter shares the draft model (and its
    state) with the old one: use one of them at a time. Raises ``ValueError`` for drafters without a tree shape."""
    if not isinstance(method.drafter, TreeShaped):  # a TreeDrafter, ModelDrafter or EarlyExit
        raise ValueError(f"{method.drafter!r} does not draft with a tree shape; it takes no tree")
    drafter = copy.copy(method.drafter)
    drafter.tree = tree
    return dataclasses.replace(method, drafter=drafter)


@dataclasses.dataclass(frozen=True)
class _Options:
    target: torch.nn.Module
    draft: torch.nn.Module | None
    head: str | None
    num_draft: int | None
    exit_layer: int | None
    draft_vocab_size: int | None
    datastore: Datastore | str | os.PathLike[str] | None
    cross_vocab: CrossVocab | None = None

    def require_draft(self, name: str) -> torch.nn.Module:
        if self.draft is None:
            raise ValueError(f"method {name!r} needs a draft model (a small LM, any tokenizer)")
        return self.draft

    def require_head(self, name: str, head_class: Any) -> Any:
        """The head for method ``name``, loaded as ``head_class`` onto the target (packed when the target is)."""
        head = self.head if self.head is not None else shipped_head(known_name(self.target), name)
        if head is None:
            raise ValueError(
                f"method {name!r} needs a trained head: a directory saved with save_pretrained or the name of a "
                f"shipped head ({', '.join(known_heads()) or 'none installed'}); none ships for this target"
            )
        return pack_like(head_class.from_pretrained(str(head_path(head)), self.target), self.target)

    def require_datastore(self, name: str) -> Datastore:
        if self.datastore is None:
            raise ValueError(
                f"method {name!r} needs a datastore: a Datastore, a file written by Datastore.save or the name of a "
                f"shipped datastore ({', '.join(known_datastores()) or 'none installed'})"
            )
        return self.datastore if isinstance(self.datastore, Datastore) else load_datastore(self.datastore)

    def length(self, default: int) -> int:
        return default if self.num_draft is None else self.num_draft


def _union_prompt_lookup(o: _Options) -> Method:
    return prompt_lookup(num_tokens=o.length(6), max_matches=1)


def _early_exit_by_name(o: _Options) -> Method:
    layer = o.exit_layer if o.exit_layer is not None else num_layers(o.target) // 2
    return early_exit(o.target, layer, k=o.length(4))


_BY_NAME: dict[str, Callable[[_Options], Method]] = {
    "leviathan": lambda o: leviathan(o.require_draft("leviathan"), k=o.length(4), draft_vocab_size=o.draft_vocab_size,
                                     cross_vocab=o.cross_vocab),
    "prompt-lookup": lambda o: prompt_lookup(num_tokens=o.length(8)),
    "datastore": lambda o: datastore(o.require_datastore("datastore"), num_tokens=o.length(4)),
    "suffix": lambda o: suffix(max_tokens=o.length(16)),
    "early-exit": _early_exit_by_name,
    "medusa": lambda o: medusa(o.require_head("medusa", MedusaHeads)),
    "eagle": lambda o: eagle(o.require_head("eagle", EagleHead)),
    "eagle3": lambda o: eagle3(o.require_head("eagle3", EagleHead)),
    "mtp": lambda o: mtp(o.require_head("mtp", MTPHead), k=o.length(3)),
    "parallel": lambda o: parallel(o.require_head("parallel", ParallelHead), k=o.num_draft),
}
NAMES: tuple[str, ...] = METHODS  # the keys of _BY_NAME (a test checks), listed where the command line reads them

__all__ = [
    "NAMES",
    "Method",
    "datastore",
    "early_exit",
    "eagle",
    "eagle3",
    "from_name",
    "leviathan",
    "medusa",
    "mtp",
    "parallel",
    "prompt_lookup",
    "union",
    "with_tree",
]
