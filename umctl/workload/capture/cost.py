"""How long a captured kernel runs with all its data resident: the larger of its FLOPs at the
GPU's peak rate for its precision and its bytes (read + written) at HBM bandwidth.

The peak rates are datasheet figures, not measurements: NVIDIA H100 SXM5 and H200 (same Hopper
compute) datasheets, dense (no structured sparsity): FP32 67 TFLOP/s, TF32 tensor core 494.7,
BF16/FP16 tensor core 989.4; V100 SXM2: FP32 15.7, FP16 tensor core 125. Real kernels reach a
fraction of them (large GEMMs 60-80 %), so a captured step is an optimistic estimate of compute;
the HBM rate is the calibration's measured device-copy rate. This package may not import the
simulator (ARCHITECTURE.md), so the CLI passes the calibration's name and HBM rate in.
"""

from __future__ import annotations

from dataclasses import dataclass

TFLOPS = 1e12

#: Datasheet peak rates (FLOP/s) per GPU family and precision: ``fp32`` is the CUDA-core rate
#: (a float32 matmul with TF32 off, PyTorch's default for matmuls), ``tf32`` the tensor-core rate
#: for float32 operands with TF32 on (cuDNN convolutions by default), ``bf16`` for bfloat16 and
#: float16. Estimates from NVIDIA's datasheets, dense math; see the module docstring.
H100_SXM_PEAK = {"fp32": 67.0 * TFLOPS, "tf32": 494.7 * TFLOPS, "bf16": 989.4 * TFLOPS}
H200_PEAK = dict(H100_SXM_PEAK)   # the H200 has the H100 SXM's compute and faster memory
V100_SXM2_PEAK = {"fp32": 15.7 * TFLOPS, "tf32": 15.7 * TFLOPS, "bf16": 125.0 * TFLOPS}
PEAKS = {"h100": H100_SXM_PEAK, "h200": H200_PEAK, "v100": V100_SXM2_PEAK}

#: The shortest a kernel takes on the GPU (launch, one wave, tail): without a floor a step of
#: thousands of tiny kernels (a per-parameter optimizer) would be predicted to take no time.
#: An estimate: back-to-back small kernels on an H100 run at a few microseconds each.
MIN_KERNEL_NS = 2_000

#: The built-in calibration's device-copy rate (umctl/sim/calibration.py, hbm_Bps), for callers
#: that do not pass one.
DEFAULT_HBM_BPS = 2.87e12


def peaks_for(calibration_name: str) -> dict[str, float]:
    """The peak rates of the GPU a calibration was measured on (by its name), H100 otherwise."""
    low = calibration_name.lower()
    return next((p for key, p in PEAKS.items() if key in low), H100_SXM_PEAK)


@dataclass(frozen=True)
class KernelCost:
    """Rates a captured kernel's time is computed from; ``tf32_matmul``/``tf32_conv``: whether
    float32 matmuls / convolutions use TF32 tensor cores (PyTorch's settings at capture time)."""

    peaks: dict
    hbm_Bps: float = DEFAULT_HBM_BPS
    tf32_matmul: bool = False
    tf32_conv: bool = True
    min_ns: int = MIN_KERNEL_NS

    def peak(self, kind: str, dtype: str) -> float:
        if dtype in ("bfloat16", "float16"):
            return self.peaks["bf16"] if kind in ("matmul", "conv") else self.peaks["fp32"]
        if kind == "matmul" and self.tf32_matmul or kind == "conv" and self.tf32_conv:
            return self.peaks["tf32"]
        return self.peaks["fp32"]

    def ns(self, flops: float, nbytes: float, kind: str = "other", dtype: str = "float32") -> int:
        t = max(flops / self.peak(kind, dtype), nbytes / self.hbm_Bps) * 1e9
        return int(max(self.min_ns, round(t)))
