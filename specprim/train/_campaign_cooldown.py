"""Cool-downs of a campaign's head (``specprim campaign cooldown RUN_DIR``).

A campaign trains at a constant learning rate, so its run can go on for as long as data keeps coming. A constant
rate leaves accuracy on the table that a decaying one collects (warm-up, stable, decay schedules): a cool-down
branches from the campaign's latest checkpoint, the same data in the same order, and decays the rate to
``min_lr_ratio`` x its peak over ``decay_steps`` more steps. The campaign itself is left as it was and can go on
training; a cool-down can branch from any point it reaches, and its head is the one to measure and ship.

Each cool-down is a directory ``RUN_DIR/cooldowns/step<S>-decay<N>/`` (``S`` the step it branched at):
``cooldown.json`` (where it branched and how it decays), ``view/`` (its feature dataset), ``train/`` (the trainer's
checkpoint, log and head) and, once finished, ``eval.json`` (the held-out evaluation of its head). A killed cool-down
resumes from its own checkpoint when the command is run again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specprim.train._campaign import (
    _ACTIVE,
    Campaign,
    _Budget,
    _Runner,
    format_accuracy,
    load_campaign,
    plan_shards,
    process_state,
    trainer_epochs,
    trainer_state,
)
from specprim.train._run_files import COOLDOWNS_NAME, read_json, write_json
from specprim.train._trainer import train

__all__ = ["DEFAULT_DECAY_FRACTION", "CooldownPlan", "cool_down", "cooldown_name", "plan_cooldown"]

DEFAULT_DECAY_FRACTION = 0.1  # decay steps per step trained, when none are given (WSD practice: 10-20 %)


def cooldown_name(step: int, decay_steps: int) -> str:
    """``"step1049-decay150"``: the directory of a cool-down branching at ``step`` over ``decay_steps`` steps."""
    return f"step{step}-decay{decay_steps}"


@dataclass(frozen=True)
class CooldownPlan:
    """A cool-down about to run: the ``campaign`` in ``run_dir`` and the cool-down's directory ``out``, the
    campaign's trainer ``state`` it branches at (``step``, ``epoch``, ``batch``, ``tokens``), the training ``shards``
    of its data, how it decays, and the ``branch`` record of ``cooldown.json`` where one was already made there."""

    campaign: Campaign
    run_dir: Path
    out: Path
    state: dict[str, Any]
    shards: int
    decay_steps: int
    min_lr_ratio: float
    branch: dict[str, Any] | None


def plan_cooldown(run_dir: str | os.PathLike[str], decay_steps: int | None = None, *,
                  min_lr_ratio: float = 0.0) -> CooldownPlan:
    """Where a cool-down of the campaign in ``run_dir`` branches and how it decays, read from its files (nothing is
    loaded or written). ``decay_steps`` defaults to 10 % of the steps trained. Raises ``ValueError`` for bad
    settings, when nothing is trained yet, when the campaign's process is running or stopped (its checkpoint
    moves), or when a cool-down branched there decays to another ``min_lr_ratio``."""
    if decay_steps is not None and decay_steps < 1:
        raise ValueError(f"decay_steps must be >= 1, got {decay_steps}")
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    directory = Path(run_dir)
    campaign = load_campaign(directory)
    _check_idle(directory)
    state = trainer_state(directory / "train")
    segment = read_json(directory / "train" / "segment.json")
    if not state["step"] or segment is None:
        raise ValueError(f"nothing trained in {directory} yet: a cool-down branches from the campaign's checkpoint")
    decay_steps = decay_steps or max(1, round(DEFAULT_DECAY_FRACTION * state["step"]))
    out = directory / COOLDOWNS_NAME / cooldown_name(state["step"], decay_steps)
    branch = read_json(out / "cooldown.json")
    if branch is not None and branch["min_lr_ratio"] != min_lr_ratio:
        raise ValueError(f"the cool-down in {out} decays to min_lr_ratio {branch['min_lr_ratio']}, not "
                         f"{min_lr_ratio}: rerun with that value to resume it, or move it away")
    return CooldownPlan(campaign, directory, out, state, segment["shards"], decay_steps, min_lr_ratio, branch)


def cool_down(run_dir: str | os.PathLike[str], decay_steps: int | None = None, *, min_lr_ratio: float = 0.0,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Branch a cool-down (see :func:`plan_cooldown`) from the campaign's latest checkpoint, or resume the one
    branched there with these settings, and train it to its end. Returns its ``eval.json`` record: the branch
    (``from_step``, ``from_tokens``, ``shards``, ``decay_steps``, ``min_lr_ratio``), the ``step`` and
    ``trained_tokens`` it ended at and the held-out metrics of its head."""
    plan = plan_cooldown(run_dir, decay_steps, min_lr_ratio=min_lr_ratio)
    out, state = plan.out, plan.state
    done = read_json(out / "eval.json")
    if done is not None:
        log(f"cooldown: {out.name} is finished ({format_accuracy(done)} at {done['trained_tokens']:,} tokens)")
        return done
    runner = _Runner(plan.campaign, _Budget(None, None), log)
    _, shards = plan_shards(runner.order(), plan.campaign.data)
    dataset = runner.view(shards[: plan.shards], out / "view")
    branch = plan.branch
    if branch is None:
        branch = {"from_step": state["step"], "from_tokens": state["tokens"], "shards": plan.shards,
                  "decay_steps": plan.decay_steps, "min_lr_ratio": min_lr_ratio,
                  "epochs": trainer_epochs(dataset, state, plan.decay_steps)}
        _copy_checkpoint(plan.run_dir / "train", out / "train")
        write_json(out / "cooldown.json", branch)  # last: its presence marks the branch made
        log(f"cooldown: branched at step {state['step']} ({state['tokens']:,} tokens) into {out}")
    config = runner.train_config(branch["epochs"], branch["from_step"] + plan.decay_steps,
                                 min_lr_ratio=min_lr_ratio, decay_steps=plan.decay_steps)
    metrics = train(runner.objective(dataset), dataset, out / "train", config, progress=False)
    end = trainer_state(out / "train")
    record = {**{k: v for k, v in branch.items() if k != "epochs"}, "step": end["step"],
              "trained_tokens": end["tokens"], **metrics}
    write_json(out / "eval.json", record)
    log(f"cooldown: {out.name} finished at {end['tokens']:,} tokens; held-out top-1 by depth {format_accuracy(record)}")
    return record


def _check_idle(directory: Path) -> None:
    """Refuse while a process of the campaign may still write the checkpoint a cool-down copies."""
    progress = read_json(directory / "progress.json") or {}
    pid = progress.get("pid")
    if progress.get("stage") in _ACTIVE and pid is not None and pid != os.getpid():
        state = process_state(pid)
        if state != "gone":
            raise ValueError(f"the campaign's process {pid} is {'stopped' if state == 'stopped' else 'running'}; "
                             "end it first (kill it; `specprim campaign run` resumes it later)")


def _copy_checkpoint(source: Path, destination: Path) -> None:
    """Copy the trainer's checkpoint of ``source`` (``checkpoint/``, or ``checkpoint.old/`` where a kill fell
    between the trainer's two renames) to ``destination/checkpoint/``, replacing a half-made branch."""
    if destination.exists():
        shutil.rmtree(destination)
    name = "checkpoint" if (source / "checkpoint").is_dir() else "checkpoint.old"
    shutil.copytree(source / name, destination / ".checkpoint.tmp")
    os.replace(destination / ".checkpoint.tmp", destination / "checkpoint")
