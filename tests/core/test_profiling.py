import json
import subprocess
import sys

import pytest
import torch

from yolov9.core.profiling import _kernel_kind


@pytest.mark.parametrize(
    "name, kind",
    [  # kernel names as torch.profiler reported them on an H100 (bench engine --profile, bench train --profile)
        ("triton_poi_fused_convolution_silu_12", "inductor"),  # Inductor's epilogue, though it names a convolution
        ("triton_per_fused_convolution_max_pool2d_with_indices_3", "inductor"),
        ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "conv_gemm"),
        ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816fprop_optimized_f16>", "conv_gemm"),
        ("nvjet_sm90_hsh_128x160_64x5_1x2_h_bz_TNT", "conv_gemm"),  # cuBLAS, called by cuDNN for 1x1 convolutions
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<__half, float, 512, true, 1>", "batchnorm"),
        ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl>", "elementwise"),
        ("Memcpy DtoD (Device -> Device)", "other"),
    ],
)
def test_kernels_are_sorted_into_kinds_by_their_names(name, kind):
    assert _kernel_kind(name) == kind


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bench engine --profile profiles CUDA kernels")
def test_bench_engine_profile_adds_gpu_time_per_kind(tmp_path):
    out, prof = tmp_path / "rows.json", tmp_path / "profile.txt"
    cmd = [sys.executable, "-m", "yolov9", "bench", "engine", "gelan-t", "--engines", "torch-fp16,torch-fp16-graph"]
    cmd += ["--batches", "1,4", "--img", "160", "--iters", "5", "--out", str(out), "--profile", str(prof)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())
    points = [(e, b) for e in ("torch-fp16", "torch-fp16-graph") for b in (1, 4)]
    assert [(r["engine"], r["batch"]) for r in rows] == points
    for r in rows:
        assert r["gpu_kernel_ms_per_step"] > 0 and abs(sum(r["gpu_time_share"].values()) - 1) < 0.01
        assert r["gpu_time_share"].get("conv_gemm", 0) > 0.1  # the convolutions ran and were counted
    assert prof.read_text().count("== torch-fp16") == 4
