"""EAGLE-3 heads in the ``speculators`` format (vLLM's own format for draft models), both ways.

``export_speculators`` writes an ``EagleHead`` (``version=3``, one Llama-layout decoder layer) as a directory the
``speculators`` package (PyPI, format of version 0.9) loads with ``SpeculatorModel.from_pretrained`` into its
``Eagle3DraftModel``, and that vLLM serves directly; ``import_speculators`` reads such a directory back into an
``EagleHead`` bound to a target model. The head's function and what it can be are those of the engine layout
(``_eagle_export``): the two formats hold the same tensors under other names and another ``config.json``.
Notation as there: ``d`` hidden size, ``V`` target vocabulary, ``V_d`` draft vocabulary, ``L`` target layers.

Weights (``model.safetensors``): ``fc.weight`` (d, 3d), ``layers.0.{input_layernorm, hidden_norm,
self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}.weight``, ``norm.weight``,
``lm_head.weight`` (V_d, d), and, only when ``V_d < V``, ``d2t`` (V_d,) int64 offsets ``target_id - draft_id`` and
``t2d`` (V,) bool (the package registers no vocabulary buffers for a full draft vocabulary), and
``embed_tokens.weight`` (V, d), the target's embedding, as the package's own ``save_pretrained`` writes it (vLLM
uses the target's either way).

Config (``config.json``): ``speculators_model_type: "eagle3"``, ``architectures: ["Eagle3DraftModel"]``,
``speculators_version``, ``transformer_layer_config`` (the decoder layer as a ``LlamaConfig`` dict:
``model_type: "llama"``, ``num_hidden_layers: 1``, ``vocab_size: V``, ...), ``draft_vocab_size``,
``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids`` (id ``j`` = the residual stream entering target layer
``j`` = ``output_hidden_states[j]``: our ``feature_layers``; the package passes them to vLLM unchanged),
``norm_before_residual: false`` (written always: vLLM reads a missing value as true), ``norm_before_fc``,
``fc_norm``, ``norm_output``, ``embed_requires_grad`` (all false), ``speculators_config`` (``algorithm: "eagle3"``,
one greedy ``proposal_methods`` entry with ``speculative_tokens``, ``default_proposal_method: "greedy"``,
``verifier: {name_or_path, architectures}``), ``dtype``, ``tie_word_embeddings: false`` and a ``specprim`` block
as in the engine layout.

Sources read (layout and semantics; no code copied): speculators 0.9.0 ``speculators/config.py``
(``SpeculatorModelConfig``, ``SpeculatorsConfig``, ``VerifierConfig``), ``speculators/models/eagle3/config.py``,
``core.py`` (``Eagle3DraftModel``: buffers, forward, positions), ``model_definitions.py`` (the first layer),
``speculators/model.py`` (``from_pretrained``, ``DraftVocabMixin``), ``speculators/proposals/greedy.py``,
``speculators/train/vocab_mapping.py`` (``d2t`` offsets), ``speculators/convert/eagle/eagle3_converter.py``
(``midlayer.`` -> ``layers.0.``); vLLM ``vllm/transformers_utils/configs/speculators/base.py`` and ``algos.py``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

from specprim.convert._eagle import (
    _check_exportable,
    _engine_config,
    _engine_weights,
    _read_config,
    _read_weights,
    _strip_prefix,
    head_from_engine_layout,
)
from specprim.drafters import EagleConfig, EagleHead

__all__ = ["export_speculators", "import_speculators"]

MODEL_TYPE = "eagle3"
ARCHITECTURE = "Eagle3DraftModel"
FORMAT_VERSION = "0.9.0"  # the speculators release whose format is written (and tested against)
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

# Engine-layout config fields that describe the decoder layer (speculators' ``transformer_layer_config``).
_LAYER_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_scaling",
    "rope_parameters", "vocab_size", "tie_word_embeddings", "attention_bias", "mlp_bias", "bos_token_id",
    "eos_token_id", "pad_token_id",
)
# Speculators EAGLE-3 variants EagleHead does not compute (extra norms around fc, post-norm features fed back).
_UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")
# Tensors the package uses only to train (a frozen copy of the verifier's LM head and norm); not part of drafting.
_TRAINING_ONLY = frozenset({"verifier_lm_head.weight", "verifier_norm.weight"})


# ------------------------------------------------------------------------------------------------------- export
def export_speculators(
    head: EagleHead,
    directory: str | os.PathLike[str],
    *,
    target_name_or_path: str | None = None,
    dtype: torch.dtype | None = torch.bfloat16,
    speculative_tokens: int = 3,
    include_embedding: bool = True,
) -> None:
    """Write ``head`` to ``directory`` in the ``speculators`` EAGLE-3 format (``docs/export.md``).

    Writes ``config.json`` and ``model.safetensors`` (created or overwritten): floating-point tensors in ``dtype``
    (``None`` keeps the head's). ``import_speculators`` on the result gives back an identical head (bit for bit
    in float32 or the head's own dtype).

    Args:
        head: an EAGLE-3 head the engine layout can hold (see :func:`export_eagle3`).
        directory: output directory.
        target_name_or_path: the target's Hugging Face id or local path, written as the verifier
            (``speculators_config.verifier.name_or_path``). The package reads the target's config and LM head
            from it when loading, and vLLM serves it as the target when given only this directory. Default: the
            name the target was loaded under, if any.
        dtype: floating-point dtype of the saved weights.
        speculative_tokens: the greedy proposal's draft length, vLLM's default ``num_speculative_tokens``.
        include_embedding: write the target's embedding as ``embed_tokens.weight`` (``V x d`` more), as the
            package's own ``save_pretrained`` does. Without it the package's loader (0.9.0) is meant to read the
            embedding from the verifier, but it does so only when the uninitialised tensor happens to hold NaN:
            in tests it kept garbage in about half the loads. vLLM uses the target's embedding either way.

    Raises:
        ValueError: everything :func:`export_eagle3` refuses, a non-floating-point ``dtype``, or
            ``speculative_tokens < 1``.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    if isinstance(speculative_tokens, bool) or not isinstance(speculative_tokens, int) or speculative_tokens < 1:
        raise ValueError(f"speculative_tokens must be a positive int, got {speculative_tokens!r}")
    feature_ids = _check_exportable(head)
    if target_name_or_path is None:
        target_name_or_path = getattr(head.layer_config, "name_or_path", None) or None
    engine_config = _engine_config(head, feature_ids, dtype or head.fc.weight.dtype, target_name_or_path)
    config = _speculators_config(head, engine_config, target_name_or_path, speculative_tokens)
    weights = _speculators_weights(_engine_weights(head, dtype), head.config)
    if include_embedding:
        embedding = head.target_embeddings.weight.detach().cpu()
        weights["embed_tokens.weight"] = (embedding if dtype is None else embedding.to(dtype)).contiguous()
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_NAME), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file(weights, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt"})


def _speculators_weights(engine: dict[str, torch.Tensor], config: EagleConfig) -> dict[str, torch.Tensor]:
    """Engine-layout tensors under the package's names (``midlayer.`` -> ``layers.0.``), vocabulary maps only
    for a reduced draft vocabulary."""
    weights = {_engine_to_speculators(name): tensor for name, tensor in engine.items()}
    if config.draft_vocab_size == config.vocab_size:
        del weights["d2t"], weights["t2d"]
    return weights


def _speculators_config(
    head: EagleHead, engine: dict[str, Any], target_name_or_path: str | None, speculative_tokens: int
) -> dict[str, Any]:
    """The package's ``config.json`` dict, built from the engine layout's for the same head."""
    layer = {name: engine[name] for name in _LAYER_FIELDS if name in engine}
    layer["model_type"] = "llama"
    layer["dtype"] = engine["torch_dtype"]
    architectures = list(getattr(head.layer_config, "architectures", None) or [])
    return {
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": FORMAT_VERSION,
        "architectures": [ARCHITECTURE],
        "transformer_layer_config": layer,
        "draft_vocab_size": engine["draft_vocab_size"],
        "target_hidden_size": engine["target_hidden_size"],
        "eagle_aux_hidden_state_layer_ids": engine["eagle_aux_hidden_state_layer_ids"],
        "norm_before_residual": False,
        **{flag: False for flag in _UNSUPPORTED_FLAGS},
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": target_name_or_path, "architectures": architectures},
        },
        "dtype": engine["torch_dtype"],
        "tie_word_embeddings": False,
        "specprim": engine["specprim"],
    }


def _engine_to_speculators(name: str) -> str:
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


# ------------------------------------------------------------------------------------------------------- import
def import_speculators(directory: str | os.PathLike[str], target: PreTrainedModel) -> EagleHead:
    """Build the ``EagleHead`` stored in a ``speculators`` EAGLE-3 ``directory``.

    Reads ``config.json`` and the weights (``model.safetensors``, sharded safetensors or ``pytorch_model.bin``),
    as written by :func:`export_speculators` or by the package (its ``save_pretrained`` or its converter), and
    returns a ``version=3``, one-layer head bound to ``target``, every tensor loaded strictly (cast to the
    target's dtype). Mapping: ``layers.0.hidden_norm`` -> ``hidden_norm``, other ``layers.0.*`` -> the head's
    layer; ``eagle_aux_hidden_state_layer_ids`` are our ``feature_layers`` (default ``(2, L // 2, L - 3)``, the
    package's and vLLM's); ``d2t`` / ``t2d`` as in :func:`import_eagle` (none: the full vocabulary); an
    ``embed_tokens.weight`` must be the target's; ``verifier_lm_head`` / ``verifier_norm`` (training only) are
    ignored.

    Raises:
        ValueError: not a speculators EAGLE-3 checkpoint (no ``speculators_model_type``, another algorithm, a
            layer other than Llama's), a variant ``EagleHead`` does not compute (``norm_before_residual`` true or
            missing, ``norm_before_fc``, ``fc_norm``, ``norm_output``), or anything :func:`import_eagle` refuses
            (another target, more than one layer, unknown / missing / misshapen tensors, a bad ``d2t`` / ``t2d``).
        FileNotFoundError: ``directory`` has no ``config.json`` or no weights file.
    """
    config = _read_config(directory)
    where = os.fspath(directory)
    _check_speculators_config(config, where)
    weights = {_strip_prefix(name): tensor for name, tensor in _read_weights(directory).items()}
    engine_weights = {
        _speculators_to_engine(name): tensor for name, tensor in weights.items() if name not in _TRAINING_ONLY
    }
    return head_from_engine_layout(_engine_layout_config(config), engine_weights, target, where)


def _check_speculators_config(config: dict[str, Any], where: str) -> None:
    """``ValueError`` unless ``config`` is a speculators EAGLE-3 config whose variant an ``EagleHead`` computes."""
    kind = config.get("speculators_model_type")
    if kind is None:
        raise ValueError(
            f"{where!r} is not in the speculators format (no speculators_model_type); an engine-layout "
            "(LlamaForCausalLMEagle3) checkpoint loads with import_eagle"
        )
    settings = config.get("speculators_config") or {}
    if not isinstance(settings, dict):
        raise ValueError(f"{where!r}: speculators_config must be a JSON object, got {type(settings).__name__}")
    algorithm = settings.get("algorithm", kind)
    if kind != MODEL_TYPE or algorithm != MODEL_TYPE:
        raise ValueError(
            f"{where!r} holds a speculators {kind!r} model (algorithm {algorithm!r}); only 'eagle3' imports into "
            "an EagleHead"
        )
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{where!r}: transformer_layer_config must be a JSON object, got {type(layer).__name__}")
    layer_type = layer.get("model_type", "qwen3")  # the package's default layer when none is named
    if layer_type != "llama":
        raise ValueError(
            f"{where!r}: transformer_layer_config.model_type is {layer_type!r}; only Llama decoder layers "
            "(model_type 'llama') import into an EagleHead"
        )
    if "norm_before_residual" not in config:
        raise ValueError(
            f"{where!r} does not say norm_before_residual: the package reads a missing value as false, vLLM as "
            "true, so the checkpoint's function is ambiguous"
        )
    if config["norm_before_residual"]:
        raise ValueError(
            f"{where!r} sets norm_before_residual: its residual stream is the normalised feature, EagleHead's is "
            "the feature itself"
        )
    flags = [flag for flag in _UNSUPPORTED_FLAGS if config.get(flag)]
    if flags:
        raise ValueError(
            f"{where!r} sets {', '.join(flags)}: EagleHead has no norms around fc and feeds back pre-norm features"
        )


def _engine_layout_config(config: dict[str, Any]) -> dict[str, Any]:
    """The engine-layout config dict of a checked speculators EAGLE-3 config."""
    layer = config["transformer_layer_config"]
    engine = {name: value for name, value in layer.items() if name not in ("dtype", "torch_dtype")}
    engine["architectures"] = ["LlamaForCausalLMEagle3"]
    for name in ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "specprim"):
        if config.get(name) is not None:
            engine[name] = config[name]
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None:
        engine["eagle_aux_hidden_state_layer_ids"] = ids
    return engine


def _speculators_to_engine(name: str) -> str:
    return "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name
