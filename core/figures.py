"""Charts for run folders and reports, drawn with matplotlib's object API rather than pyplot: no global figure
registry (a figure may be drawn on any thread, e.g. beside a training step) and no interactive backend to pick.
matplotlib is imported with the first figure, not with the stage that may draw one."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def subplots(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] | None = None, **kw) -> tuple[Any, Any]:
    """(figure, axes) as pyplot.subplots gives them."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def save(fig, out: Path, dpi: int = 100) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    return out
