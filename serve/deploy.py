"""A new model without downtime: each deployed version is its own Triton model in the repository (`<name>` is
version 1, `<name>__v<k>` version k), loaded and unloaded through Triton's explicit model control, so loading one
never reloads another. The gateway serves the highest version an endpoint has ready (serve/gateway/backend.py):

deploy:   check the new engine fits the served one (classes, image size, outputs) -> write version k -> load it on
          every Triton -> the gateway moves to it within one health check -> unload the old one (Triton finishes the
          requests it holds first).
rollback: load the previous version again -> unload the current one: the gateway falls back as it unloads.

`<repo>/<name>.versions.json` records the serving version and the history, so a restarted Triton loads the right
one and rollback knows where to go back to. The history keeps the last `keep` versions; the folders of the others
(older ones, and one rolled away from) are removed once unloaded, except the built model's (version 1). Version
numbers are never reused, so a response's version always names one engine."""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import time
from pathlib import Path

from yolov9.core.errors import BadInput, Unavailable
from yolov9.serve.config import LOAD_TIMEOUT_S
from yolov9.serve.gateway.backend import model_name, version_of

DRAIN_S = 2.0  # time for every gateway worker to see the new version (several health checks) before the old goes
KEEP = 3  # versions a repository keeps: the serving one and two to roll back to


def _state_path(repo: Path, name: str) -> Path:
    return Path(repo) / f"{name}.versions.json"


def read_state(repo: str | Path, name: str) -> dict:
    p = _state_path(Path(repo), name)
    return json.loads(p.read_text()) if p.is_file() else {"serving": 1, "history": [1], "latest": 1}


def _write_state(repo: Path, name: str, state: dict) -> None:
    p = _state_path(repo, name)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(p)


def serving_model(repo: str | Path, name: str) -> str:
    """The Triton model a (re)started server loads: the version the last deploy or rollback left serving."""
    return model_name(name, read_state(repo, name)["serving"])


def versions_in(repo: Path, name: str) -> list[int]:
    return sorted(v for d in Path(repo).iterdir() if d.is_dir() and (v := version_of(d.name, name)) is not None)


def _prune(repo: Path, name: str, history: list[int]) -> None:
    """Remove the folders of versions no longer in the history (Triton has unloaded them); the built model stays."""
    for v in versions_in(repo, name):
        if v != 1 and v not in history:
            shutil.rmtree(repo / model_name(name, v), ignore_errors=True)


def _served_config(repo: Path, name: str):
    from yolov9.serve.repository import read_config

    folder = repo / serving_model(repo, name)
    if not (folder / "config.pbtxt").is_file():
        raise BadInput(f"{repo}: no served model '{name}' to deploy beside (build the repository first)")
    return read_config(folder)


def check_fits(engine: str | Path, cfg) -> None:
    """A new version must answer as the served one does: same classes in the same order, same image size for an
    engine file (a checkpoint runs at the repository's size), raw predictions (not NMS inside)."""
    from yolov9.export.engine import weights_meta

    meta = weights_meta(engine)  # a broken or foreign file fails here, before anything is written
    served_names = json.loads(cfg.parameters["names"].string_value)
    if list(meta.names) != served_names:
        raise BadInput(
            f"{engine}: its {len(meta.names)} classes differ from the served model's {len(served_names)} "
            f"(clients would get other class ids): deploy it as a new model, not a new version"
        )
    size = int(cfg.parameters["img_size"].string_value)
    if Path(engine).suffix in (".onnx", ".pt2", ".plan", ".engine") and meta.img_size != size:
        raise BadInput(f"{engine}: exported for {meta.img_size} px, the served model runs at {size} px")
    if meta.end2end:
        raise BadInput(f"{engine}: has NMS inside (an end-to-end export): the server needs raw predictions")


def add_version(engine: str | Path, repo: str | Path, name: str) -> int:
    """Write the next version's model folder beside the served one (its configuration, a copy of the engine)."""
    from yolov9.export.metadata import EngineMeta
    from yolov9.serve.repository import install_model, write_config

    repo, engine = Path(repo), Path(engine)
    if not engine.is_file():
        raise BadInput(f"{engine}: no such engine or checkpoint file")
    cfg = _served_config(repo, name)
    check_fits(engine, cfg)
    k = max(*versions_in(repo, name), read_state(repo, name).get("latest", 1)) + 1
    folder = repo / model_name(name, k)
    (folder / "1").mkdir(parents=True)
    install_model("model.py", folder / "1")
    shutil.copy(engine, folder / "1" / engine.name)
    if EngineMeta.path_for(engine).exists():
        shutil.copy(EngineMeta.path_for(engine), folder / "1" / EngineMeta.path_for(engine).name)
    served = repo / serving_model(repo, name)
    if (served / "warmup").is_dir():
        shutil.copytree(served / "warmup", folder / "warmup")
    cfg.name = folder.name
    cfg.parameters["engine"].string_value = engine.name
    write_config(folder, cfg)
    return k


@contextlib.contextmanager
def _clients(urls: list[str]):
    """One gRPC client per server, closed before returning: left to interpreter exit, a channel's teardown can race
    gRPC's native threads."""
    import tritonclient.grpc as grpcclient

    clients = [grpcclient.InferenceServerClient(u) for u in urls]
    try:
        yield clients
    finally:
        for c in clients:
            c.close()


class LoadTimeout(Unavailable):
    """A server did not finish loading a version in time; it may still be loading it."""


def _load_everywhere(urls: list[str], clients, model: str, timeout_s: float) -> None:
    """Load on every server within timeout_s each; on a failure, unload where it loaded and say why in one line.
    A load that runs out of time goes on inside Triton: its unload is requested too (Triton unloads once the load
    ends), so the version does not come up unannounced."""
    done = []
    for url, c in zip(urls, clients):
        try:
            c.load_model(model, client_timeout=timeout_s)
            done.append(c)
        except Exception as e:
            timed_out = "DEADLINE_EXCEEDED" in str(e)
            for d in done + ([c] if timed_out else []):
                with contextlib.suppress(Exception):  # the failure to report is the load's
                    d.unload_model(model, client_timeout=timeout_s)
            if timed_out:
                raise LoadTimeout(f"{model} did not load on {url} within {timeout_s:g} s (--load-timeout)") from None
            cause = str(e).strip().splitlines()[0][:300]
            raise Unavailable(f"{model} did not load on {url}: {cause}") from None


@contextlib.contextmanager
def _locked(repo: Path, name: str):
    """One roll-out at a time on a repository, whoever starts it (CLI, any gateway worker)."""
    if not repo.is_dir():
        raise BadInput(f"{repo}: no such model repository")
    with open(repo / f".{name}.deploy.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _check_timeout(load_timeout_s: float) -> None:
    if not load_timeout_s > 0:
        raise BadInput(f"load timeout {load_timeout_s}: give seconds above 0")


def deploy(
    engine: str | Path,
    repo: str | Path,
    name: str,
    urls: list[str],
    drain_s: float = DRAIN_S,
    keep: int = KEEP,
    load_timeout_s: float = LOAD_TIMEOUT_S,
) -> dict:
    """Roll `engine` out as the next version, keeping `keep` versions; returns {model, version, previous}."""
    if keep < 1:
        raise BadInput(f"keep {keep}: at least the serving version is kept (1 or more)")
    _check_timeout(load_timeout_s)
    with _locked(Path(repo), name):
        return _deploy(engine, Path(repo), name, urls, drain_s, keep, load_timeout_s)


def _deploy(
    engine: str | Path, repo: Path, name: str, urls: list[str], drain_s: float, keep: int, load_timeout_s: float
) -> dict:
    state = read_state(repo, name)
    old = state["serving"]
    k = add_version(engine, repo, name)
    with _clients(urls) as clients:
        try:
            _load_everywhere(urls, clients, model_name(name, k), load_timeout_s)
        except LoadTimeout:  # Triton may still read the folder and may have served k: the number is spent
            _write_state(repo, name, {**state, "latest": k})  # the folder goes with the next roll-out's pruning
            raise
        except Unavailable:
            shutil.rmtree(repo / model_name(name, k))
            raise
        history = [*state["history"], k][-keep:]
        _write_state(repo, name, {"serving": k, "history": history, "latest": k})
        time.sleep(drain_s)  # every gateway worker's health check now sees version k ready, and sends there
        for c in clients:
            c.unload_model(model_name(name, old))  # Triton answers the requests it holds before it unloads
    _prune(repo, name, history)
    return {"model": name, "version": k, "previous": old}


def rollback(repo: str | Path, name: str, urls: list[str], load_timeout_s: float = LOAD_TIMEOUT_S) -> dict:
    """Back to the version served before the current one; returns {model, version, previous}."""
    _check_timeout(load_timeout_s)
    with _locked(Path(repo), name):
        return _rollback(Path(repo), name, urls, load_timeout_s)


def _rollback(repo: Path, name: str, urls: list[str], load_timeout_s: float) -> dict:
    state = read_state(repo, name)
    if len(state["history"]) < 2:
        raise BadInput(f"{name}: no earlier version to roll back to (history: {state['history']})")
    cur, prev = state["history"][-1], state["history"][-2]
    with _clients(urls) as clients:
        _load_everywhere(urls, clients, model_name(name, prev), load_timeout_s)
        history = state["history"][:-1]
        _write_state(repo, name, {"serving": prev, "history": history, "latest": state.get("latest", cur)})
        for c in clients:  # as it unloads the gateway falls back to prev, the highest version left ready
            c.unload_model(model_name(name, cur))
    _prune(repo, name, history)
    return {"model": name, "version": prev, "previous": cur}
