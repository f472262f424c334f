"""Applying a constraint's masks to a draft tree (prune, mask ``q``) and to the target's logits, the same for every
constraint (:mod:`specprim.constraints`)."""

from __future__ import annotations

import dataclasses

import torch

from specprim._types import DraftTree, Verdict
from specprim.constraints import ConstraintState


def prune_tree(tree: DraftTree, valid: torch.Tensor) -> tuple[DraftTree, torch.Tensor]:
    """The sub-tree of the ``valid`` (N,) bool nodes of a one-row ``tree`` (an ancestor-closed set), renumbered in
    order, with matching ``q`` rows; and ``kept`` (N',) long, the original id of every node left."""
    kept = valid.nonzero().flatten().cpu()  # (N',)
    if kept.numel() == tree.num_nodes:
        return tree, kept
    new_id = {int(old): new for new, old in enumerate(kept)}
    parents = [-1 if tree.parent_list[i] == -1 else new_id[tree.parent_list[i]] for i in kept.tolist()]
    q = None
    if tree.q is not None:
        q = tree.q.index_select(1, torch.cat([kept.new_zeros(1), kept + 1]).to(tree.q.device))  # (1, N' + 1, V)
    return DraftTree(tokens=tree.tokens.index_select(1, kept.to(tree.tokens.device)),
                     parents=torch.tensor(parents, dtype=torch.long, device=tree.parents.device),
                     q=q, sampling=tree.sampling), kept


def mask_draft(tree: DraftTree, masks: torch.Tensor) -> DraftTree:
    """``tree`` with its ``q`` (1, N + 1, V) masked by ``masks`` (N + 1, V) bool and renormalised: the distribution
    the nodes left after pruning were drawn from (a sample of ``q`` that lands in the mask is a sample of the
    masked, renormalised ``q``). Rows with no allowed mass (leaves whose children were all pruned) become zero."""
    if tree.q is None:
        return tree
    q = tree.q * masks.to(tree.q.device)  # (1, N + 1, V)
    total = q.sum(-1, keepdim=True)
    return dataclasses.replace(tree, q=torch.where(total > 0, q / total.clamp_min(1e-30), q))


def mask_logits(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``logits`` (1, N + 1, V) with every token outside ``masks`` (N + 1, V) bool set to ``-inf``: the constrained
    target, before temperature, top-k and top-p. ``ValueError`` when the constraint's vocabulary is not the
    target's."""
    if masks.shape[-1] != logits.shape[-1]:
        raise ValueError(f"the constraint covers {masks.shape[-1]} token ids; the target's vocabulary has "
                         f"{logits.shape[-1]} (build it with vocab_size= the target's)")
    return logits.masked_fill(~masks.to(logits.device), float("-inf"))


def constrain_tree(tree: DraftTree, state: ConstraintState) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """A one-row ``tree`` under ``state``: the tree without its disallowed nodes and with its ``q`` masked, the
    allowed tokens of its positions (N' + 1, V) bool, and the original id of every node left (N',) long."""
    valid, masks = state.allowed(tree)  # (N,), (N + 1, V)
    pruned, kept = prune_tree(tree, valid)
    masks = masks[torch.cat([kept.new_zeros(1), kept + 1]).to(masks.device)]  # (N' + 1, V)
    return mask_draft(pruned, masks), masks, kept


def unprune_verdict(verdict: Verdict, kept: torch.Tensor) -> Verdict:
    """``verdict`` on a pruned tree with its path in the node ids of the tree the drafter proposed (``kept``: the
    original id of every node left)."""
    path = verdict.path  # (1, D)
    original = kept.to(path.device)[path.clamp_min(0)]
    return dataclasses.replace(verdict, path=torch.where(path >= 0, original, path))
