"""The gateway's side of Triton: async gRPC clients (one per endpoint, connections reused), requests spread
round-robin over the endpoints, failures classified into the gateway's HTTP errors."""

from __future__ import annotations

import asyncio
import itertools
import json

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from yolov9.core.errors import BadInput


class BackendError(Exception):
    """kind: 'unavailable' (503), 'timeout' (504), 'bad_image' (400), 'internal' (500)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def classify(e: Exception) -> BackendError:
    msg = str(e)
    low = msg.lower()
    if "bad image" in low:
        return BackendError("bad_image", msg.split("bad image:", 1)[-1].strip())
    if "deadline" in low or "timeout" in low or "timed out" in low:
        return BackendError("timeout", "inference timed out")
    if "unavailable" in low or "connect" in low or "queue" in low or "not ready" in low or "exceeds" in low:
        return BackendError("unavailable", "inference server unavailable or its queue is full")
    return BackendError("internal", msg[:300])


class TritonPool:
    def __init__(self, urls: list[str], model: str, timeout_s: float = 30.0):
        if not urls:
            raise BadInput("no Triton endpoint given")
        self.urls, self.model, self.timeout_s = urls, model, timeout_s
        # short reconnect backoff: after a Triton restart the gateway recovers within about a second
        args = [
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.max_send_message_length", 64 * 2**20),
            ("grpc.max_receive_message_length", 64 * 2**20),
        ]
        self.clients = [grpcclient.InferenceServerClient(u, channel_args=args) for u in urls]
        self._next = itertools.cycle(range(len(self.clients)))
        self.names: list[str] | None = None

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients), return_exceptions=True)

    def _pick(self) -> grpcclient.InferenceServerClient:
        return self.clients[next(self._next)]

    async def ready(self) -> bool:
        for c in self.clients:
            try:
                if await c.is_model_ready(self.model, client_timeout=2):
                    return True
            except Exception:  # one endpoint down is fine if another answers
                continue
        return False

    async def model_info(self) -> dict:
        last: Exception | None = None
        for c in self.clients:
            try:
                cfg = await c.get_model_config(self.model, as_json=True, client_timeout=5)
                return cfg["config"]
            except Exception as e:
                last = e
        raise classify(last or RuntimeError("unavailable"))

    async def class_names(self) -> list[str]:
        if self.names is None:
            cfg = await self.model_info()
            engine_names = cfg.get("parameters", {}).get("names", {}).get("string_value")
            self.names = json.loads(engine_names) if engine_names else []
        return self.names

    async def detect(self, data: bytes, conf: float, iou: float, max_det: int, classes: list[int] | None):
        """(n, 6) detections x1, y1, x2, y2, score, class in original pixels."""
        arr = np.frombuffer(data, dtype=np.uint8)[None]
        inputs = [grpcclient.InferInput("IMAGE", list(arr.shape), "UINT8")]
        inputs[0].set_data_from_numpy(arr)
        for name, value, dtype in (
            ("CONF", conf, np.float32),
            ("IOU", iou, np.float32),
            ("MAX_DET", max_det, np.int32),
        ):
            t = grpcclient.InferInput(name, [1, 1], "FP32" if dtype is np.float32 else "INT32")
            t.set_data_from_numpy(np.array([[value]], dtype=dtype))
            inputs.append(t)
        if classes:
            t = grpcclient.InferInput("CLASSES", [1, len(classes)], "INT32")
            t.set_data_from_numpy(np.array([classes], dtype=np.int32))
            inputs.append(t)
        outputs = [grpcclient.InferRequestedOutput("DETECTIONS"), grpcclient.InferRequestedOutput("NUM_DETS")]
        try:
            r = await self._pick().infer(self.model, inputs, outputs=outputs, client_timeout=self.timeout_s)
        except InferenceServerException as e:
            raise classify(e) from None
        except Exception as e:  # grpc channel errors surface as other types
            raise classify(e) from None
        n = int(r.as_numpy("NUM_DETS").reshape(-1)[0])
        return r.as_numpy("DETECTIONS")[0, :n]
