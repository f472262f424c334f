"""What a drafter must do."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from specprim._types import DraftRequest, DraftTree, Verdict


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft trees and keeps its own state (its cache, index, budgets).

    The q-contract: ``propose`` returns the ``q`` its tokens were actually drawn from under its declared
    ``sampling`` scheme; a drafter that chooses tokens without randomness declares ``"deterministic"``.

    A drafter that needs the target's hidden states declares an attribute ``feature_layers``: a tuple of
    indices into Hugging Face's ``output_hidden_states`` (``0`` = embeddings, ``i`` = after layer ``i``,
    ``-1`` = the last entry, after the final norm for most models). The loop then fills
    ``DraftRequest.features``. Drafters without the attribute get ``features=None`` and cost nothing extra.

    A drafter that can draft for greedy decoding only may set ``greedy_only = True`` (optional, like the acceptance
    rules' flag; the generation loop then refuses it under sampling before the first step).

    A drafter whose trees depend on the request only (nothing kept between steps, ``observe`` learns nothing) may set
    ``stateless = True`` (optional): a :class:`specprim.drafters.UnionDrafter` with ``max_nodes`` then skips it on the
    steps where the drafters before it already fill the cap.
    """

    def propose(self, request: DraftRequest) -> DraftTree:
        """Return a tree rooted at ``request.input_ids[:, -1]`` with depth ``<= request.max_depth``."""
        ...

    def observe(self, verdict: Verdict) -> None:
        """Learn what the target accepted (called once after every ``propose``)."""
        ...
