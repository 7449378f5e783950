"""The model-family table (gdnctl/knowledge/model_families.py) is the one place a GDN family is described: every
catalog entry names a family it has, a checkpoint of another model type is refused with a sentence, and no other
module spells a family's model type or HF class names where a decision is made. These read the source and the
table; nothing imports torch."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gdnctl.knowledge import MODEL_FAMILIES, ModelNotFound, catalog, family_of, lora
from gdnctl.knowledge.model_families import GDN_IN_MODULES

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "gdnctl"
TABLE = PACKAGE_DIR / "knowledge" / "model_families.py"
SPELLINGS = {
    name
    for family in MODEL_FAMILIES.values()
    for name in (*family.model_types, *family.hf_classes, family.text_config_class)
}


def test_every_catalog_model_belongs_to_a_family():
    for model_id in catalog.catalog_ids():
        arch = catalog.from_catalog(model_id)
        assert arch.family is family_of(arch.model_type), model_id
        assert arch.architecture in arch.family.hf_classes, (model_id, arch.architecture)
        assert arch.family.moe == arch.is_moe, model_id


@pytest.mark.parametrize("family", MODEL_FAMILIES.values(), ids=list(MODEL_FAMILIES))
def test_every_entry_says_what_each_reader_needs(family):
    assert family.name in family.model_types and family.text_model_type in family.model_types
    assert family.text_class.endswith("ForCausalLM")
    assert family.vision_language_class is None or family.vision_language_class.endswith("ForConditionalGeneration")
    assert family.gdn_in_modules == GDN_IN_MODULES[family.gdn_in_projection]
    # vLLM serves a vision-language class only where one exists, and gdnctl has run it from some release
    if family.vllm_text_class_since is not None:
        assert family.vision_language_class is not None and family.vllm_vision_language_checked is not None


def test_lora_adapts_the_familys_own_gdn_input_modules():
    for model_id in catalog.catalog_ids():
        arch = catalog.from_catalog(model_id)
        assert lora.hf_modules(arch, "gdn_in") == arch.family.gdn_in_modules


def test_a_checkpoint_of_another_model_type_is_refused_with_a_sentence(tmp_path):
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelNotFound, match="names model_type 'llama', which is not a Gated DeltaNet family") as err:
        catalog.from_checkpoint(str(tmp_path))
    for family in MODEL_FAMILIES.values():
        assert family.name in str(err.value)


def spelled_family_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every string constant that is exactly a family's model type or HF class name: a name
    compared, looked up, written or imported by string. A name inside a sentence is not one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in SPELLINGS
    )


def imported_family_classes(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every `from transformers import <a family's class>`: the CPU policy takes its classes
    from the table by name instead."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted(
        (node.lineno, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name in SPELLINGS
    )


def test_only_the_table_spells_a_family():
    found = [
        f"{path.relative_to(PACKAGE_DIR)}:{line}: {name!r}"
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if path != TABLE
        for line, name in (*spelled_family_names(path), *imported_family_classes(path))
    ]
    assert found == [], "read the family from gdnctl/knowledge/model_families.py instead:\n" + "\n".join(found)


def test_the_spelling_check_sees_a_comparison_an_import_and_passes_a_sentence(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        'if model_type == "qwen3_next":\n    hint = "a qwen3_next checkpoint"\n'
        "from transformers import Qwen3_5ForCausalLM\n"
    )
    assert spelled_family_names(module) == [(1, "qwen3_next")]
    assert imported_family_classes(module) == [(3, "Qwen3_5ForCausalLM")]
