"""GPU facts the rules and the trainer's MFU need: compute capability (SM), memory and dense bf16 peak.

Memory is the capacity a job can use on one GPU in GiB (nvidia-smi's total where we have read one,
e.g. H100 80GB shows 81559 MiB = 79.6 GiB; otherwise the vendor's nominal figure).

The bf16 peak is the dense Tensor Core figure of NVIDIA's datasheets, in TFLOP/s: half of the "with sparsity"
figure the datasheets lead with (H100 SXM: 1,979 with sparsity, so 989). MFU against the sparse figure would
read half as good as it is. None where no datasheet figure was read (MFU is then not reported).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    description: str
    sm: tuple[int, int] | None  # None for the CPU pseudo-device
    memory_gib: float
    bf16_dense_tflops: float | None = None

    @property
    def sm_label(self) -> str:
        return "none" if self.sm is None else f"SM{self.sm[0]}{self.sm[1]}"

    @property
    def is_hopper(self) -> bool:
        return self.sm == (9, 0)

    @property
    def is_blackwell(self) -> bool:
        return self.sm is not None and self.sm[0] in (10, 12)


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("h100", "NVIDIA H100 80GB", (9, 0), 79.6, 989.0),
        GpuSpec("h200", "NVIDIA H200 141GB", (9, 0), 140.4, 989.0),
        GpuSpec("h800", "NVIDIA H800 80GB", (9, 0), 79.6, 989.0),
        GpuSpec("h20", "NVIDIA H20 96GB", (9, 0), 95.0, 148.0),
        GpuSpec("gh200", "NVIDIA GH200 96GB", (9, 0), 95.0, 989.0),
        GpuSpec("a100", "NVIDIA A100 80GB", (8, 0), 79.2, 312.0),
        GpuSpec("a100-40g", "NVIDIA A100 40GB", (8, 0), 39.4, 312.0),
        GpuSpec("a800", "NVIDIA A800 80GB", (8, 0), 79.2, 312.0),
        GpuSpec("l20", "NVIDIA L20 48GB", (8, 9), 44.5),
        GpuSpec("l40s", "NVIDIA L40S 48GB", (8, 9), 44.5, 362.0),
        GpuSpec("b200", "NVIDIA B200 180GB", (10, 0), 178.0, 2250.0),
        GpuSpec("gb200", "NVIDIA GB200 186GB", (10, 0), 184.0, 2500.0),
        GpuSpec("b300", "NVIDIA B300 288GB", (10, 3), 268.0),
        GpuSpec("gb300", "NVIDIA GB300 288GB", (10, 3), 268.0),
        GpuSpec("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell 96GB", (12, 0), 95.0),
        GpuSpec("rtx-5090", "NVIDIA GeForce RTX 5090 32GB", (12, 0), 31.4),
        GpuSpec("gb10", "NVIDIA GB10 (DGX Spark) 128GB unified", (12, 1), 119.0),
        GpuSpec("cpu", "no GPU: CPU processes with gloo (selftest only)", None, 0.0),
    )
}

# FlashQLA kernels exist for these compute capabilities (QwenLM/FlashQLA README).
FLASHQLA_SMS: frozenset[tuple[int, int]] = frozenset({(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)})
# ...of which SM120/SM121 had a forward kernel only before flash-qla 0.1.3 (stack.FLASHQLA_SM120_BACKWARD), so
# those releases cannot train there.
FLASHQLA_FORWARD_ONLY_SMS: frozenset[tuple[int, int]] = frozenset({(12, 0), (12, 1)})


def sm_label(sm: tuple[int, int]) -> str:
    return f"SM{sm[0]}{sm[1]}"
