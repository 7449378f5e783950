"""A campaign's figures, from its record and its arms' step logs alone: what the live run prints at its end and what
`trainer_throughput.py report DIR` prints for a campaign recorded earlier, through the same functions.

- Each arm: its steady window (steps.py), tokens/s, step time, TFLOPS/GPU and MFU, allocated and reserved peaks.
- TFLOPS and MFU on both sides from one count of model FLOPs per token, gdnctl's (gdnctl/knowledge/flops.py, what
  its trainer logs), from each side's tokens/s; Megatron-Bridge's own counter (megatron/bridge/training/utils/
  flop_utils.py) counts 0.5% fewer for the proxy at 8,192 tokens (6.429 against 6.461 GFLOPs a token), so its own
  log prints a TFLOPS 0.5% under this table's for the same step. Ratios of tokens/s do not depend on the count.
- Per GDN kernel: the ratio of each round's pair (gdnctl's tokens/s over the peer's, the same kernel on both), the
  median over the rounds and their spread (min-max), the steady peaks of both sides and the environment switches
  the two sides did not share.
- A cross-kernel figure (gdnctl on FlashQLA over the peer on FLA) only when asked for, and labelled as one.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from gdnctl.knowledge import catalog, flops

from .campaign import ArmRecord, Campaign
from .plan import PEER_GDN_ENV
from .steps import EmptyWindow, first_steady_step, gdnctl_steps, peer_steps, steady_window
from .switches import switch_difference

LOG_TAIL_LINES = 15
FEW_ROUNDS = 3  # below this many complete pairs a spread says little
SIDE_NAMES = {"gdnctl": "gdnctl", "peer": "Megatron-Bridge"}
CROSS_KERNEL_LABEL = (
    "cross-kernel, not like for like: gdnctl on FlashQLA against Megatron-Bridge on FLA's Triton kernels; a "
    "Megatron-Bridge user with flash-qla installed gets FlashQLA through FLA's own dispatch"
)


def flops_per_token(campaign: Campaign) -> float:
    """gdnctl's model FLOPs per trained token for the campaign's model at its full rows (gdnctl/knowledge/flops.py)."""
    return flops.train_flops_per_token(catalog.from_catalog(campaign.model), campaign.seq_length)


def log_tail(directory: Path, arm: ArmRecord, lines: int = LOG_TAIL_LINES) -> str | None:
    if not arm.log or not (directory / arm.log).is_file():
        return None
    return "\n".join((directory / arm.log).read_text(errors="replace").splitlines()[-lines:])


def arm_figures(campaign: Campaign, directory: Path, arm: ArmRecord, per_token: float) -> dict:
    """One arm's figures over its steady window, or why it has none (its status, note and the tail of its log)."""
    base = {
        "name": arm.name,
        "round": arm.round,
        "kernel": arm.kernel,
        "side": arm.side,
        "status": arm.status,
        "env": arm.env,
        "wall_s": arm.wall_s,
    }
    if arm.status != "ok":
        return {**base, "note": arm.note, "exit_code": arm.exit_code, "log_tail": log_tail(directory, arm)}
    path = directory / str(arm.steps_file)
    try:
        steps = gdnctl_steps(path) if arm.side == "gdnctl" else peer_steps(json.loads(path.read_text()))
        window = steady_window(steps, first_steady_step(arm.graph_warmup_steps))
    except (OSError, ValueError, KeyError, EmptyWindow) as error:
        return {**base, "status": "failed", "note": f"its step log {arm.steps_file} cannot be read: {error}"}
    tflops = window.tokens_per_s / campaign.gpus * per_token / 1e12
    return {
        **base,
        "graphs_captured_before_step": None if arm.graph_warmup_steps is None else arm.graph_warmup_steps + 1,
        "window": {"first_step": window.first_step, "last_step": window.last_step, "steps": window.steps},
        "tokens_per_s": window.tokens_per_s,
        "step_s": window.step_s,
        "tflops_per_gpu": tflops,
        "mfu": tflops / campaign.peak_tflops if campaign.peak_tflops else None,
        "allocated_peak_gib": window.allocated_peak_gib,
        "reserved_peak_gib": window.reserved_peak_gib,
    }


def _spread(ratios: list[float]) -> dict:
    if not ratios:
        return {"rounds": 0, "median": None, "min": None, "max": None}
    return {"rounds": len(ratios), "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def _peak(arms: list[dict], side: str, key: str) -> float | None:
    values = [arm[key] for arm in arms if arm["side"] == side and arm["status"] == "ok"]
    return None if not values or None in values else max(values)


def _pairs(arms: list[dict], ours: str, theirs: str) -> list[dict]:
    """Each round's pair: gdnctl's arm on kernel `ours` and the peer's on `theirs`, both measured."""
    found = {(arm["side"], arm["kernel"], arm["round"]): arm for arm in arms if arm["status"] == "ok"}
    rounds = sorted({arm["round"] for arm in arms})
    pairs = []
    for round_ in rounds:
        gdnctl, peer = found.get(("gdnctl", ours, round_)), found.get(("peer", theirs, round_))
        if gdnctl is None or peer is None:
            continue
        pairs.append(
            {
                "round": round_,
                "gdnctl": gdnctl["name"],
                "peer": peer["name"],
                "gdnctl_tokens_per_s": gdnctl["tokens_per_s"],
                "peer_tokens_per_s": peer["tokens_per_s"],
                "ratio": gdnctl["tokens_per_s"] / peer["tokens_per_s"],
            }
        )
    return pairs


def kernel_comparison(arms: list[dict], kernel: str) -> dict:
    """gdnctl against the peer on one GDN kernel: a ratio per round, its median and spread, the steady peaks, and
    the switches the two sides ran with (from the first of its arms of each side that has a record of them)."""
    own = [arm for arm in arms if arm["kernel"] == kernel]
    pairs = _pairs(own, kernel, kernel)
    envs = {side: next((arm["env"] for arm in own if arm["side"] == side and arm["env"]), None) for side in SIDE_NAMES}
    return {
        "kernel": kernel,
        "peer_env": PEER_GDN_ENV[kernel],
        "rounds": pairs,
        "ratio": _spread([pair["ratio"] for pair in pairs]),
        "allocated_peak_gib": {side: _peak(own, side, "allocated_peak_gib") for side in SIDE_NAMES},
        "reserved_peak_gib": {side: _peak(own, side, "reserved_peak_gib") for side in SIDE_NAMES},
        "switches": None if None in envs.values() else switch_difference(envs["gdnctl"], envs["peer"]),
    }


def compare(campaign: Campaign, directory: Path, cross_kernel: bool = False) -> dict:
    per_token = flops_per_token(campaign)
    arms = [arm_figures(campaign, directory, arm, per_token) for arm in campaign.arms]
    result = {
        "preset": campaign.preset,
        "sets": campaign.sets,
        "steps": campaign.steps,
        "gpus": campaign.gpus,
        "peer_mode": campaign.peer_mode,
        "device": campaign.device,
        "date": campaign.date,
        "token_stream": campaign.token_stream,
        "flops_per_token": {"count": per_token, "formula": "gdnctl/knowledge/flops.py"},
        "peak_tflops": campaign.peak_tflops,
        "explain_memory": campaign.explain_memory,
        "note": campaign.note,
        "arms": arms,
        "kernels": {kernel: kernel_comparison(arms, kernel) for kernel in campaign.kernels},
        "failed_arms": [arm["name"] for arm in arms if arm["status"] == "failed"],
        "arms_not_run": [arm["name"] for arm in arms if arm["status"] == "not run"],
        "arms_to_come": [arm["name"] for arm in arms if arm["status"] in ("planned", "running")],
    }
    if cross_kernel:
        if {"fla", "flashqla"} <= set(campaign.kernels):
            pairs = _pairs(arms, "flashqla", "fla")
            result["cross_kernel"] = {
                "label": CROSS_KERNEL_LABEL,
                "rounds": pairs,
                "ratio": _spread([p["ratio"] for p in pairs]),
            }
        else:
            result["cross_kernel"] = {"label": CROSS_KERNEL_LABEL, "note": "needs arms on both fla and flashqla"}
    return result


def report_directory(directory: Path, cross_kernel: bool = False) -> dict:
    return compare(Campaign.load(directory), directory, cross_kernel)


# --- the readable form -------------------------------------------------------------------------------------------
def _gib(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.2f} GiB"


def _windows(arms: list[dict]) -> str:
    seen = {}
    for arm in arms:
        if arm["status"] == "ok" and arm["side"] not in seen:
            window, captured = arm["window"], arm["graphs_captured_before_step"]
            how = f"graphs captured before step {captured}" if captured else "no CUDA graphs"
            seen[arm["side"]] = f"{SIDE_NAMES[arm['side']]} from step {window['first_step']} ({how})"
    return "; ".join(seen[side] for side in SIDE_NAMES if side in seen) or "none: no arm was measured"


def _setting(name: str, value: str) -> str:
    """A switch as the report shows it: a value that is a path of the host the arm ran on is shown as such, not
    spelled (it says where the image installed something, nothing about the comparison)."""
    return f"{name} (a path on the host)" if value.startswith("/") else f"{name}={value}"


def _switch_lines(switches: dict | None) -> list[str]:
    if switches is None:
        return ["- switches: not recorded for both sides"]
    lines = ["- switches on both: " + (", ".join(_setting(k, v) for k, v in switches["both"].items()) or "none")]
    for key, who in (("gdnctl_only", "gdnctl only"), ("peer_only", "Megatron-Bridge only")):
        if switches[key]:
            lines.append(f"- {who}: " + ", ".join(_setting(k, v) for k, v in switches[key].items()))
    for name, values in switches["different"].items():
        lines.append(f"- {name}: gdnctl {values['gdnctl']}, Megatron-Bridge {values['peer']}")
    return lines


def _ratio_line(ratio: dict) -> str:
    if not ratio["rounds"]:
        return "no complete pair: no ratio"
    text = (
        f"median {ratio['median']:.2f}x over {ratio['rounds']} round(s), spread {ratio['min']:.2f}-{ratio['max']:.2f}x"
    )
    if ratio["rounds"] < FEW_ROUNDS:
        text += f" (under {FEW_ROUNDS} rounds: the spread says little)"
    return text


def table(result: dict) -> str:
    arms = {arm["name"]: arm for arm in result["arms"]}
    lines = [
        f"gdnctl launch {result['preset']} {' '.join(result['sets'])} against Megatron-Bridge's loop "
        f"({result['peer_mode']}), {result['gpus']} GPU(s), {result['steps']} steps an arm"
        + (f"; {result['device']}" if result["device"] else "")
        + (f"; {result['date']}" if result["date"] else ""),
        "steady windows: " + _windows(result["arms"]),
        f"token stream: {result['token_stream']}",
        f"TFLOPS and MFU: {result['flops_per_token']['count'] / 1e9:.3f} GFLOPs a token for both "
        f"({result['flops_per_token']['formula']}), MFU against {result['peak_tflops']:g} TFLOPS",
    ]
    for kernel, comparison in result["kernels"].items():
        env = ", ".join(f"{k}={v}" for k, v in comparison["peer_env"].items())
        lines += [
            "",
            f"{kernel}: gdnctl kernels.gdn_backend={kernel}, Megatron-Bridge {env}",
            "",
            "| round | gdnctl tokens/s | Megatron-Bridge tokens/s | ratio | gdnctl TFLOPS | Megatron-Bridge TFLOPS "
            "| gdnctl MFU | Megatron-Bridge MFU |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for pair in comparison["rounds"]:
            ours, theirs = arms[pair["gdnctl"]], arms[pair["peer"]]
            mfu = [f"{arm['mfu']:.1%}" if arm["mfu"] is not None else "" for arm in (ours, theirs)]
            lines.append(
                f"| {pair['round']} | {ours['tokens_per_s']:,.0f} | {theirs['tokens_per_s']:,.0f} | "
                f"{pair['ratio']:.2f} | {ours['tflops_per_gpu']:.1f} | {theirs['tflops_per_gpu']:.1f} | "
                f"{mfu[0]} | {mfu[1]} |"
            )
        allocated, reserved = comparison["allocated_peak_gib"], comparison["reserved_peak_gib"]
        lines += [
            "",
            f"- ratio: {_ratio_line(comparison['ratio'])}",
            f"- steady peaks, allocated: gdnctl {_gib(allocated['gdnctl'])}, Megatron-Bridge {_gib(allocated['peer'])};"
            f" reserved: gdnctl {_gib(reserved['gdnctl'])}, Megatron-Bridge {_gib(reserved['peer'])}",
            *_switch_lines(comparison["switches"]),
        ]
    cross = result.get("cross_kernel")
    if cross is not None:
        lines += ["", f"{cross['label']}:"]
        if "rounds" in cross:
            lines += [f"- round {p['round']}: {p['ratio']:.2f}x" for p in cross["rounds"]]
            lines.append(f"- {_ratio_line(cross['ratio'])}")
        else:
            lines.append(f"- {cross['note']}")
    if result["explain_memory"]:
        memory = result["explain_memory"]
        lines += [
            "",
            f"gdnctl explain's estimate: {memory['total_gib']:.2f} GiB a GPU, {memory['allocated_gib']:.2f} GiB of "
            "it allocated by torch (the rest its CUDA-context and NCCL overhead row)",
        ]
    for arm in result["arms"]:
        if arm["status"] == "failed":
            lines += ["", f"{arm['name']} failed: {arm['note']}"]
            if arm.get("log_tail"):
                lines += ["    " + line for line in arm["log_tail"].splitlines()]
    for arm in result["arms"]:
        if arm["status"] == "not run":
            lines += ["", f"{arm['name']} not run: {arm['note']}"]
    if result["arms_to_come"]:
        lines += ["", "still to come (the campaign is running or was stopped): " + ", ".join(result["arms_to_come"])]
    if result["note"]:
        lines += ["", result["note"]]
    return "\n".join(lines)
