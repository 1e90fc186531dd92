#!/usr/bin/env bash
# Start a throwaway single-node SLURM (Debian's slurm-wlm and munge) on this machine, as root, for
# the SLURM executor test, and print the path of its slurm.conf as the last line of stdout (a
# caller may export it as SLURM_CONF). Nothing else goes to stdout. Running it again while that
# cluster is up prints the same path (idempotent, fast). When SLURM cannot start it prints nothing
# on stdout, says why on stderr and exits non-zero.
#
# The config goes to /etc/slurm/slurm.conf, where every SLURM command looks without being told:
# the executor plugin's job step (snakemake-executor-plugin-slurm-jobstep 0.6.1) drops SLURM_CONF
# before its inner srun, so a config elsewhere is not found inside a job. A slurm.conf this script
# did not write is never overwritten.
#   start-slurm.sh status   exits 0 when the cluster it started answers, 1 when not (prints nothing)
#   start-slurm.sh stop     stops the daemons it started (slurmctld, slurmd, and munged if it started
#                           that too) by their pids, and removes its files (nothing to stop: exit 0)
set -euo pipefail

mode="${1:-start}"
case "$mode" in start | status | stop) ;; *) echo "usage: start-slurm.sh [start|status|stop]" >&2; exit 2 ;; esac

state="${TMPDIR:-/tmp}/convsweep-test-slurm.state"
conf=/etc/slurm/slurm.conf
marker="# written by convsweep's .ci/start-slurm.sh"

fail() { echo "start-slurm: $*" >&2; exit 1; }

answers() {  # conf: the node is up and takes jobs
    SLURM_CONF="$1" timeout 10 sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'
}

ours() {  # dir: a cluster's directory this script made
    case "$1" in "${TMPDIR:-/tmp}"/convsweep-slurm.*) return 0 ;; *) return 1 ;; esac
}

halt() {  # pidfile name: SIGTERM the daemon the file names, if it is still that daemon, and wait for it
    local pid
    [ -f "$1" ] && read -r pid <"$1" && [ -n "$pid" ] || return 0
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 0  # gone, or the pid is another's now
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do  # until it is gone, or has exited and waits for its parent to reap it (Z)
        grep -qE '^State:[[:space:]]+[^Z]' "/proc/$pid/status" 2>/dev/null || return 0
        sleep 0.1
    done
    echo "start-slurm: $2 (pid $pid) did not stop after 10 s" >&2
    return 1
}

stop_cluster() {  # dir: stop what this script started there and remove its files; 1 when a daemon stays
    local stuck=0
    if ours "$1"; then
        halt "$1/slurmd.pid" slurmd || stuck=1
        halt "$1/slurmctld.pid" slurmctld || stuck=1
        if [ -f "$1/munged.started" ]; then
            halt /run/munge/munged.pid munged || stuck=1
        fi
        [ "$stuck" = 0 ] || return 1
        rm -rf "$1"
    fi
    if [ -f "$conf" ] && [ "$(head -1 "$conf")" = "$marker" ]; then
        rm -f "$conf"
    fi
    rm -f "$state"
}

dir=""
if [ -f "$state" ]; then
    read -r dir <"$state" || true
fi
case "$mode" in
    status)
        [ -n "$dir" ] && [ -f "$conf" ] && answers "$conf"
        exit
        ;;
    stop)
        if [ -n "$dir" ]; then stop_cluster "$dir" || exit 1; fi
        exit 0
        ;;
esac

[ "$(id -u)" = 0 ] || fail "needs root (it starts munged and slurmd); SLURM tests will be skipped"

if [ -n "$dir" ]; then
    if [ -f "$conf" ] && answers "$conf"; then
        echo "$conf"
        exit 0
    fi
    # That cluster is gone or half started (reboot, killed, a start that failed): stop what is left of it and
    # start afresh.
    stop_cluster "$dir" || fail "the daemons of $dir did not stop: not starting a second cluster beside them"
fi
if [ -f "$conf" ] && [ "$(head -1 "$conf")" != "$marker" ]; then
    fail "$conf exists and was not written by this script: not touching a real cluster's config"
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    echo "start-slurm: installing slurm-wlm and munge" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq slurm-wlm munge; } >/dev/null 2>&1 \
        || fail "apt-get install slurm-wlm munge failed; SLURM tests will be skipped"
fi

dir="$(mktemp -d "${TMPDIR:-/tmp}/convsweep-slurm.XXXXXX")"
echo "$dir" >"$state"  # from here on, `stop` finds what was started, even if the start fails halfway

# munge authenticates every message between the SLURM daemons and commands.
mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
chown munge:munge /run/munge
chown -R munge:munge /var/log/munge /var/lib/munge /etc/munge
if [ ! -s /etc/munge/munge.key ]; then
    runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key >&2 || fail "mungekey failed"
fi
chmod 0400 /etc/munge/munge.key
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    touch "$dir/munged.started"  # a munged that was running before is not this script's to stop
    runuser -u munge -- munged >&2 || fail "munged did not start (see /var/log/munge/munged.log)"
fi
munge -n </dev/null | unmunge >/dev/null 2>&1 || fail "munge does not answer (see /var/log/munge/munged.log)"

node="$(hostname -s)"
cpus="$(nproc)"
# slurmd drains a node whose configured memory exceeds what it finds: take slurmd's own figure.
memory_mb="$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)"
[ -n "$memory_mb" ] || fail "slurmd -C did not report RealMemory"
mkdir -p "$dir/state" "$dir/spool" "$(dirname "$conf")"
# CR_CPU without memory: a job that asks for no memory does not hold the whole node. No GresTypes:
# the node has no GPU to offer; a job with gpu=0 gets no --gpus from the executor and schedules.
# MinJobAge 600: finished jobs stay visible to squeue, the status command where sacct has no
# accounting database to read.
cat >"$conf" <<EOF
$marker
ClusterName=convsweep
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=600
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

export SLURM_CONF="$conf"
slurmctld >&2 || fail "slurmctld did not start, see $dir/slurmctld.log: $(tail -1 "$dir/slurmctld.log" 2>/dev/null)"
slurmd >&2 || fail "slurmd did not start, see $dir/slurmd.log: $(tail -1 "$dir/slurmd.log" 2>/dev/null)"

for _ in $(seq 60); do
    if answers "$conf"; then
        echo "$conf"
        exit 0
    fi
    sleep 1
done
fail "node $node not idle after 60 s ($(SLURM_CONF="$conf" sinfo -h -o '%T %E' 2>&1 | head -1)), see $dir/slurmctld.log"
