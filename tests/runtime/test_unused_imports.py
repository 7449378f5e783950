"""The trainer process keeps Transformer Engine's JAX bindings (and with them JAX) out of its imports
(runtime/launcher/unused_imports.py). Transformer Engine itself needs CUDA, so a package with its import guard
stands in."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# transformer_engine/__init__.py's guard around its JAX bindings (TE 2.20.2), and bindings that say they loaded.
PACKAGE_INIT = "try:\n    from . import jax\nexcept ImportError:\n    pass\n"
BINDINGS = "import sys\nsys.stdout.write('bindings imported\\n')\n"


def _import_the_package(tmp_path, block: bool) -> str:
    package = tmp_path / "transformer_engine"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text(PACKAGE_INIT)
    (package / "jax.py").write_text(BINDINGS)
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        if {block}:
            from gdnctl.runtime.launcher.unused_imports import keep_unused_imports_out
            keep_unused_imports_out()
        import transformer_engine
        print("package imported")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout


def test_transformer_engines_package_imports_without_its_jax_bindings(tmp_path):
    assert _import_the_package(tmp_path, block=False) == "bindings imported\npackage imported\n"
    assert _import_the_package(tmp_path, block=True) == "package imported\n"
