"""Imports a trainer process never uses and is better off without, kept out before anything can make them.

Transformer Engine's package import also imports its JAX bindings, and they import JAX itself wherever JAX is
installed beside torch (transformer_engine/__init__.py, TE 2.20.2: `from . import jax` in a try that passes on
ImportError; transformer_engine/jax/__init__.py starts with `import jax`). The bindings fail to load without
their own extension, so nothing of them is usable, but JAX stays imported: 0.64 s of imports
(`python3 -X importtime`, on an H100 host with JAX 0.11.2 beside torch), and a callback JAX adds to every garbage
collection of the process (jax/_src/lib/__init__.py, JAX 0.11.2: `_xla_gc_callback` in `gc.callbacks`, calling
into XLA at the start and the end of each one). A `None` in `sys.modules` makes the import raise ImportError at
once (the import system's documented way to block one), which Transformer Engine's guard passes over as it does
where JAX is not installed.
"""

from __future__ import annotations

import sys

# Module -> who would import it; none of them is used by gdnctl's trainer.
UNUSED = {"transformer_engine.jax": "Transformer Engine's package import (its JAX bindings)"}


def keep_unused_imports_out() -> None:
    """Block the imports in UNUSED in this process, unless one has already happened."""
    for name in UNUSED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
