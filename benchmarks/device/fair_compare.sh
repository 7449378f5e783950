#!/usr/bin/env bash
# gdnctl's defaults against Megatron-Bridge's tuned loop on the 35B-A3B proxy, like for like, on a lent GPU host:
# `benchmarks/trainer_throughput.py compare` (benchmarks/peer_compare/ says what "like for like" means) detached from
# the calling shell, so that a campaign longer than one command's limit runs on while later calls poll it.
#
#   bash benchmarks/device/fair_compare.sh start [--rounds N] [--steps N] [--kernels fla,flashqla] [--stop-after-s S]
#   bash benchmarks/device/fair_compare.sh poll [SECONDS]
#
# start copies this repository to $FAIR_COMPARE_DIR/proj (a later call may replace the working tree it came from),
# then runs the campaign there with `nohup setsid`: the proxy preset with cluster.gpu=h200, each GDN kernel on gdnctl
# and on the peer, arms alternating over the rounds (default 3 rounds of FLA and FlashQLA, 30 steps an arm: about
# 22 min on one H200 from cold kernel caches, 8 of them compiling; the campaign prints its own estimate first). One
# kernel cache a side, kept under $FAIR_COMPARE_DIR: the first round compiles each loop's kernels (before each arm's
# window), and every later arm starts warm. --stop-after-s S starts no new pair of arms after S seconds (a warm pair
# takes about 2.5 min), so a shorter device budget ends with whole pairs recorded.
# poll waits up to SECONDS (default 0) for the campaign to end, then prints its last progress lines and the report
# recomputed from what it has recorded so far (benchmarks/trainer_throughput.py report), and packs the record into
# $OUT/fair-compare.tgz when $OUT is set.
#
# Needs python3 with the GPU stack installed into two directories (pip install --target): the GDN stack (flash-qla,
# fla-core, tilelang, megatron-core) in $GDN_SITE and Transformer Engine with megatron-bridge in $TE_SITE, in that
# order on PYTHONPATH. Defaults: GDN_SITE=/opt/site-gdn, TE_SITE=/opt/site-te, FAIR_COMPARE_DIR=/opt/fair-compare.
set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${FAIR_COMPARE_DIR:-/opt/fair-compare}
GDN_SITE=${GDN_SITE:-/opt/site-gdn}
TE_SITE=${TE_SITE:-/opt/site-te}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

fail() {
  echo "fair_compare.sh: $*" >&2
  exit 2
}

running() {
  [ -f "$DIR/pid" ] && [ ! -f "$DIR/exit_code" ] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null
}

start() {
  local passed=()
  while [ $# -gt 0 ]; do
    case $1 in
      --rounds | --steps | --kernels | --stop-after-s)
        [ $# -ge 2 ] || fail "$1 needs a value"
        passed+=("$1" "$2")
        shift 2
        ;;
      *) fail "start takes --rounds, --steps, --kernels and --stop-after-s, not '$1' (see --help)" ;;
    esac
  done
  if running; then
    fail "a campaign is already running in $DIR (pid $(cat "$DIR/pid")); poll it, or wait for its end"
  fi
  for site in "$GDN_SITE" "$TE_SITE"; do
    [ -d "$site" ] || fail "$site does not exist: install the GPU stack there first (or set GDN_SITE and TE_SITE)"
  done
  command -v nvidia-smi >/dev/null || fail "nvidia-smi is not here: start the campaign on the GPU host"
  mkdir -p "$DIR"
  rm -rf "$DIR/proj" "$DIR/campaign" "$DIR/exit_code" "$DIR/pid" "$DIR/run.log"
  mkdir -p "$DIR/proj"
  tar -C "$REPO" --exclude=./.git --exclude=./.stage --exclude=./runs -cf - . | tar -C "$DIR/proj" -xf -
  local command=(
    python3 benchmarks/trainer_throughput.py compare
    --campaign "$DIR/campaign" --peer-cache-dir "$DIR/kcache-peer"
    --set cluster.gpu=h200 --set "launch.kernel_cache_dir=$DIR/kcache"
    --out "$DIR/result.json" "${passed[@]}"
  )
  (
    cd "$DIR/proj"
    # The inner shell expands its own arguments: $0 is the campaign's directory, "$@" the command.
    # shellcheck disable=SC2016
    PYTHONPATH="$GDN_SITE:$TE_SITE:$DIR/proj" PYTHONUNBUFFERED=1 nohup setsid \
      bash -c '"$@" > "$0/run.log" 2>&1; echo $? > "$0/exit_code"' "$DIR" "${command[@]}" \
      < /dev/null > /dev/null 2>&1 &
    echo $! > "$DIR/pid"
  )
  echo "started in $DIR (pid $(cat "$DIR/pid")): ${command[*]}"
  echo "poll with: bash benchmarks/device/fair_compare.sh poll 540"
}

poll() {
  local wait=${1:-0} waited=0
  case $wait in '' | *[!0-9]*) fail "poll takes a number of seconds to wait, not '$wait'" ;; esac
  [ -f "$DIR/campaign/campaign.json" ] || fail "no campaign recorded in $DIR: start one first"
  while running && [ "$waited" -lt "$wait" ]; do
    sleep 10
    waited=$((waited + 10))
  done
  if [ -f "$DIR/run.log" ]; then
    echo "== the campaign's last progress lines ($DIR/run.log)"
    grep -E '^(\[[0-9]+/[0-9]+\]|    |[0-9]+ arms)' "$DIR/run.log" | tail -n 12 || true
  fi
  echo "== the report, from what is recorded so far"
  (cd "$REPO" && PYTHONPATH="$GDN_SITE:$TE_SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}" \
    python3 benchmarks/trainer_throughput.py report --campaign "$DIR/campaign" --out "$DIR/report.json") ||
    echo "(the report failed; its message is above)"
  if [ -n "${OUT:-}" ]; then
    local files=(campaign)
    for name in run.log report.json result.json exit_code; do
      [ -f "$DIR/$name" ] && files+=("$name")
    done
    tar -czf "$OUT/fair-compare.tgz" -C "$DIR" "${files[@]}"
    echo "== packed ${files[*]} into $OUT/fair-compare.tgz"
  fi
  if [ -f "$DIR/exit_code" ]; then
    echo "DONE (exit $(cat "$DIR/exit_code"))"
  elif running; then
    echo "RUNNING"
  else
    echo "STOPPED: the campaign's process is gone without an exit code"
  fi
}

case ${1:-} in
  start)
    shift
    start "$@"
    ;;
  poll)
    shift
    [ $# -le 1 ] || fail "poll takes at most one argument, the seconds to wait"
    poll "${1:-0}"
    ;;
  -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
