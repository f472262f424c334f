"""Target features computed once and cached on disk in shards, so later epochs never rerun the target.

A feature cache is a directory:

- ``manifest.json``: the target's dimensions, the ``layers`` stored, ``top_k``, and one record per shard
  (file name, example lengths, size and SHA-256); written after every shard, so an interrupted build resumes at the
  next shard;
- ``shard-00000.safetensors``, ...: for the ``n`` examples of a shard, concatenated along tokens (``N`` in all):
  ``input_ids`` (N,) int32, ``assistant_mask`` (N,) uint8, ``features`` (N, k, d) bfloat16 (the target's
  ``output_hidden_states`` at ``layers``), ``topk_ids`` (N, K) int32 and ``topk_logprobs`` (N, K) float32: the
  target's ``K`` most likely next tokens after each position and their log-probabilities (temperature 1, over
  the whole vocabulary; ``topk_ids[:, 0]`` is the greedy token).

Shards are written under a temporary name and renamed, so a killed build leaves no half shard. A resumed build
hashes the shards it keeps: from the first one that differs from its record (truncated, corrupted) on, they are
computed again. :class:`FeatureDataset` checks each shard once (its size and SHA-256; the safetensors header for a
shard recorded without them, by an earlier version) before reading it, and refuses a damaged one.

:class:`FeatureDataset` reads a cache back as padded :class:`FeatureBatch` es in a seeded order.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from specprim._integrity import DamagedFileError, check_file, check_safetensors, write_atomically
from specprim.train._chunks import row_chunks
from specprim.train._data import Example
from specprim.train._progress import progress_bar

__all__ = ["FeatureBatch", "FeatureDataset", "build_feature_cache"]

MANIFEST = "manifest.json"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FeatureBatch:
    """A right-padded batch of cached sequences.

    Attributes:
        input_ids: (B, T) long (padding: 0).
        attention_mask: (B, T) bool, ``True`` on real tokens (a prefix of every row).
        assistant_mask: (B, T) bool, ``True`` on assistant tokens.
        features: (B, T, k, d) the target's hidden states at the cache's ``layers``, in that order.
        topk_ids: (B, T, K) long, the target's top-``K`` next tokens after each position.
        topk_logprobs: (B, T, K) float32, their log-probabilities.
        layers: the ``output_hidden_states`` index of each of the ``k`` feature slots.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    assistant_mask: torch.Tensor
    features: torch.Tensor
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    layers: tuple[int, ...]

    def feature(self, layer: int) -> torch.Tensor:
        """(B, T, d) hidden states of ``output_hidden_states[layer]`` (``ValueError`` if not cached)."""
        if layer not in self.layers:
            raise ValueError(f"layer {layer} is not in the feature cache (it holds {self.layers})")
        return self.features[:, :, self.layers.index(layer)]

    def to(self, device: torch.device | str) -> FeatureBatch:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return FeatureBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in fields.items()})


def _normalise_layers(layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Feature indices into ``output_hidden_states`` (``num_layers + 1`` entries), negative ones made positive."""
    out = []
    for layer in layers:
        index = layer + num_layers + 1 if layer < 0 else layer
        if not 0 <= index <= num_layers:
            raise ValueError(f"layer {layer} does not exist in a {num_layers}-layer target")
        out.append(index)
    if len(set(out)) != len(out):
        raise ValueError(f"layers {tuple(layers)} name the same hidden state twice")
    return tuple(out)


def _shard_plan(lengths: Sequence[int], shard_tokens: int) -> list[tuple[int, int]]:
    """Contiguous example ranges ``[start, stop)`` of about ``shard_tokens`` tokens each (deterministic)."""
    plan, start, tokens = [], 0, 0
    for i, length in enumerate(lengths):
        tokens += length
        if tokens >= shard_tokens:
            plan.append((start, i + 1))
            start, tokens = i + 1, 0
    if start < len(lengths):
        plan.append((start, len(lengths)))
    return plan


@torch.no_grad()
def build_feature_cache(
    target: Any,
    examples: Sequence[Example],
    directory: str | os.PathLike[str],
    *,
    layers: Sequence[int],
    top_k: int = 16,
    shard_tokens: int = 32_768,
    progress: bool = True,
) -> Path:
    """Run ``target`` once over every example and write its features to a cache in ``directory``.

    ``layers`` index ``output_hidden_states`` (0 = embeddings, ``L`` or -1 = after the final norm). Examples run
    one at a time (no padding) in the target's dtype; features are stored in bfloat16, top-``K`` log-probs in
    float32. Shards already listed in an existing manifest for the same target, layers, ``top_k`` and examples are
    kept (resume) up to the first damaged one (logged; it and the later ones are computed again); a manifest for
    different settings raises ``ValueError`` instead of mixing caches.

    Returns the directory.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = target.config.get_text_config()
    num_layers = int(config.num_hidden_layers)
    header = {
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(target.get_output_embeddings().weight.shape[0]),
        "num_layers": num_layers,
        "model_type": str(getattr(config, "model_type", "")),
        "layers": list(_normalise_layers(layers, num_layers)),
        "top_k": int(top_k),
        "num_examples": len(examples),
        "num_tokens": sum(len(e.input_ids) for e in examples),
    }
    if not examples:
        raise ValueError("no examples to cache")
    try:
        manifest = _read_manifest(directory)
    except DamagedFileError as error:
        logger.warning("%s: computing the feature cache again", error)
        manifest = None
    if manifest is not None and {k: manifest.get(k) for k in header} != header:
        raise ValueError(f"{directory} holds a feature cache built with other settings; use another directory")
    shards = _intact_shards(directory, manifest["shards"]) if manifest is not None else []
    plan = _shard_plan([len(e.input_ids) for e in examples], shard_tokens)
    device = target.get_input_embeddings().weight.device
    bar = progress_bar(header["num_tokens"], sum(sum(s["lengths"]) for s in shards), progress, "target features",
                       unit="tok", unit_scale=True)
    for index in range(len(shards), len(plan)):
        start, stop = plan[index]
        tensors = _shard_tensors(target, examples[start:stop], header["layers"], top_k, device)
        name = f"shard-{index:05d}.safetensors"
        written = write_atomically(directory / name, save(tensors))
        shards.append({"file": name, "lengths": [len(e.input_ids) for e in examples[start:stop]], **written})
        _write_manifest(directory, {**header, "shards": shards, "complete": index + 1 == len(plan)})
        if bar is not None:
            bar.update(sum(shards[-1]["lengths"]))
    if bar is not None:
        bar.close()
    if not plan[len(shards):] and manifest is not None and not manifest.get("complete"):
        _write_manifest(directory, {**header, "shards": shards, "complete": True})
    return directory


def _intact_shards(directory: Path, shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of ``shards`` before the first damaged one (every recorded shard hashed; one recorded without a
    checksum, by an earlier version, checked against its safetensors header); the damage is logged."""
    for index, record in enumerate(shards):
        try:
            check_shard(directory, record, full=True)
        except DamagedFileError as error:
            logger.warning("%s: computing shard %d of %d and the later ones again", error, index, len(shards))
            return shards[:index]
    return shards


def check_shard(directory: Path, record: dict[str, Any], *, full: bool = False) -> None:
    """Raise ``ValueError`` naming the shard file of ``record`` when it differs from its recorded size and SHA-256
    (the hash: when ``full`` or the shard is small), or, for a record without them, is not a whole safetensors
    file."""
    path = directory / record["file"]
    if "sha256" in record:
        check_file(path, record, full=full, where=str(directory / MANIFEST))
    elif not path.is_file():
        raise DamagedFileError(f"{path} is missing (listed in {directory / MANIFEST})")
    else:
        check_safetensors(path)


def _shard_tensors(target: Any, examples: Sequence[Example], layers: Sequence[int], top_k: int,
                   device: torch.device) -> dict[str, torch.Tensor]:
    features, top_ids, top_logprobs = [], [], []
    for example in examples:
        ids = example.input_ids.to(device)[None]  # (1, T)
        out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
        features.append(torch.stack([out.hidden_states[i][0] for i in layers], dim=1).to(torch.bfloat16).cpu())
        indices, values = top_logprobs_of(out.logits[0], top_k)  # (T, K), (T, K)
        top_ids.append(indices.to(torch.int32).cpu())
        top_logprobs.append(values.cpu())
    return {
        "input_ids": torch.cat([e.input_ids for e in examples]).to(torch.int32),
        "assistant_mask": torch.cat([e.assistant_mask for e in examples]).to(torch.uint8),
        "features": torch.cat(features).contiguous(),  # (N, k, d)
        "topk_ids": torch.cat(top_ids).contiguous(),  # (N, K)
        "topk_logprobs": torch.cat(top_logprobs).contiguous(),  # (N, K)
    }


def top_logprobs_of(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` most likely tokens of (T, V) ``logits`` (long ids, sorted) and their float32 log-probabilities,
    a few rows at a time (:func:`~specprim.train._chunks.row_chunks`: a whole float32 log-softmax of SmolLM2's
    49,152-token vocabulary took several times as long)."""
    ids = torch.empty(logits.shape[0], top_k, dtype=torch.long, device=logits.device)  # (T, K)
    values = torch.empty(logits.shape[0], top_k, dtype=torch.float32, device=logits.device)  # (T, K)
    for rows in row_chunks(logits):
        part = logits[rows].float()  # (t, V)
        top, ids[rows] = part.topk(top_k, dim=-1)
        values[rows] = top - torch.logsumexp(part, dim=-1, keepdim=True)
    return ids, values


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except ValueError as error:
        raise DamagedFileError(f"{path} is not a whole JSON file ({error})") from error
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise DamagedFileError(f"{path} is not a feature cache manifest (no list of shards)")
    return manifest


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    staged = directory / f".{MANIFEST}.tmp"
    staged.write_text(json.dumps(manifest, indent=1))
    os.replace(staged, directory / MANIFEST)


class FeatureDataset:
    """A feature cache read back as padded batches.

    ``batches(epoch)`` is a deterministic list of batches for ``(seed, epoch)``: shards in a shuffled order, the
    examples of each shard shuffled and grouped into batches of at most ``batch_tokens`` padded tokens (and at
    most ``max_length`` tokens per row, longer examples truncated). One shard is held in memory at a time.
    ``holdout`` examples (the last ones of the cache) are kept out of ``batches`` and served by
    :meth:`holdout_batches` for evaluation.
    """

    def __init__(self, directory: str | os.PathLike[str], *, batch_tokens: int = 4096, max_length: int = 1024,
                 seed: int = 0, holdout: int = 0) -> None:
        self.directory = Path(directory)
        manifest = _read_manifest(self.directory)
        if manifest is None:
            raise FileNotFoundError(f"no {MANIFEST} in {self.directory}: build it with build_feature_cache")
        if batch_tokens < max_length:
            raise ValueError(f"batch_tokens ({batch_tokens}) must be >= max_length ({max_length})")
        self.manifest = manifest
        self.layers = tuple(manifest["layers"])
        self.batch_tokens, self.max_length, self.seed = batch_tokens, max_length, seed
        examples = [(s, i) for s, shard in enumerate(manifest["shards"]) for i in range(len(shard["lengths"]))]
        if not 0 <= holdout < len(examples):
            raise ValueError(f"holdout must be in [0, {len(examples)}), got {holdout}")
        self._train = examples[: len(examples) - holdout]
        self._holdout = examples[len(examples) - holdout:]
        self._loaded: tuple[int, dict[str, torch.Tensor], list[int]] | None = None
        self._checked: set[int] = set()  # shards whose size and hash were checked

    @property
    def num_train_tokens(self) -> int:
        return sum(min(self._length(s, i), self.max_length) for s, i in self._train)

    def train_tokens_per_file(self) -> list[int]:
        """For each shard file of the manifest, in order, how many of its leading tokens belong to training examples
        (the held-out examples are the cache's last ones, so they end the last files)."""
        tokens = [0] * len(self.manifest["shards"])
        for shard, index in self._train:
            tokens[shard] += self._length(shard, index)
        return tokens

    def _length(self, shard: int, index: int) -> int:
        return self.manifest["shards"][shard]["lengths"][index]

    def _group(self, items: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        batches: list[list[tuple[int, int]]] = []
        current: list[tuple[int, int]] = []
        width = 0
        for item in items:
            length = min(self._length(*item), self.max_length)
            if current and max(width, length) * (len(current) + 1) > self.batch_tokens:
                batches.append(current)
                current, width = [], 0
            current.append(item)
            width = max(width, length)
        if current:
            batches.append(current)
        return batches

    def batches(self, epoch: int) -> list[list[tuple[int, int]]]:
        """The batch plan of ``epoch``: lists of ``(shard, example)`` indices (training examples only)."""
        rng = random.Random(self.seed * 1_000_003 + epoch)
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for item in self._train:
            by_shard.setdefault(item[0], []).append(item)
        order = sorted(by_shard)
        rng.shuffle(order)
        plan = []
        for shard in order:
            items = by_shard[shard]
            rng.shuffle(items)
            plan.extend(self._group(items))
        return plan

    def holdout_batches(self) -> list[list[tuple[int, int]]]:
        """The plan of the held-out examples, in cache order."""
        return self._group(self._holdout)

    def load(self, items: Sequence[tuple[int, int]]) -> FeatureBatch:
        """Read and right-pad the examples ``items`` (from :meth:`batches`) into a :class:`FeatureBatch`."""
        rows = [self._example(*item) for item in items]
        width = max(len(r["input_ids"]) for r in rows)
        return FeatureBatch(
            input_ids=_pad([r["input_ids"].long() for r in rows], width),
            attention_mask=_pad([torch.ones(len(r["input_ids"]), dtype=torch.bool) for r in rows], width),
            assistant_mask=_pad([r["assistant_mask"].bool() for r in rows], width),
            features=_pad([r["features"] for r in rows], width),
            topk_ids=_pad([r["topk_ids"].long() for r in rows], width),
            topk_logprobs=_pad([r["topk_logprobs"] for r in rows], width, value=float("-inf")),
            layers=self.layers,
        )

    def _example(self, shard: int, index: int) -> dict[str, torch.Tensor]:
        if self._loaded is None or self._loaded[0] != shard:
            record = self.manifest["shards"][shard]
            if shard not in self._checked:
                check_shard(self.directory, record, full=True)
                self._checked.add(shard)
            try:
                tensors = load_file(str(self.directory / record["file"]))
            except SafetensorError as error:
                raise DamagedFileError(f"{self.directory / record['file']} is not a whole safetensors file "
                                       f"({error})") from error
            offsets = [0]
            for length in record["lengths"]:
                offsets.append(offsets[-1] + length)
            self._loaded = (shard, tensors, offsets)
        _, tensors, offsets = self._loaded
        start = offsets[index]
        stop = min(offsets[index + 1], start + self.max_length)
        return {name: tensor[start:stop] for name, tensor in tensors.items()}


def _pad(rows: Sequence[torch.Tensor], width: int, value: float = 0) -> torch.Tensor:
    """Right-pad (T_i, ...) tensors to (B, width, ...)."""
    out = rows[0].new_full((len(rows), width, *rows[0].shape[1:]), value)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def iter_batches(dataset: FeatureDataset, plan: Sequence[Sequence[tuple[int, int]]]) -> Iterator[FeatureBatch]:
    """Load the batches of ``plan`` in order."""
    for items in plan:
        yield dataset.load(items)
