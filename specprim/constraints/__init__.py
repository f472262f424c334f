"""Constrained decoding: a grammar (JSON schema, regex or EBNF) restricts the target's tokens, and speculation stays
lossless with respect to the constrained target.

A :class:`Constraint` starts one :class:`ConstraintState` per generation; at every step the state masks the draft
tree (disallowed nodes are pruned, the drafter's ``q`` is masked and renormalised) and gives the allowed tokens of
every position, which the loop applies to the target's logits. :class:`GrammarConstraint` is the implementation on
``xgrammar`` (``pip install 'specprim[structured]'``). See ``docs/structured.md``.
"""

from typing import TYPE_CHECKING

from specprim._lazy import lazy_imports

if TYPE_CHECKING:
    from specprim.constraints._grammar import GrammarConstraint
    from specprim.constraints._protocol import Constraint, ConstraintState

__all__ = ["Constraint", "GrammarConstraint"]

__getattr__, __dir__ = lazy_imports(__name__)
