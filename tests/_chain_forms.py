"""Closed forms of the acceptance of a draft chain, by enumerating every prefix (tiny V and K only): what
token-level speculative sampling and block verification accept, position by position, from the empty context."""

from __future__ import annotations

import itertools

from specprim.testing import ContextTable


def acceptance_by_depth(target: ContextTable, draft: ContextTable, depth: int) -> tuple[list[float], list[float]]:
    """``P(tau >= j)`` for ``j = 1 .. depth`` of (token-level speculative sampling, block verification).

    Token level: ``sum over x_1..x_j of prod_i min(p_i(x_i), q_i(x_i))``. Block: ``sum of q(x_1..x_j) w_j`` with
    ``w_0 = 1`` and ``w_j = min(1, w_{j-1} p(x_j | x_<j) / q(x_j | x_<j))``.
    """
    vocab = target.vocab_size
    p, q = target.probs.double().tolist(), draft.probs.double().tolist()
    token_level, block = [], []
    for length in range(1, depth + 1):
        token_sum = block_sum = 0.0
        for chain in itertools.product(range(vocab), repeat=length):
            row, weight, q_chain, both = 0, 1.0, 1.0, 1.0
            for x in chain:
                weight = min(1.0, weight * p[row][x] / q[row][x]) if q[row][x] > 0 else 0.0
                q_chain *= q[row][x]
                both *= min(p[row][x], q[row][x])
                row = row * vocab + x + 1
            token_sum += both
            block_sum += q_chain * weight
        token_level.append(token_sum)
        block.append(block_sum)
    return token_level, block
