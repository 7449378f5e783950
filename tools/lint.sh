#!/usr/bin/env bash
# Lint and type checks, as CI runs them (.ci/run): ruff's lint rules and its formatter's check over the Python,
# mypy over every layer but the CLI and the runtime (pyproject's [tool.mypy] files), shellcheck over the shell
# scripts.
#   bash tools/lint.sh
# The tools are pinned in pyproject's `test` extra (pip install -e '.[test]').
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."

echo "== ruff check ==" >&2
python3 -m ruff check gdnctl tests benchmarks
echo "== ruff format --check ==" >&2
python3 -m ruff format --check gdnctl tests benchmarks
echo "== mypy ==" >&2
python3 -m mypy
echo "== shellcheck ==" >&2
shellcheck tools/*.sh benchmarks/device/*.sh .ci/run
