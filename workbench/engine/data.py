"""Data sharding: DistributedSampler for training (resumable mid-epoch) and an unpadded one for eval."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from workbench.config.sections import DataConfig


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way, at a global sample position.

    The epoch's order is the usual one for (seed, epoch): one permutation of the dataset, padded (or
    cut, with drop_last) to a multiple of the world size, dealt to the ranks in turn.  After k
    micro-batches of b samples on each of W ranks, the first k*b*W samples of that order have been
    trained on, whatever the world size was; `start` is that count, so a run resumed at the same or
    another world size trains on the rest of the epoch, no sample twice and none skipped (rounded to
    the new world size)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def epoch_order(self) -> list[int]:
        """The whole epoch's order over all ranks, as DistributedSampler builds it."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]
        else:
            indices = list(range(len(self.dataset)))  # type: ignore[arg-type]
        if not self.drop_last:
            padding = self.total_size - len(indices)
            indices += (indices * (padding // max(1, len(indices)) + 1))[:padding]
        return indices[:self.total_size]

    def __iter__(self) -> Iterator[int]:
        rest = self.epoch_order()[self.start:]
        usable = len(rest) - len(rest) % self.num_replicas
        return iter(rest[self.rank:usable:self.num_replicas])

    def __len__(self) -> int:
        return max(0, self.total_size - self.start) // self.num_replicas


class UnpaddedSampler(DistributedSampler):
    """Each rank takes every world_size-th sample; no padding, so eval sums are exact."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.size = len(dataset)
        self.num_samples = len(range(rank, self.size, num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.size, self.num_replicas))


def train_loader(dataset: Any, cfg: DataConfig, batch: int, rank: int, world: int, seed: int,
                 device: str) -> DataLoader:
    sampler = ResumableSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed,
                               drop_last=cfg.drop_last)
    loader = _loader(dataset, sampler, cfg, batch, device, drop_last=cfg.drop_last)
    # Its own generator: creating an iterator draws a worker base seed from it instead of from the
    # global RNG, so a resumed run's dropout/augmentation RNG stays in step with the original.
    loader.generator = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    return loader


def start_epoch(loader: DataLoader, epoch: int, start: int, seed: int, rank: int) -> Iterator[Any]:
    """Iterator over this rank's shard for `epoch`, from global sample position `start` (the
    samples of the epoch all ranks trained on so far)."""
    resumable_sampler(loader).set_epoch(epoch, start=start)
    loader.generator.manual_seed((seed * 1_000_003 + rank) * 10_007 + epoch)  # worker seeds per (rank, epoch)
    return iter(loader)


def endless(loader: DataLoader, seed: int, rank: int) -> Iterator[Any]:
    """Batches without end: epoch after epoch from its start, as a rank goes on past a short dataset
    (what the plan's probes and the step benches time)."""
    epoch = 0
    while True:
        yield from start_epoch(loader, epoch, 0, seed, rank)
        epoch += 1


def resumable_sampler(loader: DataLoader) -> ResumableSampler:
    """The training loader's sampler (train_loader made it a ResumableSampler)."""
    sampler = loader.sampler
    if not isinstance(sampler, ResumableSampler):
        raise TypeError(f"expected a loader from train_loader(), whose sampler is a ResumableSampler; got {sampler!r}")
    return sampler


def eval_loader(dataset: Any, cfg: DataConfig, batch: int, rank: int, world: int, device: str) -> DataLoader:
    return _loader(dataset, UnpaddedSampler(dataset, world, rank), cfg, batch, device, drop_last=False)


def _loader(dataset: Any, sampler: Any, cfg: DataConfig, batch: int, device: str, drop_last: bool) -> DataLoader:
    extra: dict[str, Any] = {}
    if cfg.num_workers > 0:
        extra["persistent_workers"] = cfg.persistent_workers
        if cfg.prefetch_factor is not None:
            extra["prefetch_factor"] = cfg.prefetch_factor
    return DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=cfg.num_workers,
                      pin_memory=cfg.pin_memory and device.startswith("cuda"), drop_last=drop_last, **extra)


def to_device(batch: Any, device: str) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
