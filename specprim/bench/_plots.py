"""PNG plots of a run (matplotlib, Agg backend): speedup per method and acceptance rate by depth."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

from specprim._pyplot import pyplot
from specprim.bench._metrics import MethodSummary


def plot_speedup(summaries: Sequence[MethodSummary], path: Path, title: str = "") -> Path:
    """Bar chart of ``speedup`` (total tokens/s over the ``hf`` baseline's) per method, with a line at 1x."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 + 1.1 * len(summaries)), 3.8))
    names = [s.method for s in summaries]
    values = [s.speedup or 0.0 for s in summaries]
    bars = ax.bar(names, values, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.2f}x" for v in values], fontsize=8)
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.set_ylabel("speedup vs hf (tokens/s ratio)")
    ax.set_title(textwrap.fill(title, 70), fontsize=7)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_acceptance(summaries: Sequence[MethodSummary], path: Path, title: str = "") -> Path:
    """Acceptance rate per depth (EAGLE's alpha_d) for every method that reports steps."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for s in summaries:
        points = [(d + 1, rate) for d, rate in enumerate(s.acceptance_by_depth) if rate is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=f"{s.method} (tau {s.tau:.2f})")
    ax.set_xlabel("depth d")
    ax.set_ylabel("acceptance rate at depth d")
    ax.set_ylim(0, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(textwrap.fill(title, 90), fontsize=7)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(summaries: Sequence[MethodSummary], directory: str | os.PathLike[str], title: str = "") -> list[Path]:
    """``speedup.png`` and ``acceptance_by_depth.png`` in ``directory`` (created); returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [
        plot_speedup(summaries, directory / "speedup.png", title),
        plot_acceptance(summaries, directory / "acceptance_by_depth.png", title),
    ]
