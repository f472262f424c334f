"""One speculative step for any number of independent sequences (rows): every row's drafter proposes a tree, one
verification scores them all, every row's acceptance rule picks its path, its drafter observes the verdict, the
verifier commits the paths and every row keeps its record.

``speculative_generate`` runs it on one row with a :class:`specprim.hf.Target`, batch generation on the rows of a
batch with one batched forward (:class:`specprim.hf.BatchedHFTarget`): the same function, only ``verify`` and
``commit`` differ.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from specprim._constrain import constrain_tree, mask_logits, unprune_verdict
from specprim._stats import GenerationStats
from specprim._types import DraftRequest, DraftTree, TargetFeatures, Verdict, token_id_list, truncate_tree
from specprim.constraints import ConstraintState
from specprim.drafters import Drafter
from specprim.sampling import SamplingConfig

AcceptanceRule = Callable[..., Verdict]

Verify = Callable[[torch.Tensor, list[DraftTree]], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]
"""``verify(roots, trees)``: roots (R,) long and one tree per row -> logits (R, N_max + 1, V) (row ``r``'s first
``N_r + 1`` positions are its own) and one (R, N_max + 1, H) tensor per layer of the step's ``layers``."""

Commit = Callable[[list[Verdict]], None]
"""``commit(verdicts)``: keep the KV entries of every row's root and accepted path (one verdict per row)."""


@dataclasses.dataclass(eq=False, kw_only=True)
class Row:
    """One sequence in generation.

    Attributes:
        ids: (1, T) long, the prompt and the tokens committed so far, on the verifier's device; the last is the
            root of the next step.
        prompt_length: the prompt's ``T`` (``ids.shape[1]`` before the first step).
        budget: ``max_new_tokens`` of this row.
        drafter: this row's drafter (drafters keep per-sequence state).
        layers: the drafter's ``feature_layers`` (``()`` when it reads no target features).
        features: the target's features at the positions committed by the last step (``None`` without layers).
        stats: the row's per-step record.
        constraint: where the row stands in its constraint (``None``: unconstrained).
        finished: set once the row emitted a stop token or its whole budget, or completed its constraint.
    """

    ids: torch.Tensor
    prompt_length: int
    budget: int
    drafter: Drafter
    layers: tuple[int, ...] = ()
    features: TargetFeatures | None = None
    stats: GenerationStats = dataclasses.field(default_factory=GenerationStats)
    constraint: ConstraintState | None = None
    finished: bool = False

    @property
    def remaining(self) -> int:
        """How many tokens the row may still emit."""
        return self.budget - (self.ids.shape[1] - self.prompt_length)


def speculative_step(
    rows: Sequence[Row], *, verify: Verify, commit: Commit, acceptance: AcceptanceRule, sampling: SamplingConfig,
    vocab_size: int, device: torch.device, layers: tuple[int, ...] = (), generator: torch.Generator | None = None,
    stop_ids: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Advance every row of ``rows`` (none finished) by one step; return each row's new tokens (n_r,).

    ``layers`` are the feature layers ``verify`` returns (the union of the rows' ``layers``). A row's tree is cut to
    the depth its budget allows; its new tokens (the accepted path and the next token) stop right after the first
    of ``stop_ids``, and then, or once the budget is spent, the row is ``finished``. Randomness: the drafters and the
    acceptance rule draw from ``generator`` in row order.

    A row with a ``constraint``: its tree loses the nodes the constraint forbids and its ``q`` is masked and
    renormalised; the target's logits are masked the same way before ``sampling``; its drafter observes the verdict
    in the ids of the tree it proposed; the row finishes once its constraint is complete.
    """
    trees, allowed, draft_s = [], [], []
    for row in rows:
        start = time.perf_counter()
        request = DraftRequest(
            input_ids=row.ids, sampling=sampling, vocab_size=vocab_size, max_depth=row.remaining - 1,
            generator=generator, step=row.stats.steps, features=row.features,
        )
        tree = truncate_tree(row.drafter.propose(request), row.remaining - 1).to(device)
        check_tree(tree, vocab_size)
        masks = kept = None
        if row.constraint is not None:
            tree, masks, kept = constrain_tree(tree, row.constraint)  # masks (N + 1, V) bool, kept (N,) long
        trees.append(tree)
        allowed.append((masks, kept))
        draft_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    roots = torch.stack([row.ids[0, -1] for row in rows])  # (R,)
    logits, hidden = verify(roots, trees)  # (R, N_max + 1, V), (R, N_max + 1, H) each
    verify_s = time.perf_counter() - start
    verdicts, emitted = [], []
    for index, (row, tree) in enumerate(zip(rows, trees, strict=True)):
        start = time.perf_counter()
        row_logits = logits[index : index + 1, : tree.num_nodes + 1]  # (1, N + 1, V)
        check_logits(row_logits)
        masks, kept = allowed[index]
        if masks is not None:
            row_logits = mask_logits(row_logits, masks)
        verdict = acceptance(sampling.probs(row_logits), tree, generator=generator)
        row.drafter.observe(verdict if kept is None else unprune_verdict(verdict, kept))
        verdicts.append(verdict)
        accepted = int(verdict.num_accepted[0])
        path = verdict.path[0, :accepted]  # (a,)
        row_hidden = tuple(h[index : index + 1] for h in _select(hidden, layers, row.layers))  # (1, N + 1, H)
        row.features = committed_features(row_hidden, row.ids[:, -1:], tree.tokens[:, path], path,
                                          row.ids.shape[1] - 1)
        new, stopped = cut_at_stop(torch.cat([tree.tokens[0, path], verdict.next_token[:1]])[: row.remaining],
                                   stop_ids)
        if row.constraint is not None:
            new = new[: row.constraint.advance(new.tolist())]
            stopped = stopped or row.constraint.finished
        row.ids = torch.cat([row.ids, new[None]], dim=1)
        row.finished = stopped or row.remaining == 0
        emitted.append(new)
        row.stats.record(
            accepted=accepted, tree_depth=tree.depth, tree_nodes=tree.num_nodes, emitted=new.shape[0],
            draft_s=draft_s[index], verify_s=verify_s,
            total_s=draft_s[index] + verify_s + time.perf_counter() - start,
            tree_parents=tree.parent_list, path=path.tolist(),
        )
    commit(verdicts)
    return emitted


def _select(hidden: tuple[torch.Tensor, ...], layers: tuple[int, ...], wanted: tuple[int, ...]
            ) -> tuple[torch.Tensor, ...]:
    """The entries of ``hidden`` (one per layer of ``layers``) for the layers ``wanted``, in that order."""
    return tuple(hidden[layers.index(layer)] for layer in wanted)


def committed_features(
    hidden: tuple[torch.Tensor, ...], root: torch.Tensor, accepted: torch.Tensor, path: torch.Tensor, start: int
) -> TargetFeatures | None:
    """The target's hidden states at the positions a step committed: the root (row 0) and the accepted
    nodes (rows ``path + 1``); ``root`` (1, 1) and ``accepted`` (1, a) are the tokens there."""
    if not hidden:
        return None
    rows = torch.cat([path.new_zeros(1), path + 1])  # (a + 1,)
    tokens = torch.cat([root, accepted], dim=1)  # (1, a + 1)
    return TargetFeatures(hidden_states=tuple(h[:, rows] for h in hidden), token_ids=tokens, start=start)


def check_decodes(acceptance: AcceptanceRule, drafters: Sequence[Drafter], sampling: SamplingConfig) -> None:
    """Raise ``ValueError`` when ``sampling`` is not greedy and the acceptance rule or one of ``drafters`` declares
    ``greedy_only``."""
    if sampling.is_greedy:
        return
    if getattr(acceptance, "greedy_only", False):
        raise ValueError(f"{acceptance!r} verifies greedy decoding only; use temperature=0 or a sampling rule")
    for drafter in drafters:
        if getattr(drafter, "greedy_only", False):
            raise ValueError(f"{drafter!r} drafts for greedy decoding only (e.g. a union with a sampled: tree, whose "
                             "nodes would lose the q they were drawn from); use temperature=0, a deterministic tree, "
                             "or the sampling drafter alone")


def check_budget(max_new_tokens: object) -> int:
    """``max_new_tokens`` as it is; ``ValueError`` unless it is an int >= 0."""
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    return max_new_tokens


def stop_token_ids(eos_token_id: int | Sequence[int] | None) -> torch.Tensor:
    """The stop tokens as a (k,) long tensor (empty for ``None``)."""
    return torch.tensor(token_id_list(eos_token_id), dtype=torch.long)


def cut_at_stop(new: torch.Tensor, stop_ids: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """Cut ``new`` (n,) right after its first stop token; say whether one was found."""
    if stop_ids is None or stop_ids.numel() == 0:
        return new, False
    hits = torch.isin(new, stop_ids.to(new.device)).nonzero()
    if hits.numel() == 0:
        return new, False
    return new[: int(hits[0, 0]) + 1], True


def check_tree(tree: DraftTree, vocab_size: int) -> None:
    """``ValueError`` unless ``tree`` is one row whose ``q`` and tokens fit a vocabulary of ``vocab_size``."""
    if tree.batch_size != 1:
        raise ValueError(f"the drafter returned a tree for batch size {tree.batch_size}, expected 1")
    if tree.q is not None and tree.q.shape[-1] != vocab_size:
        raise ValueError(f"the drafter's q has {tree.q.shape[-1]} columns; the target's vocabulary has {vocab_size}")
    if tree.num_nodes and bool(((tree.tokens < 0) | (tree.tokens >= vocab_size)).any()):
        raise ValueError(f"the drafter proposed a token id outside the target's vocabulary [0, {vocab_size})")


def check_logits(logits: torch.Tensor) -> None:
    """``FloatingPointError`` for NaN or +inf logits, or a row of all -inf."""
    if bool(torch.isfinite(logits.sum())):  # one reduction and one sync when every logit is finite
        return
    if bool(logits.isnan().any()) or bool(logits.isposinf().any()):
        raise FloatingPointError("the target produced NaN or +inf logits; check the model's dtype and weights")
    if bool(logits.isneginf().all(-1).any()):
        raise FloatingPointError("the target produced a row of all -inf logits")
