"""Concurrent detect requests of one gateway worker sent to Triton together. Each Triton request costs the same
fixed work whatever it carries (a gRPC call here, the python backend's passing of each request and response between
the server and the model's stub there), so under load several images go as one request, one per row. At most
`max_calls` requests to Triton are in flight per worker: a detect request that arrives while they all are waits for
the next one to leave, with whatever else arrived meanwhile (up to `max_images`); at light load nothing waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Item = tuple[bytes, float, float, int]  # image, conf, iou, max_det
Result = tuple[Any, int]  # detections, version


class Coalescer:
    def __init__(
        self,
        send_one: Callable[..., Awaitable[Result]],  # called with an Item's fields
        send_many: Callable[[list[Item]], Awaitable[list[Result | BaseException]]],  # per item: its result or error
        max_images: int,
        max_calls: int,
    ):
        self.send_one, self.send_many = send_one, send_many
        self.max_images, self.max_calls = max_images, max_calls
        self.waiting: list[tuple[Item, asyncio.Future]] = []
        self.calls = 0
        self._tasks: set[asyncio.Task] = set()  # the running sends (the loop keeps only weak references)

    async def submit(self, item: Item) -> Result:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((item, future))
        self._pump()
        return await future

    def _pump(self) -> None:
        while self.waiting and self.calls < self.max_calls:
            group, self.waiting = self.waiting[: self.max_images], self.waiting[self.max_images :]
            self.calls += 1
            task = asyncio.create_task(self._send(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, group: list[tuple[Item, asyncio.Future]]) -> None:
        items = [item for item, _ in group]
        try:
            results = await self._results(items)
        except Exception as e:  # the whole group failed (Triton down, a timeout): each request gets the error
            results = [e] * len(group)
        finally:
            self.calls -= 1
            self._pump()
        for (_, future), r in zip(group, results):
            if future.done():  # its client went away
                continue
            if isinstance(r, BaseException):
                future.set_exception(r)
            else:
                future.set_result(r)

    async def _results(self, items: list[Item]) -> list[Result | BaseException]:
        if len(items) == 1:
            return [await self.send_one(*items[0])]
        return await self.send_many(items)
