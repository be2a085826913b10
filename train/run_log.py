"""The run log: one row per epoch, written as JSONL (the record), CSV (for spreadsheets) and TensorBoard scalars,
with the curves drawn as results.png when the run ends."""

from __future__ import annotations

import json
from pathlib import Path

from train.plots import plot_results


class RunLog:
    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.jsonl, self.csv = run_dir / "results.jsonl", run_dir / "results.csv"
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir))
        except ImportError:  # tensorboard is optional
            self.tb = None

    def write(self, row: dict) -> None:
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        new = not self.csv.exists()
        with open(self.csv, "a") as f:
            if new:
                f.write(",".join(row) + "\n")
            f.write(",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in row.values()) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, row["epoch"])

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.jsonl.read_text().splitlines()] if self.jsonl.exists() else []

    def close(self) -> None:
        plot_results(self.jsonl, self.dir / "results.png")
        if self.tb is not None:
            self.tb.close()
