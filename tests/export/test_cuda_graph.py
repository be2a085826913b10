import pytest
import torch

from yolov9.export.cuda_graph import CudaGraphEngine
from yolov9.export.engine import load_engine

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


@gpu
def test_replays_one_graph_per_shape_as_the_engine_runs(trained_tiny):
    engine = load_engine(str(trained_tiny), device="cuda", img_size=160)
    graphed = CudaGraphEngine(engine)
    for b in (1, 3, 1):
        x = torch.rand(b, 3, 160, 160, device="cuda", dtype=engine.dtype)
        torch.testing.assert_close(graphed(x), engine(x), rtol=1e-3, atol=1e-2)
    assert len(graphed.graphs) == 2 and graphed.kind == engine.kind + "-graph"


@gpu
def test_several_inputs_from_the_host_and_outputs_without_a_copy(trained_tiny):
    """Inputs on the host are copied into the graph's; clone=False hands out the graph's own outputs, which the
    next replay overwrites."""
    engine = load_engine(str(trained_tiny), device="cuda", img_size=160)

    def step(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return engine((x * scale[:, None, None, None]).to(x.dtype)), scale * 2

    step.kind, step.names, step.img_size, step.device, step.dtype = "step", engine.names, 160, engine.device, None
    graphed = CudaGraphEngine(step, clone=False)
    x = torch.rand(2, 3, 160, 160, device="cuda", dtype=engine.dtype)
    first = graphed(x, torch.tensor([1.0, 0.5]))
    assert first[1].device.type == "cuda" and first[1].tolist() == [2.0, 1.0]
    torch.testing.assert_close(first[0], step(x, torch.tensor([1.0, 0.5], device="cuda"))[0], rtol=1e-3, atol=1e-2)
    second = graphed(x, torch.tensor([3.0, 4.0]))
    assert second[1] is first[1] and first[1].tolist() == [6.0, 8.0]
