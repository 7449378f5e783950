"""`gdnctl validate` and the runtime agree: every preset validate accepts builds Megatron-Core's TransformerConfig.

For thousands of generated presets (the parallel, recompute, precision, layout, model and cluster combinations
the schema allows) this runs the real pipeline: `gdnctl.validate.validate` on the preset file; when it has no
errors, `compile_engine_config`, the runtime's own `transformer_config_kwargs`, and megatron-core's real
`TransformerConfig(**kwargs)`, which runs ModelParallelConfig's checks too. Any exception there is a
disagreement: validate let through a job that would stop at model build, after it had been scheduled.

It runs against the installed megatron-core: 0.16.1 on CPU (0.17+ needs Python 3.12; the test extra pins it,
and its only dependencies are torch, numpy and packaging). Arguments the installed release does not know are
left out by `build`, so the rest is still checked, and must be recorded in UNCHECKED; 0.16.1 knows all of them
(as does 0.19.2, read from its wheel). Where 0.16.1 and 0.19.2 differ on a field gdnctl sets, only GDN context
parallel does (0.16.1 asserts cp == 1 for GDN; 0.19.2 asserts GDN heads % (tp x cp), which HEAD003/HEAD004 check):
a preset with cp > 1 names megatron-core >= 0.18 (LAY003), so on 0.16.1 its config is built with cp 1 to check
every other field, and counted apart; tests/gpu/test_context_parallel_gpu.py builds and trains cp 2 on 0.19.2.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import tempfile
import warnings
from collections import Counter
from functools import cache
from importlib.metadata import version
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

with warnings.catch_warnings():
    # megatron-core warns at import that Transformer Engine and Apex are missing (it falls back to torch).
    warnings.simplefilter("ignore")
    transformer_config_module = pytest.importorskip(
        "megatron.core.transformer.transformer_config",
        reason="megatron-core is not installed (pip install --no-deps megatron-core==0.16.1; it needs only torch, "
        "numpy and packaging)",
    )

from gdnctl.knowledge import GPUS, catalog  # noqa: E402
from gdnctl.plan import compile_engine_config  # noqa: E402
from gdnctl.runtime.model.bridge import provider_overrides  # noqa: E402
from gdnctl.runtime.model.megatron_config import ModelBuildError, transformer_config_kwargs  # noqa: E402
from gdnctl.schema import EngineSpeed  # noqa: E402
from gdnctl.validate import Severity, validate  # noqa: E402
from tests.validate.helpers import TINY_MOE_TEXT  # noqa: E402

TransformerConfig = transformer_config_module.TransformerConfig
MCORE_VERSION = version("megatron-core")
KNOWN_FIELDS = frozenset(f.name for f in dataclasses.fields(TransformerConfig) if f.init)

# Presets per run; derandomize: the same presets on every run, so CI is reproducible. About 40 s on 2 cores.
EXAMPLES = 4000
AGREEMENT = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)

BUILT = "accepted: TransformerConfig built"
TE_INSTALLED = importlib.util.find_spec("transformer_engine") is not None
NO_MEGATRON = "accepted: the job builds no Megatron model (selftest, or rl on device cpu)"
NEEDS_TE = (
    "accepted: FP8 with experts, whose TransformerConfig checks Transformer Engine's version (checked on "
    "the GPU machine, where TE is installed)"
)
CP_PREDATES = (
    "accepted: GDN context parallel, which the installed megatron-core predates (built with cp 1 for the other fields)"
)
STRICTER = (
    "refused by HEAD002 alone: Megatron-Core builds it (TP a multiple of the KV heads, refused for a "
    "megatron-bridge 0.4 provider or megatron-core < 0.16 the preset names)"
)
REJECTED = "rejected"


def unknown_kwargs(kwargs: dict) -> set[str]:
    """The runtime's arguments the installed megatron-core's TransformerConfig does not have."""
    return set(kwargs) - KNOWN_FIELDS


def build(kwargs: dict):
    """TransformerConfig as the runtime constructs it, less the arguments the installed release lacks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerConfig(**{k: v for k, v in kwargs.items() if k in KNOWN_FIELDS})


# --- the presets --------------------------------------------------------------------------------------------

# Checkpoints (model.path) beside every catalog model (the tiny test models included): the rule tests' tiny MoE
# model (tests/validate/helpers.py) and variants, so that architectures the catalog does not hold are generated
# too. Values are HF config.json keys over TINY_MOE_TEXT; None leaves a key out.
CHECKPOINTS = {
    "tiny-moe": {},
    "tiny-moe-top1": {"num_experts_per_tok": 1},
    "tiny-moe-no-shared": {"shared_expert_intermediate_size": 0},
    "tiny-moe-shared-unset": {"shared_expert_intermediate_size": None},
    "tiny-moe-kv4": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "linear_num_key_heads": 8,
        "linear_num_value_heads": 16,
    },
    "tiny-dense": {
        "model_type": "qwen3_5_text",
        "num_experts": None,
        "num_experts_per_tok": None,
        "moe_intermediate_size": None,
        "shared_expert_intermediate_size": None,
        "intermediate_size": 512,
    },
}
# The tiny vision-language entry's language model is gdnctl/tiny-qwen3.5-bytes' architecture (Megatron builds the
# language model alone), so it adds no TransformerConfig to agree on; left out, the derandomized presets stay the
# ones that reach every other model's construction.
SAME_TEXT_MODEL = {"gdnctl/tiny-qwen3.5-vl-bytes"}
MODELS = [("id", model_id) for model_id in catalog.catalog_ids() if model_id not in SAME_TEXT_MODEL] + [
    ("path", name) for name in CHECKPOINTS
]
# Stacks that pass the bridge/core pairing (BRG006): the pinned one, and bridge 0.4/0.5/0.6 on core 0.17/0.18/0.19.
STACKS = [
    {},
    {"megatron_core": "0.17.0", "megatron_bridge": "0.4.0"},
    {"megatron_core": "0.18.1", "megatron_bridge": "0.5.0"},
    {"megatron_core": "0.19.2", "megatron_bridge": "0.6.2"},
]


@cache
def checkpoint_dir(root: Path, name: str) -> str:
    text = {k: v for k, v in {**TINY_MOE_TEXT, **CHECKPOINTS[name]}.items() if v is not None}
    architecture = "Qwen3_5MoeForCausalLM" if "num_experts" in text else "Qwen3_5ForCausalLM"
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps({"architectures": [architecture], **text, "tie_word_embeddings": False})
    )
    return str(directory)


@cache
def _arch(kind: str, model: str, root: Path):
    return catalog.from_catalog(model) if kind == "id" else catalog.from_checkpoint(checkpoint_dir(root, model))


def _dividing(n: int, options) -> list[int]:
    return [o for o in options if n % o == 0]


@st.composite
def preset_dicts(draw, root: Path) -> dict:
    """A preset a user could write. Five draws in six are steered towards what validate accepts (a tp dividing
    the heads, a world size the parallel sizes divide, whole prompt groups) so that many reach the runtime's
    TransformerConfig; the sixth takes every size freely from the schema's range, rejections included."""
    kind, model = draw(st.sampled_from(MODELS))
    arch = _arch(kind, model, root)
    job = draw(st.sampled_from(["sft", "sft", "pretrain", "rl", "rl", "selftest"]))
    free = draw(st.integers(0, 5)) == 0
    if free:
        tp = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
        pp = draw(st.sampled_from([1, 2, 3, 4]))
        cp = draw(st.sampled_from([1, 2, 4]))
        ep = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
        etp = draw(st.sampled_from([1, 2, 4]))
        vpp = draw(st.sampled_from([None, 1, 2, 3, 4]))
        nodes = draw(st.sampled_from([1, 2, 3, 4, 8]))
        gpus_per_node = draw(st.sampled_from([1, 2, 4, 6, 8]))
    else:
        heads = (arch.num_attention_heads, arch.linear_num_key_heads, arch.linear_num_value_heads)
        # Mostly a tp dividing the KV heads too; else also a multiple of them (HEAD002, which Megatron-Core takes).
        kv = (arch.num_key_value_heads,) if draw(st.integers(0, 7)) else ()
        tp = draw(st.sampled_from([t for t in (1, 2, 4, 8, 16) if all(h % t == 0 for h in heads + kv)]))
        pp = draw(st.sampled_from(_dividing(arch.num_layers, (1, 1, 1, 2, 3, 4, 8))))
        cp = draw(st.sampled_from([1] * 6 + [2, 4] if job != "rl" else [1]))  # TRN008: rl has no CP split
        ep = draw(st.sampled_from(_dividing(arch.num_experts, (1, 2, 4, 8, 16, 32)))) if arch.is_moe else 1
        etp = draw(st.sampled_from([1, 1, 2])) if arch.is_moe else 1
        # TRN007 refuses any vpp for training (no virtual stages are built): mostly None, so more presets build.
        vpp = draw(st.sampled_from([None] * 4 + _dividing(arch.num_layers // pp, (1, 2, 3, 4)))) if pp > 1 else None
        # Up to 16x the smallest world: the largest models (122B, 397B) fit in memory (MEM001) only on many GPUs.
        world = math.lcm(tp * pp * cp, etp * ep * pp) * draw(st.sampled_from([1, 1, 2, 4, 8, 16]))
        gpus_per_node = next(g for g in (8, 6, 4, 3, 2, 1) if world % g == 0)
        nodes = world // gpus_per_node
    dp = max(1, nodes * gpus_per_node // (tp * pp * cp))
    # Context parallel splits packed rows only (LAY004) into 2 x cp chunks (LAY009): steered draws keep to that.
    steered_cp = not free and cp > 1
    layout = draw(st.sampled_from(["auto", "thd"] if steered_cp else ["auto", "auto", "thd", "bshd"]))
    # thd packs a micro-batch into one row (LAY007): steered draws take micro-batches > 1 with bshd only.
    micro = draw(st.sampled_from([1, 1, 1, 1, 1, 2, 4] if free or layout == "bshd" else [1]))
    if free:
        global_batch = draw(st.sampled_from([64, 96, 128, 256, 1024]))
    else:
        global_batch = micro * dp * 8 * draw(st.sampled_from([1, 2, 4, 16]))
    train = {
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "precision": draw(st.sampled_from(["bf16"] * 7 + ["fp8"])),
        "layout": layout,
        "micro_batch_size": micro,
        "global_batch_size": global_batch,
        "seq_length": draw(st.sampled_from([1024, 4096, 8192, 32768] + ([] if steered_cp else [4100]))),
        "mtp": draw(st.sampled_from([False] * 7 + [True])),
        "distributed_optimizer": draw(st.booleans()),
        "optimizer_cpu_offload": draw(st.sampled_from([True, True, False])),
    }
    # LoRA leaves the TransformerConfig as it is (megatron-bridge wraps the built model); TRN010 (CPU rl), TRN016
    # (TE-free) and TRN022 (no model.path) refuse some of these draws: a few draws show both outcomes.
    if draw(st.integers(0, 11)) == 0:
        train["lora"] = {"rank": 8, "alpha": 16}
    preset = {
        "name": "agreement",
        "job": job,
        "model": {"id": model} if kind == "id" else {"path": checkpoint_dir(root, model)},
        "cluster": {"nodes": nodes, "gpus_per_node": gpus_per_node, "gpu": draw(st.sampled_from(sorted(GPUS)))},
        "parallel": {
            "tp": tp,
            "pp": pp,
            "cp": cp,
            "ep": ep,
            "etp": etp,
            "vpp": vpp,
            "sequence_parallel": draw(st.sampled_from([None, None, True, False])),
        },
        "train": train,
        "kernels": {"gdn_backend": draw(st.sampled_from(["fla"] * 7 + ["flashqla"]))},
        "runtime": draw(st.sampled_from(STACKS)),
        "launch": {"executor": "slurm" if nodes > 1 else draw(st.sampled_from(["local", "slurm"]))},
    }
    if job == "rl":
        preset["model"]["tokenizer"] = "/models/tokenizer"
        train["data_path"] = "/data/prompts.jsonl"
        rollout_heads = math.gcd(*heads) if not free else arch.num_attention_heads
        preset["rollout"] = {
            "tp": draw(st.sampled_from(_dividing(rollout_heads, (1, 2, 4, 8)))),
            "colocate": draw(st.sampled_from([True] * 7 + [False])),
            "gdn_prefill_backend": "triton",
            "python": "/opt/vllm/bin/python",
        }
    return preset


# --- the check ------------------------------------------------------------------------------------------------


def runtime_kwargs(engine) -> dict:
    """What the runtime's model builder hands Megatron-Core's TransformerConfig. The megatron-bridge provider is
    a TransformerConfig whose architecture the bridge reads from the HF config (BridgeModel checks it equals
    gdnctl's: the TE-free kwargs' architecture) and whose other settings are gdnctl's provider_overrides."""
    if engine.train.model_builder == "te-free":
        return transformer_config_kwargs(engine)
    # The TE-free kwargs stand in for the architecture the bridge reads; FP8 and CP, which only the TE-free builder
    # refuses, come from provider_overrides.
    architecture = engine.model_copy(
        update={
            "train": engine.train.model_copy(update={"precision": "bf16"}),
            "parallel": engine.parallel.model_copy(update={"cp": 1}),
        }
    )
    if importlib.util.find_spec("transformer_engine") is None:
        # The speed options run Transformer Engine's kernels (fused RoPE, router, cross entropy), which
        # TransformerConfig refuses where TE is missing; the GPU runs build the model with them. Here, without TE,
        # the agreement checked is the parallel arithmetic and the architecture.
        engine = engine.model_copy(update={"speed": EngineSpeed()})
    return {
        **transformer_config_kwargs(architecture),
        **provider_overrides(engine),
        "transformer_impl": "transformer_engine",
    }


def _errors(result) -> set[str]:
    return {f.code for f in result.findings if f.severity is Severity.ERROR}


def check(preset: dict, path: Path) -> str:
    """Validate the preset and, when it passes, build the runtime's TransformerConfig. Returns the outcome;
    raises AssertionError on a disagreement."""
    path.write_text(json.dumps(preset))  # JSON is YAML
    result = validate(path)
    errors = _errors(result)
    # HEAD002 alone, with TP a multiple of the KV heads, refuses for a component the preset names other than the
    # installed megatron-core (megatron-bridge 0.4's provider, an older megatron-core): built too, to show that the
    # installed Megatron-Core takes them.
    if errors and errors != {"HEAD002"}:
        return REJECTED
    engine = compile_engine_config(result.run)
    if engine.job == "selftest" or engine.device == "cpu":
        # The selftest and the device-cpu rl policy (transformers) build no TransformerConfig.
        return REJECTED if errors else NO_MEGATRON
    if errors and engine.parallel.tp % engine.model.num_key_value_heads:
        return REJECTED  # neither a multiple nor a divisor: Megatron-Core refuses it too
    if engine.model.is_moe and engine.train.precision == "fp8" and not TE_INSTALLED:
        return NEEDS_TE
    kwargs = runtime_kwargs(engine)
    predates_cp = engine.parallel.cp > 1 and Version(MCORE_VERSION) < Version("0.18")
    if predates_cp:
        kwargs["context_parallel_size"] = 1
    try:
        build(kwargs)
    except (ModelBuildError, ValueError, AssertionError, TypeError) as err:
        findings = sorted({f.code for f in result.findings})
        raise AssertionError(
            f"validate found only {findings} but the runtime's TransformerConfig "
            f"(megatron-core {MCORE_VERSION}) refused: {type(err).__name__}: {err}\n"
            f"{json.dumps(preset, indent=1)}"
        ) from err
    if predates_cp:
        return CP_PREDATES
    return STRICTER if errors else BUILT


@pytest.fixture
def workdir(tmp_path):
    """Thousands of small files: in memory (/dev/shm) where there is one, else the test's tmp_path."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="gdnctl-agreement-") as directory:
            yield Path(directory)
    else:
        yield tmp_path


def test_validate_accepts_only_what_megatron_core_builds(workdir):
    outcomes: Counter = Counter()
    built_models: set[str] = set()
    preset_file = workdir / "preset.yaml"

    @AGREEMENT
    @given(preset_dicts(workdir))
    def agree(preset):
        outcome = check(preset, preset_file)
        outcomes[outcome] += 1
        if outcome in (BUILT, CP_PREDATES):
            built_models.add(preset["model"].get("id") or Path(preset["model"]["path"]).name)

    agree()
    generated = sum(outcomes.values())
    accepted = outcomes[BUILT] + outcomes[NO_MEGATRON] + outcomes[NEEDS_TE] + outcomes[CP_PREDATES]
    print(
        f"\nmegatron-core {MCORE_VERSION}: {generated} presets, {accepted} accepted by validate: "
        f"{dict(outcomes)}; TransformerConfig built for {sorted(built_models)}"
    )
    # The generator must keep reaching the construction, for every model it can build, or the property says little.
    assert outcomes[BUILT] + outcomes[CP_PREDATES] >= generated // 8, outcomes
    buildable = {m for kind, m in MODELS} - {"tiny-moe-top1", "tiny-moe-no-shared"}  # TRN005, TRN006 refuse them
    assert buildable <= built_models, buildable - built_models


# megatron-core version -> the runtime's arguments that release's TransformerConfig lacks, which `build` leaves out
# (so the property cannot check them against it). A new runtime argument an older release lacks goes here.
UNCHECKED: dict[str, frozenset[str]] = {"0.16.1": frozenset()}


def test_installed_megatron_core_knows_every_runtime_argument(workdir):
    """Every argument the runtime passes is a field of the installed TransformerConfig, or recorded as unchecked."""
    kwargs = {}
    for model, recompute in (("Qwen/Qwen3.5-35B-A3B", "full"), ("Qwen/Qwen3.5-9B", "selective")):
        preset = {
            "name": "fields",
            "job": "sft",
            "model": {"id": model},
            "parallel": {"tp": 2, "ep": 2},
            "train": {"recompute": recompute},
        }
        if model.endswith("9B"):
            preset["parallel"]["ep"] = 1
        path = workdir / "fields.yaml"
        path.write_text(json.dumps(preset))
        kwargs.update(transformer_config_kwargs(compile_engine_config(validate(path).run)))
    lacking = unknown_kwargs(kwargs)
    assert lacking <= UNCHECKED.get(MCORE_VERSION, frozenset()), (
        f"megatron-core {MCORE_VERSION} lacks {sorted(lacking)}: record them in UNCHECKED"
    )


# --- regressions: what the property found, and the rule that now catches it --------------------------------------

BASE = {
    "name": "regression",
    "job": "sft",
    "model": {"id": "Qwen/Qwen3.5-9B"},
    "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100"},
    "parallel": {"tp": 2},
    "train": {"global_batch_size": 64, "recompute": "full", "optimizer_cpu_offload": True},
}


def _preset(model: dict | None = None, parallel: dict | None = None) -> dict:
    return {**BASE, "model": model or BASE["model"], "parallel": parallel or BASE["parallel"]}


def _validated(preset: dict, root: Path):
    path = root / "regression.yaml"
    path.write_text(json.dumps(preset))
    return validate(path)


# (case, model, parallel, the rule that catches it, what megatron-core 0.16.1's TransformerConfig raises)
REGRESSIONS = [
    (
        "sequence parallel with tp 1",
        None,
        {"tp": 1, "sequence_parallel": True},
        "PAR011",
        "Cannot use sequence parallelism without tensor parallelism",
    ),
    (
        "MoE routing to one expert",
        "tiny-moe-top1",
        {"tp": 2, "ep": 8},
        "TRN005",
        "Please use --moe-router-pre-softmax when topk is 1",
    ),
    (
        "shared expert of size 0",
        "tiny-moe-no-shared",
        {"tp": 2, "ep": 8},
        "TRN006",
        "moe_shared_expert_intermediate_size must be",
    ),
]


def test_base_preset_builds(workdir):
    result = _validated(_preset(), workdir)
    assert result.ok, [f.code for f in result.findings]
    build(runtime_kwargs(compile_engine_config(result.run)))


@pytest.mark.parametrize("case, model, parallel, code, refusal", REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_regression_is_refused_by_validate_and_by_megatron_core(workdir, case, model, parallel, code, refusal):
    model_spec = {"path": checkpoint_dir(workdir, model)} if model else None
    result = _validated(_preset(model_spec, parallel), workdir)
    assert _errors(result) == {code}, [(f.code, f.message) for f in result.findings]
    with pytest.raises(ValueError, match=refusal):
        build(runtime_kwargs(compile_engine_config(result.run)))


# --- HEAD002: what Megatron-Core itself accepts ------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, tp", [("Qwen/Qwen3.5-35B-A3B", 4), ("Qwen/Qwen3.5-35B-A3B", 8), ("Qwen/Qwen3.5-9B", 8)]
)
def test_tp_a_multiple_of_the_kv_heads_is_accepted_and_megatron_core_builds_it(workdir, model, tp):
    """HEAD002 takes a TP above the KV heads on the pinned stack; Megatron-Core's TransformerConfig builds it."""
    ep = 8 if "A3B" in model else 1
    result = _validated(_preset({"id": model}, {"tp": tp, "ep": ep}), workdir)
    assert "HEAD002" not in _errors(result), [(f.code, f.message) for f in result.findings]
    config = build(runtime_kwargs(compile_engine_config(result.run)))
    assert config.tensor_model_parallel_size == tp and config.num_query_groups == result.run.model.num_key_value_heads


def test_megatron_core_refuses_tp_neither_multiple_nor_divisor_of_the_kv_heads(workdir):
    """Qwen3.5-27B: 4 KV heads, TP 6 (which divides its 24 attention heads) is neither."""
    preset = {
        **_preset({"id": "Qwen/Qwen3.5-27B"}, {"tp": 6}),
        "cluster": {"nodes": 1, "gpus_per_node": 6, "gpu": "h100"},
        "train": {**BASE["train"], "global_batch_size": 60},
    }
    result = _validated(preset, workdir)
    assert "HEAD002" in _errors(result)
    assert "Megatron-Core refuses it" in next(f.message for f in result.findings if f.code == "HEAD002")
    with pytest.raises(ValueError, match="must be a multiple or divisor"):
        build(runtime_kwargs(compile_engine_config(result.run)))
