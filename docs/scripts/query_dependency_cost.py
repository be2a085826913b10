"""What FastAPI's `Query()` model costs per request against validating the query in the dependency itself (what
serve/gateway/dependencies.detect_context does): two routes of one app called in-process through ASGI, no network,
microseconds per request. Usage, from the checkout: PYTHONPATH=. python docs/scripts/query_dependency_cost.py"""

import asyncio
import time
from typing import Annotated

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from yolov9.serve.gateway.dependencies import IMAGE_BODY, detect_context
from yolov9.serve.gateway.schemas import DetectQuery

app = FastAPI()
app.state.settings = app.state.pool = None


async def query_model(request: Request, query: Annotated[DetectQuery, Query()]) -> DetectQuery:
    return query


@app.post("/query-model")
async def with_query_model(q=Depends(query_model)):
    return JSONResponse({})


@app.post("/in-dependency", openapi_extra=IMAGE_BODY)
async def with_validation_in_dependency(q=Depends(detect_context)):
    return JSONResponse({})


async def call(path: str) -> None:
    scope = {
        "type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"conf=0.3&max_det=50", "headers": [(b"content-type", b"image/jpeg")],
        "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "app": app,
    }  # fmt: skip

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass

    await app(scope, receive, send)


async def main(n: int = 5000) -> None:
    for path in ("/query-model", "/in-dependency") * 3:
        for _ in range(300):
            await call(path)
        t = time.perf_counter()
        for _ in range(n):
            await call(path)
        print(f"{path}: {(time.perf_counter() - t) / n * 1e6:.1f} us per request")


if __name__ == "__main__":
    asyncio.run(main())
