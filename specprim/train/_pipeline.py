"""One call from conversations to a trained draft module: ``specprim train`` and :func:`train_drafter`.

Every stage writes into ``output_dir`` and is skipped or resumed when its output is already there:

- ``data/distilled.jsonl``: self-distilled conversations (only with ``self_distill=True``);
- ``features/``: the target feature cache (or the shared cache given as ``features_dir``);
- ``run/``: checkpoints, ``log.jsonl`` and the trained ``head/`` (see :func:`specprim.train.train`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Literal

import torch

from specprim._names import TRAIN_KINDS
from specprim.train._data import load_conversations, render_all
from specprim.train._distill import self_distill
from specprim.train._features import MANIFEST, FeatureDataset, build_feature_cache
from specprim.train._kinds import REGISTRY, KindInputs, train_kind
from specprim.train._protocol import Objective
from specprim.train._trainer import TrainConfig, train

__all__ = ["KINDS", "DataConfig", "train_drafter"]

Kind = Literal["eagle3", "eagle", "medusa", "mtp", "distill", "parallel"]
KINDS: tuple[str, ...] = TRAIN_KINDS


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the training sequences come from.

    Attributes:
        source: ``"sharegpt"`` or a JSONL file of conversations.
        num_conversations: use the first N (default: all).
        max_length: tokens per rendered conversation (longer ones are truncated).
        self_distill: let the target rewrite the first ``distill_turns`` assistant turns first.
        distill_max_new_tokens, distill_batch_size, distill_temperature: generation settings of self-distillation.
        holdout: conversations kept out of training for the evaluation lines of the log.
        top_k: target next-token probabilities kept per position (the distillation labels).
    """

    source: str = "sharegpt"
    num_conversations: int | None = 2000
    max_length: int = 1024
    self_distill: bool = False
    distill_turns: int = 1
    distill_max_new_tokens: int = 256
    distill_batch_size: int = 16
    distill_temperature: float = 0.0
    holdout: int = 32
    top_k: int = 16


def feature_layers_for(kind: str, target: Any) -> tuple[int, ...]:
    """The ``output_hidden_states`` indices cached for ``kind``: the head's own plus the last one (so one cache
    serves EAGLE-3, EAGLE-1, Medusa and MTP runs alike)."""
    num_layers = int(target.config.get_text_config().num_hidden_layers)
    own = train_kind(kind).own_layers(num_layers)
    return tuple(sorted(set(own) | {num_layers}))


def prepare_features(target: Any, tokenizer: Any, output_dir: Path, data: DataConfig, layers: tuple[int, ...],
                     features_dir: Path | None = None, progress: bool = True) -> Path:
    """Stages 1-2: conversations (self-distilled if asked) -> rendered examples -> feature cache. Returns its dir."""
    directory = features_dir or output_dir / "features"
    manifest = directory / MANIFEST
    if manifest.is_file() and json.loads(manifest.read_text()).get("complete"):
        return directory
    conversations = load_conversations(data.source, data.num_conversations)
    if data.self_distill:
        path = output_dir / "data" / "distilled.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self_distill(target, tokenizer, conversations, path, max_new_tokens=data.distill_max_new_tokens,
                     batch_size=data.distill_batch_size, temperature=data.distill_temperature,
                     max_turns=data.distill_turns, progress=progress)
        conversations = load_conversations(str(path))
    examples = render_all(tokenizer, conversations, max_length=data.max_length)
    if len(examples) <= data.holdout:
        raise ValueError(f"{len(examples)} usable conversations cannot leave {data.holdout} held out")
    return build_feature_cache(target, examples, directory, layers=layers, top_k=data.top_k, progress=progress)


def _saved_module(kind: str, target: Any, init_from: str | os.PathLike[str]) -> torch.nn.Module:
    """A saved head (a directory or a shipped head's name) to continue training; ``ValueError`` if it is not a
    head of ``kind``."""
    from specprim.models import load_head

    is_saved_kind = train_kind(kind).is_saved_kind
    if is_saved_kind is None:
        raise ValueError(f"kind {kind!r} trains the draft model it is given; init_from does not apply")
    head = load_head(init_from, target)
    if not is_saved_kind(head):
        raise ValueError(f"{os.fspath(init_from)!r} holds a {type(head).__name__}, not a {kind!r} head")
    return head


def build_objective(kind: str, target: Any, dataset: FeatureDataset, *, draft: Any = None,
                    draft_vocab_size: int | None = None, num_heads: int = 4, steps: int | None = None,
                    loss_on: str = "all", init_from: str | os.PathLike[str] | None = None,
                    align: bool = False, align_topk: int = 1, hass_topk: int = 0,
                    hass_weight: float = 1.0, head_layers: int | None = None) -> Objective:
    """A draft module of ``kind`` for ``target`` wrapped in its objective (both built by the kind's entry in
    :data:`specprim.train._kinds.REGISTRY`): freshly initialised, or the saved head ``init_from`` (its own config
    and draft vocabulary; ``num_heads`` is then ignored, and ``draft_vocab_size`` above the saved head's widens
    an EAGLE-3 head's draft vocabulary with the dataset's most frequent greedy tokens, see
    :meth:`specprim.drafters.EagleHead.widened`). ``align`` (with ``align_topk``)
    and ``hass_topk`` / ``hass_weight``: token-alignable training and HASS's top-K distillation of the unrolled
    heads (see :class:`specprim.train._unrolled.Unrolling`); ``ValueError`` for other kinds. ``head_layers``: decoder
    layers of a fresh EAGLE head, or of a saved one grown to that many (its added layers start as the identity,
    see :meth:`specprim.drafters.EagleHead.grown`); default: 1 fresh, the saved head's own count."""
    entry = train_kind(kind)
    if head_layers is not None and (entry.resize is None or head_layers < 1):
        layered = ", ".join(name for name, other in REGISTRY.items() if other.resize is not None)
        raise ValueError(f"head_layers sets the decoder layers of {layered} heads (>= 1); got {head_layers} for "
                         f"{kind!r}")
    if (align or hass_topk) and not entry.unrolled:
        unrolled = ", ".join(name for name, other in REGISTRY.items() if other.unrolled)
        option = "align" if align else "hass_topk"
        raise ValueError(f"{option} trains unrolled draft depths ({unrolled}); {kind!r} drafts none")
    if hass_topk > int(dataset.manifest["top_k"]):
        raise ValueError(f"hass_topk={hass_topk} needs that many target probabilities per position; the feature "
                         f"cache keeps {dataset.manifest['top_k']} (--top-k)")
    inputs = KindInputs(target=target, dataset=dataset, draft=draft, draft_vocab_size=draft_vocab_size,
                        num_heads=num_heads, steps=steps, loss_on=loss_on, align=align, head_layers=head_layers)
    module = entry.fresh(inputs) if init_from is None else _saved_module(kind, target, init_from)
    if init_from is not None and entry.resize is not None:
        module = entry.resize(module, inputs)
    objective = entry.objective(module, inputs)
    if align_topk != 1 or hass_topk:  # every unrolled objective holds its Unrolling as ``unrolling``
        objective.unrolling = dataclasses.replace(objective.unrolling, align_topk=align_topk, hass_topk=hass_topk,
                                                  hass_weight=hass_weight)
    return objective


def train_drafter(
    kind: Kind,
    target: Any,
    tokenizer: Any,
    output_dir: str | os.PathLike[str],
    *,
    data: DataConfig | None = None,
    config: TrainConfig | None = None,
    features_dir: str | os.PathLike[str] | None = None,
    feature_model: Any = None,
    features_only: bool = False,
    draft: Any = None,
    draft_vocab_size: int | None = None,
    num_heads: int = 4,
    steps: int | None = None,
    loss_on: str = "all",
    init_from: str | os.PathLike[str] | None = None,
    batch_tokens: int = 8192,
    progress: bool = True,
    align: bool = False,
    align_topk: int = 1,
    hass_topk: int = 0,
    hass_weight: float = 1.0,
    head_layers: int | None = None,
) -> Path:
    """Train a draft module of ``kind`` for ``target`` end to end; returns ``output_dir / "run" / "head"``.

    ``kind``: ``"eagle3"`` (EAGLE-3 head, ``steps`` training-time-test depths, ``draft_vocab_size`` most frequent
    target greedy tokens), ``"eagle"`` (EAGLE-1), ``"medusa"`` (``num_heads`` heads on the target's LM head, their
    residual blocks starting as the identity as in Medusa-1),
    ``"mtp"`` (DeepSeek-V3 MTP module), ``"parallel"`` (:class:`~specprim.drafters.ParallelHead` drafting ``steps``
    positions per forward, default 4; ``init_from`` may name an EAGLE-3 head, which becomes its EAGLE-3 part) or
    ``"distill"`` (the causal LM ``draft``, for ``ModelDrafter``). Rerunning
    with the same ``output_dir`` resumes whichever stage was interrupted.

    ``align`` trains the unrolled depths token-alignably, ``align_topk`` softens it, and ``hass_topk`` adds HASS's
    top-K distillation weighted ``hass_weight`` (see :class:`specprim.train._unrolled.Unrolling`).

    ``init_from`` continues training a saved head (a directory or a shipped head's name) instead of a fresh one,
    e.g. on a new, larger feature cache in a new ``output_dir``. ``head_layers`` sets an EAGLE head's decoder layers
    (a saved head grows to that many, its added layers starting as the identity).

    ``feature_model`` computes the features and self-distils instead of ``target`` (e.g. a bfloat16 copy: about
    twice as fast on CPUs with AMX; the head still trains against ``target``'s modules). ``features_only`` stops
    after the feature cache and returns its directory.
    """
    data = data or DataConfig()
    config = config or TrainConfig()
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    layers = feature_layers_for(kind, target)
    directory = prepare_features(feature_model if feature_model is not None else target, tokenizer, output, data,
                                 layers, Path(features_dir) if features_dir else None, progress)
    if features_only:
        return directory
    dataset = FeatureDataset(directory, batch_tokens=batch_tokens, max_length=data.max_length, seed=config.seed,
                             holdout=data.holdout)
    objective = build_objective(kind, target, dataset, draft=draft, draft_vocab_size=draft_vocab_size,
                                num_heads=num_heads, steps=steps, loss_on=loss_on, init_from=init_from, align=align,
                                align_topk=align_topk, hass_topk=hass_topk, hass_weight=hass_weight,
                                head_layers=head_layers)
    (output / "run").mkdir(exist_ok=True)
    (output / "run" / "settings.json").write_text(json.dumps({
        "kind": kind, "data": dataclasses.asdict(data), "train": dataclasses.asdict(config),
        "draft_vocab_size": draft_vocab_size, "num_heads": num_heads, "steps": steps, "loss_on": loss_on,
        "align": align, "align_topk": align_topk, "hass_topk": hass_topk, "hass_weight": hass_weight,
        "head_layers": head_layers, "batch_tokens": batch_tokens, "features": str(directory),
        "init_from": None if init_from is None else os.fspath(init_from),
    }, indent=1))
    train(objective, dataset, output / "run", config, progress=progress)
    return output / "run" / "head"
