"""Optional tqdm progress bars for the training pipeline (silently absent when tqdm is not installed)."""

from __future__ import annotations

from typing import Any


def progress_bar(total: int, initial: int, enabled: bool, desc: str, **options: Any) -> Any:
    """A ``tqdm`` bar, or ``None`` when disabled or tqdm is missing (callers check for ``None``)."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, desc=desc, **options)
