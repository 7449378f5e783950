"""Generated presets and random YAML: always exit 0, 1 or 2 with a message, never a traceback."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.knowledge.hardware import GPUS
from tests.validate.helpers import shipped

runner = CliRunner()
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 300),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["fla", "flashqla", "thd", "bshd", "auto", "0.19.2", "none", "triton", "h100", "barrier"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
small = st.integers(1, 64)

structured = st.fixed_dictionaries(
    {
        "name": st.text(min_size=1, max_size=20),
        "job": st.sampled_from(["rl", "sft", "pretrain", "selftest"]),
        "model": st.fixed_dictionaries(
            {
                "id": st.sampled_from(
                    [
                        "Qwen/Qwen3.5-35B-A3B",
                        "Qwen/Qwen3.5-0.8B",
                        "Qwen/Qwen3.5-27B",
                        "Qwen/Qwen3-Next-80B-A3B",
                        "Qwen/Qwen3.5-4B",
                        "Qwen/Nope",
                    ]
                )
            }
        ),
        "cluster": st.fixed_dictionaries(
            {"nodes": st.integers(1, 4), "gpus_per_node": st.integers(1, 8), "gpu": st.sampled_from(sorted(GPUS))}
        ),
        "parallel": st.fixed_dictionaries(
            {
                "tp": small,
                "pp": st.integers(1, 8),
                "cp": st.integers(1, 8),
                "ep": small,
                "etp": st.integers(1, 4),
                "vpp": st.one_of(st.none(), st.integers(1, 4)),
                "sequence_parallel": st.one_of(st.none(), st.booleans()),
            }
        ),
        "train": st.fixed_dictionaries(
            {
                "micro_batch_size": st.integers(1, 8),
                "global_batch_size": st.integers(1, 512),
                "seq_length": st.integers(1, 131072),
                "layout": st.sampled_from(["auto", "thd", "bshd"]),
                "recompute": st.sampled_from(["none", "selective", "full"]),
                "precision": st.sampled_from(["bf16", "fp8"]),
                "mtp": st.booleans(),
            }
        ),
        "kernels": st.fixed_dictionaries({"gdn_backend": st.sampled_from(["fla", "flashqla"])}),
        "rollout": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {
                    "tp": small,
                    "colocate": st.booleans(),
                    "num_gpus": st.one_of(st.none(), st.integers(1, 40)),
                    "gdn_prefill_backend": st.one_of(
                        st.none(), st.sampled_from(["triton", "flashinfer", "cutedsl", "x"])
                    ),
                }
            ),
        ),
        "runtime": st.fixed_dictionaries(
            {
                "megatron_core": st.sampled_from(["0.15.0", "0.17.0", "0.18.1", "0.19.2"]),
                "vllm": st.sampled_from(["0.17.0", "0.20.0", "0.33.0"]),
            }
        ),
    }
)


def _check(result):
    assert result.exit_code in (0, 1, 2), result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert "Traceback" not in result.output


@FUZZ
@given(structured)
def test_structured_presets(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("p") / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    for command in ("validate", "explain"):
        _check(runner.invoke(app, [command, str(path), "--json"]))


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "name",
                "job",
                "model",
                "cluster",
                "parallel",
                "train",
                "comm",
                "rollout",
                "runtime",
                "launch",
                "kernels",
                "base",
                "selftest",
                "zzz",
            ]
        ),
        values,
    )
)
def test_mutated_presets(tmp_path_factory, changes):
    data = {**shipped(), **changes}
    data.pop("base", None) if not isinstance(data.get("base"), str) else None
    path = tmp_path_factory.mktemp("p") / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    _check(runner.invoke(app, ["validate", str(path)]))


@FUZZ
@given(st.text(max_size=200))
def test_random_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("p") / "p.yaml"
    path.write_text(text)
    _check(runner.invoke(app, ["validate", str(path), "--json"]))


@FUZZ
@given(st.lists(st.text(max_size=30), max_size=3))
def test_random_overrides(overrides):
    args = ["validate", "qwen3.5-35b-a3b-grpo"]
    for item in overrides:
        args += ["--set", item]
    _check(runner.invoke(app, args))
