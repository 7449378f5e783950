"""The bridge builder imports megatron-bridge's AutoBridge and Qwen bridges without the package imports that reach
every other model (runtime/model/bridge_import.py), and anything that needs those packages' own names still gets
them. megatron-bridge needs Python 3.12 and Transformer Engine, so a package laid out like megatron-bridge 0.6.2
stands in, each module saying when it runs; every case is a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# path -> source; `said(...)` prints what ran, in order.
TREE = {
    "megatron/bridge/__init__.py": """
        import megatron.bridge.models
        from megatron.bridge.models.conversion.auto_bridge import AutoBridge
        __version__ = "0.6.2"
        said("megatron.bridge's __init__")
    """,
    "megatron/bridge/models/__init__.py": """
        import megatron.bridge.models.other_models
        import megatron.bridge.models.qwen
        from megatron.bridge.models.gpt_provider import GPTModelProvider
        said("megatron.bridge.models's __init__")
    """,
    "megatron/bridge/models/other_models.py": 'said("every other model")\n',
    "megatron/bridge/models/gpt_provider.py": "class GPTModelProvider:\n    pass\n",
    "megatron/bridge/models/conversion/__init__.py": "",
    "megatron/bridge/models/conversion/model_bridge.py": "REGISTRY = []\n",
    "megatron/bridge/models/conversion/auto_bridge.py": """
        from megatron.bridge.models.conversion.model_bridge import REGISTRY
        from megatron.bridge.models.gpt_provider import GPTModelProvider
        class AutoBridge:
            registry = REGISTRY
    """,
    "megatron/bridge/models/qwen/__init__.py": """
        from megatron.bridge.models.conversion.model_bridge import REGISTRY
        REGISTRY.append("Qwen3_5MoeForCausalLM")
        said("the qwen bridges")
    """,
    "megatron/bridge/training/__init__.py": "",
    "megatron/bridge/training/config.py": "from megatron.bridge.models import GPTModelProvider\n",
}


def run(tmp_path, code: str) -> list[str]:
    for path, source in TREE.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source))
    prelude = textwrap.dedent(
        f"""
        import builtins, sys
        sys.path.insert(0, {str(tmp_path)!r})
        builtins.said = lambda what: print(what)
        from gdnctl.runtime.model.bridge_import import import_auto_bridge
        """
    )
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_auto_bridge_comes_with_the_qwen_bridges_and_nothing_else(tmp_path):
    said = run(
        tmp_path,
        """
        AutoBridge = import_auto_bridge()
        print("registry", AutoBridge.registry)
        """,
    )
    assert said == ["the qwen bridges", "registry ['Qwen3_5MoeForCausalLM']"]


def test_a_name_only_the_package_defines_runs_its_init_then(tmp_path):
    said = run(
        tmp_path,
        """
        import_auto_bridge()
        print("slim import done")
        import megatron.bridge.training.config as config
        import megatron.bridge.models.gpt_provider as gpt_provider
        print("same class", config.GPTModelProvider is gpt_provider.GPTModelProvider)
        """,
    )
    assert said == [
        "the qwen bridges",
        "slim import done",
        "every other model",
        "megatron.bridge.models's __init__",
        "same class True",
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "from megatron.bridge.models import qwen",
        "import megatron.bridge.models.qwen",
        "import inspect, megatron.bridge; inspect.unwrap(megatron.bridge)",  # probes __wrapped__
    ],
)
def test_a_submodule_or_a_probe_leaves_the_package_init_waiting(tmp_path, statement):
    said = run(tmp_path, f"import_auto_bridge()\n{statement}\nprint('still slim')\n")
    assert said == ["the qwen bridges", "still slim"]


def test_the_whole_package_afterwards_gives_the_same_auto_bridge(tmp_path):
    said = run(
        tmp_path,
        """
        slim = import_auto_bridge()
        from megatron.bridge import __version__, AutoBridge
        print("same", AutoBridge is slim, __version__, AutoBridge.registry)
        """,
    )
    assert said == [
        "the qwen bridges",
        "every other model",
        "megatron.bridge.models's __init__",
        "megatron.bridge's __init__",
        "same True 0.6.2 ['Qwen3_5MoeForCausalLM']",
    ]


def test_a_package_already_imported_whole_is_left_as_it_is(tmp_path):
    said = run(
        tmp_path,
        """
        import megatron.bridge
        whole = sys.modules["megatron.bridge"]
        AutoBridge = import_auto_bridge()
        print("untouched", sys.modules["megatron.bridge"] is whole, AutoBridge is megatron.bridge.AutoBridge)
        """,
    )
    assert said == [
        "every other model",
        "the qwen bridges",
        "megatron.bridge.models's __init__",
        "megatron.bridge's __init__",
        "untouched True True",
    ]


def test_a_missing_megatron_bridge_is_an_import_error_naming_it(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from gdnctl.runtime.model.bridge_import import install_lazy_package\n"
            "try:\n    install_lazy_package('gdnctl.no_such_package')\n"
            "except ImportError as error:\n    print(error)\n",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "gdnctl.no_such_package is not an installed package"
