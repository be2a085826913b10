"""The architecture as a test: core < train < export < serve < the CLI (yolov9.cli, .quickstart, .val), imports
only go down or stay within a layer, no module imports itself through others, functions fit on a screen, and
the built wheel installs one top-level package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["core", "train", "export", "serve", "cli"]
STAGES = LAYERS[:-1]  # folders of the checkout, installed as yolov9.<stage>
MAX_LINES = 80
PARSER_DECLARATIONS = ("register", "build_parser")  # argparse blocks may be long


def _modules() -> dict[str, Path]:
    """Module name -> file, as installed: core/model.py is yolov9.core.model."""
    out = {}
    for folder in [*STAGES, "yolov9"]:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join(("yolov9", *parts) if folder != "yolov9" else parts)] = path
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else "cli"


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules imported anywhere in the file (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def test_imports_only_go_down_the_layers():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = [f"{m} -> {d}" for m, deps in _graph().items() for d in deps if rank[_layer(d)] > rank[_layer(m)]]
    assert not upward, upward


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if d.startswith(m + "."):  # a package importing its own submodule is not a cycle
                continue
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d] if d in stack else [m, d])
            elif d not in state:
                visit(d, [*stack, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_functions_fit_on_a_screen():
    long = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in PARSER_DECLARATIONS:
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


MAX_PARAMS = 7


def test_no_function_takes_more_than_seven_parameters():
    """Options travel as one object (a dataclass), not as long parameter lists; argparse declarations aside."""
    wide = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in PARSER_DECLARATIONS:
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                n = len(names) - (names[:1] in (["self"], ["cls"], ["ctx"]))
                if n > MAX_PARAMS:
                    wide.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} parameters)")
    assert not wide, wide


def test_the_wheel_installs_one_top_level_package(tmp_path):
    """Built for real: nothing but `yolov9` at the top of site-packages (no `core`, `train`, ... to collide with)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"  # a copy: a build folder left in the checkout by an earlier build must not leak in
    junk = shutil.ignore_patterns(".git", "build", "dist", "runs", "*.egg-info", "__pycache__", ".gpu", "tests", "docs")
    shutil.copytree(ROOT, src, ignore=junk)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600, cwd=src)
    (wheel,) = tmp_path.glob("yolov9_trt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"yolov9"}, top
    for part in ("core/cfg/yolov9-s.yaml", "serve/triton/model.py", "train/trainer.py", "core/assets/datasets"):
        assert any(n.startswith(f"yolov9/{part}") for n in names), part
