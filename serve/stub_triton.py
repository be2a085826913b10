"""A stand-in for Triton's gRPC service that answers every inference at once with the same few detections: the
gateway measured alone (`yolov9 bench gateway`), on any machine, without a model or a GPU.

Run as `python -m yolov9.serve.stub_triton --port P [--delay-ms D]`; it serves model `yolov9` (version 1, ready)
with the 80 COCO class names, as the real repository's model does."""

from __future__ import annotations

import argparse
import asyncio
import json

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from yolov9.core.coco_names import COCO_NAMES
from yolov9.core.detection_defaults import MAX_DET

# three detections in original-image pixels: x1, y1, x2, y2, score, class
ROWS = np.array([[10, 20, 200, 220, 0.91, 0], [50, 60, 90, 120, 0.62, 2], [300, 10, 420, 200, 0.40, 16]], np.float32)


class StubTriton(rpc.GRPCInferenceServiceServicer):
    def __init__(self, model: str, delay_ms: float):
        self.model, self.delay = model, delay_ms / 1000

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name == self.model)

    async def RepositoryIndex(self, request, context):
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(name=self.model, version="1", state="READY")]
        )

    async def ModelConfig(self, request, context):
        params = {
            "names": mc.ModelParameter(string_value=json.dumps(COCO_NAMES)),
            "img_size": mc.ModelParameter(string_value="640"),
        }
        cfg = mc.ModelConfig(name=self.model, backend="python", max_batch_size=64, parameters=params)
        return pb.ModelConfigResponse(config=cfg)

    async def ModelInfer(self, request, context):
        if self.delay:
            await asyncio.sleep(self.delay)
        max_det = MAX_DET
        for k, t in enumerate(request.inputs):
            if t.name == "MAX_DET" and k < len(request.raw_input_contents):
                max_det = int(np.frombuffer(request.raw_input_contents[k], np.int32)[0])
        det = np.zeros((1, max_det, 6), np.float32)
        n = min(len(ROWS), max_det)
        det[0, :n] = ROWS[:n]
        outputs = [
            pb.ModelInferResponse.InferOutputTensor(name="DETECTIONS", datatype="FP32", shape=list(det.shape)),
            pb.ModelInferResponse.InferOutputTensor(name="NUM_DETS", datatype="INT32", shape=[1, 1]),
        ]
        raw = [det.tobytes(), np.array([[n]], np.int32).tobytes()]
        return pb.ModelInferResponse(
            model_name=request.model_name, model_version="1", outputs=outputs, raw_output_contents=raw
        )


async def serve(host: str, port: int, model: str = "yolov9", delay_ms: float = 0.0) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 2**20)])
    rpc.add_GRPCInferenceServiceServicer_to_server(StubTriton(model, delay_ms), server)
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument("--port", type=int, default=8001, help="gRPC port")
    p.add_argument("--model", default="yolov9", help="the model name it serves")
    p.add_argument("--delay-ms", type=float, default=0.0, help="how long each inference takes (an await, no CPU)")
    a = p.parse_args()
    try:
        asyncio.run(serve(a.host, a.port, a.model, a.delay_ms))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
