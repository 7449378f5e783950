#!/usr/bin/env bash
# local-slurm.sh - a throw-away single-node Slurm cluster for gdnctl's tests.
#
# Usage:
#   tools/local-slurm.sh install          # apt-get slurmctld slurmd slurm-client munge (only if missing)
#   eval "$(tools/local-slurm.sh start [DIR])"   # start (or reuse) a cluster; prints export lines
#   tools/local-slurm.sh status [DIR]     # exit 0 when the cluster is up and the node is usable
#   tools/local-slurm.sh stop [DIR]       # cancel jobs, stop the daemons started here
#   tools/local-slurm.sh conf [DIR]       # print the slurm.conf that start would write
#
# DIR defaults to $LOCAL_SLURM_DIR, else /tmp/gdnctl-local-slurm. `start` prints, on stdout only:
#   export SLURM_CONF=DIR/slurm.conf   (all Slurm client commands read the cluster from it)
#   export LOCAL_SLURM_DIR=DIR         (so a later `stop`/`status` in the same shell finds it)
# Everything else goes to stderr.
#
# Tunables (environment): LOCAL_SLURM_CPUS (default: nproc), LOCAL_SLURM_MEMORY_MB (default:
# what slurmd detects), LOCAL_SLURM_PARTITION (default: debug), LOCAL_SLURM_CTLD_PORT /
# LOCAL_SLURM_SLURMD_PORT (default: the ports this DIR's running cluster uses, else 6817/6818 when
# free, else the first free pair above them; set, they must be free), LOCAL_SLURM_START_TIMEOUT
# (seconds, default 30).
#
# Reading a job's exit code: there is no accounting (sacct answers "Slurm accounting storage is
# disabled"), so use `scontrol show job JOBID` -> "ExitCode=3:0" (kept for MinJobAge seconds after
# the job ends), or the permanent one-line-per-job record in DIR/log/jobcomp.txt ("ExitCode=3:0"),
# or `sbatch --wait`, whose own exit status is the job's.
#
# Requires root (the daemons run as root and munged is started as the `munge` user).

set -euo pipefail

readonly DEFAULT_DIR=/tmp/gdnctl-local-slurm
readonly MARKER=".gdnctl-local-slurm"   # marks a DIR as ours, so stop never touches foreign files
readonly MUNGE_RUN=/run/munge
readonly MUNGE_SOCKET=$MUNGE_RUN/munge.socket.2
readonly MUNGE_KEY=/etc/munge/munge.key

log() { printf 'local-slurm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (the Slurm daemons and munged need it)"
}

need_binaries() {
    local b missing=()
    for b in munged munge unmunge slurmctld slurmd sinfo scontrol sbatch; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}; run: $0 install"
}

resolve_dir() {
    local d=${1:-${LOCAL_SLURM_DIR:-$DEFAULT_DIR}}
    case $d in
        /*) ;;
        *) d=$PWD/$d ;;
    esac
    printf '%s\n' "${d%/}"
}

# ---------------------------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------------------------
cmd_install() {
    need_root
    local p missing=()
    for p in slurmctld slurmd slurm-client munge; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        log "already installed: slurmctld slurmd slurm-client munge"
        return 0
    fi
    log "installing ${missing[*]} ..."
    export DEBIAN_FRONTEND=noninteractive
    local apt_log
    apt_log=$(mktemp /tmp/local-slurm-apt.XXXXXX)
    # Lock timeout: another apt run in the same box should delay us, not fail us.
    if ! { apt-get -qq -o DPkg::Lock::Timeout=300 update &&
        apt-get -qq -y -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef \
            -o Dpkg::Options::=--force-confold install --no-install-recommends "${missing[@]}"; } \
        >"$apt_log" 2>&1; then
        tail -n 30 "$apt_log" >&2
        die "apt-get failed (full log: $apt_log)"
    fi
    rm -f "$apt_log"
    log "installed ${missing[*]}"
}

# ---------------------------------------------------------------------------------------------
# slurm.conf
# ---------------------------------------------------------------------------------------------
# port_in_use PORT: something listens on 127.0.0.1:PORT.
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# choose_ports DIR: set CTLD_PORT and SLURMD_PORT. A machine may already run a Slurm (the host's own, or
# one started with another DIR) on the default ports; our daemons would then fail to bind and sinfo would
# silently talk to the other cluster. So: the caller's ports if set (refused plainly when taken), else the
# ports of this DIR's own running cluster (so `start` reuses it), else the defaults if free, else the
# first free pair above them.
choose_ports() {
    local dir=$1 port
    if [ -n "${LOCAL_SLURM_CTLD_PORT:-}${LOCAL_SLURM_SLURMD_PORT:-}" ]; then
        CTLD_PORT=${LOCAL_SLURM_CTLD_PORT:-6817}
        SLURMD_PORT=${LOCAL_SLURM_SLURMD_PORT:-6818}
        return 0
    fi
    if healthy "$dir"; then
        CTLD_PORT=$(sed -n 's/^SlurmctldPort=//p' "$dir/slurm.conf")
        SLURMD_PORT=$(sed -n 's/^SlurmdPort=//p' "$dir/slurm.conf")
        [ -n "$CTLD_PORT" ] && [ -n "$SLURMD_PORT" ] && return 0
    fi
    for ((port = 6817; port < 6917; port += 2)); do
        if ! port_in_use "$port" && ! port_in_use "$((port + 1))"; then
            CTLD_PORT=$port
            SLURMD_PORT=$((port + 1))
            [ "$port" = 6817 ] || log "ports 6817/6818 are taken (another Slurm on this machine?): using $CTLD_PORT/$SLURMD_PORT"
            return 0
        fi
    done
    die "no free pair of ports in 6817-6916 on 127.0.0.1 (other Slurm clusters hold them); set LOCAL_SLURM_CTLD_PORT/LOCAL_SLURM_SLURMD_PORT to free ones"
}

render_conf() {
    local dir=$1 node cpus mem partition
    node=$(hostname -s)
    cpus=${LOCAL_SLURM_CPUS:-$(nproc)}
    # RealMemory must not exceed what slurmd detects (else the node is drained "Low RealMemory"),
    # and must be set at all (default 1 MB) or any job with --mem=... is rejected as unsatisfiable.
    mem=${LOCAL_SLURM_MEMORY_MB:-$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')}
    mem=${mem:-1024}
    partition=${LOCAL_SLURM_PARTITION:-debug}
    cat <<EOF
# Written by tools/local-slurm.sh - regenerated on every fresh start; edit the script, not this.
ClusterName=gdnctl-local
# The explicit address keeps slurmctld and slurmd on loopback: container hostnames are often random
# ids that do not resolve (or resolve to an unreachable address). The name part must still equal
# \`hostname -s\`, because slurmctld refuses to start on a host whose name is not SlurmctldHost.
SlurmctldHost=${node}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job (scontrol requeue, preemption) may only start again once its old step
# credentials expire: 120 s by default, far too slow for tests of --requeue/SLURM_RESTART_COUNT.
# Credentials are checked within milliseconds on one host, so a short lifetime is safe here.
AuthInfo=cred_expire=10
MpiDefault=none

StateSaveLocation=${dir}/state
SlurmdSpoolDir=${dir}/spool
SlurmctldPidFile=${dir}/run/slurmctld.pid
SlurmdPidFile=${dir}/run/slurmd.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups in a container (and no systemd to delegate them): track job processes by walking
# /proc, and do no CPU binding/confinement. Any cgroup plugin here makes slurmd or the steps fail.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No slurmdbd: sacct is unavailable. The per-job completion record below replaces it for tests.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${dir}/log/jobcomp.txt

SchedulerType=sched/backfill
# Schedule a batch job as soon as it is submitted (default: up to 3 s later, which sbatch --wait's
# polling at 2 s, then 8 s turns into ~10 s per tiny test job); look at the whole queue every 5 s.
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=5
SelectType=select/cons_tres
# Cores only, memory not consumable: without DefMemPerCPU a job with no --mem would otherwise be
# given the whole node's memory and jobs would run one at a time.
SelectTypeParameters=CR_Core
# A DOWN node (e.g. after a slurmd restart) comes back by itself once it registers again.
ReturnToService=2
# Trust the node line below rather than the detected hardware, so LOCAL_SLURM_CPUS may exceed
# nproc (renders with --cpus-per-task=32 still run here) and a mismatch never drains the node.
SlurmdParameters=config_overrides
# Finished jobs stay in slurmctld for MinJobAge seconds; \`scontrol show job ID\` shows their
# ExitCode only during that time (no accounting to ask afterwards; jobcomp.txt keeps it for good).
# Side effect: sbatch --wait polls after 2 s, then 8 s, then every 32 s (it only stops growing
# the interval when it nears MinJobAge/2), so a job that ends at 3 s returns after 10 s.
MinJobAge=86400
MaxJobCount=100000
# sbatch --requeue and --signal=[B:]USR1@90 need nothing beyond the stock settings (both were
# verified here: scontrol requeue -> SLURM_RESTART_COUNT=1; USR1 arrives within ~30 s of the
# deadline, the period of slurmctld's time-limit check). JobRequeue=1 is the default, spelled out.
JobRequeue=1
# Seconds between SIGTERM and SIGKILL on scancel/timeout (default 30): keeps cancels in tests short.
KillWait=10
# No mail binary in a container; --mail-type must not make slurmctld log errors.
MailProg=/bin/true

# One socket of \$cpus single-thread cores: with CPUs= alone Slurm assumes one core per socket.
NodeName=${node} NodeAddr=127.0.0.1 NodeHostname=${node} CPUs=${cpus} Sockets=1 CoresPerSocket=${cpus} ThreadsPerCore=1 RealMemory=${mem} State=UNKNOWN
PartitionName=${partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

# ---------------------------------------------------------------------------------------------
# process helpers
# ---------------------------------------------------------------------------------------------
# proc_alive PID NAME: PID is a live (not zombie) NAME process. Zombies matter here: PID 1 of a
# container is often not an init that reaps, so a dead daemon may linger as <defunct> for a while.
proc_alive() {
    local pid=$1 name=$2 stat
    [ -n "$pid" ] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

read_pid() {
    [ -s "$1" ] && tr -dc '0-9' <"$1" 2>/dev/null
}

# pid_alive PIDFILE NAME: the pid in PIDFILE is a live NAME process.
pid_alive() {
    proc_alive "$(read_pid "$1" || true)" "$2"
}

# kill_pid PID NAME: TERM, wait up to 10 s, then KILL.
kill_pid() {
    local pid=$1 name=$2 i
    proc_alive "$pid" "$name" || return 0
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        proc_alive "$pid" "$name" || return 0
        sleep 0.1
    done
    log "$name did not stop on TERM; killing"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
}

munge_works() {
    [ -S "$MUNGE_SOCKET" ] && munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1
}

ensure_munge() {
    local dir=$1 i
    if munge_works; then
        return 0
    fi
    id munge >/dev/null 2>&1 || die "no 'munge' user; run: $0 install"
    # munged refuses keys and directories that are not owned by its user or are group/other
    # accessible; fix what a fresh container (or a copied image) may have wrong.
    install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
    install -d -o munge -g munge -m 0711 /var/lib/munge
    # /run is a tmpfs in containers: its munge dir vanishes whenever the container restarts.
    install -d -o munge -g munge -m 0755 "$MUNGE_RUN"
    if [ ! -s "$MUNGE_KEY" ]; then
        log "creating munge key $MUNGE_KEY"
        mungekey --create --keyfile="$MUNGE_KEY" >/dev/null 2>&1 ||
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
    fi
    chown munge:munge "$MUNGE_KEY"
    chmod 0400 "$MUNGE_KEY"
    # A munged killed hard leaves its socket/pid behind; munged then refuses to start.
    if ! pid_alive "$MUNGE_RUN/munged.pid" munged; then
        rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" "$MUNGE_RUN/munged.pid"
    fi
    log "starting munged"
    # Run as the munge user, like Debian's service (the ownership set up above is for that user).
    # It daemonizes itself; 9>&- so it does not inherit our lock.
    runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1 9>&- ||
        die "munged failed to start; $(tail -n 5 /var/log/munge/munged.log 2>/dev/null)"
    # Remember at once that this munged is ours, so `stop` stops it (and only it), even if the
    # check below fails.
    for ((i = 0; i < 50; i++)); do
        pid_alive "$MUNGE_RUN/munged.pid" munged && break
        sleep 0.1
    done
    tr -dc '0-9' <"$MUNGE_RUN/munged.pid" >"$dir/run/munged.pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        munge_works && break
        sleep 0.1
    done
    munge_works || die "munged started but 'munge -n | unmunge' fails; $(tail -n 5 /var/log/munge/munged.log 2>/dev/null)"
}

# node_state DIR: the node's state as sinfo prints it (idle, mixed, allocated, down*, drained, ...)
node_state() {
    local dir=$1
    SLURM_CONF=$dir/slurm.conf timeout 10 sinfo -h -N -n "$(hostname -s)" -o '%T' 2>/dev/null | head -n 1
}

# healthy DIR: munge works, both daemons are alive, the controller answers and the node takes jobs.
healthy() {
    local dir=$1 state
    [ -f "$dir/$MARKER" ] && [ -f "$dir/slurm.conf" ] || return 1
    pid_alive "$dir/run/slurmctld.pid" slurmctld || return 1
    pid_alive "$dir/run/slurmd.pid" slurmd || return 1
    munge_works || return 1
    state=$(node_state "$dir") || return 1
    case $state in
        idle | mixed | allocated | completing) return 0 ;;
        *) return 1 ;;
    esac
}

print_exports() {
    local dir=$1
    printf 'export SLURM_CONF=%q\n' "$dir/slurm.conf"
    printf 'export LOCAL_SLURM_DIR=%q\n' "$dir"
}

log_tail() {
    local dir=$1 f
    # *.stderr: what the daemons print before their log file is open (config errors, fatal()).
    for f in "$dir/log/slurmctld.stderr" "$dir/log/slurmd.stderr" "$dir/log/slurmctld.log" \
        "$dir/log/slurmd.log"; do
        [ -s "$f" ] || continue
        printf '==> %s <==\n' "$f"
        tail -n 25 "$f"
    done
    if [ -s /var/log/munge/munged.log ]; then
        printf '==> %s <==\n' /var/log/munge/munged.log
        tail -n 8 /var/log/munge/munged.log
    fi
}

stop_daemons() {
    local dir=$1 jobs pid f i
    if pid_alive "$dir/run/slurmctld.pid" slurmctld && munge_works; then
        # Cancel jobs first so slurmd cleans up their steps; stray job processes would outlive us.
        jobs=$(SLURM_CONF=$dir/slurm.conf timeout 10 squeue -h -o '%i' 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            log "cancelling jobs: $(echo "$jobs" | tr '\n' ' ')"
            # shellcheck disable=SC2086  # one argument per job id
            SLURM_CONF=$dir/slurm.conf timeout 10 scancel $jobs 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do
                [ -z "$(SLURM_CONF=$dir/slurm.conf timeout 5 squeue -h -o '%i' 2>/dev/null)" ] && break
                sleep 0.2
            done
        fi
    fi
    # Daemons remove their own pid files on exit, so read the pids first.
    kill_pid "$(read_pid "$dir/run/slurmd.pid" || true)" slurmd
    kill_pid "$(read_pid "$dir/run/slurmctld.pid" || true)" slurmctld
    rm -f "$dir/run/slurmd.pid" "$dir/run/slurmctld.pid"
    # slurmstepd processes outlive slurmd by design; ours carry our SLURM_CONF in their environment.
    for f in /proc/[0-9]*/comm; do
        pid=${f#/proc/}
        pid=${pid%/comm}
        proc_alive "$pid" slurmstepd || continue
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$dir/slurm.conf"; then
            log "killing leftover slurmstepd $pid"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    if [ -s "$dir/run/munged.pid" ]; then
        kill_pid "$(read_pid "$dir/run/munged.pid" || true)" munged
        rm -f "$dir/run/munged.pid"
    fi
}

# Serialize start/stop on one DIR (parallel test workers may all call start).
take_lock() {
    local dir=$1
    mkdir -p "$dir"
    exec 9>"$dir/.lock"
    flock -w 120 9 || die "timed out waiting for the lock on $dir/.lock"
}

# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
cmd_start() {
    need_root
    need_binaries
    local dir conf t0 deadline state timeout i
    dir=$(resolve_dir "${1:-}")
    if [ -e "$dir" ] && [ ! -f "$dir/$MARKER" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
        die "$dir exists, is not empty and was not created by this script"
    fi
    take_lock "$dir"
    touch "$dir/$MARKER"
    choose_ports "$dir"
    conf=$(render_conf "$dir")
    if healthy "$dir" && [ "$conf" = "$(cat "$dir/slurm.conf")" ]; then
        log "reusing the running cluster in $dir"
        print_exports "$dir"
        return 0
    fi
    t0=$SECONDS
    stop_daemons "$dir"
    # Fresh state every time: stale job/node state from an older run (or another hostname) only
    # produces confusing DOWN/DRAIN states.
    rm -rf "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
    mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
    printf '%s\n' "$conf" >"$dir/slurm.conf"
    chmod 0644 "$dir/slurm.conf"

    local port
    for port in "$CTLD_PORT" "$SLURMD_PORT"; do
        # Only the caller's own ports can be taken here (choose_ports picked free ones otherwise).
        if port_in_use "$port"; then
            die "port $port on 127.0.0.1 is already in use (another Slurm cluster or service holds it), so this cluster cannot start there: stop that one, or unset LOCAL_SLURM_CTLD_PORT/LOCAL_SLURM_SLURMD_PORT to let this script pick free ports"
        fi
    done

    ensure_munge "$dir"

    # Clean environment: a caller inside a Slurm job must not leak SLURM_* into the daemons
    # (slurmd hands its environment down to slurmstepd).
    local -a daemon_env=(env -i "PATH=/usr/sbin:/usr/bin:/sbin:/bin" "SLURM_CONF=$dir/slurm.conf")
    log "starting slurmctld"
    # -i: ignore unreadable state files instead of refusing to start.
    "${daemon_env[@]}" slurmctld -i -f "$dir/slurm.conf" </dev/null >>"$dir/log/slurmctld.stderr" 2>&1 9>&- || {
        log_tail "$dir" >&2
        die "slurmctld failed to start"
    }
    log "starting slurmd"
    # -N: register under the configured node name even if gethostname() differs from `hostname -s`.
    "${daemon_env[@]}" slurmd -N "$(hostname -s)" -f "$dir/slurm.conf" </dev/null >>"$dir/log/slurmd.stderr" 2>&1 9>&- || {
        log_tail "$dir" >&2
        die "slurmd failed to start"
    }

    timeout=${LOCAL_SLURM_START_TIMEOUT:-30}
    deadline=$((SECONDS + timeout))
    state=""
    while :; do
        state=$(node_state "$dir" || true)
        case $state in
            idle | mixed | allocated) break ;;
        esac
        if [ "$SECONDS" -ge "$deadline" ]; then
            log_tail "$dir" >&2
            die "node $(hostname -s) not idle after ${timeout}s (state: '${state:-no answer from slurmctld}'); logs above, all in $dir/log"
        fi
        if ! pid_alive "$dir/run/slurmctld.pid" slurmctld && [ $((SECONDS - t0)) -gt 3 ]; then
            log_tail "$dir" >&2
            die "slurmctld exited; logs above"
        fi
        sleep 0.2
    done
    # slurmctld's scheduler makes its first pass ~3 s after startup; a job submitted before then
    # waits for it, which sbatch --wait's 2 s/8 s polling turns into a 10 s first job. The first
    # pass logs the effective SchedulerParameters; wait for that line (best effort, 10 s).
    for ((i = 0; i < 100; i++)); do
        grep -q 'SchedulerParameters=' "$dir/log/slurmctld.log" 2>/dev/null && break
        sleep 0.1
    done
    log "cluster up in $((SECONDS - t0))s: node $(hostname -s) $state, SLURM_CONF=$dir/slurm.conf"
    print_exports "$dir"
}

cmd_stop() {
    need_root
    local dir
    dir=$(resolve_dir "${1:-}")
    if [ ! -f "$dir/$MARKER" ]; then
        log "nothing to stop in $dir"
        return 0
    fi
    take_lock "$dir"
    stop_daemons "$dir"
    log "stopped (state kept in $dir)"
}

cmd_status() {
    local dir state
    dir=$(resolve_dir "${1:-}")
    if healthy "$dir"; then
        state=$(node_state "$dir")
        log "healthy: node $(hostname -s) $state, SLURM_CONF=$dir/slurm.conf"
        return 0
    fi
    local ctld=down node=unknown
    if pid_alive "$dir/run/slurmctld.pid" slurmctld; then
        ctld=up
        # Only ask sinfo when slurmctld runs: otherwise it retries for many seconds.
        node=$(node_state "$dir" || true)
    fi
    log "not healthy: $dir (slurmctld: $ctld," \
        "slurmd: $(pid_alive "$dir/run/slurmd.pid" slurmd && echo up || echo down)," \
        "munge: $(munge_works && echo ok || echo down), node: ${node:-no answer})"
    return 1
}

main() {
    local cmd=${1:-} dir
    [ $# -gt 0 ] && shift
    case $cmd in
        install) cmd_install "$@" ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        status) cmd_status "$@" ;;
        conf)
            dir=$(resolve_dir "${1:-}")
            choose_ports "$dir"
            render_conf "$dir"
            ;;
        -h | --help | help) usage ;;
        *)
            usage >&2
            exit 2
            ;;
    esac
}

main "$@"
