#!/usr/bin/env bash
# selftest-cpu: single-node launch on this host (torchrun --standalone).
# Rendered by gdnctl 0.1.0 from selftest-cpu.yaml; re-render rather than edit.
# Every value that came from the preset is shell-quoted.
set -euo pipefail

RUN_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
cd -- "$RUN_DIR"
mkdir -p -- logs

export FLA_FLASH_QLA=0
export OMP_NUM_THREADS=2
export TILELANG_CACHE_DIR=/shared/tilelang
export GDNCTL_JOB_NAME=selftest-cpu

exec python3 -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 \
  -m gdnctl.runtime --config "$RUN_DIR/engine.yaml"
