"""Medusa-1 heads (Cai et al., 2024): K small residual heads on the target's last hidden state, one per depth."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch import nn

from specprim._types import DraftRequest
from specprim.drafters._checkpoint import check_target, load_head, register_head, save_head, target_dimensions
from specprim.trees import StaticTree

__all__ = ["MedusaConfig", "MedusaDraftModel", "MedusaHeads", "default_medusa_tree"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MedusaConfig:
    """Hyper-parameters of `MedusaHeads`.

    Attributes:
        hidden_size: the target's hidden size ``H``.
        vocab_size: the target's vocabulary ``V``.
        num_heads: ``K``, the number of heads; head ``k`` (1-based) drafts depth ``k``.
        num_layers: residual blocks per head.
        share_target_head: project with the target's own LM head (by reference, not saved) instead of one
            ``Linear(H, V)`` per head (Medusa-1's choice, ``K * H * V`` extra parameters).
    """

    hidden_size: int
    vocab_size: int
    num_heads: int = 4
    num_layers: int = 1
    share_target_head: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MedusaConfig.{name} must be a positive int, got {value!r}")


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)``: (..., H) -> (..., H)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


@register_head
class MedusaHeads(nn.Module):
    """``K`` Medusa-1 heads for one target: head ``k`` = ``num_layers`` `ResBlock`s, then a projection to the
    target vocabulary (its own ``Linear(H, V)``, or the target's LM head when ``share_target_head``).

    Fed the target's last hidden state at the last committed position (the position *before* the root, the
    last one the target has processed), head ``k`` predicts the token at depth ``k`` below the root.

    The target's LM head is used by reference: it is never copied, registered as a sub-module or saved, and the
    target is never modified. Build with :meth:`from_target` (random init) or :meth:`from_pretrained`.
    """

    def __init__(self, config: MedusaConfig, target: nn.Module) -> None:
        super().__init__()
        check_target(dataclasses.asdict(config), target, "this MedusaConfig")
        self.config = config
        hidden, vocab, heads = config.hidden_size, config.vocab_size, config.num_heads
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden) for _ in range(config.num_layers))) for _ in range(heads)
        )
        self.lm_heads = nn.ModuleList(
            nn.Linear(hidden, vocab, bias=False) for _ in range(0 if config.share_target_head else heads)
        )
        target_head = target.get_output_embeddings()
        # A tuple is not registered by nn.Module: the target's head stays out of state_dict() and parameters().
        self._projections = (target_head,) * heads if config.share_target_head else tuple(self.lm_heads)
        self.to(device=target_head.weight.device, dtype=target_head.weight.dtype)

    @classmethod
    def from_target(
        cls, target: nn.Module, *, num_heads: int = 4, num_layers: int = 1, share_target_head: bool = False
    ) -> MedusaHeads:
        """Randomly initialised heads sized for ``target`` (PyTorch's default init, from the global RNG),
        on the device and in the dtype of its LM head."""
        hidden, vocab = target_dimensions(target)
        config = MedusaConfig(
            hidden_size=hidden, vocab_size=vocab, num_heads=num_heads, num_layers=num_layers,
            share_target_head=share_target_head,
        )
        return cls(config, target)

    @classmethod
    def from_config(cls, config: dict[str, Any], target: nn.Module) -> MedusaHeads:
        """Randomly initialised heads from a saved config dict (used by :meth:`from_pretrained`)."""
        return cls(MedusaConfig(**config), target)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], target: nn.Module) -> MedusaHeads:
        """Load heads saved with :meth:`save_pretrained`; ``ValueError`` if ``target``'s hidden size or
        vocabulary differ from the ones they were built for."""
        return load_head(cls, directory, target)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write ``config.json`` and ``model.safetensors`` (the heads' own weights only) to ``directory``."""
        save_head(self, dataclasses.asdict(self.config), directory)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, H) target hidden states -> (B, K, V) logits; row ``k - 1`` is head ``k``'s."""
        pairs = zip(self.blocks, self._projections, strict=True)
        return torch.stack([project(block(hidden)) for block, project in pairs], dim=1)

    def default_tree(self) -> StaticTree:
        """`default_medusa_tree` for these heads' ``num_heads``."""
        return default_medusa_tree(self.config.num_heads)


def default_medusa_tree(num_heads: int = 4) -> StaticTree:
    """A 26-node sparse tree of sibling ranks for 4 heads, cut to depth ``num_heads``.

    Wider near the root, where a head's top-1 is most often wrong and the chance of reaching the node is
    highest: 5 first tokens, 8 second, 8 third and 5 fourth, favouring low ranks along the path.
    """
    paths = (
        (0,), (1,), (2,), (3,), (4,),
        (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0), (3, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 1, 0), (2, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0),
    )  # fmt: skip
    return StaticTree(paths=tuple(path for path in paths if len(path) <= num_heads))


class MedusaDraftModel:
    """`MedusaHeads` as a `TreeDraftModel` (pair it with a `StaticTree`, e.g. ``heads.default_tree()``).

    ``feature_layers = (-1,)``: the loop passes the target's last hidden states. :meth:`begin` keeps the one
    at the last committed position (the latest received; zeros before any, i.e. a one-token prompt) and runs
    all heads once. Medusa drafts every depth from that single state, so the logits of a node depend only on
    its depth: :meth:`extend` returns head ``d + 1``'s row for a node at depth ``d``, and an all-zero
    (uniform) row for nodes at depth ``>= K``, which no head predicts below (drafts there are uniform guesses;
    losslessness does not depend on them). Logits are float32 over the target vocabulary.
    """

    feature_layers: tuple[int, ...] = (-1,)

    def __init__(self, heads: MedusaHeads) -> None:
        self.heads = heads
        self._hidden: torch.Tensor | None = None  # (B, H) target state at the last committed position
        self._logits: torch.Tensor | None = None  # (B, K + 1, V): the K heads, then a zero row
        self._depths: list[int] = []  # depth of every scratch node

    def __repr__(self) -> str:
        return f"MedusaDraftModel({self.heads.config!r})"

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        """Take the newest committed hidden state and return head 1's (B, V) logits for the root's children."""
        config = self.heads.config
        if request.vocab_size != config.vocab_size:
            raise ValueError(f"Medusa heads draft {config.vocab_size} tokens; the target has {request.vocab_size}")
        if request.features is None:
            raise ValueError("MedusaDraftModel needs the target's hidden states (request.features is None)")
        hidden = request.features.hidden_states[0]  # (B, n, H)
        if request.step == 0:
            self._hidden = None
        if hidden.shape[1] > 0:
            self._hidden = hidden[:, -1]
        if self._hidden is None:
            self._hidden = hidden.new_zeros(hidden.shape[0], config.hidden_size)
        weight = self.heads.blocks[0][0].linear.weight
        logits = self.heads(self._hidden.to(device=weight.device, dtype=weight.dtype)).float()  # (B, K, V)
        self._logits = torch.cat([logits, torch.zeros_like(logits[:, :1])], dim=1)  # (B, K + 1, V)
        self._depths = []
        return self._logits[:, 0]

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(B, M, V) logits of the children of ``M`` new nodes: head ``depth + 1``'s row for each."""
        assert self._logits is not None, "call begin() first"
        for parent in parents.tolist():
            if not -1 <= parent < len(self._depths):
                raise ValueError(f"parent {parent} is not an earlier scratch node (have {len(self._depths)})")
            self._depths.append(1 if parent == -1 else self._depths[parent] + 1)
        num_heads = self.heads.config.num_heads
        rows = [min(depth, num_heads) for depth in self._depths[len(self._depths) - len(parents) :]]
        return self._logits[:, torch.tensor(rows, device=self._logits.device)]  # (B, M, V)
