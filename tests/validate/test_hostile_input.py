"""Hostile input: whatever a preset, a --set value or a base: chain holds, `gdnctl validate` (and explain and
launch --dry-run, which share the loader) ends with findings or a load error, exit 0, 1 or 2, quickly: never a
traceback, a hang or a memory blow-up. One regression test per crash found, then a fuzzer over the schema."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
import types
import typing
from dataclasses import dataclass

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.errors import PresetLoadError
from gdnctl.knowledge.hardware import GPUS
from gdnctl.launch.render import TemplateError, template_environment
from gdnctl.plan import memory
from gdnctl.resources import presets_dir, templates_dir
from gdnctl.schema import Preset
from gdnctl.schema.preset import MAX_NODES, MAX_PER_NODE, MAX_SEQUENCES, MAX_TOKENS, RuntimeSpec
from gdnctl.validate.loader import MAX_BASE_CHAIN, MAX_DEPTH, load_preset
from gdnctl.validate.rules.launch import OBEYED_NAMES, SEARCH_PATHS
from tests.validate.helpers import codes, run_of, write_checkpoint

runner = CliRunner()
QUICK_S = 2.0  # each case takes milliseconds; a bound this generous only catches a hang or a blow-up
BASE = "name: x\njob: sft\nmodel: {id: Qwen/Qwen3.5-0.8B}\ncluster: {gpus_per_node: 1}\n"


def _timed(*args: str):
    """Run a command in-process: its result and the CPU seconds it took. A crash (exit 70) fails here.

    CPU time, not wall time: what these bounds catch (a blow-up, quadratic parsing, a loop that never ends)
    burns CPU, while a wall clock also counts the time other processes hold the cores, and a loaded 2-core CI
    machine ran a millisecond command for over 5 s of wall time."""
    start = time.process_time()
    result = runner.invoke(app, list(args))
    elapsed = time.process_time() - start
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output
    return result, elapsed


def _invoke(*args: str) -> tuple[int, dict, float]:
    """Run a command with --json: its exit code, its one JSON object, and the seconds it took."""
    result, elapsed = _timed(*args, "--json")
    return result.exit_code, json.loads(result.stdout), elapsed


def _preset(tmp_path, text: str) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return str(path)


def _finding(code: str, path: str, *args: str) -> dict:
    """The finding `code` at `path` of `gdnctl validate ARGS`, which must exit 1 in well under a second."""
    exit_code, data, elapsed = _invoke("validate", *args)
    assert exit_code == 1, data
    assert elapsed < QUICK_S
    found = [f for f in data["findings"] if f["code"] == code and f["path"] == path]
    assert found, data["findings"]
    return found[0]


def _nested_path(head: str, step: str, count: int) -> str:
    return head + step * count


# 1. deep nesting in the YAML reader


def test_deep_list_nesting_is_too_complex(tmp_path):
    text = BASE.replace("name: x", "name: " + "[" * 500 + "]" * 500)
    finding = _finding("PRE004", _nested_path("name", "[0]", MAX_DEPTH), _preset(tmp_path, text))
    assert f"more than {MAX_DEPTH} levels" in finding["message"] and finding["location"].endswith(":1:27")  # the 21st [


def test_deep_mapping_nesting_is_too_complex(tmp_path):
    text = BASE + "train: " + "{a: " * 500 + "1" + "}" * 500 + "\n"
    _finding("PRE004", _nested_path("train", ".a", MAX_DEPTH - 1), _preset(tmp_path, text))


# 2. a recursive alias


@pytest.mark.parametrize(
    "text, path",
    [
        ("model: &a [*a]\n", "model[0]"),
        ("train: &t {lora: *t}\n", "train.lora"),
        ("train: &t {<<: *t}\n", "train.<<"),  # a merge key that merges its own mapping
    ],
)
def test_recursive_alias_is_too_complex(tmp_path, text, path):
    finding = _finding("PRE004", path, _preset(tmp_path, "name: x\njob: sft\n" + text))
    assert "contain itself" in finding["message"]


# 3. a deep --set value


def test_deep_set_value_is_too_complex():
    finding = _finding(
        "PRE004", _nested_path("name", "[0]", MAX_DEPTH), "selftest-cpu", "--set", "name=" + "[" * 500 + "]" * 500
    )
    assert finding["location"] == "--set"


def test_deep_set_key_is_too_complex():
    _finding("PRE004", _nested_path("a", ".a", MAX_DEPTH), "selftest-cpu", "--set", "a." * 500 + "a=1")


# 4. a long base: chain


def test_long_base_chain_is_too_complex(tmp_path):
    for index in range(1200):
        (tmp_path / f"p{index}.yaml").write_text(f"base: p{index + 1}.yaml\n")
    (tmp_path / "p1200.yaml").write_text(BASE)
    finding = _finding("PRE004", "base", str(tmp_path / "p0.yaml"))
    assert finding["location"] == f"{tmp_path / f'p{MAX_BASE_CHAIN - 1}.yaml'}:1:1"


def test_base_chain_at_the_bound_is_read(tmp_path):
    for index in range(MAX_BASE_CHAIN - 1):
        (tmp_path / f"p{index}.yaml").write_text(f"base: p{index + 1}.yaml\n")
    (tmp_path / f"p{MAX_BASE_CHAIN - 1}.yaml").write_text(BASE)
    loaded = load_preset(tmp_path / "p0.yaml")
    assert loaded.preset is not None and len(loaded.chain) == MAX_BASE_CHAIN


# 5. a billion laughs


def _laughs(levels: int) -> str:
    text = "a0: &a0 [" + ", ".join(["lol"] * 9) + "]\n"
    for level in range(1, levels):
        text += f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]\n"
    return text


def test_billion_laughs_is_refused_quickly_and_in_little_memory(tmp_path):
    text = BASE + _laughs(9)
    assert len(text.encode()) < 600
    tracemalloc.start()
    try:
        finding = _finding("PRE004", "a4", _preset(tmp_path, text))  # a4 is 9**5 values: the first past 10,000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "expands to more than 10,000" in finding["message"]
    assert peak < 50 * 2**20


def test_billion_laughs_in_a_set_value_is_refused():
    value = "[" + ", ".join(f"&b{i} [" + ", ".join([f"*b{i - 1}" if i else "x"] * 9) + "]" for i in range(9)) + "]"
    _finding("PRE004", "description[4]", "selftest-cpu", "--set", f"description={value}")


def test_alias_chain_deeper_than_the_bound_is_too_complex(tmp_path):
    chain = "c0: &c0 [x]\n" + "".join(f"c{i}: &c{i} [*c{i - 1}]\n" for i in range(1, 2000))
    _finding("PRE004", f"c{MAX_DEPTH - 1}[0]", _preset(tmp_path, BASE + chain))


def test_large_file_and_endless_device_are_too_complex(tmp_path):
    _finding("PRE004", "(preset)", _preset(tmp_path, BASE + "description: '" + "x" * 300_000 + "'\n"))
    if os.path.exists("/dev/zero"):
        _finding("PRE004", "(preset)", "/dev/zero")


def test_too_many_values_is_too_complex(tmp_path):
    _finding("PRE004", "(preset)", _preset(tmp_path, BASE + "comm: {skip_ops: [" + "a, " * 20_000 + "a]}\n"))


# 6. a NUL byte in a path (or any other) field


@pytest.mark.parametrize(
    "path",
    [
        "model.path",
        "model.tokenizer",
        "train.data_path",
        "train.save_dir",
        "launch.kernel_cache_dir",
        "launch.python",
        "rollout.python",
        "name",
    ],
)
def test_nul_byte_is_an_invalid_value(tmp_path, path):
    section, _, key = path.rpartition(".")
    data = yaml.safe_load(BASE)
    (data.setdefault(section, {}) if section else data)[key] = "a\0b"
    finding = _finding("PRE002", path, _preset(tmp_path, yaml.safe_dump(data)))
    assert "NUL" in finding["message"]


def test_nul_byte_in_an_env_value_and_in_the_preset_path(tmp_path):
    _finding("PRE002", "launch.env", _preset(tmp_path, BASE + 'launch: {env: {A: "x\\0"}}\n'))
    exit_code, _, _ = _invoke("validate", str(tmp_path / "a\0b.yaml"))
    assert exit_code == 2


# 7. an integer of 5,000 digits


@pytest.mark.parametrize("literal", ["9" * 5000, "0x" + "f" * 4000, "1" + ":59" * 2000])
def test_huge_integer_literal_is_an_invalid_value(tmp_path, literal):
    finding = _finding("PRE002", "train.seq_length", _preset(tmp_path, BASE + f"train: {{seq_length: {literal}}}\n"))
    assert "digits, beyond any value" in finding["message"]


def test_huge_integer_in_a_set_value_and_a_key(tmp_path):
    _finding("PRE002", "parallel.tp", "selftest-cpu", "--set", "parallel.tp=" + "7" * 5000)
    # A plain key of 5,000 characters is past the 1,024 YAML allows a simple key: a syntax error.
    assert _invoke("validate", _preset(tmp_path, BASE + "7" * 5000 + ": 1\n"))[0] == 2


# 8. sizes past float range, and the schema's upper bounds


@pytest.mark.parametrize(
    "path",
    [
        "train.seq_length",
        "train.micro_batch_size",
        "train.global_batch_size",
        "parallel.tp",
        "parallel.ep",
        "parallel.cp",
        "cluster.nodes",
        "cluster.gpus_per_node",
        "rollout.max_response_tokens",
        "rollout.tp",
        "train.seed",
        "train.train_iters",
    ],
)
def test_size_past_float_range_is_an_invalid_value(path):
    finding = _finding("PRE002", path, "qwen3.5-35b-a3b-grpo", "--set", f"{path}={10**309}")
    assert "less than or equal to" in finding["message"] and len(finding["message"]) < 200


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_nan_and_infinity_are_invalid_values(value):
    _finding("PRE002", "rollout.timeout_s", "qwen3.5-35b-a3b-grpo", "--set", f"rollout.timeout_s={value}")


def test_memory_estimate_stays_finite_at_the_schema_bounds():
    run = run_of(
        {
            "cluster": {"nodes": MAX_NODES, "gpus_per_node": MAX_PER_NODE},
            "parallel": {"tp": 2, "ep": 8, "cp": 1},
            "train": {"seq_length": MAX_TOKENS, "micro_batch_size": MAX_SEQUENCES, "global_batch_size": MAX_SEQUENCES},
        }
    )
    estimate = memory.estimate_training(run)
    assert all(row.gib < float("inf") for row in estimate.rows) and estimate.usage > 1


def test_checkpoint_sizes_past_float_range_are_refused_before_any_estimate(tmp_path):
    """Sizes of a config.json are within int32 (ModelArch), so the memory estimate never sees 10**400."""
    checkpoint = write_checkpoint(tmp_path / "ckpt", hidden_size=10**400, vocab_size=10**320)
    result = CliRunner().invoke(
        app,
        ["validate", "qwen3.5-35b-a3b-sft", "--set", f"model.path={checkpoint}", "--set", "model.id=null", "--json"],
    )
    assert result.exit_code == 1
    finding = json.loads(result.stdout)["findings"][0]
    assert finding["code"] == "PRE003" and "hidden_size" in finding["message"]


# The job name, #SBATCH values and environment names are checked whole: a trailing newline is refused too


@pytest.mark.parametrize(
    "field, value",
    [
        ("name", "job\nrm -rf ~"),
        ("name", "job\n"),
        ("name", "tab\there"),
        ("name", "esc\x1b[31m"),
        ("launch.slurm.partition", "gpu\n"),
        ("launch.slurm.account", "me\n"),
        ("launch.slurm.mem", "0\n"),
        ("launch.slurm.extra_sbatch", ["--reservation=x\n"]),
        ("launch.env", {"A\n": "1"}),
        ("launch.pass_env", ["SECRET\n"]),
    ],
)
def test_trailing_newline_and_control_characters_are_refused(tmp_path, field, value):
    section, _, key = field.rpartition(".")
    data = yaml.safe_load((presets_dir() / "selftest-cpu.yaml").read_text())
    node = data
    for part in section.split(".") if section else ():
        node = node.setdefault(part, {})
    node[key] = value
    _finding("PRE002", field, _preset(tmp_path, yaml.safe_dump(data)))


def test_sbatch_filter_refuses_a_trailing_newline():
    sbatch = template_environment(templates_dir()).filters["sbatch"]
    assert sbatch("gpu") == "gpu"
    with pytest.raises(TemplateError):
        sbatch("gpu\n")


# Environment names bash, the loader or Python execute or obey (LCH002), and search paths (LCH003)


@pytest.mark.parametrize("name", sorted(OBEYED_NAMES))
def test_obeyed_environment_names_are_refused(name):
    for changes, path in (
        ({"launch": {"env": {name: "x"}}}, f"launch.env.{name}"),
        ({"launch": {"pass_env": ["WANDB_API_KEY", name]}}, "launch.pass_env[1]"),
    ):
        (finding,) = codes(changes)["LCH002"]
        assert finding.path == path and name in finding.message and OBEYED_NAMES[name] in finding.message


@pytest.mark.parametrize("name", sorted(SEARCH_PATHS))
def test_search_path_overrides_warn(name):
    (finding,) = codes({"launch": {"env": {name: "/opt/x"}}})["LCH003"]
    assert finding.severity.value == "warning" and finding.path == f"launch.env.{name}"
    assert "LCH003" not in codes({"launch": {"pass_env": [name]}})


# Other crashes the fuzzer found: PyYAML's own scalar errors, lone surrogates, paths the OS cannot resolve


@pytest.mark.parametrize(
    "text",
    [
        "train: {seq_length: 0b_}\n",
        "train: {seq_length: 0x_}\n",
        "train: {seq_length: !!int abc}\n",
        "train: {mtp: !!bool maybe}\n",
        "name: !!timestamp x\n",
        "name: !!timestamp 2020-13-45\n",
        "name: !!float x\n",
        'name: "\\ud800"\n',
        '"\\udfff": 1\n',
    ],
)
def test_unreadable_scalars_are_load_errors(tmp_path, text):
    with pytest.raises(PresetLoadError, match=r"p\.yaml:\d+:\d+: .*fix the YAML"):
        load_preset(_preset(tmp_path, BASE + text))


def test_set_value_that_is_not_utf8_is_a_load_error():
    exit_code, data, _ = _invoke("validate", "selftest-cpu", "--set", "name=\udcff")  # how Python keeps b"\xff"
    assert exit_code == 2 and "UTF-8" in data["error"]


def test_paths_the_os_cannot_resolve(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for path in ("~no-such-user-gdnctl/ckpt", f"{loop}/ckpt"):
        finding = _finding(
            "PRE003", "model.path", _preset(tmp_path, BASE.replace("id: Qwen/Qwen3.5-0.8B", f"path: '{path}'"))
        )
        assert "config.json" in finding["message"]
    for reference in ("~no-such-user-gdnctl/p.yaml", "p" * 5000):
        assert _invoke("validate", reference)[0] == 2
    assert _invoke("validate", _preset(tmp_path, BASE + "base: " + "b" * 5000 + "\n"))[0] == 2


def test_non_scalar_keys_in_ordered_maps(tmp_path):
    exit_code, _, _ = _invoke("validate", _preset(tmp_path, BASE + "comm: {skip_ops: !!omap [? [a] : 1]}\n"))
    assert exit_code == 1


def test_positions_and_did_you_mean_still_work(tmp_path):
    finding = _finding("PRE001", "train.micro_batchsize", _preset(tmp_path, BASE + "train:\n  micro_batchsize: 2\n"))
    assert "Did you mean 'micro_batch_size'?" in finding["hint"] and finding["location"].endswith("p.yaml:6:3")


# The fuzzer: presets generated from the schema, every field of every section, with hostile values mixed in


@dataclass(frozen=True)
class _Raw:
    """YAML text written as is: what Python cannot hold as a value (a 5,000-digit int, an alias)."""

    text: str


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar: every character that is not printable as is goes as an escape."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable() and not 0xD800 <= ord(char) <= 0xDFFF:
            out.append(char)
        else:
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def _yaml(value) -> str:
    """Flow-style YAML for anything the strategies make (PyYAML cannot dump huge ints, NaN as .nan, ...)."""
    if isinstance(value, _Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml(k)}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(item) for item in value) + "]"
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, float) and value != value:
        return ".nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    return json.dumps(value)  # int, float, bool, None


def _mostly(common, rare, one_in: int):
    """`common`, and `rare` about one draw in `one_in` (sampled_from, not integers: hypothesis favours an
    integer range's ends, and its simplest choice is the first element, so `common`)."""
    return st.sampled_from([False] * (one_in - 1) + [True]).flatmap(lambda now: rare if now else common)


_CHARS = st.one_of(
    st.characters(),
    st.sampled_from(
        ["\0", "\n", "\t", "\x1b", "\ud800", "\u2028", "é", "😀", "$", "'", '"', "\\", "*", "&", ":", "#", "["]
    ),
)
_TEXT = st.text(_CHARS, max_size=12)
_WORD = st.from_regex(r"[a-z][a-z0-9_.-]{0,11}", fullmatch=True)
_HUGE_LITERAL = st.integers(4000, 6000).map(lambda digits: _Raw("9" * digits))
_INT = _mostly(
    st.integers(1, 8),
    st.one_of(
        st.integers(-3, 300), _HUGE_LITERAL, st.sampled_from([0, 2**24, 2**24 + 1, 2**31, 2**63, 2**64, 10**309])
    ),
    4,
)
_FLOAT = _mostly(st.floats(0.01, 1), st.floats(allow_nan=True, allow_infinity=True), 4)
_SCALAR = st.one_of(st.none(), st.booleans(), _INT, _FLOAT, _TEXT)


def _deep(depth: int, kind: str):
    return _Raw("[" * depth + "]" * depth) if kind == "list" else _Raw("{a: " * depth + "1" + "}" * depth)


def _laughs_value(levels: int, anchor: int) -> _Raw:
    names = [f"h{anchor}_{level}" for level in range(levels)]
    items = [f"&{names[0]} [x, x, x, x, x, x, x, x, x]"]
    items += [f"&{names[i]} [" + ", ".join([f"*{names[i - 1]}"] * 9) + "]" for i in range(1, levels)]
    return _Raw("[" + ", ".join(items) + "]")


HOSTILE = st.one_of(
    _SCALAR,
    st.recursive(
        _SCALAR,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.one_of(_TEXT, st.integers()), inner, max_size=3)
        ),
        max_leaves=6,
    ),
    st.builds(_deep, st.integers(MAX_DEPTH - 2, 80), st.sampled_from(["list", "map"])),
    st.builds(_laughs_value, st.integers(2, 9), st.integers(0, 10**6)),
    st.integers(0, 10**6).map(lambda n: _Raw(f"&r{n} [*r{n}]")),
)

# Fields whose valid values are few: drawn from them mostly, so that presets get past the schema and reach the
# rules, the memory estimate and the renderer; text anywhere else is anything.
_SBATCH_VALUE = _mostly(st.from_regex(r"[A-Za-z0-9_.,:@%+=/&|!*-]{1,12}", fullmatch=True), _TEXT, 4)
_VERSION = _mostly(
    st.sampled_from(["0.4.0", "0.6.2", "0.15.0", "0.18.1", "0.19.2", "0.33.0", "9.19.0", "none"]), _TEXT, 6
)
_ENV_NAMES = st.sampled_from(["A", "WANDB_PROJECT", "PS4", "PATH", "LD_PRELOAD", "PYTHONPATH", "NCCL_DEBUG"])
DOMAIN = {
    "name": _mostly(_WORD, _TEXT, 6),
    "model": st.fixed_dictionaries(
        {
            "id": st.sampled_from(
                [
                    "Qwen/Qwen3.5-0.8B",
                    "Qwen/Qwen3.5-35B-A3B",
                    "Qwen/Qwen3.5-27B",
                    "Qwen/Qwen3-Next-80B-A3B",
                    "Qwen/Qwen3.5-397B-A17B",
                    "Qwen/Nope",
                ]
            )
        }
    ),
    "cluster.gpu": st.sampled_from(sorted(GPUS)),
    "comm.skip_ops": st.lists(st.sampled_from(["all_reduce", "barrier", "broadcast", "nope"]), max_size=3),
    "rollout.gdn_prefill_backend": st.sampled_from(["triton", "flashinfer", "x", None]),
    "launch.env": st.dictionaries(_mostly(_ENV_NAMES, _TEXT, 6), _TEXT, max_size=2),
    "launch.pass_env": st.lists(_mostly(_ENV_NAMES, _TEXT, 6), max_size=2),
    "launch.slurm.time": st.sampled_from(["04:00:00", "2-00:00:00", "30", "1:00:00\n", "x"]),
    "launch.slurm.extra_sbatch": st.lists(st.sampled_from(["--reservation=x", "--comment=$(id)", "-x"]), max_size=2),
    **{f"runtime.{name}": _VERSION for name in RuntimeSpec.model_fields},
    **{f"launch.slurm.{name}": _SBATCH_VALUE for name in ("partition", "account", "qos", "constraint", "mem")},
}
SHIPPED = sorted(path.stem for path in presets_dir().glob("*.yaml"))


def _typed(annotation, path: str):
    """A strategy for values of the schema type `annotation` (a new kind of field type must be taught here)."""
    if path in DOMAIN:
        return DOMAIN[path]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _section(annotation, path)
    if origin is typing.Annotated:  # a tagged union's member (grpo.reward): the type it annotates
        return _typed(args[0], path)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_typed(arg, path) for arg in args))
    if origin is list:
        return st.lists(_field(args[0], f"{path}[]"), max_size=3)
    if origin is dict:
        return st.dictionaries(_TEXT, _field(args[1], f"{path}{{}}"), max_size=3)
    simple = {type(None): st.none(), bool: st.booleans(), int: _INT, float: _FLOAT, str: _TEXT}
    return simple[annotation]


def _field(annotation, path: str):
    """Mostly a value of the field's type; one time in twenty anything at all."""
    return _mostly(_typed(annotation, path), HOSTILE, 20)


def _section(model: type[BaseModel], path: str):
    prefix = f"{path}." if path else ""
    fields = {name: _field(info.annotation, prefix + name) for name, info in model.model_fields.items()}
    required = {name: fields.pop(name) for name, info in model.model_fields.items() if info.is_required()}
    return st.fixed_dictionaries(required, optional=fields)


PRESETS = st.fixed_dictionaries({}, optional={"base": st.sampled_from(SHIPPED)}).flatmap(
    lambda base: st.builds(lambda body: {**base, **body}, _section(Preset, ""))
)
FIELD_PATHS = sorted(
    f"{section}.{name}"
    for section, info in Preset.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
    for name in info.annotation.model_fields
)
OVERRIDES = _mostly(
    st.just([]),
    st.lists(st.tuples(st.sampled_from(FIELD_PATHS + ["zzz", "model.zzz.a"]), HOSTILE), min_size=1, max_size=2),
    4,
)
HANG_S = 5.0  # per command; measured at a few milliseconds, under 1.1 s in 3,000 examples on 2 loaded cores


# 400 examples take about 25 s on 2 cores; on the code before these fixes one example in four crashed or hung.
@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(preset=PRESETS, overrides=OVERRIDES)
def test_schema_fuzz_never_crashes_or_hangs(tmp_path_factory, preset, overrides):
    """validate, then explain when the preset is readable, then launch --dry-run when it is valid."""
    path = tmp_path_factory.mktemp("fuzz") / "p.yaml"
    path.write_text("\n".join(f"{_yaml(key)}: {_yaml(value)}" for key, value in preset.items()) + "\n")
    args = [str(path)] + [arg for key, value in overrides for arg in ("--set", f"{key}={_yaml(value)}")]
    exit_code, _, elapsed = _invoke("validate", *args)
    assert elapsed < HANG_S
    if exit_code != 2:  # readable: explain shows the derived values and the memory table
        assert _invoke("explain", *args)[2] < HANG_S
    if exit_code == 0:  # valid: the scripts render
        result, elapsed = _timed("launch", *args, "--dry-run", "--run-dir", str(path.parent / "run"))
        assert result.exit_code == 0 and elapsed < HANG_S, result.output


@pytest.mark.parametrize(
    "text_config, why",
    [
        ({"full_attention_interval": 0, "layer_types": None}, "full_attention_interval"),
        ({"linear_num_key_heads": 0}, "linear_num_key_heads"),
        ({"num_attention_heads": 0, "head_dim": None}, "cannot use"),
        ({"layer_types": 7}, "cannot use"),
        ({"hidden_size": -5}, "hidden_size"),
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ],
)
def test_a_hostile_checkpoint_config_is_a_pre003_finding_not_a_crash(tmp_path, text_config, why):
    from tests.validate.helpers import write_checkpoint

    checkpoint = write_checkpoint(tmp_path / "ckpt", **text_config)
    config = json.loads((checkpoint / "config.json").read_text())
    config["text_config"] = {k: v for k, v in config["text_config"].items() if v is not None}
    (checkpoint / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(
        app,
        ["validate", "qwen3.5-35b-a3b-sft", "--set", f"model.path={checkpoint}", "--set", "model.id=null", "--json"],
    )
    assert result.exit_code == 1, result.output
    finding = json.loads(result.stdout)["findings"][0]
    assert finding["code"] == "PRE003" and finding["path"] == "model.path" and why in finding["message"]


def test_a_checkpoint_integer_of_thousands_of_digits_is_a_pre003_finding(tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    result = CliRunner().invoke(
        app,
        ["validate", "qwen3.5-35b-a3b-sft", "--set", f"model.path={checkpoint}", "--set", "model.id=null", "--json"],
    )
    assert result.exit_code == 1 and json.loads(result.stdout)["findings"][0]["code"] == "PRE003"
