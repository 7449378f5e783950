"""The inner loop's list of slow tests (tests/conftest.py) names modules and tests that exist: a renamed test
must not drop out of the list silently and slow the inner loop down."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SLOW_MODULES, SLOW_TESTS

ROOT = Path(__file__).resolve().parent.parent


def test_every_slow_module_exists():
    assert [module for module in sorted(SLOW_MODULES) if not (ROOT / module).is_file()] == []


def test_every_slow_test_exists_in_its_module():
    missing = []
    for module, names in SLOW_TESTS.items():
        text = (ROOT / module).read_text()
        missing += [f"{module}::{name}" for name in sorted(names) if not re.search(rf"^def {name}\(", text, re.M)]
    assert missing == []
