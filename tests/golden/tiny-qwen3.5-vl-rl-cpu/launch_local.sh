#!/usr/bin/env bash
# tiny-qwen3.5-vl-rl-cpu: single-node launch on this host (torchrun --standalone).
# Rendered by gdnctl 0.1.0 from tiny-qwen3.5-vl-rl-cpu.yaml; re-render rather than edit.
# Every value that came from the preset is shell-quoted.
set -euo pipefail

RUN_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
cd -- "$RUN_DIR"
mkdir -p -- logs

export FLA_FLASH_QLA=0
export OMP_NUM_THREADS=2
export TILELANG_CACHE_DIR=/shared/tilelang
export TORCHINDUCTOR_CACHE_DIR=/shared/tilelang/inductor
export TRITON_CACHE_AUTOTUNING=1
export TRITON_CACHE_DIR=/shared/tilelang/triton
export VLLM_CACHE_ROOT=/shared/tilelang/vllm
export GDNCTL_JOB_NAME=tiny-qwen3.5-vl-rl-cpu

# `bash launch_local.sh --smoke` runs the job's smoke run instead: a few steps of this layout in RUN_DIR/smoke,
# a checkpoint saved and loaded back, verdicts in RUN_DIR/smoke.json (`gdnctl launch --smoke` reads them).
if [[ $# -gt 1 || ( $# -eq 1 && $1 != --smoke ) ]]; then
  echo "usage: bash launch_local.sh [--smoke]" >&2
  exit 2
fi

# The job holds the run dir: an flock on .gdnctl-run.lock that torchrun inherits through exec, so it lasts as long
# as the job. A second launch here, or `gdnctl render --force`, is refused meanwhile. Never through a link.
lock="$RUN_DIR/.gdnctl-run.lock"
if [[ -L $lock || ( -e $lock && ! -f $lock ) ]]; then
  echo "gdnctl: $lock is not a regular file (a symbolic link?); remove it and launch again" >&2
  exit 2
fi
exec {lock_fd}>>"$lock"
lock_status=0
flock --nonblock --conflict-exit-code 75 "$lock_fd" || lock_status=$?
if [[ $lock_status -eq 75 ]]; then
  echo "gdnctl: another job is running in $RUN_DIR (it holds $lock); stop it or wait for it to end, or render into another run dir" >&2
  exit 75
elif [[ $lock_status -ne 0 ]]; then
  echo "gdnctl: this file system does not lock $lock; the job runs without holding its run dir" >&2
fi

exec <gdnctl's python> -m gdnctl.runtime.launcher.torchrun --standalone --nnodes 1 --nproc-per-node 1 \
  -m gdnctl.runtime --config "$RUN_DIR/engine.yaml" "$@"
