#!/usr/bin/env bash
# Lint and type checks, as CI runs them (.ci/run): ruff's lint rules over the Python, mypy over the layers below
# the runtime (pyproject's [tool.mypy] files), shellcheck over the repository's shell scripts.
#   bash tools/lint.sh
# The tools are pinned in pyproject's `test` extra (pip install -e '.[test]').
# Not checked: `ruff format`. The code aligns continuation lines under their opening bracket, which ruff's
# formatter (black's style) cannot express; it would rewrite most files. CONTRIBUTING.md says so.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."

echo "== ruff check ==" >&2
python3 -m ruff check gdnctl tests benchmarks
echo "== mypy ==" >&2
python3 -m mypy
echo "== shellcheck ==" >&2
shellcheck tools/*.sh .ci/run
