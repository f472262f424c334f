"""A Hugging Face causal LM verifying one draft tree per row in a single forward, over a ragged KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from specprim._types import DraftTree
from specprim.hf._causal_lm import CausalLM
from specprim.masks import tree_attention_mask

__all__ = ["BatchedHFTarget"]


class BatchedHFTarget:
    """A causal LM as the target of a batch of independent speculative generations (rows), with one KV cache.

    The cache is *ragged*: it has ``S`` slots per row, and ``valid`` (B, S) says which slots hold a committed
    token of that row. Left-padding slots of the prompt and *holes* are invalid and masked out of every later
    query. A hole appears when a row accepts fewer draft tokens than the longest-accepting row of the same step:
    every row gets the same number of new slots, and the unused ones stay invalid. Since every query gets an
    explicit position id and a 4D mask, the order of slots does not matter to attention, so :meth:`compact`
    can move each row's valid slots to the front and drop the columns that are invalid in every row.

    Like :class:`specprim.hf.HFTarget`, the cache holds every committed token of a row except the last one, the
    *root*; ``root_positions`` (B,) is each row's root position (its committed length minus one).

    Guarantees: row ``b`` of :meth:`verify` attends to exactly the keys a batch-1 :class:`HFTarget` verification
    of that row alone would attend to, at the same positions, so its logits equal the batch-1 ones up to
    floating-point summation order. Supports the models :class:`HFTarget` supports; sliding-window layers only
    while a row's slots fit in the window (the cache is compacted first, then ``ValueError``).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.lm = CausalLM.of(model)
        self.model, self.device, self.vocab_size = model, self.lm.device, self.lm.vocab_size
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # (B, S)
        self.root_positions = torch.zeros(0, dtype=torch.long)  # (B,)
        self.compactions = 0
        self._pending = 0  # slots before the last verification

    @property
    def num_slots(self) -> int:
        """``S``: cache slots per row, holes and padding included."""
        return self.valid.shape[1]

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]

    @torch.no_grad()
    def start(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, feature_layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, ...]:
        """Reset the cache and prefill it with every token but the last of each left-padded row.

        Args:
            input_ids: (B, T) long; row ``b``'s prompt is its last ``attention_mask[b].sum()`` tokens.
            attention_mask: (B, T), 1 on prompt tokens and 0 on the left padding; the last column must be 1.
            feature_layers: indices into ``output_hidden_states`` to return.
        Returns:
            one (B, T - 1, H) tensor per entry of ``feature_layers``; padding columns hold meaningless values.
        """
        real = attention_mask.to(self.device).bool()  # (B, T)
        ids = input_ids.to(self.device).masked_fill(~real, 0)  # (B, T) padding ids replaced by a valid id
        batch, length = ids.shape
        self.cache = DynamicCache(config=self.model.config)
        self.valid = real[:, :-1]  # (B, T - 1)
        self.root_positions = real.long().sum(1) - 1  # (B,)
        if length == 1:
            return self.lm.no_hidden_states(batch, feature_layers)
        positions = (self.valid.long().cumsum(1) - 1).clamp(min=0)  # (B, T - 1)
        causal = torch.ones(length - 1, length - 1, dtype=torch.bool, device=self.device).tril()  # (T-1, T-1)
        eye = torch.eye(length - 1, dtype=torch.bool, device=self.device)
        allowed = (causal & self.valid[:, None, :]) | eye  # (B, T - 1, T - 1); a padding query sees itself only
        _, hidden = self._forward(ids[:, :-1], allowed, positions, feature_layers)
        self.lm.check_dynamic_cache(self.cache)
        return hidden

    @torch.no_grad()
    def verify(
        self,
        roots: torch.Tensor,
        trees: Sequence[DraftTree],
        feature_layers: tuple[int, ...] = (),
        pad_token_id: int = 0,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Score every row's ``[root] + tree`` in one forward, trees padded to the largest ``N``.

        Args:
            roots: (B,) long, each row's last committed token.
            trees: ``B`` batch-1 trees; row ``b`` has ``N_b`` nodes and ``N = max N_b``.
            feature_layers: indices into ``output_hidden_states`` to return.
            pad_token_id: the input id of the dummy nodes that pad a row's tree to ``N`` (any valid id).
        Returns:
            logits: (B, N + 1, V) float32; for row ``b`` only rows ``0 .. N_b`` are meaningful (row 0 scores the
                root's children, row ``i + 1`` the children of node ``i``).
            hidden: one (B, N + 1, H) tensor per entry of ``feature_layers``, same layout.

        Dummy nodes attend to themselves only and are dropped by :meth:`commit`.
        """
        assert self.cache is not None, "call start() first"
        batch = self.batch_size
        if len(trees) != batch or roots.shape != (batch,):
            raise ValueError(f"need {batch} roots and trees, got {tuple(roots.shape)} and {len(trees)}")
        sizes = [tree.num_nodes for tree in trees]
        num_nodes = max(sizes, default=0)
        self._fit_window(num_nodes)
        slots = self.num_slots
        ids = torch.full((batch, 1 + num_nodes), pad_token_id, dtype=torch.long, device=self.device)  # (B, 1+N)
        ids[:, 0] = roots.to(self.device)
        depth = torch.zeros(batch, 1 + num_nodes, dtype=torch.long)  # (B, 1 + N), 0 for root and dummies
        tree_part = torch.eye(1 + num_nodes, dtype=torch.bool).repeat(batch, 1, 1)  # (B, 1+N, 1+N) self only
        for row, (tree, size) in enumerate(zip(trees, sizes, strict=True)):
            if tree.batch_size != 1:
                raise ValueError(f"row {row}: expected a batch-1 tree, got batch size {tree.batch_size}")
            tree_part[row, : 1 + size, 0] = True  # the root and the row's nodes see the root
            if size:
                ids[row, 1 : 1 + size] = tree.tokens[0].to(self.device)
                tree_part[row, 1 : 1 + size, 1 : 1 + size] = tree_attention_mask(tree.parents.cpu(), device="cpu")
                depth[row, 1 : 1 + size] = torch.tensor(tree.depth_list, dtype=torch.long)
        tree_part = tree_part.to(self.device)
        real = torch.zeros(batch, 1 + num_nodes, dtype=torch.bool, device=self.device)  # (B, 1 + N)
        real[:, 0] = True
        for row, size in enumerate(sizes):
            real[row, 1 : 1 + size] = True
        past = self.valid[:, None, :] & real[:, :, None]  # (B, 1 + N, S): real queries see the row's valid slots
        allowed = torch.cat([past, tree_part], dim=2)  # (B, 1 + N, S + 1 + N)
        positions = self.root_positions[:, None].to(self.device) + depth.to(self.device)  # (B, 1 + N)
        logits, hidden = self._forward(ids, allowed, positions, feature_layers)
        self.lm.check_dynamic_cache(self.cache)
        self._pending = slots
        return logits.float(), hidden

    def commit(self, paths: Sequence[torch.Tensor]) -> None:
        """Keep each row's root and accepted nodes, appended after the old slots; drop the rest.

        Args:
            paths: ``B`` (a_b,) long tensors of accepted node ids (root to leaf). Every row gets ``1 + max a_b``
                new slots; a row that accepted fewer leaves ``max a_b - a_b`` holes, invalid from now on.
        """
        assert self.cache is not None, "call start() first"
        slots = self._pending
        batch = self.batch_size
        counts = [int(path.shape[0]) for path in paths]
        if len(counts) != batch:
            raise ValueError(f"need {batch} paths, got {len(counts)}")
        longest = max(counts, default=0)
        index = torch.zeros(batch, 1 + longest, dtype=torch.long)  # (B, 1 + A) into the verified [root] + tree
        kept = torch.zeros(batch, 1 + longest, dtype=torch.bool)  # (B, 1 + A)
        kept[:, 0] = True
        for row, path in enumerate(paths):
            index[row, 1 : 1 + counts[row]] = path.cpu() + 1
            kept[row, 1 : 1 + counts[row]] = True
        index = index.to(self.device)
        is_prefix = all(count == longest for count in counts) and bool(
            (index == torch.arange(1 + longest, device=self.device)).all()
        )
        for layer in self._layers():
            end = slots + 1 + longest
            if not is_prefix:
                gather = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1]) + slots
                keys, values = layer.keys.gather(2, gather), layer.values.gather(2, gather)  # (B, h, 1 + A, d)
            layer.keys, layer.values = layer.keys[..., :end, :], layer.values[..., :end, :]
            if not is_prefix:
                layer.keys[..., slots:end, :] = keys
                layer.values[..., slots:end, :] = values
            if isinstance(layer, DynamicSlidingWindowLayer):
                layer.cumulative_length = layer.keys.shape[-2]
        self.valid = torch.cat([self.valid, kept.to(self.device)], dim=1)  # (B, S + 1 + A)
        self.root_positions = self.root_positions + 1 + torch.tensor(counts, dtype=torch.long).to(
            self.root_positions.device
        )

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop every row not in ``rows`` (K,) long (indices into the current batch, in the new order)."""
        assert self.cache is not None, "call start() first"
        rows = rows.to(self.device)
        for layer in self._layers():
            layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
        self.valid = self.valid.index_select(0, rows)
        self.root_positions = self.root_positions.index_select(0, rows.to(self.root_positions.device))

    def reclaimable(self) -> int:
        """Slot columns :meth:`compact` would remove: ``S`` minus the largest number of valid slots of a row."""
        return self.num_slots - int(self.valid.sum(1).max()) if self.batch_size else 0

    def compact(self) -> None:
        """Move each row's valid slots to the front (in order) and drop the columns no row needs any more.

        A full copy of the cache: worth it when :meth:`reclaimable` is a good fraction of ``S``, since every
        later forward attends over ``S`` slots per row.
        """
        assert self.cache is not None, "call start() first"
        if self.reclaimable() == 0:
            return
        counts = self.valid.sum(1)  # (B,)
        width = int(counts.max())
        order = torch.sort((~self.valid).to(torch.uint8), dim=1, stable=True).indices[:, :width]  # (B, S')
        for layer in self._layers():
            gather = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
            if isinstance(layer, DynamicSlidingWindowLayer):
                layer.cumulative_length = layer.keys.shape[-2]
        self.valid = torch.arange(width, device=self.valid.device)[None] < counts[:, None]  # (B, S')
        self.compactions += 1

    def _fit_window(self, num_nodes: int) -> None:
        window = self.lm.sliding_window
        if window is None or self.num_slots + 1 + num_nodes < window:
            return
        self.compact()
        self.lm.check_length(self.num_slots + 1 + num_nodes)

    def _layers(self) -> list[DynamicLayer]:
        assert self.cache is not None
        return [layer for layer in self.cache.layers if layer.is_initialized]

    def check_length(self, total_length: int) -> None:
        """Raise ``ValueError`` if a row of ``total_length`` tokens does not fit the model."""
        self.lm.check_length(total_length)

    def _forward(
        self,
        ids: torch.Tensor,
        allowed: torch.Tensor,
        position_ids: torch.Tensor,
        feature_layers: tuple[int, ...],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """ids (B, Q), allowed (B, Q, K) bool, position_ids (B, Q) -> logits (B, Q, V) and the hidden states."""
        dtype = self.lm.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]  # (B, 1, Q, K) additive
        logits, hidden = self.lm.forward(self.cache, ids, mask, position_ids, feature_layers)
        return logits.to(self.device), hidden
