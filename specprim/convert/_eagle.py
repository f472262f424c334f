"""EAGLE-3 heads in the checkpoint layout that vLLM and SGLang load as draft models, both ways.

``export_eagle3`` writes an ``EagleHead`` (``version=3``, one decoder layer) as a
``LlamaForCausalLMEagle3`` directory (``config.json`` + ``model.safetensors``); ``import_eagle`` reads such a
directory (ours, or a published one such as the ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`` layout) back into an
``EagleHead`` bound to a target model. Notation: ``d`` hidden size, ``V`` target vocabulary, ``V_d`` draft
vocabulary, ``H`` / ``K`` attention / key-value heads, ``h`` head dim, ``I`` MLP width, ``L`` target layers.

Weights (one file, names without a ``model.`` prefix; the importer also accepts the prefix):

============================================  =============  ==================================================
name                                          shape          ``EagleHead`` tensor
============================================  =============  ==================================================
``fc.weight``                                 (d, 3d)        ``fc.weight`` (fuses the 3 target features)
``midlayer.input_layernorm.weight``           (d,)           ``layers.0.input_layernorm.weight`` (embeddings)
``midlayer.hidden_norm.weight``               (d,)           ``hidden_norm.weight`` (fused feature)
``midlayer.self_attn.q_proj.weight``          (H*h, 2d)      ``layers.0.self_attn.q_proj.weight``
``midlayer.self_attn.k_proj.weight``          (K*h, 2d)      ``layers.0.self_attn.k_proj.weight``
``midlayer.self_attn.v_proj.weight``          (K*h, 2d)      ``layers.0.self_attn.v_proj.weight``
``midlayer.self_attn.o_proj.weight``          (d, H*h)       ``layers.0.self_attn.o_proj.weight``
``midlayer.post_attention_layernorm.weight``  (d,)           ``layers.0.post_attention_layernorm.weight``
``midlayer.mlp.gate_proj.weight``             (I, d)         ``layers.0.mlp.gate_proj.weight``
``midlayer.mlp.up_proj.weight``               (I, d)         ``layers.0.mlp.up_proj.weight``
``midlayer.mlp.down_proj.weight``             (d, I)         ``layers.0.mlp.down_proj.weight``
``norm.weight``                               (d,)           ``norm.weight``
``lm_head.weight``                            (V_d, d)       ``lm_head.weight``
``d2t``                                       (V_d,) int64   offsets: ``head.d2t - arange(V_d)``
``t2d``                                       (V,) bool      ``target_mask(head.d2t, V)``
============================================  =============  ==================================================

No ``embed_tokens.weight``: both engines then use the target's embedding (vLLM shares it when the draft
checkpoint has none; SGLang always sets the target's for EAGLE-3), exactly as ``EagleHead`` does.

Config (a ``LlamaConfig`` dict): ``architectures: ["LlamaForCausalLMEagle3"]``, ``model_type: "llama"``,
``num_hidden_layers: 1``, the layer's ``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim``, ``hidden_act`` (``"silu"``), ``rms_norm_eps``, ``max_position_embeddings``,
the rotary embedding (``rope_theta`` + ``rope_scaling`` for transformers 4 readers, ``rope_parameters`` for 5),
``vocab_size: V``, ``draft_vocab_size: V_d``, ``target_hidden_size: d``, ``tie_word_embeddings: false`` (SGLang
would otherwise use the embedding as LM head), ``attention_bias: false``, ``mlp_bias: false``,
``norm_before_residual: false`` (vLLM: the residual stream is the un-normalised feature), ``torch_dtype``, and the
auxiliary layers, written twice because the two engines count differently:

- ``eagle_aux_hidden_state_layer_ids`` (top level, read by vLLM): id ``j`` is the residual stream *entering*
  decoder layer ``j`` (vLLM's Llama appends ``hidden_states + residual`` before calling layer ``j``), i.e.
  ``output_hidden_states[j]``: exactly our ``feature_layers`` index.
- ``eagle_config.eagle_aux_hidden_state_layer_ids`` (read by SGLang, which adds 1 and then captures the stream
  entering that layer): id ``j`` is the *output* of decoder layer ``j``, i.e. our index minus one.
  ``eagle_config.use_aux_hidden_state: true``.

Without any ids both engines use ``(2, L // 2, L - 3)`` in the vLLM convention. An extra ``specprim`` block records
``feature_layers``, ``target_num_hidden_layers`` and ``target_name_or_path`` (informational; checked on import).

Sources read (layout and semantics; no code copied): vLLM ``vllm/model_executor/models/llama_eagle3.py``
(``Eagle3LlamaForCausalLM.load_weights``: ``midlayer.`` -> ``layers.0.``, ``d2t`` -> ``draft_id_to_target_id``
offsets added to ``arange``, ``t2d`` skipped, ``fc`` of ``3 * target_hidden_size`` inputs, ``norm_before_residual``,
``eagle_config.use_aux_hidden_state``), ``vllm/model_executor/models/llama_eagle.py`` (EAGLE-1),
``vllm/model_executor/models/llama.py`` (aux capture, ``get_eagle3_aux_hidden_state_layers``),
``vllm/model_executor/models/registry.py``, ``vllm/v1/worker/gpu_model_runner.py``
(``_get_eagle3_aux_layers_from_config``), ``vllm/v1/worker/gpu/spec_decode/eagle/utils.py`` (embedding sharing);
SGLang ``python/sglang/srt/models/llama_eagle3.py`` (``LlamaForCausalLMEagle3``: ``midlayer``, ``hot_token_id =
d2t + arange``, ``tie_word_embeddings``, one layer), ``python/sglang/srt/models/llama.py``
(``set_eagle3_layers_to_capture``: ids + 1), ``python/sglang/srt/model_executor/model_runner.py`` (reads
``eagle_config``), ``python/sglang/srt/speculative/eagle_worker.py`` (target embedding); EAGLE (SafeAILab/EAGLE)
``eagle/model/cnets.py`` (``midlayer``, ``hidden_norm``, ``d2t`` / ``t2d`` buffers) and
``eagle/traineagle3/config.json``.

EAGLE-1 checkpoints (``EagleLlamaForCausalLM``: ``fc`` of ``2d`` inputs, ``layers.0.*``) are recognised and
refused: their first decoder layer has no ``input_layernorm`` (the reference code and vLLM drop it), while an
``EagleHead`` of version 1 keeps the target layer's norm, so no ``EagleHead`` computes the same function.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pickle import UnpicklingError
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, PreTrainedModel

from specprim._integrity import DamagedFileError, UnsafeFileError
from specprim.drafters import EagleConfig, EagleHead, check_d2t, target_mask

__all__ = ["export_eagle3", "import_eagle"]

ARCHITECTURE = "LlamaForCausalLMEagle3"
# Architecture names vLLM's registry maps to its EAGLE-3 Llama draft (SGLang registers the first).
_EAGLE3_ARCHITECTURES = frozenset({"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"})
_EAGLE1_ARCHITECTURES = frozenset({"EagleLlamaForCausalLM", "EAGLEModel"})
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

# The tensors of the engines' Llama decoder layer (under ``midlayer.``), as named in an EagleHead's ``layers.0``.
_LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
# EagleHead state-dict name -> engine name, for every tensor but ``d2t``.
_HEAD_TO_ENGINE = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "midlayer.hidden_norm.weight",
    **{f"layers.0.{name}": f"midlayer.{name}" for name in _LAYER_TENSORS},
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_ENGINE_TO_HEAD = {engine: head for head, engine in _HEAD_TO_ENGINE.items()}


# ------------------------------------------------------------------------------------------------------- export
def export_eagle3(
    head: EagleHead,
    directory: str | os.PathLike[str],
    *,
    target_name_or_path: str | None = None,
    dtype: torch.dtype | None = torch.bfloat16,
) -> None:
    """Write ``head`` to ``directory`` as a ``LlamaForCausalLMEagle3`` draft model for vLLM and SGLang.

    Writes ``config.json`` and ``model.safetensors`` (created or overwritten) in the engine layout tabulated in
    ``docs/export.md``: floating-point tensors in ``dtype`` (``None`` keeps the head's), ``d2t`` as int64 offsets
    ``target_id - draft_id``, ``t2d`` as a bool mask, no embedding. ``import_eagle`` on the result gives back an
    identical head (bit for bit with ``dtype=torch.float32`` or the head's own dtype, otherwise the weights
    rounded to ``dtype``).

    Args:
        head: an EAGLE-3 head with one decoder layer and three feature layers.
        directory: output directory.
        target_name_or_path: the target model's Hugging Face id or path, recorded in the config for reference.
        dtype: floating-point dtype of the saved weights.

    Raises:
        ValueError: ``head`` is EAGLE-1, has more than one decoder layer (SGLang loads one; the engines disagree on
            the extra layers), does not read exactly three feature layers (both engines build ``fc`` for three),
            reads a feature the engines cannot capture (index 0 = the embeddings, or the last entry, which is
            after the final norm: allowed indices are ``1 .. L - 1``), uses an activation other than SiLU, or has
            a decoder layer whose tensors are not the Llama layout (non-zero biases, extra norms as in Qwen3); or
            ``dtype`` is not a floating-point dtype.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    feature_ids = _check_exportable(head)
    weights = _engine_weights(head, dtype)
    config = _engine_config(head, feature_ids, dtype or head.fc.weight.dtype, target_name_or_path)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_NAME), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file(weights, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt"})


def _check_exportable(head: EagleHead) -> list[int]:
    """The vLLM aux ids (= non-negative feature indices) of an exportable head; ``ValueError`` otherwise."""
    config = head.config
    if config.version != 3:
        raise ValueError(
            f"only EAGLE-3 heads can be exported, got EAGLE-{config.version}: the engines' EAGLE-1 layer has no "
            "first-layer input_layernorm, which an EagleHead of version 1 keeps"
        )
    if config.num_layers != 1:
        raise ValueError(
            f"only one-layer heads can be exported, got num_layers={config.num_layers}: SGLang's EAGLE-3 draft "
            "loads a single decoder layer ('midlayer') and vLLM's extra layers are built differently"
        )
    if len(config.feature_layers) != 3:
        raise ValueError(
            f"vLLM and SGLang fuse exactly 3 target features (fc takes 3 * hidden_size inputs), this head reads "
            f"{len(config.feature_layers)}: {config.feature_layers}"
        )
    num = config.target_num_layers
    ids = [i if i >= 0 else num + 1 + i for i in config.feature_layers]
    bad = [layer for layer, i in zip(config.feature_layers, ids, strict=True) if not 1 <= i <= num - 1]
    if bad:
        raise ValueError(
            f"feature layers {bad} cannot be captured by the engines: they read the residual stream entering "
            f"decoder layers 1 .. {num - 1} (output_hidden_states indices 1 .. {num - 1}); index 0 (the "
            f"embeddings) and {num} / -1 (after the final norm) are not available there"
        )
    act = getattr(head.layer_config, "hidden_act", None)
    if act != "silu":
        raise ValueError(f"the engines' EAGLE-3 Llama layer uses a SiLU MLP, this head's layer uses {act!r}")
    state = head.state_dict()
    missing = sorted(set(_HEAD_TO_ENGINE) - set(state))
    extra = sorted(set(state) - set(_HEAD_TO_ENGINE) - {"d2t"})
    nonzero = [name for name in extra if not (name.endswith(".bias") and not bool(state[name].any()))]
    if missing or nonzero:
        raise ValueError(
            f"{type(head.layers[0]).__name__} is not the Llama decoder layer the engines build (missing "
            f"{missing or 'nothing'}, extra {nonzero or 'nothing'}); only Llama-layout heads (Llama, Mistral, and "
            "heads whose extra biases are all zero) can be exported"
        )
    return ids


def _engine_weights(head: EagleHead, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """The engine-named tensors of ``head`` on the CPU (floats in ``dtype``, ``d2t`` offsets, ``t2d`` mask)."""
    state = head.state_dict()
    weights = {}
    for head_name, engine_name in _HEAD_TO_ENGINE.items():
        tensor = state[head_name].detach().cpu()
        weights[engine_name] = (tensor if dtype is None else tensor.to(dtype)).contiguous()
    d2t = head.d2t.detach().cpu().long()
    weights["d2t"] = d2t - torch.arange(d2t.numel())
    weights["t2d"] = target_mask(d2t, head.config.vocab_size)
    return weights


def _engine_config(
    head: EagleHead, feature_ids: list[int], dtype: torch.dtype, target_name_or_path: str | None
) -> dict[str, Any]:
    """The ``config.json`` dict of the engine layout for ``head``."""
    layer = head.layers[0]
    layer_config = head.layer_config
    num_heads = int(layer_config.num_attention_heads)
    rope = dict(layer_config.rope_parameters)
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": head.config.hidden_size,
        "intermediate_size": int(layer.mlp.gate_proj.out_features),
        "num_hidden_layers": 1,
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(layer_config.num_key_value_heads or num_heads),
        "head_dim": int(layer.self_attn.q_proj.out_features) // num_heads,
        "hidden_act": "silu",
        "rms_norm_eps": float(layer_config.rms_norm_eps),
        "max_position_embeddings": int(layer_config.max_position_embeddings),
        "rope_theta": float(rope["rope_theta"]),
        "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
        "rope_parameters": rope,
        "vocab_size": head.config.vocab_size,
        "draft_vocab_size": head.config.draft_vocab_size,
        "target_hidden_size": head.config.hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "norm_before_residual": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "eagle_aux_hidden_state_layer_ids": feature_ids,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in feature_ids],
            "use_aux_hidden_state": True,
        },
        "specprim": {
            "feature_layers": list(head.config.feature_layers),
            "target_num_hidden_layers": head.config.target_num_layers,
            "target_name_or_path": target_name_or_path,
        },
    }
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(layer_config, name, None)
        if value is not None:
            config[name] = value
    return config


# ------------------------------------------------------------------------------------------------------- import
def import_eagle(directory: str | os.PathLike[str], target: PreTrainedModel) -> EagleHead:
    """Build the ``EagleHead`` stored in an EAGLE-3 engine-layout ``directory``.

    Reads ``config.json`` and ``model.safetensors`` (or a sharded ``model.safetensors.index.json``, or
    ``pytorch_model.bin``) in the engine layout (``docs/export.md``), as written by ``export_eagle3`` or published
    for vLLM / SGLang, and returns a ``version=3``, one-layer head bound to ``target`` with every tensor loaded
    strictly (cast to the target's dtype). Mapping rules:

    - ``feature_layers``: the top-level ``eagle_aux_hidden_state_layer_ids`` as is (vLLM convention), else
      ``eagle_config.eagle_aux_hidden_state_layer_ids`` plus one (SGLang convention), else ``(2, L // 2, L - 3)``
      (both engines' default); both present must agree.
    - ``d2t``: the offsets plus ``arange(V_d)``; an unsorted draft vocabulary is sorted, with the LM-head rows
      permuted alike (the same function). Without ``d2t``, ``V_d`` must equal ``V`` (identity). ``t2d``, if
      present, must be the mask of ``d2t``.
    - A missing ``lm_head.weight`` with ``V_d == V`` is taken from the target (as SGLang does); missing biases of
      the target's layer class (Qwen2's q/k/v) are zero, which is the engines' bias-free layer.
    - ``embed_tokens.weight``, if present, must match the target's embedding (the head always uses the target's).
    - The rotary embedding follows the checkpoint's ``rope_*`` fields, as the engines build it, even where they
      differ from the target's. ``EagleHead.save_pretrained`` does not record such an override (a head loaded
      with ``from_pretrained`` uses the target's); ``export_eagle3`` does.

    Args:
        directory: a directory with ``config.json`` and the weights.
        target: the target causal LM the head drafts for (its hidden size, vocabulary and depth must match).

    Returns:
        The head, on the target's device and dtype, in eval mode.

    Raises:
        ValueError: the checkpoint does not fit ``target`` (hidden size, vocabulary, depth recorded at export,
            attention geometry, MLP width, norm epsilon, activation) or cannot be mapped exactly: an EAGLE-1 or
            another layout, more than one decoder layer, ``norm_before_residual``, no auxiliary features, a draft
            hidden size different from the target's, feature ids out of range or inconsistent, unknown, missing or
            wrongly shaped tensors, a ``d2t`` / ``t2d`` that is not a valid draft vocabulary.
        FileNotFoundError: ``directory`` has no ``config.json`` or no weights file.
    """
    config = _read_config(directory)
    weights = {_strip_prefix(name): tensor for name, tensor in _read_weights(directory).items()}
    return head_from_engine_layout(config, weights, target, os.fspath(directory))


def head_from_engine_layout(
    config: dict[str, Any], weights: dict[str, torch.Tensor], target: PreTrainedModel, where: str
) -> EagleHead:
    """:func:`import_eagle` on an engine-layout ``config`` dict and ``weights`` (engine names, no ``model.``
    prefix) already read from ``where`` (named in errors). Pops ``d2t``, ``t2d`` and ``embed_tokens.weight``."""
    _check_layout(config, weights, where)
    draft = LlamaConfig.from_dict({k: v for k, v in config.items() if k != "specprim"})
    hidden, vocab = _target_dims(target)
    num_layers = int(target.config.get_text_config().num_hidden_layers)
    for name, target_name, theirs, want in (
        ("hidden_size", "hidden_size", draft.hidden_size, hidden),
        ("target_hidden_size", "hidden_size", config.get("target_hidden_size", draft.hidden_size), hidden),
        ("vocab_size", "vocab_size", draft.vocab_size, vocab),
    ):
        if theirs != want:
            raise ValueError(
                f"the EAGLE-3 checkpoint in {where!r} has {name}={theirs}, but {type(target).__name__} has "
                f"{target_name}={want}: it was made for another target"
            )
    recorded = config.get("specprim") or {}
    if recorded.get("target_num_hidden_layers") not in (None, num_layers):
        raise ValueError(
            f"the EAGLE-3 checkpoint in {where!r} was exported for a {recorded['target_num_hidden_layers']}-layer "
            f"target, but {type(target).__name__} has {num_layers} layers (its feature layers would not match)"
        )
    feature_layers = _feature_layers(config, num_layers, where)
    if recorded.get("feature_layers") not in (None, list(feature_layers)):
        raise ValueError(
            f"{where!r}: the recorded feature_layers {recorded['feature_layers']} disagree with the auxiliary "
            f"layer ids, which give {list(feature_layers)}"
        )
    draft_vocab_size = int(config.get("draft_vocab_size") or vocab)
    d2t, order = _draft_vocabulary(weights, draft_vocab_size, vocab, where)
    head = EagleHead(
        EagleConfig(
            version=3, hidden_size=hidden, vocab_size=vocab, draft_vocab_size=draft_vocab_size,
            feature_layers=feature_layers, target_num_layers=num_layers, num_layers=1,
        ),
        target,
    )
    _check_geometry(draft, head, where)
    _check_embeddings(weights.pop("embed_tokens.weight", None), target, where)
    tied = bool(draft.tie_word_embeddings)
    lm_head = target.get_input_embeddings() if tied else target.get_output_embeddings()
    state = _head_state(head, weights, d2t, order, lm_head, where)
    head.load_state_dict(state, strict=True)
    _use_checkpoint_rope(head, draft)
    return head.eval()


def _read_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {CONFIG_NAME} in {os.fspath(directory)!r}")
    with open(path) as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{path!r} does not hold a JSON object")
    return config


def _read_weights(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, on the CPU: one safetensors file, sharded safetensors, or a torch pickle."""
    single = os.path.join(directory, WEIGHTS_NAME)
    index = os.path.join(directory, "model.safetensors.index.json")
    pickle = os.path.join(directory, "pytorch_model.bin")
    if os.path.isfile(single):
        return _read_safetensors(single)
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(_read_safetensors(os.path.join(directory, shard)))
        return weights
    if os.path.isfile(pickle):
        try:
            loaded = torch.load(pickle, map_location="cpu", weights_only=True)
        except UnpicklingError as error:
            raise UnsafeFileError(f"{pickle} holds pickled objects other than tensors; they are never loaded (a "
                                  "pickle can run code)") from error
        if not isinstance(loaded, Mapping) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
            raise ValueError(f"{pickle!r} does not hold a state dict of tensors")
        return dict(loaded)
    raise FileNotFoundError(
        f"no {WEIGHTS_NAME}, model.safetensors.index.json or pytorch_model.bin in {os.fspath(directory)!r}"
    )


def _read_safetensors(path: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except SafetensorError as error:
        raise DamagedFileError(f"{path} is not a whole safetensors file ({error})") from error


def _strip_prefix(name: str) -> str:
    return name.removeprefix("model.")


def _check_layout(config: dict[str, Any], weights: dict[str, torch.Tensor], where: str) -> None:
    """``ValueError`` unless this is a single-layer EAGLE-3 ``midlayer`` checkpoint the head can represent."""
    architectures = set(config.get("architectures") or [])
    if config.get("head") == "EagleHead" and "config" in config:
        raise ValueError(f"{where!r} was written by EagleHead.save_pretrained: load it with EagleHead.from_pretrained")
    if "speculators_config" in config or "transformer_layer_config" in config:
        raise ValueError(
            f"{where!r} is in the 'speculators' format (Eagle3Speculator): load it with import_speculators"
        )
    midlayer = any(name.startswith("midlayer.") for name in weights)
    fc = weights.get("fc.weight")
    hidden = config.get("hidden_size")
    eagle1 = architectures & _EAGLE1_ARCHITECTURES or (
        not midlayer and any(name.startswith("layers.0.") for name in weights)
        and fc is not None and hidden is not None and tuple(fc.shape) == (hidden, 2 * hidden)
    )
    if eagle1:
        raise ValueError(
            f"{where!r} holds an EAGLE-1 head: its first decoder layer has no input_layernorm (the reference code "
            "and vLLM drop it), while EagleHead(version=1) keeps the target layer's norm, so it cannot be imported "
            "exactly"
        )
    if not midlayer:
        raise ValueError(
            f"{where!r} is not an EAGLE-3 checkpoint in the LlamaForCausalLMEagle3 layout: no 'midlayer.*' weights "
            f"(architectures {sorted(architectures) or 'not given'})"
        )
    layers = config.get("num_hidden_layers", 1)
    if layers != 1 or any(name.split(".")[0] in ("layers", "additional_layers") for name in weights):
        raise ValueError(f"{where!r} has num_hidden_layers={layers}: only one-layer EAGLE-3 heads are supported")
    if config.get("norm_before_residual", False):
        raise ValueError(
            f"{where!r} sets norm_before_residual: its residual stream is the normalised feature, EagleHead's is "
            "the feature itself"
        )
    eagle_config = config.get("eagle_config") or {}
    if not eagle_config.get("use_aux_hidden_state", True):
        raise ValueError(f"{where!r} sets use_aux_hidden_state=false (no fc over target features): unsupported")


def _feature_layers(config: dict[str, Any], num_layers: int, where: str) -> tuple[int, ...]:
    """Our ``feature_layers`` (``output_hidden_states`` indices) from the engines' auxiliary layer ids."""
    vllm_ids = config.get("eagle_aux_hidden_state_layer_ids")
    sglang_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    for name, ids in (("eagle_aux_hidden_state_layer_ids", vllm_ids), ("eagle_config's ids", sglang_ids)):
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, int) for i in ids)):
            raise ValueError(f"{where!r}: {name} must be a list of ints, got {ids!r}")
    if vllm_ids and sglang_ids and list(vllm_ids) != [i + 1 for i in sglang_ids]:
        raise ValueError(
            f"{where!r}: eagle_aux_hidden_state_layer_ids {vllm_ids} (vLLM: stream entering layer j) and "
            f"eagle_config.eagle_aux_hidden_state_layer_ids {sglang_ids} (SGLang: output of layer j) name "
            "different layers"
        )
    if vllm_ids:
        layers = list(vllm_ids)
    elif sglang_ids:
        layers = [i + 1 for i in sglang_ids]
    else:
        layers = [2, num_layers // 2, num_layers - 3]
    if len(layers) != 3 or not all(0 <= i <= num_layers - 1 for i in layers):
        raise ValueError(
            f"{where!r}: auxiliary layers {layers} (output_hidden_states indices) must be three indices in "
            f"[0, {num_layers - 1}] for a {num_layers}-layer target"
        )
    return tuple(layers)


def _draft_vocabulary(
    weights: dict[str, torch.Tensor], draft_vocab_size: int, vocab: int, where: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted ``d2t`` (V_d,) target ids and the draft-id ``order`` that sorts them; pops ``d2t`` and ``t2d``."""
    if not 1 <= draft_vocab_size <= vocab:
        raise ValueError(f"{where!r}: draft_vocab_size {draft_vocab_size} is outside [1, {vocab}]")
    offsets = weights.pop("d2t", None)
    if offsets is None:
        if draft_vocab_size != vocab:
            raise ValueError(f"{where!r} has draft_vocab_size {draft_vocab_size} < {vocab} but no d2t tensor")
        target_ids = torch.arange(vocab)
    else:
        if offsets.dim() != 1 or offsets.numel() != draft_vocab_size or offsets.is_floating_point():
            raise ValueError(
                f"{where!r}: d2t must be ({draft_vocab_size},) integer offsets, got {tuple(offsets.shape)} "
                f"{offsets.dtype}"
            )
        target_ids = offsets.long() + torch.arange(draft_vocab_size)
    order = torch.argsort(target_ids, stable=True)
    d2t = target_ids[order]
    try:
        check_d2t(d2t, vocab)
    except ValueError as error:
        raise ValueError(f"{where!r}: d2t is not a valid draft vocabulary ({error})") from None
    t2d = weights.pop("t2d", None)
    if t2d is not None and (t2d.shape != (vocab,) or not torch.equal(t2d.bool(), target_mask(d2t, vocab))):
        raise ValueError(f"{where!r}: t2d ({tuple(t2d.shape)}) is not the target mask of d2t")
    return d2t, order


def _check_geometry(draft: LlamaConfig, head: EagleHead, where: str) -> None:
    """``ValueError`` unless the checkpoint's layer hyper-parameters are those of the head built from the target."""
    layer_config = head.layer_config
    heads = int(layer_config.num_attention_heads)
    ours = {
        "num_attention_heads": heads,
        "num_key_value_heads": int(layer_config.num_key_value_heads or heads),
        "head_dim": int(head.layers[0].self_attn.q_proj.out_features) // heads,
        "intermediate_size": int(head.layers[0].mlp.gate_proj.out_features),
        "rms_norm_eps": float(layer_config.rms_norm_eps),
        "hidden_act": layer_config.hidden_act,
    }
    theirs = {
        "num_attention_heads": draft.num_attention_heads,
        "num_key_value_heads": draft.num_key_value_heads or draft.num_attention_heads,
        "head_dim": draft.head_dim or draft.hidden_size // draft.num_attention_heads,
        "intermediate_size": draft.intermediate_size,
        "rms_norm_eps": float(draft.rms_norm_eps),
        "hidden_act": draft.hidden_act,
    }
    differ = {name: (theirs[name], ours[name]) for name in ours if theirs[name] != ours[name]}
    if differ:
        detail = ", ".join(f"{name}: checkpoint {a!r}, target layer {b!r}" for name, (a, b) in differ.items())
        raise ValueError(
            f"the EAGLE-3 checkpoint in {where!r} does not fit a decoder layer of this target ({detail}); "
            "EagleHead builds its layer from the target's config"
        )


def _check_embeddings(embeddings: torch.Tensor | None, target: PreTrainedModel, where: str) -> None:
    """A checkpoint's own embedding copy must be the target's (shape, and values up to a half-precision round)."""
    if embeddings is None:
        return
    theirs = target.get_input_embeddings().weight
    if embeddings.shape != theirs.shape:
        raise ValueError(
            f"{where!r}: embed_tokens.weight has shape {tuple(embeddings.shape)}, the target's embedding "
            f"{tuple(theirs.shape)}"
        )
    for start in range(0, embeddings.shape[0], 8192):  # row blocks: bounded memory on large vocabularies
        a = embeddings[start : start + 8192].float()
        b = theirs[start : start + 8192].detach().float().cpu()
        if not torch.allclose(a, b, rtol=1e-2, atol=1e-3):
            raise ValueError(
                f"{where!r}: embed_tokens.weight differs from the target's embedding (rows from {start}): the head "
                "was trained on another target"
            )


def _head_state(
    head: EagleHead,
    weights: dict[str, torch.Tensor],
    d2t: torch.Tensor,
    order: torch.Tensor,
    target_lm_head: torch.nn.Module,
    where: str,
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the head's names, shapes checked, cast to the head's dtype and device."""
    expected = head.state_dict()
    unknown = sorted(name for name in weights if name not in _ENGINE_TO_HEAD)
    if unknown:
        raise ValueError(f"{where!r}: tensors with no EagleHead counterpart: {unknown[:8]}")
    state: dict[str, torch.Tensor] = {}
    for engine_name, tensor in weights.items():
        name = _ENGINE_TO_HEAD[engine_name]
        if name not in expected:
            raise ValueError(f"{where!r}: {engine_name} has no counterpart in a {type(head.layers[0]).__name__}")
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{where!r}: {engine_name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}"
            )
        state[name] = tensor
    if "lm_head.weight" in state:
        state["lm_head.weight"] = state["lm_head.weight"][order]  # rows follow the sorted draft ids
    elif head.config.draft_vocab_size == head.config.vocab_size:  # SGLang: the LM head is the target's
        rows = target_lm_head.weight.detach()
        state["lm_head.weight"] = rows[d2t.to(rows.device)]
    for name, reference in expected.items():
        if name in state or name == "d2t":
            continue
        if not name.endswith(".bias"):
            raise ValueError(f"{where!r}: no tensor for {_HEAD_TO_ENGINE.get(name, name)}")
        state[name] = torch.zeros_like(reference)  # the engines' Llama layer has no biases
    state["d2t"] = d2t
    return {
        name: tensor.to(device=expected[name].device, dtype=expected[name].dtype) for name, tensor in state.items()
    }


def _use_checkpoint_rope(head: EagleHead, draft: LlamaConfig) -> None:
    """Give ``head`` the checkpoint's rotary embedding where it differs from the one built from the target."""
    layer_config = copy.deepcopy(head.layer_config)
    layer_config.rope_parameters = dict(draft.rope_parameters)
    layer_config.max_position_embeddings = draft.max_position_embeddings
    rotary_class = type(head.rotary_emb)
    theirs = rotary_class(config=layer_config)
    ours = rotary_class(config=head.layer_config)
    if torch.equal(theirs.inv_freq, ours.inv_freq) and theirs.attention_scaling == ours.attention_scaling:
        return
    reference = head.rotary_emb.inv_freq
    head.layer_config = layer_config
    head.rotary_emb = theirs.to(device=reference.device, dtype=reference.dtype)


def _target_dims(target: PreTrainedModel) -> tuple[int, int]:
    lm_head = target.get_output_embeddings()
    if lm_head is None:
        raise TypeError(f"{type(target).__name__} has no LM head; load it with AutoModelForCausalLM")
    vocab, hidden = lm_head.weight.shape
    return int(hidden), int(vocab)
