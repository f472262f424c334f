"""The training loop: any :class:`Objective` over a :class:`FeatureDataset`, on ``accelerate``.

The same code runs on one CPU process and, unchanged, under ``accelerate launch`` on several GPUs or nodes
(each process takes every ``world_size``-th batch of the epoch's plan, the last ``len % world_size`` batches of an
epoch are left out so that all processes step together; gradients are averaged by accelerate).
State lives in ``output_dir``:

- ``checkpoint/``: accelerate state (weights, optimizer, scheduler, RNG) plus ``trainer_state.json`` (step,
  epoch, batch within the epoch) and the checksums of the accelerate files, written every ``checkpoint_every``
  steps and at the end (in a new directory, then swapped in); a new call with the same ``output_dir`` resumes from
  it and, as the data order is a function of ``(seed, epoch)``, continues exactly as an uninterrupted run would. A
  checkpoint that differs from its checksums, or holds pickled objects other than tensors and plain state, is
  refused (a ``ValueError`` naming it) before anything is loaded from it;
- ``log.jsonl``: one JSON line per ``log_every`` steps (``step``, ``epoch``, ``lr``, ``tokens`` and ``tokens_per_s``
  summed over processes, ``train_seconds`` of optimisation so far across resumed runs, the main process's
  metrics averaged since the last line) and one per evaluation (``"eval": true``, metrics on the held-out
  batches);
- ``head/``: the trained draft module (``save_pretrained``) at the end and at every checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from specprim._integrity import DamagedFileError, UnsafeFileError, check_directory, write_checksums
from specprim.train._features import FeatureDataset
from specprim.train._progress import progress_bar
from specprim.train._protocol import Objective

__all__ = ["TrainConfig", "train"]

STATE_NAME = "trainer_state.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation settings.

    Attributes:
        epochs: passes over the training examples.
        max_steps: stop after this many optimizer steps in all (``None``: run every epoch); the LR schedule
            spans ``min(max_steps, steps of all epochs)`` steps.
        lr: peak learning rate (AdamW, betas (0.9, 0.95)); linear warm-up over ``warmup_steps``, then cosine
            decay to ``lr * min_lr_ratio``.
        decay_steps: ``None``: the cosine decay spans every step after the warm-up; a number: warm-up, stable,
            decay: the rate stays at ``lr`` until the last ``decay_steps`` steps and decays over those alone
            (a cool-down that can branch from any checkpoint of a constant-rate run).
        weight_decay, grad_clip: AdamW weight decay; gradient-norm clip (``0`` = none).
        checkpoint_every, log_every, eval_every: in optimizer steps (``eval_every = 0``: only at the end).
        mixed_precision: ``"no"`` or ``"bf16"`` (autocast; weights stay float32).
        seed: data order and initialisation seed.
    """

    epochs: int = 1
    max_steps: int | None = None
    lr: float = 3e-4
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    decay_steps: int | None = None
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    checkpoint_every: int = 200
    log_every: int = 10
    eval_every: int = 0
    mixed_precision: str = "no"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or (self.max_steps is not None and self.max_steps < 1):
            raise ValueError("epochs and max_steps must be >= 1")
        if self.lr <= 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("lr must be > 0, warmup_steps >= 0 and min_lr_ratio in [0, 1]")
        if self.decay_steps is not None and self.decay_steps < 1:
            raise ValueError(f"decay_steps must be >= 1 (or None), got {self.decay_steps}")
        if min(self.checkpoint_every, self.log_every) < 1 or self.eval_every < 0:
            raise ValueError("checkpoint_every and log_every must be >= 1, eval_every >= 0")
        if self.mixed_precision not in ("no", "bf16"):
            raise ValueError(f"mixed_precision must be 'no' or 'bf16', got {self.mixed_precision!r}")


def _schedule(config: TrainConfig, total_steps: int):
    """The learning-rate factor of each step: warm-up, then a cosine decay over the rest (or, with ``decay_steps``,
    over the last ``decay_steps`` steps only, the rate staying at its peak until they begin)."""
    decay_start = config.warmup_steps if config.decay_steps is None else total_steps - config.decay_steps

    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / (config.warmup_steps + 1)
        progress = min(1.0, max(0, step - decay_start) / max(1, total_steps - decay_start))
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def train(
    objective: Objective,
    dataset: FeatureDataset,
    output_dir: str | os.PathLike[str],
    config: TrainConfig = TrainConfig(),
    *,
    progress: bool = True,
    accelerator: Any = None,
) -> dict[str, float]:
    """Optimise ``objective`` on ``dataset``; resume from ``output_dir/checkpoint`` if it exists.

    Returns the metrics of the final held-out evaluation (empty when the dataset has no held-out examples).
    Raises ``ValueError`` when the dataset lacks a feature layer the objective needs.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, set_seed

    missing = [layer for layer in objective.layers if layer not in dataset.layers]
    if missing:
        raise ValueError(f"the feature cache holds layers {dataset.layers}; the objective also needs {missing}")
    output = Path(output_dir)
    _freeze_target_modules(objective)
    accelerator = accelerator or Accelerator(
        mixed_precision=config.mixed_precision, cpu=not torch.cuda.is_available(),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],  # e.g. MTP's unused embedding
    )
    set_seed(config.seed)
    every_epoch = sum(len(dataset.batches(epoch)) // accelerator.num_processes for epoch in range(config.epochs))
    total = every_epoch if config.max_steps is None else min(config.max_steps, every_epoch)
    trainable = [p for p in objective.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config, total))
    model, optimizer, scheduler = accelerator.prepare(objective, optimizer, scheduler)
    state = {"step": 0, "epoch": 0, "batch": 0, "tokens": 0, "seconds": 0.0}
    checkpoint = output / "checkpoint"
    if not (checkpoint / STATE_NAME).is_file() and (checkpoint.with_name("checkpoint.old") / STATE_NAME).is_file():
        checkpoint = checkpoint.with_name("checkpoint.old")  # interrupted between the two renames
    if (checkpoint / STATE_NAME).is_file():
        _load_checkpoint(accelerator, checkpoint)
        state = _read_state(checkpoint / STATE_NAME)
        checkpoint = output / "checkpoint"
    bar = progress_bar(total, state["step"], progress and accelerator.is_main_process, "train", unit="step")
    sums: dict[str, float] = defaultdict(float)
    count, tokens_since, clock = 0, 0, time.perf_counter()
    evaluation: dict[str, float] = {}
    while state["step"] < total and state["epoch"] < config.epochs:
        plan = dataset.batches(state["epoch"])
        usable = len(plan) - len(plan) % accelerator.num_processes  # every process runs the same number of steps
        mine = plan[accelerator.process_index: usable: accelerator.num_processes]
        while state["batch"] < len(mine) and state["step"] < total:
            started = time.perf_counter()
            batch = dataset.load(mine[state["batch"]]).to(accelerator.device)
            model.train()
            with accelerator.autocast():
                out = model(batch)
            accelerator.backward(out.loss)
            if config.grad_clip:
                accelerator.clip_grad_norm_(trainable, config.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["batch"] += 1
            real = batch.attention_mask.sum()
            real = int(accelerator.reduce(real, reduction="sum") if accelerator.num_processes > 1 else real)
            state["tokens"] += real
            state["seconds"] = state.get("seconds", 0.0) + time.perf_counter() - started
            tokens_since += real
            for name, value in out.metrics.items():
                sums[name] += value
            count += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{out.metrics['loss']:.3f}", acc_1=f"{out.metrics.get('acc_1', 0):.3f}")
            if state["step"] % config.log_every == 0:
                elapsed = time.perf_counter() - clock
                _log(output, accelerator, {
                    "step": state["step"], "epoch": state["epoch"], "lr": scheduler.get_last_lr()[0],
                    "tokens": state["tokens"], "tokens_per_s": tokens_since / max(elapsed, 1e-9),
                    "train_seconds": round(state["seconds"], 1),
                    **{k: v / count for k, v in sums.items()},
                })
                sums, count, tokens_since, clock = defaultdict(float), 0, 0, time.perf_counter()
            if config.eval_every and state["step"] % config.eval_every == 0:
                evaluation = _evaluate(model, dataset, accelerator, output, state)
            if state["step"] % config.checkpoint_every == 0:
                _save(accelerator, model, checkpoint, output, state)
        if state["batch"] >= len(mine):
            state["epoch"] += 1
            state["batch"] = 0
    if bar is not None:
        bar.close()
    evaluation = _evaluate(model, dataset, accelerator, output, state)
    _save(accelerator, model, checkpoint, output, state)
    return evaluation


def _freeze_target_modules(objective: Objective) -> None:
    """Stop gradients into the target modules a head uses by reference (embeddings, LM head), which heads keep in
    plain tuples or dataclass records so that they are not sub-modules: they are not the objective's parameters,
    so their gradients would only cost memory and time."""
    own = {id(p) for p in objective.parameters()}
    for value in vars(objective.module).values():
        if isinstance(value, tuple):
            parts = value
        elif dataclasses.is_dataclass(value):
            parts = tuple(getattr(value, field.name) for field in dataclasses.fields(value))
        else:
            continue
        for part in parts:
            if isinstance(part, torch.nn.Module):
                for parameter in part.parameters():
                    if id(parameter) not in own:
                        parameter.requires_grad_(False)


@torch.no_grad()
def _evaluate(model, dataset: FeatureDataset, accelerator, output: Path, state: dict[str, int]) -> dict[str, float]:
    plan = dataset.holdout_batches()
    if not plan:
        return {}
    model.eval()
    sums: dict[str, float] = defaultdict(float)
    weights = 0
    for items in plan:
        batch = dataset.load(items).to(accelerator.device)
        with accelerator.autocast():
            out = model(batch)
        weight = int(batch.attention_mask.sum())
        for name, value in out.metrics.items():
            sums[name] += value * weight
        weights += weight
    metrics = {name: value / weights for name, value in sums.items()}
    _log(output, accelerator, {"eval": True, "step": state["step"], "epoch": state["epoch"], **metrics})
    return metrics


def _load_checkpoint(accelerator, checkpoint: Path) -> None:
    """Restore the accelerate state in ``checkpoint`` once its files match their checksums (one written before
    checksums were kept is loaded as it is); pickled objects are refused (accelerate reads with
    ``weights_only``)."""
    try:
        check_directory(checkpoint, full=True)
    except DamagedFileError as error:
        raise DamagedFileError(f"{error}: the checkpoint cannot be resumed; delete {checkpoint} to train from the "
                               "start") from error
    try:
        accelerator.load_state(str(checkpoint))
    except pickle.UnpicklingError as error:
        raise UnsafeFileError(f"{checkpoint} holds pickled objects other than tensors and plain state; they are never "
                              "loaded (a pickle can run code)") from error


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text())
    except ValueError as error:
        raise DamagedFileError(f"{path} is not a whole JSON file ({error}): delete {path.parent} to train from the "
                               "start") from error
    if not isinstance(state, dict) or not {"step", "epoch", "batch"} <= set(state):
        raise DamagedFileError(f"{path} is not a trainer state (step, epoch, batch)")
    return state


def _save(accelerator, model, checkpoint: Path, output: Path, state: dict[str, int]) -> None:
    """Write the checkpoint next to the old one, then swap, so an interruption never leaves a torn checkpoint."""
    accelerator.wait_for_everyone()
    staged = checkpoint.with_name(checkpoint.name + ".new")
    accelerator.save_state(str(staged))
    accelerator.wait_for_everyone()  # every process's files are written before they are hashed
    if accelerator.is_main_process:
        (staged / STATE_NAME).write_text(json.dumps(state))
        write_checksums(staged, exclude=(STATE_NAME,))  # the state is small JSON that a campaign may rewrite
        old = checkpoint.with_name(checkpoint.name + ".old")
        if checkpoint.exists():
            os.replace(checkpoint, old)
        os.replace(staged, checkpoint)
        if old.exists():
            shutil.rmtree(old)
        accelerator.unwrap_model(model).save_pretrained(output / "head")
    accelerator.wait_for_everyone()


def _log(output: Path, accelerator, record: dict[str, Any]) -> None:
    if not accelerator.is_main_process:
        return
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "log.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
