"""Training curves as a PNG in the run folder (losses per epoch and validation mAP)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_results(jsonl: Path, out: Path) -> Path | None:
    if not jsonl.exists():
        return None
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    ep = [r["epoch"] for r in rows]
    for ax, key in zip(axes[:3], ("box", "cls", "dfl")):
        ax.plot(ep, [r[key] for r in rows], marker=".")
        ax.set_title(f"train {key} loss")
        ax.set_xlabel("epoch")
    val = [(r["epoch"], r["map"], r["map50"]) for r in rows if "map" in r]
    if val:
        axes[3].plot([v[0] for v in val], [v[2] for v in val], marker=".", label="mAP50")
        axes[3].plot([v[0] for v in val], [v[1] for v in val], marker=".", label="mAP50-95")
        axes[3].legend()
    axes[3].set_title("validation")
    axes[3].set_xlabel("epoch")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
