"""``torch.compile`` of a causal LM's forward, shared by plain decoding and speculative verification.

One compiled function with dynamic shapes serves the prefill, one-token steps and tree verification (any number of
query tokens, a growing KV cache, with or without a 4D mask). On CPU inductor's *freezing* treats the weights as
constants: it pre-packs them for oneDNN, as :func:`specprim.models.pack_weights` does, and fuses the elementwise work
around them (norms, rotary embeddings, activations). Experimental: with transformers' dynamic cache the forward
recompiles as the cache's strides and the call's arguments vary, and requesting hidden states splits the graph, so
end to end it is not yet faster for speculation on CPU than packed weights (measurements in ``docs/models.md``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._inductor import config as inductor_config
from transformers import PreTrainedModel

from specprim.linears import is_packed


def is_compiled(model: PreTrainedModel) -> bool:
    """Whether :func:`compile_forward` has replaced ``model.forward``."""
    return hasattr(model.forward, "_torchdynamo_orig_callable")


def compile_forward(model: PreTrainedModel, *, freeze: bool = True) -> PreTrainedModel:
    """Replace ``model.forward`` by ``torch.compile(model.forward, dynamic=True)``, in place; returns ``model``.

    Everything that calls the model (``model.generate``, :class:`specprim.hf.HFTarget`, drafters holding the
    model) then runs the compiled forward, so a baseline and a speculative method compare on equal terms. The
    first call of each kind (prefill, one-token step, multi-token verification, with or without hidden states)
    compiles, which takes minutes on a small CPU; inductor caches the result on disk, so later processes start
    faster. Calling it again on a compiled model does nothing.

    Args:
        freeze: use inductor's freezing (weights become constants, pre-packed on CPU). Compiled outputs then
            ignore later changes to the weights: compile a model only for inference, after any training.

    Guarantees: the compiled model computes the same function as the eager one up to floating-point rounding
    (fusion reorders arithmetic), so greedy outputs can differ from the eager model's at near-ties; speculative
    decoding stays lossless with respect to the compiled model, which verifies and decodes with the same forward.

    Raises:
        ValueError: ``model`` has packed weights (:func:`specprim.models.pack_weights`): freezing packs the weights
            itself, and the packed op cannot be traced; load the model without ``pack``.
    """
    if is_packed(model):
        raise ValueError("cannot compile a model with packed weights (the packed oneDNN op cannot be traced, and "
                         "compiling with freezing packs the weights itself): load it without pack=True / --pack")
    if not is_compiled(model):
        compiled = torch.compile(model.forward, dynamic=True)
        model.forward = _frozen(compiled) if freeze else compiled
    return model


def _frozen(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled``, called with inductor's ``freezing`` switched on. Compilation happens lazily inside calls, and
    passing ``options={"freezing": True}`` to ``torch.compile`` measured slower here (16-token forward 43 vs 31 ms)."""

    @functools.wraps(compiled)  # keeps ``_torchdynamo_orig_callable`` for is_compiled and eager_forward
    def forward(*args: Any, **kwargs: Any) -> Any:
        with inductor_config.patch(freezing=True):
            return compiled(*args, **kwargs)

    return forward


@contextlib.contextmanager
def eager_forward(model: PreTrainedModel) -> Iterator[None]:
    """Inside this context a compiled ``model`` runs its original eager forward: the baseline that shows what
    compiling gains (``specprim bench --compile --method hf-eager``). ``ValueError`` if ``model`` is not compiled."""
    if not is_compiled(model):
        raise ValueError("eager_forward needs a model compiled with compile_forward")
    compiled = model.forward
    model.forward = compiled._torchdynamo_orig_callable
    try:
        yield
    finally:
        model.forward = compiled
