"""Exponential moving average of the weights (the official ramped decay), updated with fused foreach ops so the
update adds no host synchronisation to the step."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


class ModelEMA:
    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000, updates: int = 0):
        self.ema = copy.deepcopy(model).eval().requires_grad_(False)
        self.updates, self.decay_max, self.tau = updates, decay, tau
        self._pairs()

    def _pairs(self) -> None:
        self._ema_t = [v for v in self.ema.state_dict().values() if v.dtype.is_floating_point]

    def decay(self) -> float:
        return self.decay_max * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.decay()
        src = [v for v in model.state_dict().values() if v.dtype.is_floating_point]
        torch._foreach_mul_(self._ema_t, d)
        torch._foreach_add_(self._ema_t, [s.detach() for s in src], alpha=1 - d)

    def state_dict(self) -> dict:
        return {"model": self.ema.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["model"])
        self.updates = state["updates"]
