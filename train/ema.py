"""Exponential moving average of the weights (the official ramped decay), updated with fused foreach ops. The
update count lives on the device too and the decay is computed there, so an update adds no host synchronisation
and a captured update (train/graphed_step.py) ramps its decay on every replay as the eager one does."""

from __future__ import annotations

import copy

import torch
from torch import nn


class ModelEMA:
    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000, updates: int = 0):
        self.ema = copy.deepcopy(model).eval().requires_grad_(False)
        self.updates, self.decay_max, self.tau = updates, decay, tau
        self._ema_t = [v for v in self.ema.state_dict().values() if v.dtype.is_floating_point]
        self._count = torch.tensor(float(updates), dtype=torch.float64, device=self._ema_t[0].device)
        self._src: tuple[int, list[torch.Tensor]] | None = None  # (id of the model, its float state tensors)

    def _sources(self, model: nn.Module) -> list[torch.Tensor]:
        """The model's float parameters and buffers, listed once: they are updated in place, never replaced."""
        if self._src is None or self._src[0] != id(model):
            self._src = (id(model), [v for v in model.state_dict().values() if v.dtype.is_floating_point])
        return self._src[1]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        self._count += 1
        d = (self.decay_max * (1 - torch.exp(-self._count / self.tau))).float()
        torch._foreach_mul_(self._ema_t, d)
        torch._foreach_add_(self._ema_t, torch._foreach_mul(self._sources(model), 1 - d))

    def state_dict(self) -> dict:
        return {"model": self.ema.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["model"])
        self.updates = state["updates"]
        self._count.fill_(float(self.updates))
