"""A view of a causal LM that stops after its first layers, sharing every weight with the original."""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

# Where decoder-only architectures keep their stack of layers: (attribute of the LM, attribute of that module).
_LAYER_STACKS = (("model", "layers"), ("transformer", "h"), ("gpt_neox", "layers"), ("model", "decoder"))


def _layer_stack(model: PreTrainedModel) -> tuple[str, str, torch.nn.ModuleList]:
    for outer, inner in _LAYER_STACKS:
        body = getattr(model, outer, None)
        layers = getattr(body, inner, None)
        if isinstance(layers, torch.nn.ModuleList):
            return outer, inner, layers
    raise TypeError(f"{type(model).__name__}: cannot find its stack of decoder layers for early exit")


def num_layers(model: PreTrainedModel) -> int:
    """Number of decoder layers of ``model``."""
    return len(_layer_stack(model)[2])


def truncated_view(model: PreTrainedModel, keep_layers: int) -> PreTrainedModel:
    """``model`` with only its first ``keep_layers`` decoder layers, then its final norm and LM head.

    No weight is copied: the view's modules are the original's. The original model is not modified. Raises
    ``ValueError`` unless ``1 <= keep_layers < number of layers``.
    """
    outer, inner, layers = _layer_stack(model)
    if not isinstance(keep_layers, int) or not 1 <= keep_layers < len(layers):
        raise ValueError(f"exit layer must be in [1, {len(layers) - 1}] for a {len(layers)}-layer model, "
                         f"got {keep_layers!r}")
    config = copy.deepcopy(model.config)
    text_config = config.get_text_config()
    text_config.num_hidden_layers = keep_layers
    if getattr(text_config, "layer_types", None):
        text_config.layer_types = list(text_config.layer_types[:keep_layers])
    body = _shallow(getattr(model, outer))
    body._modules[inner] = torch.nn.ModuleList(list(layers)[:keep_layers])
    body.config = text_config
    view = _shallow(model)
    view._modules[outer] = body
    view.config = config
    return view


_HOOK_TABLES = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks",
)


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object sharing parameters and children with ``module``, with its own child table and no
    hooks of its own: hooks on the original (a forward counter, accelerate's wrapper of ``forward``, which is
    bound to the original object) must not run for the view. Hooks on the shared children still apply."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    for table in _HOOK_TABLES:
        if hasattr(module, table):
            setattr(clone, table, type(getattr(module, table))())
    clone.__dict__.pop("forward", None)
    return clone
