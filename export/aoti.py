"""AOTInductor engine: the deployed model compiled ahead of time with torch.export + AOTInductor into a .pt2
package (fp16 on CUDA by default, dynamic batch) that loads without recompiling (export/engine.py AOTIEngine)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch

from yolov9.core.checkpoint import weights_source
from yolov9.core.errors import BadInput, Unavailable
from yolov9.core.model import DetectionModel
from yolov9.export.metadata import EngineMeta

# Inductor options for CUDA packages (docs/benchmarks.md). Dynamic batch makes Inductor skip
# its channels-last choice for convolutions (it only decides it on static shapes), and NCHW fp16 convolutions are
# slower in cuDNN: force the layout. Freezing folds the weights into the package as constants, so they are
# converted to that layout once at compile time rather than on every call.
CUDA_DEFAULTS = {"freezing": True, "force_layout_optimization": True}


def export_aoti(
    weights: str | Path | DetectionModel,
    out: str | Path,
    img: int = 640,
    half: bool = True,
    device: str = "cuda",
    max_batch: int = 256,
    inductor_configs: dict | None = None,
) -> Path:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise Unavailable(
            "AOTInductor export for CUDA needs a CUDA GPU on this machine (use --device cpu for a CPU package)"
        )
    out = Path(out)
    src, source, data = weights_source(weights)
    dtype = torch.float16 if half else torch.float32
    model = src.deploy().to(device, dtype)
    x = torch.zeros(2, 3, img, img, device=device, dtype=dtype)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    with torch.no_grad():
        ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
        out.parent.mkdir(parents=True, exist_ok=True)
        options = inductor_options(device, inductor_configs)
        requested = dict(options)  # the compile adds keys of its own to `options`
        with shared_cxx_runtime(options):
            torch._inductor.aoti_compile_and_package(ep, package_path=str(out), inductor_configs=options)
    cxx_shared = links_shared_cxx_runtime(out)
    if cxx_shared is False:
        print(f"warning: {out} has the C++ runtime linked in statically; it may crash when loaded", file=sys.stderr)
    EngineMeta(
        names=list(src.names),
        img_size=img,
        strides=model.stride.tolist(),
        dtype=str(dtype).split(".")[1],
        device=device,
        source=source,
        data=data,
        extra={
            "max_batch": max_batch,
            "inductor_configs": {k: repr(v) for k, v in requested.items()},
            "torch": torch.__version__,
            "links_shared_cxx_runtime": cxx_shared,
            "output": "(B, 4 + nc, anchors)",
        },
    ).write(out)
    return out


def inductor_options(device: str, user: dict | None = None) -> dict:
    """The Inductor options of one compile: the CUDA defaults on CUDA, overridden by the user's --inductor."""
    return {**(CUDA_DEFAULTS if device.startswith("cuda") else {}), **(user or {})}


# A g++ front for Inductor's compile of the model library. Some PyTorch builds (2.11 on our H200 image) link the
# C++ runtime statically into the AOTI library; loaded next to PyTorch's shared libstdc++, two copies of the
# locale machinery then meet and the model constructor crashes (std::regex in parse_device_str: SIGSEGV, or
# std::bad_cast). The front drops static-runtime flags and ends each shared-library link with the shared
# libstdc++.so.6 named explicitly, ahead of the driver's own -lstdc++ (that image has libstdc++.so.6 but no
# libstdc++.so link, so the plain link came out static). YOLOV9_CXX_LOG=FILE records the commands it was given.
_CXX_FRONT = """#!/bin/sh
[ -n "$YOLOV9_CXX_LOG" ] && printf '%s\\n' "$*" >> "$YOLOV9_CXX_LOG"
shared=0
for a do
  shift
  case $a in -static-libstdc++|-static-libgcc) continue ;; -shared) shared=1 ;; -c|-E|-S) shared=2 ;; esac
  set -- "$@" "$a"
done
[ $shared = 1 ] && set -- "$@" -Wl,-Bdynamic -l:libstdc++.so.6
exec "{real}" "$@"
"""


@contextlib.contextmanager
def shared_cxx_runtime(options: dict) -> Iterator[None]:
    """Point Inductor's C++ compiler (option cpp.cxx) at the g++ front above for one compile (Linux + gcc only;
    an explicit cpp.cxx in `options` wins)."""
    from torch._inductor import cpp_builder

    real = ""
    if sys.platform.startswith("linux") and "cpp.cxx" not in options:
        try:  # private helpers of Inductor: if they move, compile with Inductor's own choice
            real = cpp_builder.get_cpp_compiler()
            real = real if cpp_builder._is_gcc(real) else ""
        except (AttributeError, RuntimeError, OSError):
            real = ""
    if not real:
        yield
        return
    tmp = Path(tempfile.mkdtemp(prefix="yolov9_cxx_"))
    try:
        options["cpp.cxx"] = (None, str(write_cxx_front(tmp, shutil.which(real) or real)))
        yield
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_cxx_front(folder: Path, real: str) -> Path:
    front = folder / "g++"  # named g++ so that Inductor's compiler checks see a gcc
    front.write_text(_CXX_FRONT.replace("{real}", real))
    front.chmod(0o755)
    return front


def links_shared_cxx_runtime(package: Path) -> bool | None:
    """Whether the package's model library needs libstdc++.so (None: no ELF library in it, e.g. on macOS)."""
    with zipfile.ZipFile(package) as z:
        libs = [n for n in z.namelist() if n.endswith(".so")]
        return elf_needs_libstdcxx(z.read(libs[0])) if libs else None


def elf_needs_libstdcxx(data: bytes) -> bool | None:
    # the dependency's file name sits in the dynamic string table; a static copy of the runtime leaves no such name
    return b"libstdc++.so" in data if data.startswith(b"\x7fELF") else None


class AOTIEngine:
    kind = "aoti"

    def __init__(self, path: Path, device: str | torch.device = "cuda"):
        if not zipfile.is_zipfile(path):
            raise BadInput(f"{path} is not an AOTInductor package (not a zip archive)")
        self.meta = EngineMeta.read(path)
        self.names, self.img_size = self.meta.names, self.meta.img_size
        self.dtype = getattr(torch, self.meta.dtype)
        self.device = torch.device(self.meta.device if self.meta.device != "cuda" else str(device))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise Unavailable(f"{path} was compiled for CUDA and this machine has no CUDA GPU")
        if self.device.type == "cuda":  # the package's convolutions call cuDNN through ATen: time algorithms once
            torch.backends.cudnn.benchmark = True
        loader = os.environ.get("YOLOV9_AOTI_LOADER", "runner")
        if loader not in ("package", "runner"):
            raise BadInput(f"YOLOV9_AOTI_LOADER must be 'runner' or 'package', not {loader!r}")
        # single-threaded: no cross-thread synchronisation inside the model, which CUDA-graph capture requires
        if loader == "runner":
            self.runner = aoti_runner(path, self.device)
        else:
            self.runner = torch._inductor.aoti_load_package(str(path), run_single_threaded=True)

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.runner(x.to(self.device, self.dtype)).float()


def aoti_runner(path: Path, device: torch.device):
    """The package's compiled model opened directly with Inductor's container runner (one tensor in, one out).

    Same library as aoti_load_package() runs, but it opens in under a second where the package loader can take
    tens of seconds. A .pt2 holds native code: load only packages you trust."""
    tmp = Path(tempfile.mkdtemp(prefix="yolov9_aoti_"))
    atexit.register(
        shutil.rmtree, tmp, ignore_errors=True
    )  # kept while the process runs: CUDA kernels load lazily from it
    try:
        with zipfile.ZipFile(path) as z:
            z.extractall(tmp)  # zipfile drops absolute paths and '..' members
    except zipfile.BadZipFile as e:
        raise BadInput(f"{path} is not an AOTInductor package ({e})") from None
    libs = sorted(tmp.rglob("*.wrapper.so"))
    if len(libs) != 1:
        raise BadInput(f"{path}: expected one compiled model in the package, found {len(libs)}")
    so = str(libs[0])
    if device.type == "cuda":
        runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, str(device), str(libs[0].parent), True)
    else:
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
    return lambda x: runner.run([x])[0]
