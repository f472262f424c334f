"""A resumable, many-hour training campaign for an EAGLE-3 head: ``specprim campaign run`` / ``status``.

A campaign grows its data and trains on it in shards, all in one run directory:

1. **order** (``order.json``): the conversations of the source (ShareGPT V3 by default) it may use, in a fixed
   order: items ``[0, skip_first)`` are never used, nor any conversation sharing an 8-word sequence with a
   benchmark question (MT-bench, HumanEval, GSM); the last ``holdout`` eligible ones are the held-out shard, the
   rest are shuffled with ``seed`` and cut into shards of ``shard_sizes`` conversations (the last size repeats).
   Every pass over the order answers each shard at the next temperature of ``temperatures``, so shards alternate
   greedy and sampled answers and a second pass answers each conversation the other way;
2. **self-distillation** per shard (``shards/NNNNN/distilled.jsonl``): the target answers the first
   ``max_turns`` assistant turns, each given the conversation so far (first turns and multi-turn continuations),
   with :func:`specprim.train.self_distill`, one batch at a time;
3. **target features** per shard (``shards/NNNNN/features/``) with :func:`specprim.train.build_feature_cache`;
4. **training** (``train/``): after each shard, :func:`specprim.train.train` continues from the latest checkpoint
   over all shards cached so far until ``train_ratio`` tokens have been trained per cached token, in segments of at
   most ``segment_steps`` steps. Each segment ends with a held-out evaluation (``eval.jsonl``: teacher-forced top-1
   agreement with the target by draft depth) and, at each of ``milestones`` trained tokens, a copy of the head in
   ``milestones/<label>/``.

Every file the campaign writes appears atomically (a temporary name, then ``os.replace``); an interrupted
self-distillation batch, feature shard or training step is redone from the last complete one. Each decision
depends only on what is on disk, so rerunning ``run_campaign`` (or ``specprim campaign run RUN_DIR``) after a kill
at any moment continues exactly where it stopped and ends with the files an uninterrupted run writes
(``train/log.jsonl`` and the timing files excepted).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
import operator
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from specprim.train._data import Conversation, load_conversations, render_all
from specprim.train._distill import self_distill
from specprim.train._features import MANIFEST, FeatureDataset, build_feature_cache
from specprim.train._run_files import (
    EVAL_NAME,
    complete_lines,
    finished_cooldowns,
    read_json,
    read_jsonl,
    write_json,
    write_jsonl,
    write_text,
)
from specprim.train._trainer import STATE_NAME, TrainConfig, train

__all__ = [
    "DEFAULT_MILESTONES",
    "Campaign",
    "CampaignData",
    "CampaignHead",
    "CampaignStatus",
    "campaign_status",
    "format_status",
    "load_campaign",
    "run_campaign",
]

DEFAULT_MILESTONES = (500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000)
CONFIG_NAME = "campaign.json"
_DTYPES = ("auto", "float32", "bfloat16")
# how the target and the head compute and how long the head trains, not what it computes: may change on resume
_RESUME_SETTINGS = ("distill_dtype", "feature_dtype", "data.batch_size", "head.mixed_precision",
                     "head.train_ratio", "head.max_train_tokens")
_GENERATED_PER_CACHED = {"target": 0.7, "source": 0.0}  # generated tokens per cached token before any is known
_RECENT = 20  # units of work the rates of `campaign status` are measured over
_SHINGLE = 8  # words in a row shared with a benchmark question that exclude a conversation


@dataclasses.dataclass(frozen=True, kw_only=True)
class CampaignData:
    """The data plan: which conversations, how the target answers them, how they are cut into shards.

    Attributes:
        source: ``"sharegpt"`` (ShareGPT V3), ``"sharegpt-code"`` (its conversations with a fenced code block in an
            answer) or a JSONL file of conversations.
        answers: ``"target"``: the target answers every training conversation itself (self-distillation);
            ``"source"``: the source's own assistant turns are kept (no generation; only the labels, the target's
            next-token probabilities, come from the target). The held-out shard is the target's greedy answers
            either way, so campaigns that differ in ``answers`` are evaluated on the same data.
        skip_first: items ``[0, skip_first)`` of the source are never used.
        exclude_benchmarks: built-in benchmark datasets whose questions must not be trained on: a conversation
            with a user turn sharing 8 consecutive words with one of their questions is left out.
        max_prompt_chars: a conversation is cut before its first user turn longer than this (dropped if it is
            the first one).
        max_turns: assistant turns the target answers per conversation (1 = first turns only).
        holdout: conversations of the held-out shard (the last eligible ones of the source, answered greedily).
        shard_sizes: conversations per training shard, in order; the last size repeats.
        temperatures: the answer temperature of shard ``j`` in pass ``p`` is ``temperatures[(j + p) % n]``
            (0 = greedy).
        passes: passes over the ordered conversations.
        max_new_tokens, max_prompt_tokens: self-distillation generation settings.
        batch_size: conversations answered at once (a compute setting: it may change when a run resumes; a
            changed size applies to the conversations still to answer, and the sampled answers of a temperature
            shard then differ from an uninterrupted run's, as they are seeded by batch).
        max_length: tokens kept per rendered conversation.
        top_k: target next-token probabilities cached per position (the labels).
        seed: the order of the training conversations and the sampling seeds.
    """

    source: str = "sharegpt"
    answers: str = "target"
    skip_first: int = 200
    exclude_benchmarks: tuple[str, ...] = ("mt-bench", "humaneval", "gsm")
    max_prompt_chars: int = 1500
    max_turns: int = 3
    holdout: int = 64
    shard_sizes: tuple[int, ...] = (256, 1024, 2048)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    passes: int = 2
    max_new_tokens: int = 256
    max_prompt_tokens: int = 512
    batch_size: int = 64
    max_length: int = 1024
    top_k: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclude_benchmarks", tuple(self.exclude_benchmarks))
        object.__setattr__(self, "shard_sizes", tuple(self.shard_sizes))
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        if not self.source:
            raise ValueError("data source must be 'sharegpt', 'sharegpt-code' or a JSONL file")
        if self.answers not in ("target", "source"):
            raise ValueError(f"answers must be 'target' or 'source', got {self.answers!r}")
        if self.answers == "source" and self.passes > 1:
            raise ValueError(f"passes ({self.passes}) > 1 with answers='source' would cache the same conversations "
                             "again; train longer with train_ratio instead")
        if self.skip_first < 0:
            raise ValueError(f"skip_first must be >= 0, got {self.skip_first}")
        if not self.shard_sizes or min(self.shard_sizes) < 1:
            raise ValueError(f"shard_sizes must be one or more sizes >= 1, got {self.shard_sizes}")
        if not self.temperatures or min(self.temperatures) < 0:
            raise ValueError(f"temperatures must be one or more values >= 0, got {self.temperatures}")
        if self.passes < 1:
            raise ValueError(f"passes must be >= 1, got {self.passes}")
        if 0.0 in self.temperatures and self.passes > len(self.temperatures):
            raise ValueError(f"passes ({self.passes}) > len(temperatures) ({len(self.temperatures)}) would answer "
                             "conversations greedily twice (the same answers)")
        for name in ("max_prompt_chars", "max_turns", "holdout", "max_new_tokens", "max_prompt_tokens",
                     "batch_size", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CampaignHead:
    """The EAGLE-3 head and how it is trained.

    Attributes:
        init_from: continue training this saved head (a directory or a shipped head's name); ``None``: a fresh
            head with ``draft_vocab_size`` draft tokens (the target's most frequent greedy tokens in shard 0).
        draft_vocab_size, steps, loss_on: as ``specprim train eagle3 --draft-vocab-size / --steps / --loss-on``.
        head_layers: decoder layers of the head (default: 1 fresh, ``init_from``'s own count; more than that grows
            the saved head, its added layers starting as the identity), as ``specprim train --head-layers``.
        align, align_topk, hass_topk, hass_weight: token-alignable training and HASS's top-K distillation, as
            ``specprim train --align / --align-topk / --hass-topk / --hass-weight`` (off by default).
        lr, warmup_steps: AdamW learning rate, constant after a linear warm-up (the data keeps growing, so no
            decay is planned).
        batch_tokens: padded tokens per batch.
        mixed_precision: ``"bf16"`` autocast, ``"no"``, or ``"auto"``: ``"bf16"`` where the machine computes
            bfloat16 natively (:func:`specprim.models.native_dtype`), else ``"no"``. Like the campaign's dtypes, it
            may change when a run resumes.
        train_ratio: tokens trained per cached token: after shard ``i`` is cached, training continues until
            ``train_ratio`` x (tokens of shards ``0..i``) tokens have been trained in all.
        segment_steps: most optimizer steps between two held-out evaluations.
        checkpoint_every, log_every: in steps (``train/checkpoint``, ``train/log.jsonl``).
        milestones: trained-token counts at which the head is copied to ``milestones/<label>/``.
        max_train_tokens: the campaign ends after this many trained tokens (default: the last milestone). It may
            change when a run resumes (a finished run taken further).
        seed: data order of training and initialisation.
    """

    init_from: str | None = None
    draft_vocab_size: int = 8192
    steps: int = 3
    loss_on: str = "assistant"
    head_layers: int | None = None
    align: bool = False
    align_topk: int = 1
    hass_topk: int = 0
    hass_weight: float = 1.0
    lr: float = 3e-4
    warmup_steps: int = 50
    batch_tokens: int = 4096
    mixed_precision: str = "auto"
    train_ratio: float = 2.0
    segment_steps: int = 100
    checkpoint_every: int = 25
    log_every: int = 10
    milestones: tuple[int, ...] = DEFAULT_MILESTONES
    max_train_tokens: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "milestones", tuple(int(m) for m in self.milestones))
        if self.draft_vocab_size < 1 or self.steps < 1 or (self.head_layers is not None and self.head_layers < 1):
            raise ValueError("draft_vocab_size, steps and head_layers must be >= 1")
        if self.loss_on not in ("all", "assistant"):
            raise ValueError(f"loss_on must be 'all' or 'assistant', got {self.loss_on!r}")
        if self.align_topk < 1 or (self.align_topk > 1 and not self.align):
            raise ValueError(f"align_topk must be >= 1, and > 1 only with align, got {self.align_topk}")
        if self.hass_topk < 0 or not self.hass_weight > 0:
            raise ValueError(f"hass_topk must be >= 0 and hass_weight > 0, got {self.hass_topk} and {self.hass_weight}")
        if not self.lr > 0 or self.warmup_steps < 0:
            raise ValueError(f"lr must be > 0 and warmup_steps >= 0, got {self.lr} and {self.warmup_steps}")
        if self.mixed_precision not in ("auto", "no", "bf16"):
            raise ValueError(f"mixed_precision must be 'auto', 'no' or 'bf16', got {self.mixed_precision!r}")
        if not self.train_ratio > 0:
            raise ValueError(f"train_ratio must be > 0, got {self.train_ratio}")
        if min(self.batch_tokens, self.segment_steps, self.checkpoint_every, self.log_every) < 1:
            raise ValueError("batch_tokens, segment_steps, checkpoint_every and log_every must be >= 1")
        if not self.milestones or self.milestones[0] < 1 or any(
                b <= a for a, b in zip(self.milestones, self.milestones[1:], strict=False)):
            raise ValueError(f"milestones must be increasing token counts >= 1, got {self.milestones}")
        if self.max_train_tokens is not None and self.max_train_tokens < 1:
            raise ValueError(f"max_train_tokens must be >= 1, got {self.max_train_tokens}")

    @property
    def train_tokens(self) -> int:
        """Trained tokens at which the campaign ends."""
        return self.max_train_tokens if self.max_train_tokens is not None else self.milestones[-1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Campaign:
    """One campaign: the target, its run directory, the data plan and the head. Saved as ``campaign.json``.

    Attributes:
        target: the target model (a known name, a local path or a hub id).
        run_dir: the directory holding everything the campaign writes.
        data: the :class:`CampaignData` plan.
        head: the :class:`CampaignHead` settings.
        distill_dtype, feature_dtype: the target's dtype while answering and while computing features: ``"auto"``
            (:func:`specprim.models.native_dtype`, decided by the machine each run resumes on), ``"float32"`` or
            ``"bfloat16"`` (packed weights on a CPU that can pack them). The head trains against a float32 target.
            Unlike the other settings, these, ``data.batch_size``, ``head.mixed_precision``, ``head.train_ratio``
            and ``head.max_train_tokens`` may change when a run resumes (a campaign moved to a machine without native
            bfloat16, or with room for larger batches; a run to be taken further, or trained longer on the data it
            has); each shard records the dtype it was made in.
    """

    target: str
    run_dir: str
    data: CampaignData = dataclasses.field(default_factory=CampaignData)
    head: CampaignHead = dataclasses.field(default_factory=CampaignHead)
    distill_dtype: str = "auto"
    feature_dtype: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", os.fspath(self.run_dir))
        if not self.target:
            raise ValueError("target must name a model")
        if not self.run_dir:
            raise ValueError("run_dir must be a directory path")
        for name in ("distill_dtype", "feature_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")
        if self.head.batch_tokens < self.data.max_length:
            raise ValueError(f"batch_tokens ({self.head.batch_tokens}) must be >= max_length ({self.data.max_length})")
        if self.head.hass_topk > self.data.top_k:
            raise ValueError(f"hass_topk ({self.head.hass_topk}) must be <= top_k ({self.data.top_k}), the target "
                             "probabilities cached per position")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Campaign:
        """The campaign of a ``campaign.json`` record; ``ValueError`` for unknown or invalid fields."""
        try:
            return cls(**{**record, "data": CampaignData(**record.get("data", {})),
                          "head": CampaignHead(**record.get("head", {}))})
        except TypeError as error:
            raise ValueError(f"not a campaign record: {error}") from error


def _settings_differ(a: Campaign, b: Campaign) -> list[str]:
    """``field: old -> new`` for every setting that differs (run directory and the settings that may change on
    resume aside)."""
    out = [f"target: {a.target!r} -> {b.target!r}"] if a.target != b.target else []
    for part in ("data", "head"):
        for field in dataclasses.fields(getattr(a, part)):
            old, new = getattr(getattr(a, part), field.name), getattr(getattr(b, part), field.name)
            if old != new and f"{part}.{field.name}" not in _RESUME_SETTINGS:
                out.append(f"{field.name}: {old!r} -> {new!r}")
    return out


def _resume_changes(a: Campaign, b: Campaign) -> list[str]:
    """``field: old -> new`` for the settings that differ and may change on resume."""
    out = []
    for name in _RESUME_SETTINGS:
        old, new = operator.attrgetter(name)(a), operator.attrgetter(name)(b)
        if old != new:
            out.append(f"{name.rpartition('.')[2]}: {old!r} -> {new!r}")
    return out


def resolved_mixed_precision(setting: str) -> str:
    """A campaign's ``mixed_precision`` as it runs here (``"auto"``: ``"bf16"`` where bfloat16 is native)."""
    if setting != "auto":
        return setting
    return "bf16" if resolved_dtype("auto") == "bfloat16" else "no"


def resolved_dtype(dtype: str) -> str:
    """A campaign dtype setting as the dtype it runs in here (``"auto"``: :func:`specprim.models.native_dtype`)."""
    if dtype != "auto":
        return dtype
    from specprim import models

    return models.native_dtype()


def load_campaign(run_dir: str | os.PathLike[str]) -> Campaign:
    """The campaign saved in ``run_dir`` (its ``run_dir`` set to where it is now). ``FileNotFoundError`` if none."""
    path = Path(run_dir) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no campaign in {os.fspath(run_dir)} ({CONFIG_NAME} missing)")
    record = json.loads(path.read_text())
    return Campaign.from_json({**record, "run_dir": os.fspath(run_dir)})


# ------------------------------------------------------------------------------------------------ order


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _shingles(text: str) -> set[str]:
    words = _words(text)
    return {" ".join(words[i: i + _SHINGLE]) for i in range(len(words) - _SHINGLE + 1)}


def benchmark_shingles(names: Sequence[str]) -> set[str]:
    """Every run of 8 consecutive words in the questions (all turns) of the built-in benchmark datasets ``names``."""
    if not names:
        return set()
    from specprim.bench import load_dataset

    out: set[str] = set()
    for name in names:
        for prompt in load_dataset(name):
            for turn in prompt.turns:
                out |= _shingles(turn)
    return out


def trim_conversation(conversation: Conversation, data: CampaignData) -> Conversation | None:
    """The part of ``conversation`` the target answers: cut before the ``max_turns + 1``-th user turn and before
    the first user turn longer than ``max_prompt_chars``, ending on an assistant turn; ``None`` when nothing is
    left."""
    out: Conversation = []
    users = 0
    for message in conversation:
        if message["role"] == "user":
            if users == data.max_turns or len(message["content"]) > data.max_prompt_chars:
                break
            users += 1
        out.append(message)
    while out and out[-1]["role"] != "assistant":
        out.pop()
    return out if users and out else None


def _prompt_size(conversation: Conversation) -> tuple[int, int]:
    """(user turns, characters of the system and user turns)."""
    users = sum(m["role"] == "user" for m in conversation)
    return users, sum(len(m["content"]) for m in conversation if m["role"] != "assistant")


def _first_user(conversation: Conversation) -> str:
    return next(m["content"] for m in conversation if m["role"] == "user")


def distill_order(conversations: Sequence[Conversation], written: Sequence[Conversation] = ()) -> list[int]:
    """The order a shard's ``conversations`` are answered (and written) in: by number of user turns, then shortest
    prompts first (characters of the system and user turns; ties by position), so that a batch stays full for
    every turn it answers and pads its prompts to about one length.

    ``written``: the conversations a partial file already holds. A file begun in the shard's own order (by a version
    that did not sort) goes on in that order; ``ValueError`` when it follows neither.
    """
    by_length = sorted(range(len(conversations)), key=lambda i: (*_prompt_size(conversations[i]), i))
    for order in (by_length, list(range(len(conversations)))):
        begun = order[: len(written)]
        if len(begun) == len(written) and all(
                _first_user(w) == _first_user(conversations[i]) for w, i in zip(written, begun, strict=True)):
            return order
    raise ValueError("a partial self-distillation file holds conversations of another shard; remove it to redo "
                     "the shard")


def plan_order(conversations: Sequence[Conversation], data: CampaignData, excluded: set[str]) -> dict[str, Any]:
    """The eligible source items: ``holdout`` (the last ones) and ``train`` (the others before them, shuffled)."""
    eligible, dropped = [], 0
    for index in range(data.skip_first, len(conversations)):
        kept = trim_conversation(conversations[index], data)
        if kept is None:
            continue
        if excluded and any(_shingles(m["content"]) & excluded for m in kept if m["role"] == "user"):
            dropped += 1
            continue
        eligible.append(index)
    if len(eligible) <= data.holdout:
        raise ValueError(f"{len(eligible)} eligible conversations cannot leave {data.holdout} held out")
    holdout = eligible[-data.holdout:]
    train_items = [i for i in eligible[: -data.holdout] if i < holdout[0] - 10]  # apart from the held-out ones
    random.Random(data.seed).shuffle(train_items)
    return {"source_conversations": len(conversations), "benchmark_overlaps": dropped, "holdout": holdout,
            "train": train_items}


@dataclasses.dataclass(frozen=True)
class Shard:
    """One unit of data: ``items`` (source indices) answered at ``temperature`` with sampling seed ``seed``."""

    name: str
    index: int
    pass_index: int
    items: tuple[int, ...]
    temperature: float
    seed: int


def plan_shards(order: dict[str, Any], data: CampaignData) -> tuple[Shard, list[Shard]]:
    """The held-out shard and the training shards of every pass, in the order they are made."""
    items = order["train"]
    ranges, start, j = [], 0, 0
    while start < len(items):
        size = data.shard_sizes[min(j, len(data.shard_sizes) - 1)]
        ranges.append((start, min(len(items), start + size)))
        start, j = start + size, j + 1
    shards = []
    for p in range(data.passes):
        for j, (a, b) in enumerate(ranges):
            i = len(shards)
            temperature = data.temperatures[(j + p) % len(data.temperatures)]
            seed = data.seed * 1_000_003 + 7919 * (i + 1)
            shards.append(Shard(f"{i:05d}", i, p, tuple(items[a:b]), temperature, seed))
    holdout = Shard("holdout", -1, 0, tuple(order["holdout"]), 0.0, data.seed * 1_000_003)
    return holdout, shards


def milestone_label(tokens: int) -> str:
    """``500000`` -> ``"0.5M"``, ``2000000`` -> ``"2M"``, ``1500`` -> ``"1.5k"``, ``800`` -> ``"800"``."""
    if tokens >= 100_000:
        return f"{tokens / 1_000_000:g}M"
    if tokens >= 1_000:
        return f"{tokens / 1_000:g}k"
    return str(tokens)


# ----------------------------------------------------------------------------------------------- runner


class StopCampaign(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised inside a run when its ``max_seconds`` / ``max_items`` budget is spent (caught by run_campaign)."""


class _Budget:
    def __init__(self, max_seconds: float | None, max_items: int | None,
                 before_unit: Callable[[], None] | None = None) -> None:
        self.deadline = None if max_seconds is None else time.monotonic() + max_seconds
        self.max_items, self.items = max_items, 0
        self.before_unit = before_unit

    def check(self) -> None:
        """Raise :class:`StopCampaign` when no new unit of work may start; else call ``before_unit``."""
        if self.max_items is not None and self.items >= self.max_items:
            raise StopCampaign
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise StopCampaign
        if self.before_unit is not None:
            self.before_unit()

    def tick(self) -> None:
        self.items += 1


def _busy_cpus(interval: float) -> float | None:
    """CPUs kept busy by every process over the next ``interval`` seconds (Linux ``/proc/stat``; ``None`` elsewhere)."""
    def sample() -> list[int]:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:]]

    try:
        before = sample()
        time.sleep(interval)
        after = sample()
    except (OSError, ValueError):
        return None
    delta = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(delta)
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)  # idle, iowait
    return (total - idle) / total * (os.cpu_count() or 1) if total else None


def adapt_threads(maximum: int, *, interval: float = 0.5, log: Callable[[str], None] = print) -> Callable[[], None]:
    """A ``before_unit`` hook for :func:`run_campaign`: before each unit of work, measure the CPUs other processes
    keep busy (this run is idle between units) and use ``maximum`` torch threads minus that many, at least one.

    A niced run whose threads share a core with a busy process waits for the starved thread at every parallel
    region; one thread on the free core is then several times faster than two.
    """
    def before_unit() -> None:
        busy = _busy_cpus(interval)
        threads = maximum if busy is None else max(1, min(maximum, maximum - round(busy)))
        if threads != torch.get_num_threads():
            log(f"threads: {threads} (other processes keep {busy or 0:.1f} CPUs busy)")
            torch.set_num_threads(threads)

    return before_unit


class _Runner:
    """Runs one campaign's stages in order; every decision is read from the run directory."""

    def __init__(self, campaign: Campaign, budget: _Budget, log: Callable[[str], None]) -> None:
        self.campaign, self.data, self.head = campaign, campaign.data, campaign.head
        self.dir = Path(campaign.run_dir)
        self.budget, self.log = budget, log
        self._models: dict[str, Any] = {}
        self._tokenizer: Any = None
        self._conversations: list[Conversation] | None = None

    # -- models --------------------------------------------------------------------------------------------

    def model(self, dtype: str) -> Any:
        """The target in ``dtype`` (``"auto"``: this machine's native dtype; bfloat16: packed linears where this CPU
        can pack them), loaded once."""
        from specprim import models

        dtype = resolved_dtype(dtype)
        if dtype not in self._models:
            model, tokenizer = models.load(self.campaign.target, dtype=getattr(torch, dtype),
                                           pack=dtype == "bfloat16" and models.packing_supported())
            self._models[dtype] = model
            self._tokenizer = self._tokenizer or tokenizer
        return self._models[dtype]

    @property
    def target(self) -> Any:
        """The float32 target the head trains against (never packed: training reads its LM head and embeddings)."""
        if "train" not in self._models:
            from specprim import models

            self._models["train"], tokenizer = models.load(self.campaign.target, dtype=torch.float32)
            self._tokenizer = self._tokenizer or tokenizer
        return self._models["train"]

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from specprim.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.campaign.target)
        return self._tokenizer

    # -- order and shards ------------------------------------------------------------------------------------

    def conversations(self) -> list[Conversation]:
        if self._conversations is None:
            self._conversations = load_conversations(self.data.source)
        return self._conversations

    def order(self) -> dict[str, Any]:
        path = self.dir / "order.json"
        order = read_json(path)
        if order is None:
            excluded = benchmark_shingles(self.data.exclude_benchmarks)
            order = plan_order(self.conversations(), self.data, excluded)
            write_json(path, order)
            self.log(f"order: {len(order['train'])} training and {len(order['holdout'])} held-out conversations "
                     f"({order['benchmark_overlaps']} left out for overlapping a benchmark question)")
        return order

    def shard_dir(self, shard: Shard) -> Path:
        return self.dir / "shards" / shard.name

    # -- stage 1: self-distillation ----------------------------------------------------------------------------

    def distill(self, shard: Shard) -> None:
        directory = self.shard_dir(shard)
        final = directory / "distilled.jsonl"
        if final.is_file():
            return
        directory.mkdir(parents=True, exist_ok=True)
        source = self.conversations()
        todo = [trim_conversation(source[i], self.data) for i in shard.items]
        if self.data.answers == "source" and shard.index >= 0:
            self.keep_source_answers(shard, todo)
            return
        partial = directory / ".distilled.jsonl.partial"
        partial.touch()
        done = complete_lines(partial)
        written = read_jsonl(partial)
        todo = [todo[i] for i in distill_order(todo, written)]
        generated = _generated_tokens(self.tokenizer, written)
        size = self.data.batch_size
        while done < len(todo):
            self.budget.check()
            self._progress("self-distillation", shard, done=done, total=len(todo), generated_tokens=generated)
            upto = min(len(todo), done - done % size + size)
            started = time.perf_counter()
            self_distill(self.model(self.campaign.distill_dtype), self.tokenizer, todo[:upto], partial,
                         max_new_tokens=self.data.max_new_tokens, max_prompt_tokens=self.data.max_prompt_tokens,
                         batch_size=size, temperature=shard.temperature, max_turns=self.data.max_turns,
                         seed=shard.seed, progress=False)
            seconds = time.perf_counter() - started
            new = _generated_tokens(self.tokenizer, read_jsonl(partial)[done:upto])
            generated += new
            self._add_rate("distill", new, seconds)
            done = upto
            self._progress("self-distillation", shard, done=done, total=len(todo), generated_tokens=generated)
            self.log(f"shard {shard.name} (temperature {shard.temperature:g}): self-distilled {done}/{len(todo)} "
                     f"conversations, {generated:,} tokens ({new / max(seconds, 1e-9):.0f} tok/s)")
            self.budget.tick()
        write_json(directory / "distilled.json", {
            "conversations": len(todo), "generated_tokens": generated, "temperature": shard.temperature,
            "pass": shard.pass_index, "seed": shard.seed, "dtype": resolved_dtype(self.campaign.distill_dtype),
        })
        os.replace(partial, final)

    def keep_source_answers(self, shard: Shard, conversations: Sequence[Conversation]) -> None:
        """Stage 1 with ``answers="source"``: the trimmed conversations as they are, written in one go."""
        directory = self.shard_dir(shard)
        tokens = _generated_tokens(self.tokenizer, conversations)
        write_json(directory / "distilled.json", {
            "conversations": len(conversations), "generated_tokens": 0, "source_tokens": tokens, "answers": "source",
            "pass": shard.pass_index,
        })
        write_text(directory / "distilled.jsonl",  # last: its presence marks the stage done
                    "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in conversations))
        self.log(f"shard {shard.name}: kept the source's answers of {len(conversations)} conversations "
                 f"({tokens:,} assistant tokens)")

    # -- stage 2: target features ------------------------------------------------------------------------------

    def layers(self) -> tuple[int, ...]:
        """The ``output_hidden_states`` indices the head reads (only those are cached)."""
        if self.head.init_from is not None:
            from specprim.models import head_path

            record = json.loads((head_path(self.head.init_from) / "config.json").read_text())
            num_layers = int(record["config"]["target_num_layers"])
            return tuple(sorted({layer % (num_layers + 1) for layer in record["config"]["feature_layers"]}))
        from specprim.drafters import default_feature_layers

        return default_feature_layers(3, int(self.target.config.get_text_config().num_hidden_layers))

    def cache(self, shard: Shard) -> None:
        directory = self.shard_dir(shard)
        if (directory / "cached.json").is_file():
            return
        conversations = read_jsonl(directory / "distilled.jsonl")
        examples = render_all(self.tokenizer, conversations, max_length=self.data.max_length)
        record = {"examples": len(examples), "tokens": sum(len(e.input_ids) for e in examples),
                  "assistant_tokens": sum(int(e.assistant_mask.sum()) for e in examples),
                  "dtype": resolved_dtype(self.campaign.feature_dtype)}
        if examples:
            self.budget.check()
            before = _manifest_tokens(directory / "features")
            self._progress("feature caching", shard, tokens=record["tokens"])
            started = time.perf_counter()
            build_feature_cache(self.model(self.campaign.feature_dtype), examples, directory / "features",
                                layers=self.layers(), top_k=self.data.top_k, progress=False)
            seconds = time.perf_counter() - started
            self._add_rate("cache", record["tokens"] - before, seconds)
            self.log(f"shard {shard.name}: features of {record['examples']} conversations, {record['tokens']:,} "
                     f"tokens ({(record['tokens'] - before) / max(seconds, 1e-9):.0f} tok/s)")
            self.budget.tick()
        write_json(directory / "cached.json", record)

    # -- stage 3: training ---------------------------------------------------------------------------------------

    def view(self, shards: Sequence[Shard], view: Path | None = None) -> FeatureDataset:
        """One feature dataset over the caches of ``shards`` with the held-out shard last (its examples held out),
        its manifest written in ``view`` (default ``train/view``)."""
        view = view or self.dir / "train" / "view"
        records, header, holdout = [], None, 0
        for shard in [*shards, None]:
            directory = self.shard_dir(shard) if shard is not None else self.dir / "shards" / "holdout"
            manifest = read_json(directory / "features" / MANIFEST)
            if manifest is None:
                continue  # a shard without a usable conversation
            header = header or {k: v for k, v in manifest.items() if k not in ("shards", "complete")}
            for record in manifest["shards"]:
                file = os.path.relpath(directory / "features" / record["file"], view)
                records.append({**record, "file": file})  # with the shard's checksum, where it has one
                if shard is None:
                    holdout += len(record["lengths"])
        write_json(view / MANIFEST, {**header, "shards": records, "complete": True})
        return FeatureDataset(view, batch_tokens=self.head.batch_tokens, max_length=self.data.max_length,
                              seed=self.head.seed, holdout=holdout)

    def objective(self, dataset: FeatureDataset) -> Any:
        """The head to train wrapped in its objective: ``init_from`` or a fresh one (a fresh head's draft
        vocabulary is read from ``dataset``); once a checkpoint exists, the trainer restores its weights."""
        from specprim.train._pipeline import build_objective

        return build_objective("eagle3", self.target, dataset, draft_vocab_size=self.head.draft_vocab_size,
                               steps=self.head.steps, loss_on=self.head.loss_on, init_from=self.head.init_from,
                               align=self.head.align, align_topk=self.head.align_topk, hass_topk=self.head.hass_topk,
                               hass_weight=self.head.hass_weight, head_layers=self.head.head_layers)

    def trainer_state(self) -> dict[str, Any]:
        return trainer_state(self.dir / "train")

    def train_config(self, epochs: int, target_step: int, *, min_lr_ratio: float = 1.0,
                     decay_steps: int | None = None) -> TrainConfig:
        """The trainer's settings for steps up to ``target_step``: the campaign's constant rate after the warm-up,
        or with ``decay_steps`` a decay over the last steps (a cool-down)."""
        return TrainConfig(epochs=epochs, max_steps=target_step, lr=self.head.lr, warmup_steps=self.head.warmup_steps,
                           min_lr_ratio=min_lr_ratio, decay_steps=decay_steps,
                           checkpoint_every=self.head.checkpoint_every, log_every=self.head.log_every,
                           mixed_precision=resolved_mixed_precision(self.head.mixed_precision), seed=self.head.seed)

    def baseline(self, shards: Sequence[Shard]) -> None:
        """The held-out evaluation of the initial head, before any step (the first line of ``eval.jsonl``)."""
        if read_jsonl(self.dir / EVAL_NAME) or self.trainer_state()["step"]:
            return
        from accelerate import Accelerator

        from specprim.train._trainer import _evaluate

        dataset = self.view(shards)
        objective = self.objective(dataset)
        accelerator = Accelerator(mixed_precision=resolved_mixed_precision(self.head.mixed_precision),
                                  cpu=not torch.cuda.is_available())
        metrics = _evaluate(objective, dataset, accelerator, self.dir / "train", {"step": 0, "epoch": 0})
        self._record({"segment": 0, "step": 0, "trained_tokens": 0, "shards": 0, "data_tokens": 0, **metrics})

    def train(self, shards: Sequence[Shard]) -> bool:
        """Train over ``shards`` until ``train_ratio`` x their tokens (or the campaign's end); ``True`` at the end."""
        data_tokens = sum(read_json(self.shard_dir(s) / "cached.json")["tokens"] for s in shards)
        goal = min(self.head.train_tokens, int(self.head.train_ratio * data_tokens))
        self.baseline(shards)
        segment_path = self.dir / "train" / "segment.json"
        while True:
            segment = read_json(segment_path)
            if segment is not None and not segment["done"] and segment["shards"] != len(shards):
                return False  # an unfinished segment over more shards: a later call's
            if segment is None or segment["done"]:
                state = self.trainer_state()
                if state["tokens"] >= goal:
                    return state["tokens"] >= self.head.train_tokens
                segment = self.plan_segment(state, goal, shards, 1 if segment is None else segment["index"] + 1)
                write_json(segment_path, segment)
            self.budget.check()
            dataset = self.view(shards[: segment["shards"]])
            config = self.train_config(segment["epochs"], segment["target_step"])
            self._progress("training", None, segment=segment["index"], from_step=segment["start_step"],
                           to_step=segment["target_step"])
            started = time.perf_counter()
            before = self.trainer_state()["tokens"]
            metrics = train(self.objective(dataset), dataset, self.dir / "train", config, progress=False)
            state = self.end_of_epoch(dataset)
            self._add_rate("train", state["tokens"] - before, time.perf_counter() - started)
            for milestone in self.head.milestones:
                if state["tokens"] >= milestone:
                    self.snapshot(milestone, state, metrics)
            self._record({"segment": segment["index"], "step": state["step"], "trained_tokens": state["tokens"],
                          "shards": segment["shards"], "data_tokens": segment["data_tokens"], **metrics})
            self.log(f"train: segment {segment['index']}, step {state['step']}, {state['tokens']:,} tokens over "
                     f"{segment['shards']} shard(s); held-out top-1 by depth {format_accuracy(metrics)}")
            write_json(segment_path, {**segment, "done": True})
            self.budget.tick()

    def end_of_epoch(self, dataset: FeatureDataset) -> dict[str, Any]:
        """The trainer's state, a checkpoint taken after the last batch of an epoch moved to the next epoch's start.

        Over one dataset the two are the same position; the next segment reads a grown dataset, whose plan of the
        finished epoch is longer, so only the second is where an uninterrupted run continues.
        """
        path = self.dir / "train" / "checkpoint" / STATE_NAME
        state = read_json(path)
        if state is not None and state["batch"] >= len(dataset.batches(state["epoch"])):
            state = {**state, "epoch": state["epoch"] + 1, "batch": 0}
            write_text(path, json.dumps(state))
        return self.trainer_state()

    def plan_segment(self, state: dict[str, Any], goal: int, shards: Sequence[Shard], index: int) -> dict[str, Any]:
        """The next segment: up to ``segment_steps`` steps, ending near the next milestone or the goal."""
        stop = min([goal, *[m for m in self.head.milestones if m > state["tokens"]]])
        per_step = state["tokens"] / state["step"] if state["step"] else 0.75 * self.head.batch_tokens
        steps = max(1, min(self.head.segment_steps, math.ceil((stop - state["tokens"]) / per_step)))
        target = state["step"] + steps
        epochs = trainer_epochs(self.view(shards), state, steps)
        data_tokens = sum(read_json(self.shard_dir(s) / "cached.json")["tokens"] for s in shards)
        return {"index": index, "shards": len(shards), "data_tokens": data_tokens, "start_step": state["step"],
                "target_step": target, "epochs": epochs, "done": False}

    def snapshot(self, milestone: int, state: dict[str, Any], metrics: dict[str, float]) -> None:
        """Copy the head to ``milestones/<label>/`` the first time ``milestone`` trained tokens are passed."""
        final = self.dir / "milestones" / milestone_label(milestone)
        if final.is_dir():
            return
        staged = final.with_name(f".{final.name}.tmp")
        if staged.exists():
            shutil.rmtree(staged)
        shutil.copytree(self.dir / "train" / "head", staged)
        (staged / "milestone.json").write_text(json.dumps({
            "milestone": milestone, "trained_tokens": state["tokens"], "step": state["step"], **metrics}, indent=1))
        os.replace(staged, final)
        self.log(f"milestone {final.name}: head copied to {final} (step {state['step']}, {state['tokens']:,} tokens)")

    # -- records -------------------------------------------------------------------------------------------------

    def _record(self, record: dict[str, Any]) -> None:
        """Add ``record`` to ``eval.jsonl`` unless a record of its segment is there (rewritten atomically)."""
        path = self.dir / EVAL_NAME
        records = read_jsonl(path)
        if any(r["segment"] == record["segment"] for r in records):
            return
        write_jsonl(path, [*records, record])

    def _add_rate(self, stage: str, tokens: int, seconds: float) -> None:
        """Add a unit of work to ``rates.json``: totals per stage, and the last ``_RECENT`` units (the ETA's)."""
        path = self.dir / "rates.json"
        rates = read_json(path) or {}
        entry = rates.get(stage, {"tokens": 0, "seconds": 0.0})
        recent = [*entry.get("recent", []), [int(tokens), round(seconds, 3)]][-_RECENT:]
        rates[stage] = {"tokens": entry["tokens"] + int(tokens), "seconds": round(entry["seconds"] + seconds, 3),
                        "recent": recent}
        write_json(path, rates)

    def _progress(self, stage: str, shard: Shard | None, **counts: Any) -> None:
        write_json(self.dir / "progress.json", {"stage": stage, "shard": None if shard is None else shard.name,
                                                 "time": time.time(), "pid": os.getpid(), **counts})


def _generated_tokens(tokenizer: Any, conversations: Sequence[Conversation]) -> int:
    """Tokens of the assistant turns (what the target wrote)."""
    texts = [m["content"] for c in conversations for m in c if m["role"] == "assistant"]
    return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids) if texts else 0


def _manifest_tokens(directory: Path) -> int:
    manifest = read_json(directory / MANIFEST)
    return 0 if manifest is None else sum(sum(s["lengths"]) for s in manifest["shards"])


def trainer_epochs(dataset: FeatureDataset, state: dict[str, Any], steps: int) -> int:
    """The trainer's ``epochs`` for ``steps`` more steps from ``state`` (its ``step``, ``epoch``, ``batch``): enough
    that its schedule spans ``step + steps`` steps and the epochs left hold them all."""
    lengths: dict[int, int] = {}

    def plan_length(epoch: int) -> int:
        if epoch not in lengths:
            lengths[epoch] = len(dataset.batches(epoch))
        return lengths[epoch]

    epoch, batch, epochs = state.get("epoch", 0), state.get("batch", 0), state.get("epoch", 0) + 1
    while (sum(plan_length(e) for e in range(epochs)) < state["step"] + steps
           or max(0, plan_length(epoch) - batch) + sum(plan_length(e) for e in range(epoch + 1, epochs)) < steps):
        epochs += 1
    return epochs


def trainer_state(run: Path) -> dict[str, Any]:
    """``step``, ``epoch``, ``batch``, ``tokens``, ``seconds`` of the trainer's last checkpoint in ``run`` (zeros
    before the first)."""
    for name in ("checkpoint", "checkpoint.old"):  # .old: interrupted between the trainer's two renames
        state = read_json(run / name / STATE_NAME)
        if state is not None:
            return state
    return {"step": 0, "epoch": 0, "batch": 0, "tokens": 0, "seconds": 0.0}


def settings_conflict(saved: Campaign, campaign: Campaign, retrain: bool) -> str | None:
    """Why ``campaign`` cannot continue the run started as ``saved`` (its settings differ, and not only the head's
    with ``retrain``), or ``None`` when it can."""
    differ = _settings_differ(saved, campaign)
    only_head = differ and not _settings_differ(dataclasses.replace(saved, head=campaign.head), campaign)
    if not differ or (retrain and only_head):
        return None
    hint = "retrain (--retrain) to train the head again on the same data, or use" if only_head else "use"
    return f"{campaign.run_dir} was started with other settings ({'; '.join(differ)}); {hint} another run directory"


def run_campaign(campaign: Campaign, *, max_seconds: float | None = None, max_items: int | None = None,
                 log: Callable[[str], None] = print, before_unit: Callable[[], None] | None = None,
                 retrain: bool = False) -> CampaignStatus:
    """Run (or resume) ``campaign`` until it ends, its data runs out, or the budget is spent.

    The budget stops the run before the next unit of work (a self-distillation batch, a shard's feature cache or a
    training segment) once ``max_seconds`` have passed or ``max_items`` units have run in this call; a later call
    continues. ``before_unit`` is called before each unit (e.g. :func:`adapt_threads`). The first call writes
    ``campaign.json``; a later call with other settings raises ``ValueError`` naming them (the settings that may
    change on resume: dtypes, the self-distillation batch size, mixed precision, ``train_ratio`` and
    ``max_train_tokens``, are saved and apply to the work still to do), unless only the head's settings differ and
    ``retrain`` is set: the training so far (``train/``, ``eval.jsonl``, ``milestones/``) then moves to
    ``retrained-<n>/`` and the head trains again from the start on the data already made. Returns the
    :func:`campaign_status` at the end.
    """
    if max_seconds is not None and max_seconds < 0:
        raise ValueError(f"max_seconds must be >= 0, got {max_seconds}")
    if max_items is not None and max_items < 0:
        raise ValueError(f"max_items must be >= 0, got {max_items}")
    run_dir = Path(campaign.run_dir)
    new_run = not (run_dir / CONFIG_NAME).is_file()
    differ: list[str] = []
    resumed: list[str] = []
    if not new_run:
        saved = load_campaign(run_dir)
        conflict = settings_conflict(saved, campaign, retrain)
        if conflict:
            raise ValueError(conflict)
        differ, resumed = _settings_differ(saved, campaign), _resume_changes(saved, campaign)
        if differ:
            archive = run_dir / f"retrained-{1 + len(list(run_dir.glob('retrained-*')))}"
            archive.mkdir()
            for name in ("train", EVAL_NAME, "milestones"):
                if (run_dir / name).exists():
                    os.replace(run_dir / name, archive / name)
            shutil.copy2(run_dir / CONFIG_NAME, archive / CONFIG_NAME)
            log(f"retraining with {'; '.join(differ)}: the training so far moved to {archive}")
        elif resumed:
            log(f"from now on {'; '.join(resumed)} (what is done keeps its own)")
    if new_run or differ or resumed:  # saved as it now runs
        write_json(run_dir / CONFIG_NAME, {**campaign.to_json(), "run_dir": os.fspath(run_dir)})
    runner = _Runner(campaign, _Budget(max_seconds, max_items, before_unit), log)
    try:
        holdout, shards = plan_shards(runner.order(), campaign.data)
        runner.distill(holdout)
        runner.cache(holdout)
        finished = False
        for position, shard in enumerate(shards):
            runner.distill(shard)
            runner.cache(shard)
            if runner.train(shards[: position + 1]):
                finished = True
                break
        runner._progress("finished" if finished else "data exhausted", None)
        log("campaign finished" if finished else "campaign: every shard is trained on; the data plan is exhausted")
    except StopCampaign:
        runner._progress("stopped (budget spent)", None)
        log("campaign: stopped, the budget of this run is spent; rerun to continue")
    return campaign_status(run_dir)


# ----------------------------------------------------------------------------------------------- status


@dataclasses.dataclass(frozen=True)
class CampaignStatus:
    """Where a campaign stands, read from its run directory (see :func:`campaign_status`).

    Token counts: ``generated`` (written by the target, training shards), ``source`` (the source's own assistant
    turns kept by a campaign with ``answers="source"``), ``cached`` (rendered tokens with cached
    features, training shards), ``trained`` (tokens optimised on, repeats counted). ``rates`` are measured tokens
    per second of each stage over its last 20 units of work (``None`` before the first); ``eta_seconds`` estimates
    the time to ``next_milestone`` from them. ``data_exhausted``: every shard of the data plan is cached and the
    training it allows ends before the campaign's end. ``cooldowns``: the ``eval.json`` record of each finished
    cool-down (``specprim campaign cooldown``).
    """

    run_dir: str
    campaign: Campaign
    shards_planned: int
    shards_distilled: int
    shards_cached: int
    conversations: int
    generated_tokens: int
    source_tokens: int
    cached_tokens: int
    holdout_tokens: int
    trained_tokens: int
    step: int
    baseline: dict[str, Any] | None
    evaluation: dict[str, Any] | None
    milestones_done: tuple[str, ...]
    next_milestone: int | None
    rates: dict[str, float | None]
    eta_seconds: float | None
    stage: dict[str, Any] | None
    data_exhausted: bool
    cooldowns: tuple[dict[str, Any], ...] = ()


def campaign_status(run_dir: str | os.PathLike[str]) -> CampaignStatus:
    """Read the state of the campaign in ``run_dir`` (``FileNotFoundError`` when there is none)."""
    campaign = load_campaign(run_dir)
    directory = Path(run_dir)
    order = read_json(directory / "order.json")
    shards = plan_shards(order, campaign.data)[1] if order is not None else []
    distilled = cached = conversations = generated = source = cached_tokens = 0
    for shard in shards:
        record = read_json(directory / "shards" / shard.name / "distilled.json")
        if record is not None:
            distilled += 1
            conversations += record["conversations"]
            generated += record["generated_tokens"]
            source += record.get("source_tokens", 0)
        record = read_json(directory / "shards" / shard.name / "cached.json")
        if record is not None:
            cached += 1
            cached_tokens += record["tokens"]
    stage = read_json(directory / "progress.json")
    if stage and stage.get("stage") == "self-distillation" and stage.get("shard") != "holdout":
        if not (directory / "shards" / stage["shard"] / "distilled.json").is_file():
            conversations += stage["done"]
            generated += stage["generated_tokens"]
    holdout = read_json(directory / "shards" / "holdout" / "cached.json")
    state = trainer_state(directory / "train")
    records = read_jsonl(directory / EVAL_NAME)
    head = campaign.head
    labels = [milestone_label(m) for m in head.milestones]
    done = tuple(label for label in labels if (directory / "milestones" / label).is_dir())
    upcoming = [m for m in head.milestones if m > state["tokens"]]
    rates_record = read_json(directory / "rates.json") or {}
    rates = {name: _rate(rates_record.get(name, {})) for name in ("distill", "cache", "train")}
    next_milestone = upcoming[0] if upcoming else None
    exhausted = bool(shards) and cached == len(shards) and head.train_ratio * cached_tokens < head.train_tokens
    eta = None
    if next_milestone is not None and not (exhausted and head.train_ratio * cached_tokens < next_milestone):
        eta = _eta(next_milestone - state["tokens"], head.train_ratio * cached_tokens - state["tokens"],
                   head.train_ratio, generated / cached_tokens if cached_tokens else _GENERATED_PER_CACHED[
                       campaign.data.answers], rates)
    return CampaignStatus(
        run_dir=os.fspath(run_dir), campaign=campaign, shards_planned=len(shards), shards_distilled=distilled,
        shards_cached=cached, conversations=conversations, generated_tokens=generated, source_tokens=source,
        cached_tokens=cached_tokens,
        holdout_tokens=0 if holdout is None else holdout["tokens"], trained_tokens=state["tokens"],
        step=state["step"], baseline=next((r for r in records if r["segment"] == 0), None),
        evaluation=records[-1] if records else None, milestones_done=done, next_milestone=next_milestone,
        rates=rates, eta_seconds=eta, stage=stage, data_exhausted=exhausted,
        cooldowns=tuple(finished_cooldowns(run_dir)),
    )


def _rate(entry: dict[str, Any]) -> float | None:
    """Tokens per second of a stage: the token-weighted median of the rates of its last ``_RECENT`` units (the
    totals in older files). A median, so that a unit that ran while the job was paused (``kill -STOP``) or shared
    the machine does not drag the ETA down with it."""
    units = [(t, s) for t, s in entry.get("recent") or [[entry.get("tokens", 0), entry.get("seconds", 0.0)]]
             if t > 0 and s > 0]
    if not units:
        return None
    units.sort(key=lambda unit: unit[0] / unit[1])
    cumulative = list(itertools.accumulate(t for t, _ in units))
    middle = bisect.bisect_left(cumulative, cumulative[-1] / 2)  # the first unit reaching half of all tokens
    return units[middle][0] / units[middle][1]


def _eta(tokens: float, trainable: float, ratio: float, generated_per_cached: float,
         rates: dict[str, float | None]) -> float | None:
    """Seconds to train ``tokens`` more: ``trainable`` of them on data already cached, the rest on new data that
    must be generated and cached first (``1 / ratio`` cached tokens per trained token)."""
    if not rates["train"]:
        return None
    seconds = tokens / rates["train"]
    missing = tokens - max(0.0, trainable)
    if missing > 0:
        if (generated_per_cached and not rates["distill"]) or not rates["cache"]:
            return None
        seconds += missing / ratio * ((generated_per_cached / rates["distill"] if generated_per_cached else 0.0)
                                      + 1 / rates["cache"])
    return seconds


_ACTIVE = ("self-distillation", "feature caching", "training")


def process_state(pid: int) -> str:
    """``"gone"``, ``"stopped"`` (``kill -STOP``) or ``"alive"`` (running, or not ours to inspect)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "alive"
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "alive"
    return "stopped" if state in ("T", "t") else "alive"


def _process_note(pid: int | None) -> str:
    """What the status line says about the process of the stage in progress: nothing while it runs."""
    state = "alive" if pid is None else process_state(pid)
    if state == "gone":
        return f"; process {pid} is not running (rerun `specprim campaign run` to resume)"
    return f"; process {pid} is stopped (`kill -CONT {pid}` continues it)" if state == "stopped" else ""


def format_accuracy(record: dict[str, Any]) -> str:
    """Held-out top-1 by depth of an evaluation record: ``"0.438 / 0.367 / 0.341"``."""
    return " / ".join(f"{record[f'acc_{k}']:.3f}" for k in range(1, 10) if f"acc_{k}" in record)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_status(status: CampaignStatus) -> str:
    """The status as the lines ``specprim campaign status`` prints."""
    campaign = status.campaign
    init = campaign.head.init_from or "a fresh head"
    lines = [f"campaign {status.run_dir}: EAGLE-3 head for {campaign.target}, from {init}"]
    stage = status.stage
    if stage:
        text = stage["stage"] + (f" of shard {stage['shard']}" if stage.get("shard") else "")
        if "total" in stage:
            text += f" ({stage['done']:,}/{stage['total']:,} conversations)"
        if "tokens" in stage:
            text += f" ({stage['tokens']:,} tokens)"
        if "to_step" in stage:
            text += f" (segment {stage['segment']}: steps {stage['from_step']} to {stage['to_step']})"
        text += f", last update {_duration(time.time() - stage['time'])} ago"
        if stage["stage"] in _ACTIVE:
            text += _process_note(stage.get("pid"))
        lines.append(f"now:        {text}")
    made = (f"generated:  {status.generated_tokens:,} tokens" if campaign.data.answers == "target"
            else f"answers:    the source's own, {status.source_tokens:,} tokens")
    lines += [
        f"{made} ({status.conversations:,} conversations; {status.shards_distilled} of {status.shards_planned} "
        "shards complete)",
        f"cached:     {status.cached_tokens:,} tokens ({status.shards_cached} shards; held-out shard "
        f"{status.holdout_tokens:,} tokens)",
        f"trained:    {status.trained_tokens:,} tokens (step {status.step})",
    ]

    if status.evaluation is not None:
        start = f" (at the start: {format_accuracy(status.baseline)})" if status.baseline else ""
        lines.append(f"held-out:   top-1 by depth {format_accuracy(status.evaluation)} at "
                     f"{status.evaluation['trained_tokens']:,} trained tokens{start}")
    lines.append("milestones: " + (", ".join(status.milestones_done) or "none yet") + " done" + (
        f"; next {milestone_label(status.next_milestone)}" if status.next_milestone else ""))
    lines += [f"cooled:     {record['name']}: top-1 by depth {format_accuracy(record)} at {record['trained_tokens']:,} "
              "trained tokens" for record in status.cooldowns]
    names = {"distill": "self-distillation", "cache": "feature caching", "train": "training"}
    lines.append("rates:      " + ", ".join(f"{names[k]} {v:.0f} tok/s" if v else f"{names[k]} -"
                                            for k, v in status.rates.items()))
    if status.next_milestone is not None:
        eta = ("never: the data plan runs out first" if status.data_exhausted and status.eta_seconds is None
               else "unknown until every stage has run" if status.eta_seconds is None
               else _duration(status.eta_seconds))
        lines.append(f"ETA:        {eta} to {milestone_label(status.next_milestone)} trained tokens")
    return "\n".join(lines)
