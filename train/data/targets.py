"""The target layout of a batch: rows (image, class, x, y, w, h) normalised, and the same rows padded per image to
(batch, most boxes of one image, 5), all-zero padding rows, the layout the loss consumes with no host sync."""

from __future__ import annotations

import torch


def pad_targets(rows: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Rows (image, class, x, y, w, h) -> (batch, max boxes per image, 5) with all-zero padding rows."""
    if rows.shape[0] == 0:
        return rows.new_zeros(batch_size, 0, 5)
    img = rows[:, 0].long()
    counts = torch.bincount(img, minlength=batch_size)
    order = torch.argsort(img, stable=True)
    img_sorted = img[order]
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(img), device=rows.device) - starts[img_sorted]
    out = rows.new_zeros(batch_size, int(counts.max()), 5)
    out[img_sorted, slot] = rows[order, 1:]
    return out


def target_capacity(n: int) -> int:
    """The padded box count for a batch with at most n boxes per image: a power of two, at least 64, so a captured
    or compiled step sees few target shapes over a run."""
    return max(64, 1 << (n - 1).bit_length())


def pad_to(padded: torch.Tensor, capacity: int) -> torch.Tensor:
    """(b, n, 5) padded targets with more all-zero rows, to (b, capacity, 5); the loss is the same."""
    n = padded.shape[1]
    return padded if n == capacity else torch.nn.functional.pad(padded, (0, 0, 0, capacity - n))
