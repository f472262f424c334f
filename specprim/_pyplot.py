"""matplotlib's pyplot on the Agg backend (files only), or a one-line ImportError naming the package to install."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("plots need matplotlib: pip install matplotlib") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
