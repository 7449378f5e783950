#!/usr/bin/env bash
# local-slurm.sh - a throw-away Slurm cluster on this machine for gdnctl's tests: one node on loopback, or
# several, each a network namespace of its own.
#
# Usage:
#   tools/local-slurm.sh install          # apt-get slurmctld slurmd slurm-client munge iproute2 (if missing)
#   eval "$(tools/local-slurm.sh start [--nodes N] [DIR])"   # start (or reuse) a cluster; prints export lines
#   tools/local-slurm.sh status [DIR]     # exit 0 when the cluster is up and every node is usable
#   tools/local-slurm.sh stop [DIR]       # cancel jobs, stop the daemons and remove what start made
#   tools/local-slurm.sh conf [--nodes N] [DIR]   # print the slurm.conf that start would write
#   tools/local-slurm.sh nodes [DIR]      # one line per node: NAME ADDRESS NAMESPACE ("-": one node, no namespace)
#
# DIR defaults to $LOCAL_SLURM_DIR, else /tmp/gdnctl-local-slurm. `start` prints, on stdout only:
#   export SLURM_CONF=DIR/slurm.conf   (all Slurm client commands read the cluster from it)
#   export LOCAL_SLURM_DIR=DIR         (so a later `stop`/`status` in the same shell finds it)
# Everything else goes to stderr.
#
# One node (the default, --nodes 1): slurmctld and one slurmd on 127.0.0.1, the node named `hostname -s`.
# --nodes N (2 to 4): one slurmctld on this host and N slurmd, each in a network namespace of its own with an
# address and a host name (UTS namespace) of its own, all on this machine's file system. The namespaces hang off
# a bridge of their own (BRIDGE.1 is this host, .11 to .14 the nodes, in the first 10.251.K.0/24 that no address
# or route of this machine uses; LOCAL_SLURM_NET=A.B picks another A.B.K.0/24), and have no route anywhere else:
# their traffic goes to loopback, this host's bridge address and each other, nothing more. Node names are
# slurm-TAG-1 .. slurm-TAG-N (TAG: six hex digits of DIR's sha256, so two DIRs' clusters never share a name),
# resolvable on this host and in every namespace through lines this script adds to /etc/hosts, each marked as
# its own, and removes again. Every process a node ran (slurmd, the job steps, what they left behind) is in its
# namespace, so `stop` ends them all there; it then removes the namespaces, the bridge and the hosts lines. A
# `start` after a crash (everything killed with -9) finds what the crashed cluster left and removes it first.
#
# Tunables (environment): LOCAL_SLURM_CPUS (default: nproc; per node), LOCAL_SLURM_MEMORY_MB (default:
# what slurmd detects), LOCAL_SLURM_PARTITION (default: debug), LOCAL_SLURM_CTLD_PORT /
# LOCAL_SLURM_SLURMD_PORT (default: the ports this DIR's running cluster uses, else 6817/6818 when
# free, else the first free pair above them; set, they must be free), LOCAL_SLURM_START_TIMEOUT
# (seconds, default 30), LOCAL_SLURM_NET (several nodes: the first two octets of their network, default
# 10.251), LOCAL_SLURM_SLURMD_TIMEOUT (several nodes: seconds without an answer after which slurmctld takes a
# node for lost, sets it DOWN and ends its jobs NODE_FAIL; default 20; Slurm's own default is 300).
#
# Reading a job's exit code: there is no accounting (sacct answers "Slurm accounting storage is
# disabled"), so use `scontrol show job JOBID` -> "ExitCode=3:0" (kept for MinJobAge seconds after
# the job ends), or the permanent one-line-per-job record in DIR/log/jobcomp.txt ("ExitCode=3:0"),
# or `sbatch --wait`, whose own exit status is the job's.
#
# Requires root (the daemons run as root, munged is started as the `munge` user, and several nodes need
# `ip netns`, veth pairs, a bridge and `unshare --uts`).

set -euo pipefail

readonly DEFAULT_DIR=/tmp/gdnctl-local-slurm
readonly MARKER=".gdnctl-local-slurm"   # marks a DIR as ours, so stop never touches foreign files
readonly MUNGE_RUN=/run/munge
readonly MUNGE_SOCKET=$MUNGE_RUN/munge.socket.2
readonly MUNGE_KEY=/etc/munge/munge.key
readonly MAX_NODES=4
readonly HOSTS=/etc/hosts
readonly MACHINE_LOCK=/run/gdnctl-local-slurm.lock       # one start or stop at a time on this machine

# Set by parse_args (NODES) and set_layout (TAG, from DIR); SUBNET by choose_subnet (several nodes only).
NODES=1
TAG=""
SUBNET=""
DIR=""

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

# parse_args ARGS...: [--nodes N] [DIR] in any order; sets NODES and ARG_DIR.
ARG_DIR=""
parse_args() {
    while [ $# -gt 0 ]; do
        case $1 in
            --nodes)
                [ $# -ge 2 ] || die "--nodes needs a number from 1 to $MAX_NODES"
                NODES=$2
                shift 2
                ;;
            --nodes=*)
                NODES=${1#--nodes=}
                shift
                ;;
            -*) die "unknown option $1 (usage: $0 start|conf [--nodes N] [DIR])" ;;
            *)
                [ -z "$ARG_DIR" ] || die "more than one DIR given ($ARG_DIR and $1)"
                ARG_DIR=$1
                shift
                ;;
        esac
    done
    case $NODES in
        [1-9]) [ "$NODES" -le "$MAX_NODES" ] || die "--nodes must be a number from 1 to $MAX_NODES (got $NODES)" ;;
        *) die "--nodes must be a number from 1 to $MAX_NODES (got '$NODES')" ;;
    esac
}

# ---------------------------------------------------------------------------------------------
# several nodes: names, namespaces, the bridge, /etc/hosts
# ---------------------------------------------------------------------------------------------
# set_layout DIR: TAG, six hex digits of DIR's sha256, which every name the cluster gives its nodes, namespaces
# and links carries: two DIRs' clusters never meet, and `stop` or a `start` after a crash finds exactly what
# this DIR's cluster made, by name, with no record that a crash could have lost.
set_layout() {
    TAG=$(printf '%s' "$1" | sha256sum | cut -c1-6)
}

node_name() { printf 'slurm-%s-%s' "$TAG" "$1"; }
netns_name() { printf 'gdnctl-slurm-%s-%s' "$TAG" "$1"; }
veth_name() { printf 'gsv%s%s' "$TAG" "$1"; } # at most 15 characters: an interface name's limit
bridge_name() { printf 'gsb%s' "$TAG"; }
node_addr() { printf '%s.%s' "$SUBNET" "$((10 + $1))"; }
host_addr() { printf '%s.1' "$SUBNET"; }
hosts_marker() { printf '# tools/local-slurm.sh cluster %s ' "$TAG"; }

# conf_nodes DIR: the node names of DIR's slurm.conf, one a line (none without a slurm.conf).
conf_nodes() {
    [ -f "$1/slurm.conf" ] || return 0
    sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' "$1/slurm.conf"
}

# slurmd_pid_file DIR NODE: one node keeps today's run/slurmd.pid; several have one each (SlurmdPidFile's %n).
slurmd_pid_file() {
    if [ "$(conf_nodes "$1" | wc -l)" -gt 1 ]; then
        printf '%s/run/slurmd-%s.pid' "$1" "$2"
    else
        printf '%s/run/slurmd.pid' "$1"
    fi
}

ip4_int() {
    local a b c d
    IFS=. read -r a b c d <<<"$1"
    printf '%s' "$(((a << 24) | (b << 16) | (c << 8) | d))"
}

# networks_in_use: every IPv4 prefix (ADDR/LEN) this machine has an address in or a route to, but the default.
networks_in_use() {
    ip -4 -o addr show | awk '{print $4}'
    ip -4 route show table all | awk '
        $1 == "default" { next }
        $1 ~ /^(local|broadcast|unicast|multicast|anycast|blackhole|unreachable|prohibit|throw|nat)$/ { print $2; next }
        { print $1 }'
}

# subnet_free A.B.K: no address or route of this machine overlaps A.B.K.0/24.
subnet_free() {
    local candidate prefix addr len shift
    candidate=$(ip4_int "$1.0")
    while read -r prefix; do
        [ -n "$prefix" ] || continue
        addr=${prefix%/*}
        len=32
        [ "$addr" = "$prefix" ] || len=${prefix#*/}
        [[ $addr =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ && $len =~ ^[0-9]+$ ]] || continue
        ((len < 24)) || len=24
        shift=$((32 - len))
        if (((candidate >> shift) == ($(ip4_int "$addr") >> shift))); then
            return 1
        fi
    done < <(networks_in_use)
}

# choose_subnet DIR: set SUBNET (A.B.K): the one this DIR's running cluster uses, else the first A.B.K.0/24
# (LOCAL_SLURM_NET=A.B, default 10.251) that overlaps no address or route of this machine.
choose_subnet() {
    local dir=$1 net=${LOCAL_SLURM_NET:-10.251} k
    [[ $net =~ ^[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "LOCAL_SLURM_NET must be the first two octets of an IPv4 network, like 10.251 (got '$net')"
    if healthy "$dir"; then
        SUBNET=$(sed -n 's/^SlurmctldHost=.*(\([0-9.]*\)\.1)$/\1/p' "$dir/slurm.conf")
        [ -n "$SUBNET" ] && return 0
    fi
    for ((k = 0; k < 256; k++)); do
        if subnet_free "$net.$k"; then
            SUBNET=$net.$k
            return 0
        fi
    done
    die "every $net.K.0/24 overlaps an address or a route of this machine; set LOCAL_SLURM_NET to the first two octets of a free network"
}

# edit_hosts [LINE...]: remove this cluster's lines from /etc/hosts, then add LINEs, each marked as this
# cluster's (under take_lock's machine-wide lock, so two clusters never edit it at once). A new file renamed over
# the old one, so no reader ever sees it half written; where /etc/hosts is a mount point (a container's),
# renaming over it fails, and it is written in place instead.
edit_hosts() {
    local marker line tmp
    marker=$(hosts_marker)
    if [ $# -eq 0 ] && ! grep -qF -- "$marker" "$HOSTS" 2>/dev/null; then
        return 0
    fi
    tmp=$(mktemp "$HOSTS.gdnctl-local-slurm.XXXXXX")
    grep -vF -- "$marker" "$HOSTS" >"$tmp" || true
    for line in "$@"; do
        printf '%s %s(%s)\n' "$line" "$marker" "$DIR" >>"$tmp"
    done
    chmod 0644 "$tmp"
    if ! mv -f "$tmp" "$HOSTS" 2>/dev/null; then
        cat "$tmp" >"$HOSTS"
        rm -f "$tmp"
    fi
}

# kill_netns NS: end every process in network namespace NS (TERM, then KILL), within 10 s.
kill_netns() {
    local ns=$1 pids i
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    log "stopping $(echo "$pids" | wc -w) process(es) left in namespace $ns"
    # shellcheck disable=SC2086  # one argument per pid
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    log "warning: processes $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')still run in namespace $ns after SIGKILL"
}

# remove_network DIR: every namespace, link and hosts line of this DIR's cluster (found by TAG, so a crashed
# cluster's too), and every process left in those namespaces. Nothing to do for a one-node cluster.
remove_network() {
    local i ns link
    command -v ip >/dev/null 2>&1 || return 0
    for ((i = 1; i <= MAX_NODES; i++)); do
        ns=$(netns_name "$i")
        [ -e "/run/netns/$ns" ] || continue
        kill_netns "$ns"
        log "removing namespace $ns"
        ip netns del "$ns" 2>/dev/null || log "warning: could not remove namespace $ns"
    done
    for link in $(bridge_name) $(ip -o link show | sed -n "s/^[0-9]*: \(gsv${TAG}[0-9]\)[@:].*/\1/p"); do
        [ -e "/sys/class/net/$link" ] || continue
        log "removing link $link"
        ip link del "$link" 2>/dev/null || log "warning: could not remove link $link"
    done
    edit_hosts
}

# make_network: a bridge with this host's address, and per node a namespace joined to it by a veth pair, with
# the node's address and loopback up and no route beyond the bridge; the node names go into /etc/hosts.
make_network() {
    local br i ns veth lines=()
    br=$(bridge_name)
    log "creating bridge $br ($(host_addr)/24) and $NODES namespaces"
    ip link add name "$br" type bridge
    ip addr add "$(host_addr)/24" dev "$br"
    ip link set "$br" up
    for ((i = 1; i <= NODES; i++)); do
        ns=$(netns_name "$i")
        veth=$(veth_name "$i")
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$br" up
        ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        lines+=("$(node_addr "$i") $(node_name "$i")")
    done
    edit_hosts "${lines[@]}"
}

# ---------------------------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------------------------
cmd_install() {
    need_root
    local p missing=()
    # iproute2: `ip netns`, veth pairs and the bridge of a cluster of several nodes.
    for p in slurmctld slurmd slurm-client munge iproute2; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        log "already installed: slurmctld slurmd slurm-client munge iproute2"
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
    local dir=$1 node cpus mem partition i ctld_host ctld_why daemon_files nodes_lines node_timeout=""
    node=$(hostname -s)
    cpus=${LOCAL_SLURM_CPUS:-$(nproc)}
    # RealMemory must not exceed what slurmd detects (else the node is drained "Low RealMemory"),
    # and must be set at all (default 1 MB) or any job with --mem=... is rejected as unsatisfiable.
    mem=${LOCAL_SLURM_MEMORY_MB:-$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')}
    mem=${mem:-1024}
    partition=${LOCAL_SLURM_PARTITION:-debug}
    if [ "$NODES" -eq 1 ]; then
        ctld_host="${node}(127.0.0.1)"
        ctld_why="# The explicit address keeps slurmctld and slurmd on loopback: container hostnames are often random
# ids that do not resolve (or resolve to an unreachable address). The name part must still equal
# \`hostname -s\`, because slurmctld refuses to start on a host whose name is not SlurmctldHost."
        daemon_files="SlurmdPidFile=${dir}/run/slurmd.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd.log"
        nodes_lines="# One socket of \$cpus single-thread cores: with CPUs= alone Slurm assumes one core per socket.
NodeName=${node} NodeAddr=127.0.0.1 NodeHostname=${node} CPUs=${cpus} Sockets=1 CoresPerSocket=${cpus} ThreadsPerCore=1 RealMemory=${mem} State=UNKNOWN"
    else
        ctld_host="${node}($(host_addr))"
        ctld_why="# slurmctld on this host's address on the nodes' bridge, which every node's namespace reaches (they
# have no other route). The name part must still equal \`hostname -s\`, because slurmctld refuses to
# start on a host whose name is not SlurmctldHost."
        # %n: each node's slurmd writes its own files (SlurmdPidFile, SlurmdSpoolDir, SlurmdLogFile).
        daemon_files="SlurmdPidFile=${dir}/run/slurmd-%n.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd-%n.log"
        nodes_lines="# ${NODES} nodes, each a network namespace with its own address and host name (tools/local-slurm.sh);
# each one socket of \$cpus single-thread cores: with CPUs= alone Slurm assumes one core per socket."
        for ((i = 1; i <= NODES; i++)); do
            nodes_lines+="
NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") NodeHostname=$(node_name "$i") CPUs=${cpus} Sockets=1 CoresPerSocket=${cpus} ThreadsPerCore=1 RealMemory=${mem} State=UNKNOWN"
        done
        node_timeout="
# A node that stops answering (its slurmd killed, its link down) is set DOWN after this many seconds and its
# jobs end NODE_FAIL (requeued, with --requeue): Slurm's default of 300 s is too long for the tests of a lost
# node. slurmctld pings every node a third of this apart.
SlurmdTimeout=${LOCAL_SLURM_SLURMD_TIMEOUT:-20}"
    fi
    cat <<EOF
# Written by tools/local-slurm.sh - regenerated on every fresh start; edit the script, not this.
ClusterName=gdnctl-local
${ctld_why}
SlurmctldHost=${ctld_host}
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
SlurmdSpoolDir=${dir}/spool$([ "$NODES" -eq 1 ] || printf '/%%n')
SlurmctldPidFile=${dir}/run/slurmctld.pid
${daemon_files}
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
MailProg=/bin/true${node_timeout}

${nodes_lines}
PartitionName=${partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

# ---------------------------------------------------------------------------------------------
# process helpers
# ---------------------------------------------------------------------------------------------
# proc_alive PID NAME: PID is a live (not zombie) NAME process. Zombies matter here: PID 1 of a
# container is often not an init that reaps, so a dead daemon may linger as <defunct> for a while.
# Builtins only (read, not cat): stop and other_cluster ask this of every process on the machine, and a fork
# per process made a stop take seconds on a loaded machine.
proc_alive() {
    local pid=$1 name=$2 comm stat
    [ -n "$pid" ] || return 1
    read -r comm 2>/dev/null <"/proc/$pid/comm" || return 1
    [ "$comm" = "$name" ] || return 1
    read -r stat 2>/dev/null <"/proc/$pid/stat" || return 1
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
    # It daemonizes itself; 9>&- 7>&- so it does not inherit our locks.
    runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1 9>&- 7>&- ||
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

# node_states DIR: "NAME STATE" for each node of DIR's slurm.conf, as sinfo prints the state (idle, mixed,
# allocated, down*, drained, ...); a node sinfo does not list gets the state "unknown".
node_states() {
    local dir=$1 answer node state
    answer=$(SLURM_CONF=$dir/slurm.conf timeout 10 sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    while read -r node; do
        state=$(awk -v n="$node" '$1 == n { print $2; exit }' <<<"$answer")
        printf '%s %s\n' "$node" "${state:-unknown}"
    done < <(conf_nodes "$dir")
}

# node_state DIR: the state of the one node (a one-node cluster), as sinfo prints it.
node_state() {
    local dir=$1
    SLURM_CONF=$dir/slurm.conf timeout 10 sinfo -h -N -n "$(hostname -s)" -o '%T' 2>/dev/null | head -n 1
}

# states_usable STATES: every "NAME STATE" line of node_states takes jobs (and there is one at least).
states_usable() {
    local node state seen=0
    while read -r node state; do
        [ -n "$node" ] || continue
        seen=1
        case $state in
            idle | mixed | allocated | completing) ;;
            *) return 1 ;;
        esac
    done <<<"$1"
    [ "$seen" = 1 ]
}

# healthy DIR: munge works, every daemon is alive, the controller answers and every node takes jobs.
healthy() {
    local dir=$1 state node count
    [ -f "$dir/$MARKER" ] && [ -f "$dir/slurm.conf" ] || return 1
    pid_alive "$dir/run/slurmctld.pid" slurmctld || return 1
    count=$(conf_nodes "$dir" | wc -l)
    if [ "$count" -le 1 ]; then
        pid_alive "$dir/run/slurmd.pid" slurmd || return 1
        munge_works || return 1
        state=$(node_state "$dir") || return 1
        case $state in
            idle | mixed | allocated | completing) return 0 ;;
            *) return 1 ;;
        esac
    fi
    while read -r node; do
        pid_alive "$(slurmd_pid_file "$dir" "$node")" slurmd || return 1
    done < <(conf_nodes "$dir")
    munge_works || return 1
    states_usable "$(node_states "$dir")"
}

print_exports() {
    local dir=$1
    printf 'export SLURM_CONF=%q\n' "$dir/slurm.conf"
    printf 'export LOCAL_SLURM_DIR=%q\n' "$dir"
}

log_tail() {
    local dir=$1 f
    # *.stderr: what the daemons print before their log file is open (config errors, fatal()).
    for f in "$dir/log/slurmctld.stderr" "$dir"/log/slurmd*.stderr "$dir/log/slurmctld.log" \
        "$dir"/log/slurmd*.log; do
        [ -s "$f" ] || continue
        printf '==> %s <==\n' "$f"
        tail -n 25 "$f"
    done
    if [ -s /var/log/munge/munged.log ]; then
        printf '==> %s <==\n' /var/log/munge/munged.log
        tail -n 8 /var/log/munge/munged.log
    fi
}

# other_cluster DIR: the DIR of another cluster of this script whose slurmctld or slurmd still runs (they share
# this machine's munged), if any.
other_cluster() {
    local dir=$1 f pid conf other
    for f in /proc/[0-9]*/comm; do
        pid=${f#/proc/}
        pid=${pid%/comm}
        proc_alive "$pid" slurmctld || proc_alive "$pid" slurmd || continue
        conf=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^SLURM_CONF=//p')
        other=${conf%/slurm.conf}
        if [ -n "$conf" ] && [ "$other" != "$dir" ] && [ -f "$other/$MARKER" ]; then
            printf '%s\n' "$other"
            return 0
        fi
    done
    return 1
}

stop_daemons() {
    local dir=$1 jobs pid f i other
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
    for f in "$dir"/run/slurmd.pid "$dir"/run/slurmd-*.pid; do
        [ -e "$f" ] || continue
        kill_pid "$(read_pid "$f" || true)" slurmd
        rm -f "$f"
    done
    kill_pid "$(read_pid "$dir/run/slurmctld.pid" || true)" slurmctld
    rm -f "$dir/run/slurmctld.pid"
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
    # Several nodes: what their namespaces still run (slurmd found by no pid file, a job's processes that lost
    # their slurmstepd), then the namespaces, links and hosts lines themselves.
    remove_network "$dir"
    if [ -s "$dir/run/munged.pid" ]; then
        # munged is the machine's: a cluster in another DIR may still use it. It then keeps it, and stops it.
        if other=$(other_cluster "$dir"); then
            log "leaving munged running for the cluster in $other, which stops it"
            [ -s "$other/run/munged.pid" ] || cp "$dir/run/munged.pid" "$other/run/munged.pid"
        else
            kill_pid "$(read_pid "$dir/run/munged.pid" || true)" munged
        fi
        rm -f "$dir/run/munged.pid"
    fi
}

# Serialize start/stop on one DIR (parallel test workers may all call start), then across every DIR: two
# clusters starting at once would both take the first free ports, or both start munged, and a cluster stopping
# could stop the munged another is about to use.
take_lock() {
    local dir=$1
    mkdir -p "$dir"
    exec 9>"$dir/.lock"
    flock -w 120 9 || die "timed out waiting for the lock on $dir/.lock"
    exec 7>"$MACHINE_LOCK"
    flock -w 180 7 || die "timed out waiting for the lock on $MACHINE_LOCK (another cluster's start or stop)"
}

# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
cmd_start() {
    need_root
    need_binaries
    local dir=$DIR conf t0 deadline state timeout i
    if [ "$NODES" -gt 1 ]; then
        local b missing=()
        for b in ip nsenter unshare hostname sha256sum; do
            command -v "$b" >/dev/null 2>&1 || missing+=("$b")
        done
        [ ${#missing[@]} -eq 0 ] || die "--nodes $NODES needs ${missing[*]} (Debian: iproute2, util-linux, hostname, coreutils)"
    fi
    if [ -e "$dir" ] && [ ! -f "$dir/$MARKER" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
        die "$dir exists, is not empty and was not created by this script"
    fi
    # slurmstepd listens on SlurmdSpoolDir/NODE_JOBID.STEPID, a Unix socket path of at most 107 bytes; a longer
    # one fails every job step ("Unix socket path ... is too long").
    local spool
    spool=$dir/spool/$(hostname -s)_
    [ "$NODES" -eq 1 ] || spool=$dir/spool/$(node_name 1)/$(node_name 1)_
    if [ $((${#spool} + 20)) -gt 107 ]; then
        die "$dir is too long a path for a cluster's state: slurmstepd's sockets, $spool<job>.<step>, must fit 107 bytes; choose a shorter DIR (${#dir} bytes now, at most $((${#dir} - ${#spool} + 87)))"
    fi
    take_lock "$dir"
    touch "$dir/$MARKER"
    choose_ports "$dir"
    [ "$NODES" -eq 1 ] || choose_subnet "$dir"
    conf=$(render_conf "$dir")
    if healthy "$dir" && [ "$conf" = "$(cat "$dir/slurm.conf")" ]; then
        log "reusing the running cluster in $dir"
        print_exports "$dir"
        return 0
    fi
    t0=$SECONDS
    # Also what a crashed cluster of this DIR left: its processes, namespaces, links and hosts lines.
    stop_daemons "$dir"
    if [ "$NODES" -gt 1 ]; then
        # Again, now that this DIR's own leftovers no longer hold a network.
        choose_subnet "$dir"
        conf=$(render_conf "$dir")
    fi
    # Fresh state every time: stale job/node state from an older run (or another hostname) only
    # produces confusing DOWN/DRAIN states.
    rm -rf "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
    mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
    printf '%s\n' "$conf" >"$dir/slurm.conf"
    chmod 0644 "$dir/slurm.conf"
    # SlurmdSpoolDir=DIR/spool/%n: slurmd does not create its own.
    for ((i = 1; i <= NODES && NODES > 1; i++)); do
        mkdir -p "$dir/spool/$(node_name "$i")"
    done

    local port
    for port in "$CTLD_PORT" "$SLURMD_PORT"; do
        # Only the caller's own ports can be taken here (choose_ports picked free ones otherwise).
        if port_in_use "$port"; then
            die "port $port on 127.0.0.1 is already in use (another Slurm cluster or service holds it), so this cluster cannot start there: stop that one, or unset LOCAL_SLURM_CTLD_PORT/LOCAL_SLURM_SLURMD_PORT to let this script pick free ports"
        fi
    done

    ensure_munge "$dir"
    [ "$NODES" -eq 1 ] || make_network

    # Clean environment: a caller inside a Slurm job must not leak SLURM_* into the daemons
    # (slurmd hands its environment down to slurmstepd).
    local -a daemon_env=(env -i "PATH=/usr/sbin:/usr/bin:/sbin:/bin" "SLURM_CONF=$dir/slurm.conf")
    log "starting slurmctld"
    # -i: ignore unreadable state files instead of refusing to start.
    "${daemon_env[@]}" slurmctld -i -f "$dir/slurm.conf" </dev/null >>"$dir/log/slurmctld.stderr" 2>&1 9>&- 7>&- || {
        log_tail "$dir" >&2
        die "slurmctld failed to start"
    }
    local -a nodes=()
    if [ "$NODES" -eq 1 ]; then
        nodes=("$(hostname -s)")
        log "starting slurmd"
        # -N: register under the configured node name even if gethostname() differs from `hostname -s`.
        "${daemon_env[@]}" slurmd -N "$(hostname -s)" -f "$dir/slurm.conf" </dev/null >>"$dir/log/slurmd.stderr" 2>&1 9>&- 7>&- || {
            log_tail "$dir" >&2
            die "slurmd failed to start"
        }
    else
        local node
        for ((i = 1; i <= NODES; i++)); do
            node=$(node_name "$i")
            nodes+=("$node")
            log "starting slurmd for $node ($(node_addr "$i")) in namespace $(netns_name "$i")"
            # Its own network namespace, and a UTS namespace whose host name is the node's: slurmd, its
            # slurmstepd and every process of a job step see that name and address, as on a host of their own.
            # shellcheck disable=SC2016  # $1 and $@ belong to the inner shell
            # nsenter, not `ip netns exec`: that remounts /sys for the namespace, which hides /sys/fs/cgroup, and
            # slurmd refuses to start without it ("Unable to initialize cgroup plugin").
            nsenter --net="/run/netns/$(netns_name "$i")" unshare --uts -- sh -c 'hostname "$1" && shift && exec "$@"' sh \
                "$node" "${daemon_env[@]}" slurmd -N "$node" -f "$dir/slurm.conf" \
                </dev/null >>"$dir/log/slurmd-$node.stderr" 2>&1 9>&- 7>&- || {
                log_tail "$dir" >&2
                die "slurmd for $node failed to start"
            }
        done
    fi

    timeout=${LOCAL_SLURM_START_TIMEOUT:-30}
    deadline=$((SECONDS + timeout))
    state=""
    while :; do
        if [ "$NODES" -eq 1 ]; then
            state=$(node_state "$dir" || true)
            case $state in
                idle | mixed | allocated) break ;;
            esac
        else
            state=$(node_states "$dir" || true)
            states_usable "$state" && break
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            log_tail "$dir" >&2
            die "node(s) ${nodes[*]} not idle after ${timeout}s (state: '$(echo "${state:-no answer from slurmctld}" | tr '\n' ' ' | sed 's/ $//')'); logs above, all in $dir/log"
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
    if [ "$NODES" -eq 1 ]; then
        log "cluster up in $((SECONDS - t0))s: node $(hostname -s) $state, SLURM_CONF=$dir/slurm.conf"
    else
        log "cluster up in $((SECONDS - t0))s: $NODES nodes ($(echo "$state" | paste -sd, - | sed 's/,/, /g')), SLURM_CONF=$dir/slurm.conf"
    fi
    print_exports "$dir"
}

cmd_stop() {
    need_root
    local dir=$DIR
    if [ ! -f "$dir/$MARKER" ]; then
        log "nothing to stop in $dir"
        return 0
    fi
    take_lock "$dir"
    stop_daemons "$dir"
    log "stopped (state kept in $dir)"
}

cmd_status() {
    local dir=$DIR state count
    count=$(conf_nodes "$dir" | wc -l)
    if healthy "$dir"; then
        if [ "$count" -le 1 ]; then
            state=$(node_state "$dir")
            log "healthy: node $(hostname -s) $state, SLURM_CONF=$dir/slurm.conf"
        else
            state=$(node_states "$dir" | paste -sd, - | sed 's/,/, /g')
            log "healthy: $count nodes ($state), SLURM_CONF=$dir/slurm.conf"
        fi
        return 0
    fi
    local ctld=down node=unknown slurmd=down name up=0
    if pid_alive "$dir/run/slurmctld.pid" slurmctld; then
        ctld=up
        # Only ask sinfo when slurmctld runs: otherwise it retries for many seconds.
        if [ "$count" -le 1 ]; then
            node=$(node_state "$dir" || true)
        else
            node=$(node_states "$dir" | paste -sd, - | sed 's/,/, /g' || true)
        fi
    fi
    if [ "$count" -le 1 ]; then
        pid_alive "$dir/run/slurmd.pid" slurmd && slurmd=up
    else
        while read -r name; do
            pid_alive "$(slurmd_pid_file "$dir" "$name")" slurmd && up=$((up + 1))
        done < <(conf_nodes "$dir")
        slurmd="$up of $count up"
    fi
    log "not healthy: $dir (slurmctld: $ctld," \
        "slurmd: $slurmd," \
        "munge: $(munge_works && echo ok || echo down), node: ${node:-no answer})"
    return 1
}

cmd_nodes() {
    local dir=$DIR name addr i=0
    [ -f "$dir/slurm.conf" ] || die "no cluster in $dir (no slurm.conf): start one first"
    while read -r name; do
        i=$((i + 1))
        addr=$(sed -n "s/^NodeName=$name NodeAddr=\([^ ]*\) .*/\1/p" "$dir/slurm.conf")
        if [ "$(conf_nodes "$dir" | wc -l)" -gt 1 ]; then
            printf '%s %s %s\n' "$name" "$addr" "$(netns_name "$i")"
        else
            printf '%s %s -\n' "$name" "$addr"
        fi
    done < <(conf_nodes "$dir")
}

main() {
    local cmd=${1:-}
    [ $# -gt 0 ] && shift
    case $cmd in
        install) cmd_install "$@" ;;
        start | stop | status | conf | nodes)
            parse_args "$@"
            case $cmd in
                stop | status | nodes)
                    [ "$NODES" -eq 1 ] || die "$cmd takes no --nodes: it reads the cluster's nodes from DIR/slurm.conf"
                    ;;
            esac
            DIR=$(resolve_dir "$ARG_DIR")
            set_layout "$DIR"
            case $cmd in
                start) cmd_start ;;
                stop) cmd_stop ;;
                status) cmd_status ;;
                nodes) cmd_nodes ;;
                conf)
                    choose_ports "$DIR"
                    [ "$NODES" -eq 1 ] || choose_subnet "$DIR"
                    render_conf "$DIR"
                    ;;
            esac
            ;;
        -h | --help | help) usage ;;
        *)
            usage >&2
            exit 2
            ;;
    esac
}

main "$@"
