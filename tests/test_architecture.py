"""The package's layers (ARCHITECTURE.md), checked on the source: no import circle, no import up a layer,
cross-package imports through the package's public API (`__all__`), and the sizes the layout promises.

Imports are read with `ast` from every module, function-level imports included (a lazy import still ties
two modules together), so nothing here imports the runtime's heavy dependencies.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "gdnctl"

# Bottom up. Modules directly in gdnctl/ other than cli and __main__ (errors, resources, the version) are the
# base everything may use. launch and doctor sit side by side and do not import each other.
LAYER_RANK = {
    "base": 0,
    "knowledge": 1,
    "schema": 2,
    "plan": 3,
    "validate": 4,
    "launch": 5,
    "doctor": 5,
    "cli": 6,
    "__main__": 7,
}
# What the runtime (the code the rendered scripts execute on the cluster) may import besides itself.
RUNTIME_MAY_IMPORT = {"base", "knowledge", "schema"}
# Above the runtime: launch (prewarm) and doctor (kernel checks) run the runtime's kernels.
MAY_IMPORT_RUNTIME = {"launch", "doctor", "cli", "__main__"}
# Inside the runtime, bottom up: a subpackage (or module directly in runtime/) imports only ranks below its own,
# so two of one rank sit side by side. The checks every job makes (checks/) sit below the jobs (train/, rl/), and
# the smoke run that drives the jobs (smoke/) above them; `gdnctl.runtime` itself (the lazy __init__) is for the
# entry point only.
RUNTIME_RANK = {
    "exports": 0,
    "comm": 1,
    "data": 1,
    "kernels": 1,
    "checks": 1,
    "launcher": 1,
    "model": 2,
    "train": 3,
    "rl": 4,
    "selftest": 4,
    "smoke": 5,
    "__main__": 6,
}
# Inside runtime/rl, the same rule one level down (rl/__init__.py says what each part is): where a process listens
# for a peer on another node at the bottom; the prompts, the learning rule and the weight syncs above it; the
# rollout (whose server takes the syncs in) and the policies (which train on the algorithm's losses and export
# through the syncs) above those; the held-out evaluation above them, and the loop
# that runs it all on top.
RL_RANK = {
    "network": 0,
    "user_code": 0,
    "prompts": 1,
    "algorithm": 1,
    "weights": 1,
    "rewards": 1,
    "environments": 1,
    "rollout": 2,
    "policy": 2,
    "evaluation": 3,
    "feed": 3,
    "job": 4,
}


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted module (or package) name imported from
    names: tuple[str, ...]  # names taken with `from target import ...`; () for `import target`
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def is_package(name: str, modules: dict[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def imports_of(name: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gdnctl":
                    found.append(Import(name, alias.name, (), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "gdnctl":
                found.append(Import(name, target, tuple(a.name for a in node.names), node.lineno))
    return found


def area(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return "base"
    top = parts[1]
    if top in ("cli", "__main__"):
        return top
    if (PACKAGE_DIR / top).is_dir():
        return top
    return "base"


def edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> modules it imports (a `from package import submodule` counts as the submodule)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for imp in imports_of(name, path):
            submodules = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in modules]
            graph[name].update(submodules)
            # `from package import submodule` needs the submodule, not the package's other exports
            if len(submodules) < len(imp.names) or not imp.names:
                graph[name].add(imp.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def package_exports(package: str, modules: dict[str, Path]) -> set[str] | None:
    """The names in a package's `__all__`, or None when it has none. (Importing a package is light: the
    runtime's subpackages resolve their names lazily.)"""
    exported = getattr(importlib.import_module(package), "__all__", None)
    return None if exported is None else set(exported)


def layer_violations(modules: dict[str, Path]) -> list[str]:
    problems = []
    for name, path in modules.items():
        here = area(name)
        for imp in imports_of(name, path):
            there = area(imp.target)
            if here == there:
                continue
            where = f"{path.relative_to(PACKAGE_DIR.parent)}:{imp.line}"
            if here == "runtime":
                if there not in RUNTIME_MAY_IMPORT:
                    problems.append(f"{where}: the runtime imports {imp.target} ({there})")
            elif there == "runtime":
                if here not in MAY_IMPORT_RUNTIME:
                    problems.append(f"{where}: {here} imports the runtime ({imp.target})")
            elif LAYER_RANK[there] >= LAYER_RANK[here]:
                problems.append(f"{where}: {here} imports {imp.target}, which is not below it ({there})")
    return problems


def runtime_part(name: str) -> str | None:
    """The runtime subpackage (or module directly in runtime/) a module belongs to; None outside the runtime and
    for `gdnctl.runtime` itself."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "runtime" else None


def runtime_rank_violations(modules: dict[str, Path]) -> list[str]:
    problems = []
    for name, path in modules.items():
        here = runtime_part(name)
        if here is None:
            continue
        if here not in RUNTIME_RANK:
            problems.append(f"gdnctl.runtime.{here} has no rank: add it to RUNTIME_RANK")
            continue
        for imp in imports_of(name, path):
            targets = (
                ([f"{imp.target}.{n}" for n in imp.names] or [imp.target])
                if imp.target == "gdnctl.runtime"
                else [imp.target]
            )
            for target in targets:
                there = runtime_part(target)
                if there is None or there == here:
                    continue
                shown = path.relative_to(PACKAGE_DIR.parent) if path.is_relative_to(PACKAGE_DIR.parent) else path
                where = f"{shown}:{imp.line}"
                if there not in RUNTIME_RANK:
                    problems.append(f"{where}: gdnctl.runtime.{there} has no rank: add it to RUNTIME_RANK")
                elif RUNTIME_RANK[there] >= RUNTIME_RANK[here]:
                    problems.append(f"{where}: runtime/{here} imports {target}, which is not below it ({there})")
    return sorted(set(problems))


def rl_part(name: str) -> str | None:
    """The part of runtime/rl (a subpackage or a module directly in it) a module belongs to; None outside rl and
    for `gdnctl.runtime.rl` itself."""
    parts = name.split(".")
    return parts[3] if len(parts) > 3 and parts[1:3] == ["runtime", "rl"] else None


def rl_rank_violations(modules: dict[str, Path]) -> list[str]:
    problems = []
    for name, path in modules.items():
        here = rl_part(name)
        if here is None:
            continue
        if here not in RL_RANK:
            problems.append(f"gdnctl.runtime.rl.{here} has no rank: add it to RL_RANK")
            continue
        for imp in imports_of(name, path):
            targets = [f"{imp.target}.{n}" for n in imp.names] if imp.target == "gdnctl.runtime.rl" else [imp.target]
            for target in targets:
                there = rl_part(target)
                if there is None or there == here:
                    continue
                shown = path.relative_to(PACKAGE_DIR.parent) if path.is_relative_to(PACKAGE_DIR.parent) else path
                where = f"{shown}:{imp.line}"
                if there not in RL_RANK:
                    problems.append(f"{where}: gdnctl.runtime.rl.{there} has no rank: add it to RL_RANK")
                elif RL_RANK[there] >= RL_RANK[here]:
                    problems.append(f"{where}: rl/{here} imports {target}, which is not below it ({there})")
    return sorted(set(problems))


def deep_import_violations(modules: dict[str, Path]) -> list[str]:
    """Imports from another package that bypass its `__init__` or take names it does not export."""
    problems = []
    for name, path in modules.items():
        for imp in imports_of(name, path):
            where = f"{path.relative_to(PACKAGE_DIR.parent)}:{imp.line}"
            target = imp.target
            if is_package(target, modules):
                owner = target
                if owner == "gdnctl":
                    continue  # the base modules and the version: for everyone
                if name == owner or name.startswith(owner + "."):
                    # a module importing its own package's __init__ goes round in a circle
                    through_own_init = name != owner and imp.names and modules[name].name != "__init__.py"
                    if through_own_init and not all(f"{owner}.{n}" in modules for n in imp.names):
                        problems.append(f"{where}: import siblings directly, not through {owner}")
                    continue
                exported = package_exports(owner, modules)
                if exported is None:
                    problems.append(f"{where}: {owner} has no __all__")
                    continue
                missing = [n for n in imp.names if n not in exported]
                if missing:
                    problems.append(f"{where}: {owner} does not export {', '.join(missing)}")
            else:
                owner = target.rsplit(".", 1)[0]
                if owner == "gdnctl" or name.startswith(owner + ".") or name == owner:
                    continue
                problems.append(f"{where}: import {target} through its package {owner}")
    return problems


MODULES = all_modules()


def test_no_import_circle():
    assert cycles(edges(MODULES)) == []


def test_no_import_points_up_a_layer():
    assert layer_violations(MODULES) == []


def test_no_runtime_import_points_up_a_rank():
    assert runtime_rank_violations(MODULES) == []


def test_no_rl_import_points_up_a_rank():
    assert rl_rank_violations(MODULES) == []


def test_the_rl_check_sees_a_sync_importing_the_loop(tmp_path):
    """The split this guards: the weight syncs (weights/) importing the loop (job) is reported."""
    module = tmp_path / "sync.py"
    module.write_text("from gdnctl.runtime.rl import job\nfrom gdnctl.runtime.rl.network import LOOPBACK\n")
    assert rl_rank_violations({"gdnctl.runtime.rl.weights.sync": module}) == [
        f"{module}:1: rl/weights imports gdnctl.runtime.rl.job, which is not below it (job)"
    ]


def test_other_packages_are_used_through_their_public_api():
    assert deep_import_violations(MODULES) == []


@pytest.mark.parametrize("package", sorted(m for m in MODULES if is_package(m, MODULES) and m != "gdnctl"))
def test_every_package_names_its_public_api(package):
    exported = package_exports(package, MODULES)
    assert exported is not None, f"{package}/__init__.py has no __all__"


def test_top_level_and_runtime_stay_small():
    top = [p.name for p in PACKAGE_DIR.glob("*.py")]
    runtime = [p.name for p in (PACKAGE_DIR / "runtime").glob("*.py")]
    assert len(top) <= 8, top
    assert len(runtime) <= 4, runtime


def test_the_checker_sees_a_circle_and_an_upward_import():
    """The checks above would catch what they claim to (a known-bad graph and import)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert area("gdnctl.runtime.rl.job") == "runtime" and area("gdnctl.errors") == "base"
    assert LAYER_RANK[area("gdnctl.validate.pipeline")] > LAYER_RANK[area("gdnctl.plan.run")]


def test_the_runtime_check_sees_a_job_importing_the_smoke_run(tmp_path):
    """The split this guards: a job (train/) importing the smoke run's drivers (smoke/) is reported."""
    module = tmp_path / "trainer.py"
    module.write_text("from gdnctl.runtime.smoke import runner\nfrom gdnctl.runtime.checks import verdicts\n")
    assert runtime_rank_violations({"gdnctl.runtime.train.trainer": module}) == [
        f"{module}:1: runtime/train imports gdnctl.runtime.smoke, which is not below it (smoke)"
    ]


if __name__ == "__main__":
    for problem in [*map(str, cycles(edges(MODULES))), *layer_violations(MODULES), *deep_import_violations(MODULES)]:
        print(problem)


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                names.update(e.id for e in elements if isinstance(e, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


LAZY_PACKAGES = sorted(
    module_name(path)
    for path in (PACKAGE_DIR / "runtime").rglob("__init__.py")
    if "lazy_attributes" in path.read_text()
)


def test_every_runtime_package_with_subpackages_resolves_lazily():
    """A new runtime subpackage (rl's parts included) gets the lazy __init__ the others have."""
    assert {
        "gdnctl.runtime.rl",
        "gdnctl.runtime.rl.algorithm",
        "gdnctl.runtime.rl.policy",
        "gdnctl.runtime.rl.prompts",
        "gdnctl.runtime.rl.rollout",
        "gdnctl.runtime.rl.weights",
    } <= set(LAZY_PACKAGES)
    for path in (PACKAGE_DIR / "runtime").rglob("__init__.py"):
        if path.parent != PACKAGE_DIR / "runtime":
            assert "lazy_attributes" in path.read_text(), path


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_lazy_runtime_name_is_defined_where_its_package_says(package):
    """The runtime's subpackages resolve names on first use; a wrong entry would only fail on the cluster. A home
    is a module of the package (which defines the name) or a subpackage of it (which resolves it in turn)."""
    module = importlib.import_module(package)
    folder = PACKAGE_DIR.parent.joinpath(*package.split("."))
    homes = module._HOMES  # name -> the submodule that defines it
    assert set(homes) <= set(module.__all__)
    for name, home in homes.items():
        if (folder / home).is_dir():
            assert name in importlib.import_module(f"{package}.{home}").__all__, (package, name, home)
        else:
            assert name in _top_level_names(folder / f"{home}.py"), (package, name, home)
    for name in set(module.__all__) - set(homes):
        assert (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file(), (package, name)


# --- the map: ARCHITECTURE.md (and the README's layout) name every part the code has ---------------------------
MAP = (PACKAGE_DIR.parent / "ARCHITECTURE.md").read_text()
README = (PACKAGE_DIR.parent / "README.md").read_text()
LAYER_PACKAGES = ("knowledge", "schema", "plan", "validate", "launch", "doctor")


def _layer_row(package: str) -> str:
    return next(line for line in MAP.splitlines() if line.startswith("| ") and f"`{package}/`" in line)


@pytest.mark.parametrize("package", LAYER_PACKAGES)
def test_the_map_names_every_module_of_a_layer(package):
    row = _layer_row(package)
    modules = sorted(
        path.stem if path.is_file() else path.name
        for path in (PACKAGE_DIR / package).iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    )
    missing = [name for name in modules if f"`{name}`" not in row and f"`{name}/`" not in row]
    assert missing == [], f"ARCHITECTURE.md's {package}/ row does not name {missing}"


def test_the_map_and_the_readme_name_every_runtime_subpackage():
    subpackages = sorted(p.name for p in (PACKAGE_DIR / "runtime").iterdir() if (p / "__init__.py").is_file())
    assert set(subpackages) <= set(RUNTIME_RANK), "give every runtime subpackage a rank"
    for text, where in ((MAP, "ARCHITECTURE.md"), (README, "README.md")):
        missing = [name for name in subpackages if f"`{name}/`" not in text]
        assert missing == [], f"{where} does not name runtime/{missing}"


def test_the_map_names_every_room_of_rl():
    rooms = sorted(
        path.stem if path.is_file() else f"{path.name}/"
        for path in (PACKAGE_DIR / "runtime" / "rl").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    )
    table = [line for line in MAP.splitlines() if line.startswith("| ") and "rl part" not in line]
    missing = [room for room in rooms if not any(f"`{room}`" in line or f"`{room}.py`" in line for line in table)]
    assert missing == [], f"ARCHITECTURE.md's rl table does not name {missing}"
    assert set(RL_RANK) == {room.rstrip("/") for room in rooms}, "give every rl room a rank in RL_RANK"
