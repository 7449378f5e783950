"""The arms of a campaign, in the order they run, and the time it takes.

Each round runs, for each GDN kernel, gdnctl's launch and then the peer on the same kernel (A B A B ...), so that
a pair's two arms run minutes apart and every kernel's pairs are spread over the whole campaign; the ratio of a
round is the ratio of its pair. Separate runs of one loop differ by several percent from start-up and the host
alone, so a campaign has several rounds and reports the spread of the ratio, not one figure.

The GDN kernels pair by name. FLA 0.6.0 hands its chunk_gated_delta_rule to FlashQLA whenever flash_qla imports on
a Hopper GPU (fla/ops/gated_delta_rule/backends/flash_qla.py, FLA_FLASH_QLA on by default), and Megatron-Core calls
FLA's public function: so the peer runs FLA's Triton kernels with FLA_FLASH_QLA=0, and FlashQLA through FLA's own
dispatch with FLA_FLASH_QLA=1, as a Megatron-Bridge user with flash-qla installed gets it.
"""

from __future__ import annotations

from dataclasses import dataclass

SIDES = ("gdnctl", "peer")
# The environment variables a loop's speed can depend on: what each arm's record keeps of its process's environment.
SPEED_ENVIRONMENT_PREFIXES = (
    "NVTE_",
    "NCCL_",
    "TORCH_NCCL_",
    "PYTORCH_",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "OMP_NUM_THREADS",
    "FLA_",
    "TRITON_",
    "TORCHINDUCTOR_",
    "TILELANG_",
)
PEER_GDN_ENV = {"fla": {"FLA_FLASH_QLA": "0"}, "flashqla": {"FLA_FLASH_QLA": "1"}}
KERNELS = tuple(PEER_GDN_ENV)
DEFAULT_ROUNDS = 3


@dataclass(frozen=True)
class Arm:
    """One run of one loop: its place in the campaign, its round, its GDN kernel and which loop it is."""

    index: int
    round: int
    kernel: str
    side: str

    @property
    def name(self) -> str:
        return f"{self.index:02d}-{self.side}-{self.kernel}"


def speed_environment(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in sorted(env.items()) if name.startswith(SPEED_ENVIRONMENT_PREFIXES)}


def plan_arms(kernels: list[str], rounds: int) -> list[Arm]:
    """Round after round, kernel after kernel: gdnctl's arm, then the peer's on the same kernel. The first round
    runs every (loop, kernel) once, so each loop's kernel cache is filled in it and the later rounds start warm
    (the first round's windows start after its compiles, so they count too)."""
    if rounds < 1:
        raise ValueError(f"rounds is {rounds}; run at least one round (three for a spread)")
    unknown = [kernel for kernel in kernels if kernel not in PEER_GDN_ENV]
    if not kernels or unknown:
        raise ValueError(f"kernels {kernels}: name GDN kernels from {', '.join(KERNELS)}")
    arms: list[Arm] = []
    for round_ in range(1, rounds + 1):
        for kernel in kernels:
            for side in SIDES:
                arms.append(Arm(len(arms) + 1, round_, kernel, side))
    return arms


# What an arm costs on one H200 with the 35B-A3B proxy, from the recorded like-for-like run (benchmarks/results/
# h200-like-for-like-2026-12-01, the arms' step times and the gaps between gdnctl's arms): a warm gdnctl launch takes
# about 45 s besides its steps (35 s to the end of step 1, the render and the exit), the peer about 52 s (its start-up
# and its 12 s first step), and a steady step 0.65 s on both sides; a warm pair of 20 steps each took 118-142 s. A
# loop's first arm on a kernel compiles that kernel into its own cache: gdnctl's first FLA step took 74 s longer (its
# kernel warm-up's share is not in its log, so this is the least it cost), its first FlashQLA arm about 148 s longer
# (TileLang in its kernel warm-up); the peer's first FLA step 151 s longer (FLA's Triton kernels, torch.compile's and
# Transformer Engine's first work), its first FlashQLA step 131 s longer.
ARM_START_S = {"gdnctl": 45.0, "peer": 52.0}
STEP_S = 0.65
COLD_S = {("gdnctl", "fla"): 75.0, ("gdnctl", "flashqla"): 148.0, ("peer", "fla"): 151.0, ("peer", "flashqla"): 131.0}


def estimate_seconds(arms: list[Arm], steps: int) -> dict[str, float]:
    """The campaign's expected seconds, warm and cold apart (the first arm of each loop on each kernel pays the
    cold compile), for the plan printed before it starts and for the budget a device session needs."""
    warm = sum(ARM_START_S[arm.side] + STEP_S * steps for arm in arms)
    cold = sum(COLD_S[key] for key in {(arm.side, arm.kernel) for arm in arms})
    return {"warm_s": warm, "cold_s": cold, "total_s": warm + cold}
