"""The one model builder: turns a layer list (official YAML layout) into a DetectionModel, and the model-level
operations built on it (fusion, re-parameterization to GELAN, summary with GFLOPs)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from yolov9.core.detection_defaults import CONF, IOU, MAX_DET, Thresholds
from yolov9.core.errors import BadInput, MissingInput
from yolov9.core.modules import MODULES, Conv, Detect, RepConvN, make_divisible
from yolov9.core.yaml_io import read_yaml

if TYPE_CHECKING:
    from yolov9.core.predict import Detections

CFG_DIR = Path(__file__).parent / "cfg"
# Layers whose first argument is the output width (input width is inserted in front, as officially).
_WIDTH_FIRST = {"Conv", "AConv", "ADown", "ELAN1", "RepNCSPELAN4", "SPPELAN"}


def zoo_names() -> list[str]:
    return sorted(p.stem for p in CFG_DIR.glob("*.yaml"))


def load_cfg(cfg: str | Path | dict) -> dict:
    """A model config from a dict, a YAML path or a zoo name such as 'yolov9-s'."""
    if isinstance(cfg, dict):
        return copy.deepcopy(cfg)
    path = Path(cfg)
    if not path.suffix and (CFG_DIR / f"{cfg}.yaml").exists():
        path = CFG_DIR / f"{cfg}.yaml"
    if not path.exists():
        raise MissingInput(f"no model config '{cfg}': give a YAML path or one of {', '.join(zoo_names())}")
    d = read_yaml(path)
    if not isinstance(d, dict) or "backbone" not in d or "head" not in d:
        raise BadInput(f"{path}: a model config is a mapping with backbone: and head: layer lists")
    d.setdefault("name", path.stem)
    return d


def _layers_key(cfg: dict) -> list:
    """Layer lists with head names unified (official DDetect/DualDDetect == our Detect)."""
    return [[f, n, "Detect" if MODULES.get(m) is Detect else m, a] for f, n, m, a in cfg["backbone"] + cfg["head"]]


def zoo_reparam(cfg: dict) -> dict | None:
    """The re-parameterization mapping of the zoo model with the same layer list (for official configs)."""
    key = _layers_key(cfg)
    for name in zoo_names():
        z = load_cfg(name)
        if "reparam" in z and _layers_key(z) == key:
            return z["reparam"]
    return None


def _eval_arg(a, nc: int):
    if a == "nc":
        return nc
    if a == "None":
        return None
    return a


def parse_layers(d: dict, ch: int = 3) -> tuple[nn.Sequential, list[int]]:
    nc, gw = d["nc"], d.get("width_multiple", 1.0)
    gd = d.get("depth_multiple", 1.0)
    chs: list[int] = [ch]
    layers, save = [], []
    for i, (f, n, name, args) in enumerate(d["backbone"] + d["head"]):
        if name not in MODULES:
            raise BadInput(f"layer {i}: unknown module '{name}' (known: {', '.join(sorted(MODULES))})")
        m = MODULES[name]
        args = [_eval_arg(a, nc) for a in args]
        n = max(round(n * gd), 1) if n > 1 else n
        cin = chs[f] if isinstance(f, int) else None
        if name in _WIDTH_FIRST:
            c2 = make_divisible(args[0] * gw, 8)
            args = [cin, c2, *args[1:]]
        elif name == "Concat":
            c2 = sum(chs[x] for x in f)
        elif name == "CBLinear":
            c2 = args[0]
            args = [cin, c2, *args[1:]]
        elif name == "CBFuse":
            c2 = chs[f[-1]]
        elif m is Detect:
            args = [args[0], [chs[x] for x in f]]
            c2 = None
        else:
            c2 = cin
        module = nn.Sequential(*(m(*args) for _ in range(n))) if n > 1 else m(*args)
        module.i, module.f, module.type = i, f, name
        save.extend(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)
        layers.append(module)
        if i == 0:
            chs = []
        chs.append(c2)
    return nn.Sequential(*layers), sorted(save)


def run_layers(layers: nn.Sequential, calls, save: list[int], x: torch.Tensor):
    """The layer graph's forward: each layer of `layers` takes the outputs named by its `f` (-1: the previous
    layer's), through the callable at its position in `calls` (the layers themselves, or compiled versions of them);
    outputs that later layers read (`save`) are kept."""
    y: list = []
    for m, call in zip(layers, calls):
        if m.f != -1:
            x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
        x = call(x)
        y.append(x if m.i in save else None)
    return x


class DetectionModel(nn.Module):
    """A layer graph in the official layout; `model.{i}` indices match the official checkpoints."""

    def __init__(self, cfg: str | Path | dict, nc: int | None = None, names: list[str] | None = None):
        super().__init__()
        self.cfg = load_cfg(cfg)
        if nc is not None:
            self.cfg["nc"] = nc
        self.model, self.save = parse_layers(self.cfg)
        head = self.head
        self.names = list(names) if names else [str(i) for i in range(head.nc)]
        # Strides from a dry run, as officially; BN statistics are restored afterwards.
        state = {k: v.clone() for k, v in self.state_dict().items()}
        self.train()
        with torch.no_grad():
            out = self.forward(torch.zeros(1, self.cfg.get("ch", 3), 256, 256))
        feats = out if head.groups == 1 else out[0]
        head.stride.copy_(torch.tensor([256 / f.shape[-2] for f in feats]))
        self.load_state_dict(state)
        head.bias_init()

    @property
    def head(self) -> Detect:
        return self.model[-1]

    @property
    def stride(self) -> torch.Tensor:
        return self.head.stride

    @property
    def nc(self) -> int:
        return self.head.nc

    def forward(self, x: torch.Tensor):
        return run_layers(self.model, self.model, self.save, x)

    def fuse(self) -> DetectionModel:
        """Fold every BatchNorm into its conv and every RepConvN into one 3x3 conv (inference only)."""
        for m in self.modules():
            if isinstance(m, (Conv, RepConvN)):
                m.fuse()
        return self

    def deploy(self) -> DetectionModel:
        """The form every engine runs: re-parameterized to GELAN, fused, in eval mode."""
        return self.reparameterize().fuse().eval()

    def reparameterize(self) -> DetectionModel:
        """A YOLOv9 training model as its GELAN inference model: auxiliary branch dropped, main branch kept."""
        spec = self.cfg.get("reparam") or zoo_reparam(self.cfg)
        if spec is None:
            if self.head.groups > 1:
                raise BadInput(
                    "this multi-head model has no 'reparam' mapping in its config and matches no zoo "
                    "model; add one to its YAML"
                )
            return self
        gelan = DetectionModel(spec["to"], nc=self.nc, names=self.names).to(self.stride.device)
        src = self.state_dict()
        dst = {}
        for first, end, offset in spec["layers"]:
            for i in range(first, end):
                j = i + offset
                is_head = isinstance(gelan.model[i], Detect)
                for k in gelan.model[i].state_dict():
                    sk = k
                    if is_head:  # GELAN's single group takes the main (last) group of the dual head
                        g = self.head.groups - 1
                        sk = k.replace("cv2.", f"cv{2 + 2 * g}.", 1).replace("cv3.", f"cv{3 + 2 * g}.", 1)
                        sk = sk.replace("dfl.", f"dfl{g + 1}.", 1)
                    dst[f"model.{i}.{k}"] = src[f"model.{j}.{sk}"]
        gelan.load_state_dict(dst)
        return gelan.train(self.training)

    img_size = 640  # the training size; load_model sets it from the checkpoint

    def predict(
        self,
        source,
        conf: float = CONF,
        iou: float = IOU,
        max_det: int = MAX_DET,
        classes: list[int] | None = None,
        img_size: int | None = None,
    ) -> list[Detections]:
        """Detections per image for a file, bytes, an RGB array (H, W, 3), a PIL image or a list of them, with the
        letterbox and NMS of `yolov9 predict` and the server. The model itself is left as it is: a fused copy
        runs, made again when the weights change."""
        from yolov9.core.predict import predict_images

        return predict_images(self._deployed(), source, img_size or self.img_size, self.names,
                              Thresholds(conf, iou, max_det), classes)  # fmt: skip

    def _deployed(self) -> DetectionModel:
        key = sum(p._version for p in self.parameters()), self.stride.device
        if getattr(self, "_deployed_key", None) != key:
            self.__dict__.pop("_deployed_model", None)  # not copied along
            self.__dict__["_deployed_model"] = copy.deepcopy(self).deploy()
            self.__dict__["_deployed_key"] = key
        return self.__dict__["_deployed_model"]

    def info(self, img_size: int = 640) -> str:
        rows = [f"{'':>3}{'from':>26}{'n':>3}{'params':>11}  {'module':<14}"]
        for m in self.model:
            n = len(m) if isinstance(m, nn.Sequential) else 1
            rows.append(f"{m.i:>3}{str(m.f):>26}{n:>3}{n_params(m):>11,}  {m.type:<14}")
        rows.append(
            f"{self.cfg.get('name', 'model')}: {len(list(self.modules()))} modules, {n_params(self):,} "
            f"parameters, {gflops(self, img_size):.1f} GFLOPs at {img_size}"
        )
        return "\n".join(rows)


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def gflops(model: nn.Module, img_size: int = 640) -> float:
    """Forward FLOPs (multiply and add counted separately, the usual 'GFLOPs') of one image at img_size."""
    from torch.utils.flop_counter import FlopCounterMode

    p = next(model.parameters())
    was_training = model.training
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, img_size, img_size, device=p.device, dtype=p.dtype))
    model.train(was_training)
    return counter.get_total_flops() / 1e9
