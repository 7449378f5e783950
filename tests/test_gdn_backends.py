"""The GDN kernel backends' table (gdnctl/knowledge/gdn_backends.py) is the one place a backend is described:
the schema's choices are its names, every entry has its adapter in the runtime, and no other module spells a
backend's name where a decision is made. These read the source and the table; nothing imports a kernel."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from gdnctl.knowledge import DEFAULT_GDN_BACKEND, GDN_BACKENDS, KERNEL_DISTRIBUTIONS, GdnBackendName
from gdnctl.plan import kernel_cache_env
from gdnctl.schema import EngineConfig, Preset

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "gdnctl"
TABLE = PACKAGE_DIR / "knowledge" / "gdn_backends.py"
# (module, name) pairs where the string is not a backend: DEFAULT_STACK's keys are the preset's runtime: fields,
# named after packages, and runtime.fla is the fla package's version.
NOT_A_BACKEND = {("knowledge/stack.py", "fla")}


def test_the_schema_offers_exactly_the_tables_backends_in_its_order():
    assert get_args(GdnBackendName) == tuple(GDN_BACKENDS)
    preset_kernels = Preset.model_fields["kernels"].annotation.model_fields["gdn_backend"]
    engine_kernels = EngineConfig.model_fields["kernels"].annotation.model_fields["gdn_backend"]
    assert preset_kernels.annotation is GdnBackendName and engine_kernels.annotation is GdnBackendName
    assert preset_kernels.default == DEFAULT_GDN_BACKEND


def test_every_backend_has_its_adapter_in_the_runtime_and_no_adapter_lacks_a_backend():
    from gdnctl.runtime.kernels.backends import PROBLEM_FINDERS

    assert list(PROBLEM_FINDERS) and set(PROBLEM_FINDERS) == set(GDN_BACKENDS)


@pytest.mark.parametrize("backend", GDN_BACKENDS.values(), ids=list(GDN_BACKENDS))
def test_every_entry_says_what_each_reader_needs(backend):
    assert backend.distributions and set(backend.distributions) | set(backend.requires) <= set(KERNEL_DISTRIBUTIONS)
    # prewarm reads the backend's compiler cache from the variables the rendered scripts set
    assert backend.cache_variable in {name for name, _, _ in kernel_cache_env("/cache")}
    # a compile gdnctl cannot watch is announced with its cost instead
    assert backend.shows_compile_progress or backend.cold_compile
    if backend.gpus is not None:
        assert backend.forward_only_gpus <= backend.gpus
    assert bool(backend.environment) == bool(backend.environment_reason)


def spelled_backend_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every string constant that is exactly a backend's name: a name compared, looked up,
    passed or keyed. A name inside a sentence (a hint such as "set kernels.gdn_backend: fla") is not one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in GDN_BACKENDS
    )


def test_only_the_table_spells_a_backends_name():
    found = [
        f"{path.relative_to(PACKAGE_DIR)}:{line}: {name!r}"
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if path != TABLE
        for line, name in spelled_backend_names(path)
        if (path.relative_to(PACKAGE_DIR).as_posix(), name) not in NOT_A_BACKEND
    ]
    assert found == [], "read the backend from gdnctl/knowledge/gdn_backends.py instead:\n" + "\n".join(found)


def test_the_spelling_check_sees_a_comparison_and_passes_a_sentence(tmp_path):
    module = tmp_path / "module.py"
    module.write_text('if backend == "flashqla":\n    hint = "or set kernels.gdn_backend: fla"\n')
    assert spelled_backend_names(module) == [(1, "flashqla")]
