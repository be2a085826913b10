"""POST /v1/admin/deploy and /v1/admin/rollback: a new model version without downtime (serve/deploy.py), run as
`yolov9 serve deploy|rollback` in a child process on the gateway's repository, so the workers stay torch-free.
Behind the API key; without one, only for clients on this machine."""

from __future__ import annotations

import asyncio
import json
import sys

from fastapi import APIRouter, Depends, Query, Request

from yolov9.serve.gateway.dependencies import app_settings
from yolov9.serve.gateway.errors import GatewayError
from yolov9.serve.gateway.settings import Settings

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


async def require_admin(request: Request, settings: Settings = Depends(app_settings)) -> None:
    if not settings.api_key and (request.client is None or request.client.host not in LOOPBACK):
        raise GatewayError(403, "forbidden", "admin endpoints need YOLOV9_API_KEY set, or a client on this machine")
    if not settings.repo:
        raise GatewayError(
            409, "no_repository", "this gateway was started without a repository (serve gateway --repo, YOLOV9_REPO)"
        )


# behind the API key (app.ApiKeyMiddleware)
router = APIRouter(prefix="/v1/admin", dependencies=[Depends(require_admin)])
_lock = asyncio.Lock()  # one roll-out at a time per worker (serve/deploy.py also locks the repository)


async def _run(args: list[str], settings: Settings) -> dict:
    cmd = [sys.executable, "-m", "yolov9", "serve", *args, "--repo", settings.repo, "--name", settings.model,
           "--triton", ",".join(settings.endpoints)]  # fmt: skip
    async with _lock:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
    if proc.returncode != 0:
        lines = [x for x in err.decode(errors="replace").splitlines() if x.strip()]
        detail = lines[-1].split("error: ", 1)[-1] if lines else f"exit code {proc.returncode}"
        raise GatewayError(422, "deploy_failed", detail)
    return json.loads(out.decode().strip().splitlines()[-1])


@router.post("/deploy", summary="Roll out a checkpoint or engine file (a path on the server) as the next version")
async def deploy(
    engine: str = Query(..., description="file path on the gateway's host"), settings=Depends(app_settings)
):
    return await _run(["deploy", engine], settings)


@router.post("/rollback", summary="Go back to the version served before the current one")
async def rollback(settings: Settings = Depends(app_settings)):
    return await _run(["rollback"], settings)
