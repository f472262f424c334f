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
from specprim.drafters import EagleHead, MedusaHeads, MTPHead, count_tokens, default_feature_layers
from specprim.train._data import load_conversations, render_all
from specprim.train._distill import self_distill
from specprim.train._features import MANIFEST, FeatureDataset, build_feature_cache, check_shard
from specprim.train._objective import EagleObjective, MTPObjective, Objective
from specprim.train._trainer import TrainConfig, train

__all__ = ["KINDS", "DataConfig", "train_drafter"]

Kind = Literal["eagle3", "eagle", "medusa", "mtp", "distill"]
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
    own = default_feature_layers(3, num_layers) if kind == "eagle3" else ()
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


def greedy_token_counts(dataset: FeatureDataset, vocab_size: int) -> torch.Tensor:
    """(V,) how often each id is the target's greedy next token in the cache (what a draft head must predict)."""
    from safetensors import safe_open

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for shard in dataset.manifest["shards"]:
        check_shard(dataset.directory, shard)  # its size (and hash, when small): a damaged shard raises by name
        with safe_open(str(dataset.directory / shard["file"]), framework="pt") as f:
            counts += count_tokens([f.get_slice("topk_ids")[:, 0]], vocab_size)
    return counts


def _fresh_module(kind: str, target: Any, dataset: FeatureDataset, draft_vocab_size: int | None,
                  num_heads: int) -> torch.nn.Module:
    """A randomly initialised head of ``kind`` (Medusa: residual blocks at the identity, as in Medusa-1)."""
    if kind in ("eagle3", "eagle"):
        vocab = int(target.get_output_embeddings().weight.shape[0])
        counts = greedy_token_counts(dataset, vocab) if draft_vocab_size else None
        return EagleHead.from_target(target, version=3 if kind == "eagle3" else 1, draft_vocab_size=draft_vocab_size,
                                     token_counts=counts, generator=torch.Generator().manual_seed(0))
    if kind == "mtp":
        return MTPHead.from_target(target)
    heads = MedusaHeads.from_target(target, num_heads=num_heads, share_target_head=True)
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block:
                layer.linear.weight.zero_()
                layer.linear.bias.zero_()
    return heads


def _saved_module(kind: str, target: Any, init_from: str | os.PathLike[str]) -> torch.nn.Module:
    """A saved head (a directory or a shipped head's name) to continue training; ``ValueError`` if it is not a
    head of ``kind``."""
    from specprim.models import load_head

    head = load_head(init_from, target)
    expected = {"eagle3": (EagleHead, 3), "eagle": (EagleHead, 1), "mtp": (MTPHead, None),
                "medusa": (MedusaHeads, None)}
    cls, version = expected[kind]
    if not isinstance(head, cls) or (version is not None and head.config.version != version):
        raise ValueError(f"{os.fspath(init_from)!r} holds a {type(head).__name__}, not a {kind!r} head")
    return head


def build_objective(kind: str, target: Any, dataset: FeatureDataset, *, draft: Any = None,
                    draft_vocab_size: int | None = None, num_heads: int = 4, steps: int | None = None,
                    loss_on: str = "all", init_from: str | os.PathLike[str] | None = None,
                    align: bool = False) -> Objective:
    """A draft module of ``kind`` for ``target`` wrapped in its objective: freshly initialised, or the saved head
    ``init_from`` (its own config and draft vocabulary; ``draft_vocab_size`` / ``num_heads`` are then ignored).
    ``align``: token-alignable training of the unrolled heads (EAGLE, MTP; see
    :class:`specprim.train.EagleObjective`); ``ValueError`` for other kinds."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    if align and kind not in ("eagle3", "eagle", "mtp"):
        raise ValueError(f"align trains unrolled draft depths (eagle3, eagle, mtp); {kind!r} drafts none")
    if kind == "distill":
        from specprim.train._lm import DistillObjective

        if draft is None:
            raise ValueError("kind 'distill' needs a draft model to train")
        if init_from is not None:
            raise ValueError("kind 'distill' trains the draft model it is given; init_from does not apply")
        vocab = int(target.get_output_embeddings().weight.shape[0])
        return DistillObjective(draft, loss_on=loss_on, vocab_size=vocab)
    module = (_fresh_module(kind, target, dataset, draft_vocab_size, num_heads) if init_from is None
              else _saved_module(kind, target, init_from))
    num_layers = int(target.config.get_text_config().num_hidden_layers)
    if kind in ("eagle3", "eagle"):
        return EagleObjective(module, steps=steps, loss_on=loss_on, align=align)
    if kind == "mtp":
        return MTPObjective(module, steps=steps or 3, loss_on=loss_on, num_target_layers=num_layers, align=align)
    from specprim.train._medusa import MedusaObjective

    return MedusaObjective(module, num_target_layers=num_layers, loss_on=loss_on)


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
) -> Path:
    """Train a draft module of ``kind`` for ``target`` end to end; returns ``output_dir / "run" / "head"``.

    ``kind``: ``"eagle3"`` (EAGLE-3 head, ``steps`` training-time-test depths, ``draft_vocab_size`` most frequent
    target greedy tokens), ``"eagle"`` (EAGLE-1), ``"medusa"`` (``num_heads`` heads on the target's LM head, their
    residual blocks starting as the identity as in Medusa-1),
    ``"mtp"`` (DeepSeek-V3 MTP module) or ``"distill"`` (the causal LM ``draft``, for ``ModelDrafter``). Rerunning
    with the same ``output_dir`` resumes whichever stage was interrupted.

    ``align`` trains the unrolled depths token-alignably (see :class:`specprim.train.EagleObjective`).

    ``init_from`` continues training a saved head (a directory or a shipped head's name) instead of a fresh one,
    e.g. on a new, larger feature cache in a new ``output_dir``.

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
                                num_heads=num_heads, steps=steps, loss_on=loss_on, init_from=init_from, align=align)
    (output / "run").mkdir(exist_ok=True)
    (output / "run" / "settings.json").write_text(json.dumps({
        "kind": kind, "data": dataclasses.asdict(data), "train": dataclasses.asdict(config),
        "draft_vocab_size": draft_vocab_size, "num_heads": num_heads, "steps": steps, "loss_on": loss_on,
        "align": align,
        "batch_tokens": batch_tokens, "features": str(directory),
        "init_from": None if init_from is None else os.fspath(init_from),
    }, indent=1))
    train(objective, dataset, output / "run", config, progress=progress)
    return output / "run" / "head"
