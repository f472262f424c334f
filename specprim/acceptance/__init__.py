"""Acceptance rules: verify a draft tree against the target distribution ``p``.

Every rule is a frozen keyword-only dataclass called as ``rule(p, tree, generator=None) -> Verdict`` and
declares its guarantee in the class attribute ``lossless``.
"""

from specprim.acceptance._base import AcceptanceRule
from specprim.acceptance._block import BlockVerification
from specprim.acceptance._greedy import Greedy
from specprim.acceptance._multidraft import OptimalMultiDraft
from specprim.acceptance._speculative import SpeculativeSampling
from specprim.acceptance._traversal import TraversalVerification
from specprim.acceptance._typical import TypicalAcceptance

RULES = {
    "speculative": SpeculativeSampling,
    "greedy": Greedy,
    "typical": TypicalAcceptance,
    "block": BlockVerification,
    "traversal": TraversalVerification,
}
"""The rules by the name a command line or a :class:`specprim.recipes.Recipe` gives them."""

__all__ = [
    "RULES",
    "AcceptanceRule",
    "BlockVerification",
    "Greedy",
    "OptimalMultiDraft",
    "SpeculativeSampling",
    "TraversalVerification",
    "TypicalAcceptance",
]
