"""comm-report reads the profiles of a real 2-rank gloo run: the runtime tests' session fixture."""

from tests.runtime.conftest import gloo_run  # noqa: F401  (a fixture, shared rather than run twice)
