"""The run log: one row per epoch, written as JSONL (the record), CSV (for spreadsheets; one fixed header, empty
cells where an epoch did not validate) and TensorBoard scalars grouped as train/, val/, metrics/, lr/ and speed/.
Epochs count from 1 in all three, as the progress bar counts them."""

from __future__ import annotations

import json
from pathlib import Path

# row key -> the column name in results.csv and TensorBoard
COLUMNS = {
    "epoch": "epoch",
    "box": "train/box_loss",
    "cls": "train/cls_loss",
    "dfl": "train/dfl_loss",
    "precision": "metrics/precision",
    "recall": "metrics/recall",
    "map50": "metrics/mAP50",
    "map": "metrics/mAP50-95",
    "val_box": "val/box_loss",
    "val_cls": "val/cls_loss",
    "val_dfl": "val/dfl_loss",
    "lr0": "lr/pg0",
    "lr1": "lr/pg1",
    "lr2": "lr/pg2",
    "images_per_s": "speed/images_per_s",
    "data_wait": "speed/data_wait",
    "mosaic": "mosaic",
    "batch": "batch",
}


class RunLog:
    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.jsonl, self.csv = run_dir / "results.jsonl", run_dir / "results.csv"
        if not self.csv.exists():
            self.csv.write_text(",".join(COLUMNS.values()) + "\n")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir))
        except ImportError:  # tensorboard is optional
            self.tb = None

    def write(self, row: dict) -> None:
        """row: the epoch's values under COLUMNS' keys (others go to the JSONL only); row['epoch'] counts from 1."""
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        cells = [row.get(k) for k in COLUMNS]
        with open(self.csv, "a") as f:
            f.write(",".join("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for v in cells) + "\n")
        if self.tb is not None:
            for k, name in COLUMNS.items():
                v = row.get(k)
                if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(name, v, row["epoch"])

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.jsonl.read_text().splitlines()] if self.jsonl.exists() else []

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
