"""The detection dataset and its loader: decoding, RAM/disk cache, augmentation, a rank-aware (epoch, index)
batch sampler, and a collate that hands the GPU uint8 images and one list of target rows (no host sync later)."""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np
import psutil
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm import tqdm

from yolov9.core.decode import decode_image
from yolov9.core.errors import BadInput, MissingInput
from yolov9.core.image_io import image_file_hw
from yolov9.core.preprocess import ImageError, letterbox
from yolov9.train import distributed
from yolov9.train.config import Hyp
from yolov9.train.data import augment as A
from yolov9.train.data.formats import DatasetIndex
from yolov9.train.data.pinned import PinnedBatches
from yolov9.train.distributed import DistContext


def check_image(path: Path) -> str | None:
    """A reason to skip this image, or None. Header check plus the JPEG end marker (catches truncation)."""
    try:
        with Image.open(path) as im:
            im.verify()
            fmt = im.format
        if fmt == "JPEG":
            with open(path, "rb") as f:
                f.seek(-2, 2)
                if f.read() != b"\xff\xd9":
                    return "truncated images (skipped)"
        return None
    except FileNotFoundError:
        return "missing images (skipped)"
    except Exception:
        return "unreadable or corrupt images (skipped)"


def resized_hw(h: int, w: int, size: int) -> tuple[int, int]:
    """(h, w) of an h x w image with its long side scaled to `size` (what read_resized returns)."""
    r = size / max(h, w)
    return (h, w) if r == 1 else (max(1, round(h * r)), max(1, round(w * r)))


def read_resized(path: Path, size: int, augment: bool) -> np.ndarray:
    """Decoded RGB HWC uint8 with the long side scaled to `size`."""
    img = decode_image(path).permute(1, 2, 0).numpy()
    h, w = img.shape[:2]
    nh, nw = resized_hw(h, w, size)
    if (nh, nw) != (h, w):
        interp = cv2.INTER_LINEAR if (augment or max(nh, nw) > max(h, w)) else cv2.INTER_AREA
        img = cv2.resize(img, (nw, nh), interpolation=interp)
    return np.ascontiguousarray(img)


@dataclass(frozen=True)
class Cache:
    """Decoded, resized images kept in 'ram' (one shared-memory copy per machine) or on 'disk' (.npy beside the
    cache folder), filled by `workers` threads; `dist` tells the ranks of a machine apart."""

    mode: str = "ram"
    workers: int = 8
    dist: DistContext | None = None


class DetectionDataset(Dataset):
    def __init__(
        self,
        index: DatasetIndex,
        img_size: int = 640,
        augment: Hyp | None = None,
        cache: Cache | None = None,
        seed: int = 0,
        desc: str = "data",
        original: bool = False,
    ):
        """augment: training samples with these hyper-parameters (mosaic, mixup, affine, HSV, flips), else the
        letterboxed inference view. original: validation items are letterboxed from the decoded original image,
        as prediction and the server do (no cache); otherwise from the image resized to img_size (the official
        validator's input)."""
        keep = []
        for i, p in enumerate(tqdm(index.images, desc=f"{desc}: checking images", leave=False)):
            reason = check_image(p)
            if reason:
                index.problems.add(reason, p)
            else:
                keep.append(i)
        self.images = [index.images[i] for i in keep]
        self.labels = [index.labels[i] for i in keep]
        self.names, self.problems = index.names, index.problems
        if not self.images:
            raise MissingInput(f"{desc}: no readable images")
        self.desc = desc
        self.img_size, self.augment, self.hyp = img_size, augment is not None, augment or Hyp()
        self.seed = seed
        # Mosaic is on for epochs below this (the trainer sets it from --close-mosaic). Samples are keyed by
        # (epoch, index), so a worker computes any epoch's sample without state shared with the trainer.
        self.mosaic_until = 1 << 30
        self.original = original and not self.augment
        self.cache_mode = None if self.original or cache is None else cache.mode
        self.ram: np.ndarray | None = None
        if self.cache_mode == "ram":
            self._cache_ram(cache.workers, desc, cache.dist or DistContext())
        elif self.cache_mode == "disk":
            self._cache_disk(cache.workers, desc)

    def describe(self) -> str:
        """One line with what this split holds, so a dataset that loads but is not what was meant shows at once."""
        boxes = sum(len(lab) for lab in self.labels)
        background = sum(len(lab) == 0 for lab in self.labels)
        return f"{self.desc}: {len(self)} images ({background} background), {boxes} boxes, {len(self.names)} classes"

    # --- caching ----------------------------------------------------------------------------------------
    def _cache_ram(self, workers: int, desc: str, dist_ctx: DistContext) -> None:
        """Decoded images in one shared-memory file per machine: local rank 0 fills it, every local rank (and its
        loader workers, forked) maps it, so N ranks hold one copy. Unlinked once mapped: nothing outlives the run."""
        key = hashlib.sha1(
            f"{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}:{desc}:{self.img_size}:{self.augment}:"
            f"{[str(p) for p in self.images]}".encode()
        ).hexdigest()[:16]
        folder = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
        path = Path(folder or tempfile.gettempdir()) / f"yolov9-cache-{key}"
        if dist_ctx.local_rank == 0:
            self._fill_shared_cache(path, workers, desc)
        distributed.barrier(dist_ctx)
        index = np.load(f"{path}.index.npy")
        self.ram_index, self.ram = index, np.memmap(path, np.uint8, mode="r")
        distributed.barrier(dist_ctx)
        if dist_ctx.local_rank == 0:
            path.unlink()
            Path(f"{path}.index.npy").unlink()
        share = f", shared by {dist_ctx.local_world} local ranks" if dist_ctx.local_world > 1 else ""
        print(f"{desc}: cache {self.ram.nbytes / 2**20:.1f} MiB in RAM{share} ({path.parent})")

    def _fill_shared_cache(self, path: Path, workers: int, desc: str) -> None:
        """Sizes from the image headers, then each decoded image straight into its slot of the file: the cache
        never exists twice in memory."""
        shapes = [(*resized_hw(*image_file_hw(p), self.img_size), 3) for p in self.images]
        sizes = np.array([h * w * c for h, w, c in shapes], np.int64)
        need, avail = int(sizes.sum()), psutil.virtual_memory().available
        if need * 1.3 > avail:
            raise MemoryError(
                f"{desc}: --cache ram needs about {need / 2**30:.1f} GiB but only {avail / 2**30:.1f} "
                f"GiB is free; use --cache disk or no cache"
            )
        index = np.zeros((len(shapes), 4), np.int64)  # offset, h, w, c
        index[1:, 0] = np.cumsum(sizes)[:-1]
        index[:, 1:] = shapes
        tmp = path.with_name(path.name + ".tmp")
        buf = np.memmap(tmp, np.uint8, mode="w+", shape=(max(1, need),))

        def fill(i: int) -> None:
            im = read_resized(self.images[i], self.img_size, self.augment)
            if im.shape != shapes[i]:
                raise BadInput(f"{self.images[i]}: decodes to {im.shape[:2]}, its header says {shapes[i][:2]}")
            buf[index[i, 0] : index[i, 0] + im.size] = im.reshape(-1)

        with ThreadPoolExecutor(max(1, workers)) as pool:
            it = pool.map(fill, range(len(self)))
            list(tqdm(it, total=len(self), desc=f"{desc}: caching {need / 2**30:.2f} GiB in RAM"))
        buf.flush()  # the mapping closes when this function returns
        np.save(f"{path}.index.npy", index)
        tmp.replace(path)

    def _disk_path(self, p: Path) -> Path:
        key = hashlib.sha1(f"{p.resolve()}:{p.stat().st_mtime_ns}:{self.img_size}:{self.augment}".encode()).hexdigest()
        return Path.home() / ".cache" / "yolov9-trt" / "images" / f"{key}.npy"

    def _cache_disk(self, workers: int, desc: str) -> None:
        def write(p: Path) -> None:
            out = self._disk_path(p)
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_suffix(f".{os.getpid()}.tmp.npy")
                np.save(tmp, read_resized(p, self.img_size, self.augment))
                tmp.replace(out)

        with ThreadPoolExecutor(max(1, workers)) as pool:
            list(tqdm(pool.map(write, self.images), total=len(self), desc=f"{desc}: caching on disk"))

    def load(self, i: int) -> np.ndarray:
        """The decoded image (HWC uint8, long side img_size); a read-only view when cached in RAM."""
        if self.ram is not None:
            off, h, w, c = self.ram_index[i]
            return self.ram[off : off + h * w * c].reshape(h, w, c)
        if self.cache_mode == "disk":
            return np.load(self._disk_path(self.images[i]))
        return read_resized(self.images[i], self.img_size, self.augment)

    # --- samples ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.images)

    def _mosaic_sample(self, i: int, rng: np.random.Generator):
        idx = [i, *rng.integers(0, len(self), 3)]
        img, lab = A.mosaic4([self.load(j) for j in idx], [self.labels[j] for j in idx], self.img_size, rng)
        return A.random_affine(img, lab, self.hyp, rng, border=-self.img_size // 2)

    def __getitem__(self, key: int | tuple):
        """key: (epoch, index) for an augmented training sample, a pure function of (seed, epoch, index); for
        validation an index, or (index, (H, W)) for an image of a rectangular batch (RectBatchSampler)."""
        if not self.augment:
            i, shape = key if isinstance(key, tuple) else (key, None)
            return self._eval_item(i, shape)
        epoch, i = key if isinstance(key, tuple) else (0, key)
        rng = np.random.default_rng([self.seed, epoch, i])
        if epoch < self.mosaic_until and rng.random() < self.hyp.mosaic:
            img, lab = self._mosaic_sample(i, rng)
            if rng.random() < self.hyp.mixup:
                img, lab = A.mixup(img, lab, *self._mosaic_sample(int(rng.integers(0, len(self))), rng), rng)
        else:
            src = self.load(i)
            img, r, (left, top) = A.letterbox_np(src, self.img_size)
            h, w = src.shape[:2]
            lab = A.xywhn_to_xyxy(self.labels[i], w, h, left, top)
            img, lab = A.random_affine(img, lab, self.hyp, rng)
        lab = A.xyxy_to_xywhn(lab, img.shape[1], img.shape[0])
        img = A.augment_hsv(img, self.hyp, rng)
        img, lab = A.flips(img, lab, self.hyp, rng)
        return torch.from_numpy(img).permute(2, 0, 1).contiguous(), torch.from_numpy(lab), i, None

    def _eval_item(self, i: int, shape: tuple[int, int] | None):
        """The inference path (core/preprocess.letterbox), so validation sees what prediction sees; into the
        rectangular batch shape (H, W) when the sampler gives one."""
        if self.original:
            src = decode_image(self.images[i])
        else:
            src = torch.from_numpy(np.array(self.load(i))).permute(2, 0, 1)  # a writable copy of the cached view
        if shape is not None:  # as officially: a rectangular batch shape never scales an image up
            img, meta = letterbox(src, shape, scaleup=False)
            # and boxes are mapped back with the unrounded half-padding, as the official validator does
            (h, w), r = meta.orig_hw, meta.ratio
            meta.pad = ((img.shape[2] - round(w * r)) / 2, (img.shape[1] - round(h * r)) / 2)
        else:
            img, meta = letterbox(src, self.img_size)
        return img, torch.from_numpy(self.labels[i].copy()), i, meta


class RectBatchSampler(Sampler[list]):
    """The official validation batching: images sorted by aspect ratio (h / w), and each batch letterboxed to one
    stride-aligned shape that fits its widest or tallest image, with half a stride of padding. Yields batches of
    (index, (H, W)) keys; `shapes` maps each index to its batch's shape."""

    def __init__(self, ds: DetectionDataset, batch: int, stride: int = 32, pad: float = 0.5):
        hw = np.array([image_file_hw(p) for p in ds.images], np.float64)
        ar = hw[:, 0] / hw[:, 1]
        order = ar.argsort()  # numpy's default sort, as officially: ties (many 4:3 photos) fall into the same batches
        self.batches = [[int(i) for i in order[k : k + batch]] for k in range(0, len(order), batch)]
        self.shapes: dict[int, tuple[int, int]] = {}
        for idx in self.batches:
            lo, hi = ar[idx].min(), ar[idx].max()
            shape = [hi, 1.0] if hi < 1 else [1.0, 1 / lo] if lo > 1 else [1.0, 1.0]
            h, w = (np.ceil(np.array(shape) * ds.img_size / stride + pad).astype(int) * stride).tolist()
            self.shapes.update({i: (h, w) for i in idx})

    def __iter__(self):
        for idx in self.batches:
            yield [(i, self.shapes[i]) for i in idx]

    def __len__(self) -> int:
        return len(self.batches)


class Batch(NamedTuple):
    """A collated batch: uint8 images (B, 3, H, W); target rows (N, 6) = image, class, x, y, w, h normalised, in
    image order (what the loss takes); each image's dataset index (B,); and for validation batches each image's
    LetterboxMeta (None for training batches)."""

    images: torch.Tensor
    rows: torch.Tensor
    indices: torch.Tensor
    metas: list | None


def collate(items) -> Batch:
    imgs, labs, idx, metas = zip(*items)
    rows = torch.cat([torch.cat((torch.full((len(lab), 1), float(j)), lab), 1) for j, lab in enumerate(labs)], 0)
    metas = None if metas[0] is None else list(metas)
    return Batch(torch.stack(imgs), rows, torch.tensor(idx), metas)


class EpochBatchSampler(Sampler[list]):
    """Batches of (epoch, index) keys, epoch after epoch, from `start_epoch` until `epochs` (None: without end).

    One loader iterator spans the whole run, so workers keep prefetching across epoch boundaries instead of
    draining and refilling every epoch (which dominates on small datasets). Each epoch is a seeded shuffle split
    across ranks (equal shares; the last wraps around); a batch never spans two epochs, so len() is the number
    of batches per epoch.

    first_split: the run's first batch comes as that many consecutive parts, which a loader's workers build side by
    side (each worker builds a whole batch, so the first one would otherwise wait for one worker to build all of
    it); `run_batches` joins them again."""

    def __init__(
        self,
        n: int,
        batch: int,
        seed: int = 0,
        shard: tuple[int, int] = (0, 1),
        start_epoch: int = 0,
        epochs: int | None = None,
        first_split: int = 1,
    ):
        """shard: (rank, world) of this process."""
        self.n, self.batch, self.seed = n, batch, seed
        self.first_split = first_split
        (self.rank, self.world), self.start_epoch, self.epochs = shard, start_epoch, epochs
        self.per_rank = -(-n // self.world)

    def epoch_indices(self, epoch: int) -> list[int]:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        order += order[: self.per_rank * self.world - self.n]
        return order[self.rank :: self.world]

    def __iter__(self):
        epoch, first = self.start_epoch, True
        while self.epochs is None or epoch < self.epochs:
            idx = self.epoch_indices(epoch)
            for k in range(0, len(idx), self.batch):
                keys = [(epoch, i) for i in idx[k : k + self.batch]]
                if first:
                    first = False
                    yield from _parts(keys, self.first_split)
                else:
                    yield keys
            epoch += 1

    def __len__(self) -> int:
        return -(-self.per_rank // self.batch)


def _parts(keys: list, n: int) -> list[list]:
    """keys in min(n, len(keys)) consecutive parts of sizes as equal as can be."""
    n = max(1, min(n, len(keys)))
    cuts = [round(j * len(keys) / n) for j in range(n + 1)]
    return [keys[a:b] for a, b in zip(cuts, cuts[1:])]


def join_batches(parts: list[Batch]) -> Batch:
    """Collated parts of one batch -> the batch `collate` would have made of all their items."""
    offsets = np.cumsum([0] + [len(p.images) for p in parts[:-1]])
    rows = torch.cat([p.rows + torch.tensor([float(o), 0, 0, 0, 0, 0]) for p, o in zip(parts, offsets)], 0)
    metas = None if parts[0].metas is None else [m for p in parts for m in p.metas]
    images = torch.cat([p.images for p in parts], 0)
    return Batch(images, rows, torch.cat([p.indices for p in parts]), metas)


def run_batches(loader: DataLoader, pin: torch.device | None = None) -> Iterator[Batch]:
    """A training loader's batches, the first one joined from the parts its sampler split it into, and with `pin` (a
    CUDA device) pinned a few ahead of the step (PinnedBatches; the loader itself does not pin). The loader's
    workers start here, not at the first next(), so a caller can start them before it needs the batches. Close
    the result to stop them."""
    batches = _joined(iter(loader), getattr(loader.batch_sampler, "first_split", 1))
    return PinnedBatches(batches, pin) if pin is not None and pin.type == "cuda" else batches


def _joined(batches: Iterator[Batch], split: int) -> Iterator[Batch]:
    parts = list(itertools.islice(batches, split))
    if parts:
        yield join_batches(parts) if len(parts) > 1 else parts[0]
    yield from batches


def _worker_init(_: int) -> None:
    """One thread per loader worker: N workers x (cv2 + torch thread pools) would oversubscribe the cores."""
    cv2.setNumThreads(0)
    torch.set_num_threads(1)


def _loader_options(ds: DetectionDataset, workers: int, pin: bool) -> dict:
    kw = dict(
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        worker_init_fn=_worker_init if workers > 0 else None,
    )
    if workers > 0 and ds.ram is not None and sys.platform.startswith("linux"):
        kw["multiprocessing_context"] = "fork"  # workers inherit the shared cache mapping instead of a pickled copy
    return kw


def train_loader(ds: DetectionDataset, sampler: EpochBatchSampler, workers: int = 0) -> DataLoader:
    """An augmenting dataset's batches from the continuous (epoch, index) sampler, unpinned: `run_batches` pins."""
    return DataLoader(ds, batch_sampler=sampler, **_loader_options(ds, workers, pin=False))


def eval_loader(
    ds: DetectionDataset, batch: int, workers: int = 0, rect: bool = False, pin: bool = False
) -> DataLoader:
    """Validation batches in order, or with rect the official rectangular ones."""
    kw = _loader_options(ds, workers, pin)
    if rect:
        return DataLoader(ds, batch_sampler=RectBatchSampler(ds, batch), **kw)
    return DataLoader(ds, batch_size=batch, shuffle=False, **kw)


__all__ = [
    "Batch",
    "DetectionDataset",
    "EpochBatchSampler",
    "RectBatchSampler",
    "Cache",
    "eval_loader",
    "join_batches",
    "run_batches",
    "train_loader",
    "collate",
    "ImageError",
]
