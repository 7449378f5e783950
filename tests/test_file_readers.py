"""Every reader of a file gdnctl did not just write, on generated damage: each either reads it or stops with a
GdnctlError whose one sentence names the file, never a hang, another exception or a crash further on.

Each reader in READERS starts from a file it reads (VALID), which the generator damages the ways such files
arrive damaged: a field of another type or missing (a hand edit, another version's format), a value no later use
survives (an integer of 5,001 digits, a lone surrogate escape, a path leading out, a control character), nesting
past any format, cut short (a killed write), stray bytes and non-UTF-8 text, or another kind of file at the name
(a FIFO, a directory, a device). The readers all go through gdnctl/files.py (read_regular, read_text, read_json,
read_jsonl, decode_json, typed); the test holds them to what that promises rather than to a list of cases.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from gdnctl.errors import GdnctlError
from gdnctl.launch import run_dir as run_dirs
from gdnctl.launch import runs, smoke
from gdnctl.runtime.data import pipeline
from gdnctl.runtime.model import checkpoint, passthrough
from gdnctl.runtime.model.durable_files import document_checksum
from gdnctl.runtime.rl.prompts.chat_template import load_chat_template
from gdnctl.runtime.rl.prompts.dataset import load_prompts
from gdnctl.runtime.train import metrics
from tests.runtime.model.test_hf_weights import TINY

HOLE = "\u0000hole\u0000"  # where a generated value goes into a document


@dataclass(frozen=True)
class Reader:
    """A reader of `name` (a path inside the test's directory): `valid` is what it reads, `read` reads it."""

    name: str
    valid: Callable[[Path], bytes]  # the file's content, given the directory (some name what is beside them)
    read: Callable[[Path], object]  # reads the file (through what gdnctl does with it) from the directory
    jsonl: bool = False  # one JSON value a line
    prepare: Callable[[Path], None] = lambda directory: None  # what else the directory holds


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


WEIGHTS = b"\0\1\2\3"


def _trainer_state(directory: Path) -> bytes:
    state = {
        "iteration": 1,
        "consumed_samples": 8,
        "world_size": 1,
        "files": {"model.safetensors": {"size": len(WEIGHTS), "sha256": _sha256(WEIGHTS)}},
    }
    return json.dumps({**state, "state_sha256": document_checksum(state)}, indent=2).encode()


def _checkpoint(directory: Path) -> None:
    checkpoint_dir = directory / "save" / "iter_0000001"
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    (checkpoint_dir / "model.safetensors").write_bytes(WEIGHTS)
    state = checkpoint_dir / "trainer_state.json"
    if not os.path.lexists(state):
        state.write_bytes(_trainer_state(directory))
    latest = directory / "save" / "latest"
    if not os.path.lexists(latest):
        latest.write_text("iter_0000001\n")


def _resume(directory: Path) -> object:
    found = checkpoint.latest_checkpoint(directory / "save")
    return found and checkpoint.read_training_state(found, world_size=1)


def _tensor_file(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({"model.norm.weight": torch.ones(4)}, str(directory / "model-00000.safetensors"))


def _safetensors(directory: Path) -> bytes:
    """A safetensors file (its header is what the generator damages, the length prefix following it)."""
    path = directory / "valid.safetensors"
    save_file({"model.norm.weight": torch.ones(4), "mtp.fc.weight": torch.zeros(2, 2)}, str(path))
    return path.read_bytes()


def _run_dir(directory: Path) -> Path:
    return directory / "run"


def _rendered(directory: Path) -> None:
    """A run dir as `gdnctl render` leaves it (its manifest aside, which the manifest reader's file is)."""
    run_dir = _run_dir(directory)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    for name in ("engine.yaml", "launch_local.sh", "launch_slurm.sbatch"):
        (run_dir / name).write_text(f"# {name}\n")


def _manifest(directory: Path) -> bytes:
    files = [
        {"path": name, "sha256": _sha256(f"# {name}\n".encode())}
        for name in ("engine.yaml", "launch_local.sh", "launch_slurm.sbatch")
    ]
    return json.dumps(
        {
            "gdnctl_version": "0.1.0",
            "engine_config_sha256": files[0]["sha256"],
            "resolved": {"name": "selftest-cpu", "job": "selftest"},
            "launch": {"executor": "local", "job_name": "selftest-cpu"},
            "files": [*files, {"path": "manifest.json"}],
        },
        indent=2,
    ).encode()


def _smoke_report(directory: Path) -> bytes:
    check = {"name": "comm guard", "status": "ok", "detail": "fine"}
    measured = dict.fromkeys(
        ("step_seconds", "peak_memory_gib", "memory_source", "estimate_peak_memory_gib", "estimate_allocated_gib")
    )
    return json.dumps({"job": "selftest", "ranks": 2, "green": True, "checks": [check], "measured": measured}).encode()


def _metrics(directory: Path) -> object:
    log = metrics.MetricsLog.__new__(metrics.MetricsLog)
    log.path = directory / metrics.METRICS_FILE
    log._keep_records_up_to(2)
    return log.path.read_bytes()


def _outcome(directory: Path) -> object:
    found = smoke.read_outcome(_run_dir(directory), 0)
    found.verdict()  # never raises: an unreadable report is a failed smoke, said in the verdict
    return found


TEMPLATE = "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
READERS = {
    "latest": Reader("save/latest", lambda d: b"iter_0000001\n", _resume, prepare=_checkpoint),
    "trainer_state.json": Reader("save/iter_0000001/trainer_state.json", _trainer_state, _resume, prepare=_checkpoint),
    "chat_template.jinja": Reader(
        "tok/chat_template.jinja",
        lambda d: TEMPLATE.encode(),
        lambda d: (template := load_chat_template(d / "tok")) and template.render([{"role": "user", "content": "hi"}]),
    ),
    "tokenizer_config.json": Reader(
        "tok/tokenizer_config.json",
        lambda d: json.dumps(
            {"chat_template": [{"name": "default", "template": TEMPLATE}], "eos_token": "<e>"}
        ).encode(),
        lambda d: (load_chat_template(d / "tok"), pipeline._configured_eos_token(d / "tok")),
    ),
    "rl prompts": Reader(
        "prompts.jsonl",
        lambda d: (
            b'{"prompt": "1+1=", "answer": 2}\n{"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}\n'
        ),
        lambda d: load_prompts(d / "prompts.jsonl"),
        jsonl=True,
    ),
    "training data": Reader(
        "train.jsonl",
        lambda d: b'{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5], "loss_mask": [1, 1]}\n',
        lambda d: pipeline.read_documents(d / "train.jsonl", vocab_size=16),
        jsonl=True,
    ),
    "index": Reader(
        "ckpt/model.safetensors.index.json",
        lambda d: json.dumps({"metadata": {}, "weight_map": {"model.norm.weight": "model-00000.safetensors"}}).encode(),
        lambda d: checkpoint.HFReader(d / "ckpt").get("model.norm.weight"),
        prepare=lambda d: _tensor_file(d / "ckpt"),
    ),
    "config.json": Reader(
        "ckpt/config.json",
        lambda d: json.dumps({"architectures": ["Qwen3_5ForCausalLM"], "mtp_num_hidden_layers": 1}).encode(),
        lambda d: checkpoint.run_source(TINY, d / "ckpt"),
        prepare=lambda d: (
            _tensor_file(d / "ckpt"),
            (d / "ckpt" / checkpoint.INDEX_FILE).write_text(
                json.dumps({"weight_map": {"model.norm.weight": "model-00000.safetensors"}})
            ),
        ),
    ),
    "safetensors header": Reader(
        "source.safetensors",
        _safetensors,
        lambda d: (
            passthrough.write_passthrough({"mtp.fc.weight": d / "source.safetensors"}, d / "out.safetensors"),
            (d / "out.safetensors").read_bytes(),
        ),
    ),
    "metrics.jsonl": Reader(
        metrics.METRICS_FILE,
        lambda d: b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.0}\n{"step": 3, "loss": 1.5}\n',
        _metrics,
        jsonl=True,
    ),
    "W&B run id": Reader("wandb/run_id", lambda d: b"0123456789ab\n", lambda d: metrics.wandb_run_id(d)),
    "manifest.json": Reader("run/manifest.json", _manifest, lambda d: runs.status(_run_dir(d)), prepare=_rendered),
    "Slurm job record": Reader(
        f"run/{run_dirs.SLURM_JOBS_FILE}",
        lambda d: b"41\n42\n",
        lambda d: run_dirs.recorded_slurm_jobs(_run_dir(d)),
        prepare=_rendered,
    ),
    "local exit record": Reader(
        "run/.gdnctl-local-exit.json",
        lambda d: b'{"exit_code": 0, "ended_at": "2026-01-01T00:00:00+00:00"}',
        lambda d: run_dirs.read_local_exit(_run_dir(d)),
        prepare=_rendered,
    ),
    "smoke.json": Reader("run/smoke.json", _smoke_report, _outcome, prepare=_rendered),
}

# What a field can hold after a hand edit or another version's write: any JSON value, and raw JSON text that is
# valid JSON Python's json module takes but nothing after it can use (or that is no JSON at all).
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
RAW_JSON = st.sampled_from(
    [
        "7" * 5001,
        '"\\ud800"',
        '"x\\udfff"',
        '"../../etc/passwd"',
        '"/etc/passwd"',
        '"iter_0000001/../../x"',
        "NaN",
        "-Infinity",
        "1e999",
        "-1",
        '"\\u001b[31m"',
        '"\x1b"',
        '"a\\u0000b"',
        "[" * 70 + "]" * 70,
        "{" + '"a":{' * 70 + "}" * 71,
    ]
)
KINDS = ("fifo", "directory", "device")


def _paths(value, prefix=()):
    """Every place in a JSON value: (keys and indices from the top)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _replaced(document, path, new):
    if not path:
        return new
    copy = json.loads(json.dumps(document))
    place = copy
    for part in path[:-1]:
        place = place[part]
    if new is _DELETE:
        place.pop(path[-1]) if isinstance(place, dict) else place.pop(path[-1])
    else:
        place[path[-1]] = new
    return copy


_DELETE = object()


@st.composite
def damaged(draw, valid: bytes, jsonl: bool) -> bytes | str:
    """`valid` damaged one way: bytes, or one of KINDS."""
    how = draw(st.sampled_from(["field", "raw", "nest", "cut", "bytes", "kind"]))
    if how == "kind":
        return draw(st.sampled_from(KINDS))
    if how == "cut":
        return valid[: draw(st.integers(0, max(len(valid) - 1, 0)))]
    if how == "bytes":
        at = draw(st.integers(0, len(valid)))
        stray = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\0", b"\x1b[2J", b"\r", b'"', b"}"]))
        return valid[:at] + stray + valid[at:]
    if how == "nest":
        depth = draw(st.sampled_from([65, 900, 100_000]))
        return b"[" * depth + valid.strip() + b"]" * depth
    lines = valid.splitlines(keepends=True) if jsonl else [valid]
    index = draw(st.integers(0, len(lines) - 1))
    try:
        document = json.loads(lines[index])
    except ValueError:  # not JSON (latest, a template, a run id): the stray bytes above are its damage
        return lines[index][: len(lines[index]) // 2] + draw(RAW_JSON).encode(errors="surrogatepass")
    path = draw(st.sampled_from(list(_paths(document))))
    if how == "field":
        new = draw(JSON_VALUES | st.just(_DELETE)) if path else draw(JSON_VALUES)
        text = json.dumps(_replaced(document, path, new))
    else:
        text = json.dumps(_replaced(document, path, HOLE)).replace(json.dumps(HOLE), draw(RAW_JSON))
    lines[index] = text.encode(errors="surrogatepass") + (b"\n" if jsonl else b"")
    return b"".join(lines)


class Hang(Exception):
    pass


def _no_hang(signum, frame):
    raise Hang("the reader did not return within 20 s")


def _place(path: Path, content: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif os.path.lexists(path):
        path.unlink()
    if content == "fifo":
        os.mkfifo(path)
    elif content == "directory":
        path.mkdir()
    elif content == "device":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(content)


def _with_header(valid: bytes, header: bytes) -> bytes:
    """A safetensors file with its JSON header replaced (the length prefix says the new length)."""
    length = struct.unpack("<Q", valid[:8])[0]
    return struct.pack("<Q", len(header)) + header + valid[8 + length :]


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo group: the resume readers are collective."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_the_valid_file_reads(tmp_path, one_rank, reader):
    reader.prepare(tmp_path)
    _place(tmp_path / reader.name, reader.valid(tmp_path))
    assert reader.read(tmp_path) is not None


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_file_is_read_or_refused_with_a_sentence_naming_it(tmp_path, one_rank, reader, data):
    directory = Path(tempfile.mkdtemp(dir=tmp_path))  # each example its own: the last one's files are not this one's
    reader.prepare(directory)
    valid = reader.valid(directory)
    if reader.name.endswith(".safetensors"):  # the header is the JSON; the tensors' bytes stay as they are
        length = struct.unpack("<Q", valid[:8])[0]
        header = data.draw(damaged(valid[8 : 8 + length], jsonl=False))
        content = header if isinstance(header, str) else _with_header(valid, header)
    else:
        content = data.draw(damaged(valid, reader.jsonl))
    path = directory / reader.name
    _place(path, content)
    previous = signal.signal(signal.SIGALRM, _no_hang)
    signal.alarm(20)
    try:
        reader.read(directory)
    except GdnctlError as error:
        message = str(error)
        # The file, or for what its content says of the directory it describes (a tensor its index lacks), that.
        assert path.name in message or str(path.parent) in message, message
        assert "\n" not in message, message  # one sentence (the reporters write what a terminal acts on as escapes)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
