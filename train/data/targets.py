"""The target layout of a batch: rows (image, class, x, y, w, h) normalised, one list over the batch in image
order, the layout the loss consumes with no host sync; all-zero rows pad it to a fixed count for a captured step."""

from __future__ import annotations

import torch


def target_capacity(n: int) -> int:
    """The padded row count for a batch of n boxes: a power of two, at least 64, so a captured or compiled step sees
    few target shapes over a run."""
    return max(64, 1 << (n - 1).bit_length())


def pad_rows(rows: torch.Tensor, capacity: int) -> torch.Tensor:
    """(n, 6) target rows with all-zero rows after them, to (capacity, 6); the loss is the same."""
    n = rows.shape[0]
    return rows if n == capacity else torch.nn.functional.pad(rows, (0, 0, 0, capacity - n))
