"""An optimality oracle: the largest expected number of accepted draft tokens any lossless verification of a chain
can reach, as a linear program over couplings of the draft and the emitted tokens, solved with HiGHS (``scipy``)."""

from __future__ import annotations

import numpy as np
import torch

from specprim.testing._lossless import ContextTable

MAX_VARIABLES = 300_000
"""The LP has ``V**K * (K V + 1)`` variables: refuse problems larger than this (use a smaller V or K)."""


def optimal_chain_acceptance(target: ContextTable, draft: ContextTable, depth: int) -> float:
    """The maximum, over every lossless verification scheme, of the expected number of accepted draft tokens of one
    step that drafts a chain of ``depth`` tokens from ``draft`` after the empty context, against ``target``.

    A verification scheme is any joint law (a *coupling*) of the draft ``x_1 .. x_K ~ draft``, the number of
    accepted tokens ``tau`` and the token ``y`` emitted after them; it may look at the whole draft and use its own
    randomness. The variables are ``z[x, tau, y] = P(draft = x, tau, y)`` for ``tau < K`` and ``z[x, K]`` (after a
    fully accepted chain ``y ~ p(. | x)`` is forced). Constraints:

    - the draft keeps its law: ``sum_{tau, y} z[x, tau, y] = q(x)`` for every chain ``x``;
    - lossless: for every ``j < K``, prefix ``x_1..x_j`` and token ``v``,
      ``P(tau > j, x_1..x_j v) + P(tau = j, x_1..x_j, y = v) = p(v | x_1..x_j) P(tau >= j, x_1..x_j)``:
      given that the step emits more than ``j`` tokens starting with ``x_1..x_j``, the next emitted token is
      distributed as the target's. These equalities for all ``j`` are exactly "one step followed by sampling from
      ``p`` is sampling from ``p``".

    The objective is ``E[tau]`` (the bonus token not counted, like ``Verdict.num_accepted``). Divide a rule's
    measured mean accepted length (``LosslessReport.mean_accepted`` of `assert_lossless` run with the same
    ``target``, ``draft`` and a chain of ``depth``) by this value to report it as a fraction of the optimum.

    The tables' rows are renormalised in float64 first (float32 rows that miss 1 by ~1e-7 make the equalities
    inconsistent). Needs ``scipy``. Raises ``ValueError`` when the tables are too shallow for ``depth`` or the
    program would have more than ``MAX_VARIABLES`` variables (``V**K * (K V + 1)``; V = 4, K = 4 has 4,352), and
    ``RuntimeError`` if the solver fails.
    """
    from scipy.optimize import linprog

    vocab = target.vocab_size
    if draft.vocab_size != vocab:
        raise ValueError("target and draft tables must share the vocabulary")
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an int >= 0, got {depth!r}")
    if depth == 0:
        return 0.0
    if min(target.max_context, draft.max_context) < depth - 1:
        raise ValueError(f"the tables need max_context >= depth - 1 = {depth - 1}")
    width = depth * vocab + 1  # variables per chain: (tau, y) for tau < K, then tau = K
    chains = vocab**depth
    if chains * width > MAX_VARIABLES:
        raise ValueError(f"{chains * width} LP variables (V**K * (K V + 1)); use a smaller vocabulary or depth")
    p, q = (_normalised(table) for table in (target, draft))  # (R, V) each
    digits = np.stack([(np.arange(chains) // vocab ** (depth - 1 - i)) % vocab for i in range(depth)], 1)  # (C, K)
    rows = np.zeros((chains, depth), dtype=np.int64)  # rows[c, j]: table row of chain c's prefix of length j
    for j in range(1, depth):
        rows[:, j] = rows[:, j - 1] * vocab + digits[:, j - 1] + 1
    q_chain = np.prod(q[rows, digits], axis=1)  # (C,) q(x_1 .. x_K)
    offsets = np.cumsum([0] + [vocab ** (j + 1) for j in range(depth)])  # lossless rows of level j from offsets[j]

    def lossless_row(j: int, chain: np.ndarray, token: np.ndarray) -> np.ndarray:
        """Row of the constraint (level j, prefix of ``chain`` of length j, next token ``token``)."""
        prefix = chain // vocab ** (depth - j)
        return chains + offsets[j] + prefix * vocab + token

    num_rows = chains + int(offsets[-1])
    a_eq = np.zeros((num_rows, chains * width))
    b_eq = np.zeros(num_rows)
    all_chains = np.arange(chains)
    a_eq[all_chains[:, None], all_chains[:, None] * width + np.arange(width)] = 1.0
    b_eq[:chains] = q_chain
    tokens = np.arange(vocab)
    for tau in range(depth + 1):
        for y in range(vocab if tau < depth else 1):
            column = all_chains * width + (tau * vocab + y if tau < depth else depth * vocab)  # (C,)
            for j in range(tau + 1):
                if j < depth:  # "tau >= j" mass with prefix x_1..x_j, times -p(v | prefix) on every v
                    targets = lossless_row(j, all_chains[:, None], tokens[None, :])  # (C, V)
                    a_eq[targets, column[:, None]] -= p[rows[:, j]]
                if j < tau:  # emits more than j tokens: the (j+1)-th is the draft's
                    a_eq[lossless_row(j, all_chains, digits[:, j]), column] += 1.0
                elif j == tau < depth:  # stops at j: the (j+1)-th is y
                    a_eq[lossless_row(j, all_chains, np.full(chains, y)), column] += 1.0
    accepted = np.tile(np.concatenate([np.repeat(np.arange(depth), vocab), [depth]]), chains)  # tau of each column
    result = linprog(-accepted.astype(np.float64), A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"the linear program failed: {result.message}")
    return float(-result.fun)


def _normalised(table: ContextTable) -> np.ndarray:
    """(R, V) float64 rows of ``table`` summing to 1 to float64 precision. A float32 table's rows are off by ~1e-7,
    which makes the lossless equalities (summed over the next token) slightly inconsistent, and HiGHS then returns
    the optimum of a perturbed program (measured: 0.5337 instead of 0.5409 on a truncated V = 4, K = 3 table)."""
    probs = table.probs.to(torch.float64)
    return (probs / probs.sum(dim=1, keepdim=True)).cpu().numpy()
