"""POST /v1/admin/deploy and /v1/admin/rollback: a new model version without downtime (serve/deploy.py), run as
`yolov9 serve deploy|rollback` in a child process on the gateway's repository, so the workers stay torch-free.
Behind the API key; without one, only for clients on this machine."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys

from fastapi import APIRouter, Depends, Query, Request

from yolov9.serve.config import LOAD_TIMEOUT_S
from yolov9.serve.deploy import read_state
from yolov9.serve.gateway.dependencies import app_settings
from yolov9.serve.gateway.errors import GatewayError
from yolov9.serve.gateway.settings import Settings

log = logging.getLogger("uvicorn.error")  # beside the server's own lines, at its level
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
        returncode, out, err = await run_child(cmd)
    return outcome(returncode, out, err, read_state(settings.repo, settings.model))


async def run_child(cmd: list[str]) -> tuple[int, str, str]:
    """Run cmd to its end off the event loop: (returncode, stdout, stderr). Not the loop's own spawn: uvloop's
    fork() runs gRPC's fork handlers in the child while this process's channels are busy, and now and then the
    child dies of SIGSEGV (or hangs) before it execs. subprocess starts it with vfork, which runs no fork handlers."""
    done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True)
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:  # a real-time signal has no name
        return f"signal {n}"


def outcome(returncode: int, out: str, err: str, state: dict) -> dict:
    """The roll-out's result from its process. The result line is printed last, after every server loaded and
    unloaded and the repository's state was written; a process that printed it and then died of a signal (a native
    library's teardown) finished its roll-out when the state agrees, and that is logged."""
    lines = out.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if returncode == 0 and result is not None:
        return result
    died = f"died of {_signal_name(-returncode)}" if returncode < 0 else f"exited with {returncode}"
    if returncode < 0 and isinstance(result, dict) and result.get("version") == state["serving"]:
        log.warning("the roll-out %s after it finished (version %s serving): %s", died, state["serving"], result)
        return result
    if returncode < 0:
        log.error("the roll-out %s; its stderr: %s", died, err[-2000:] or "(empty)")
    errs = [x for x in err.splitlines() if x.strip()]
    detail = errs[-1].split("error: ", 1)[-1] if errs and returncode > 0 else (
        f"the roll-out process {died}; the repository serves version {state['serving']}")  # fmt: skip
    raise GatewayError(422, "deploy_failed", detail)


LOAD_TIMEOUT = Query(LOAD_TIMEOUT_S, gt=0, description="seconds each Triton server may take to load the version")


@router.post("/deploy", summary="Roll out a checkpoint or engine file (a path on the server) as the next version")
async def deploy(
    engine: str = Query(..., description="file path on the gateway's host"),
    load_timeout_s: float = LOAD_TIMEOUT,
    settings=Depends(app_settings),
):
    return await _run(["deploy", engine, "--load-timeout", str(load_timeout_s)], settings)


@router.post("/rollback", summary="Go back to the version served before the current one")
async def rollback(load_timeout_s: float = LOAD_TIMEOUT, settings: Settings = Depends(app_settings)):
    return await _run(["rollback", "--load-timeout", str(load_timeout_s)], settings)
