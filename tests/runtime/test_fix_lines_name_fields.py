"""Every preset field a runtime message names exists in the preset schema.

The runtime's errors end with a fix ("set model.tokenizer to ..."), and a fix that names a key the preset does
not have (`train.tokenizer_path`, `device: cpu`) sends a user to edit a field that cannot be written. This walks
every string the runtime's code holds (error messages and their f-string parts alike), takes each dotted name
that starts with a preset section, and resolves it through the pydantic models of gdnctl.schema.Preset.
"""

from __future__ import annotations

import ast
import re
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from gdnctl.schema import Preset

RUNTIME = Path(__file__).resolve().parents[2] / "gdnctl" / "runtime"
SECTIONS = sorted(Preset.model_fields)
DOTTED = re.compile(r"(?<![\w./-])({})\.([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)".format("|".join(SECTIONS)))
# Words a message puts after a bare key to tell the user to set it ("render the preset with device: cpu").
BARE_KEY = re.compile(r"(?:preset with|[Ss]et) ([a-z_]+): ")
# Dotted names that are not preset fields and say so by their form: files (metrics.jsonl, model.safetensors, a
# module's job.py) and Hugging Face / Megatron tensor names (model.layers.0...).
NOT_FIELDS = re.compile(
    r"\.(jsonl?|py|safetensors|weight|log)(\.|$)|^model\.(layers|embed_tokens|norm|mtp|visual|"
    r"language_model)\b|^job\.reported$"
)
# Engine-config fields a message names as such ("compiled for parallel.world_size 8"): the engine config's
# section, not a key the user writes.
ENGINE_ONLY = {"parallel.world_size"}


def _model(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model(arg)
            if found is not None:
                return found
    return None


def _resolves(path: str) -> bool:
    model: type[BaseModel] | None = Preset
    parts = path.split(".")
    for index, part in enumerate(parts):
        if model is None or part not in model.model_fields:
            # A mapping field (launch.env, metrics.wandb.tags ...) takes any key below it.
            return model is None and index > 0
        model = _model(model.model_fields[part].annotation)
    return True


def _runtime_strings():
    """Every string constant of the runtime's code but docstrings (they speak of the engine config's fields)."""
    for path in sorted(RUNTIME.rglob("*.py")):
        tree = ast.parse(path.read_text())
        owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, owners)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                yield f"{path.relative_to(RUNTIME)}:{node.lineno}", node.value


def test_every_preset_field_a_runtime_message_names_exists():
    named, wrong = 0, []
    for where, text in _runtime_strings():
        for match in DOTTED.finditer(text):
            name = match.group(0)
            if NOT_FIELDS.search(name) or name in ENGINE_ONLY:
                continue
            named += 1
            if not _resolves(name):
                wrong.append(f"{where}: {name}")
        for match in BARE_KEY.finditer(text):
            if match.group(1) not in Preset.model_fields:
                wrong.append(f"{where}: {match.group(1)}: (no such top-level key)")
    assert named > 30, "the walk found too few field names: the pattern no longer matches the messages"
    assert wrong == [], "runtime messages name preset fields that do not exist:\n" + "\n".join(wrong)


def test_the_walk_catches_the_names_it_is_for():
    assert not _resolves("train.tokenizer_path") and _resolves("model.tokenizer")
    assert _resolves("rollout.python") and not _resolves("cluster.device")
    assert BARE_KEY.search("render the preset with device: cpu").group(1) == "device"
