#!/usr/bin/env bash
# A throw-away single-node Slurm cluster on loopback, for the end-to-end test of `recipe submit`
# and `srun recipe run` (tests/it/slurm.rs) and for trying Slurm by hand.
#
#   tools/slurm/ci-cluster.sh start   # install slurm-wlm + munge if missing, configure, start, wait
#   tools/slurm/ci-cluster.sh stop    # stop the daemons this script started
#   tools/slurm/ci-cluster.sh env     # print `export SLURM_CONF=...` for the client commands
#
# Everything lives under $FERROTRON_SLURM_DIR (default /tmp/ferrotron-slurm): slurm.conf, state,
# spool, logs, pid files. Nothing under /etc is changed except what the Debian packages install,
# so a real cluster's configuration is never touched: the clients and daemons find this one
# through SLURM_CONF. Needs root (apt-get, munged's key, slurmd). Exit status 3 means "Slurm cannot
# be installed or started here" (the test skips with the message); anything else non-zero is a bug.
set -euo pipefail

DIR="${FERROTRON_SLURM_DIR:-/tmp/ferrotron-slurm}"
CONF="$DIR/slurm.conf"
CTLD_PORT="${FERROTRON_SLURMCTLD_PORT:-16817}"
SLURMD_PORT="${FERROTRON_SLURMD_PORT:-16818}"
CPUS="${FERROTRON_SLURM_CPUS:-2}"

cannot() { echo "ci-cluster: $*" >&2; exit 3; }
say() { echo "ci-cluster: $*" >&2; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null; then
        return
    fi
    [ "$(id -u)" = 0 ] || cannot "slurm-wlm and munge are missing and installing them needs root"
    command -v apt-get >/dev/null || cannot "slurm-wlm and munge are missing and there is no apt-get"
    say "installing slurm-wlm and munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends slurm-wlm munge >"$DIR/apt.log" 2>&1; then
        apt-get update >>"$DIR/apt.log" 2>&1 || true
        apt-get install -y --no-install-recommends slurm-wlm munge >>"$DIR/apt.log" 2>&1 \
            || cannot "apt-get could not install slurm-wlm and munge (see $DIR/apt.log)"
    fi
}

start_munge() {
    if [ -S /run/munge/munge.socket.2 ] && munge -n </dev/null | unmunge >/dev/null 2>&1; then
        return
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then mungekey --create --force; else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
    fi
    chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
    if id munge >/dev/null 2>&1; then
        runuser -u munge -- munged || cannot "munged did not start"
    else
        munged --force || cannot "munged did not start"
    fi
    for _ in $(seq 50); do
        munge -n </dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.1
    done
    cannot "munged started but does not answer"
}

write_config() {
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/logs"
    local memory
    memory=$(awk '/MemTotal/ { print int($2 / 1024 / 2) }' /proc/meminfo)
    cat >"$CONF" <<CONF
# Single-node Slurm on loopback, written by tools/slurm/ci-cluster.sh.
ClusterName=ferrotron-ci
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: processes are tracked through /proc, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=20
SchedulerParameters=sched_interval=1
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$memory State=UNKNOWN
PartitionName=ci Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
}

# Running and not a zombie (daemons started here may have no parent left to reap them).
alive() {
    kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null
}

stop_daemons() {
    local name pid
    for name in slurmd slurmctld; do
        if [ -s "$DIR/$name.pid" ]; then
            pid=$(cat "$DIR/$name.pid")
            # Only the daemon this script started: a stale pid file may name a reused pid.
            if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null \
                | grep -q "$name .*-f $CONF"; then
                kill "$pid" 2>/dev/null || true
                for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
                kill -9 "$pid" 2>/dev/null || true
            fi
            rm -f "$DIR/$name.pid"
        fi
    done
}

start() {
    mkdir -p "$DIR"
    install_packages
    start_munge
    stop_daemons
    write_config
    export SLURM_CONF="$CONF"
    # -c: forget jobs of an earlier cluster in this directory; -i: ignore unreadable state.
    slurmctld -c -i -f "$CONF" || cannot "slurmctld did not start (see $DIR/slurmctld.log)"
    slurmd -N localhost -f "$CONF" || cannot "slurmd did not start (see $DIR/slurmd.log)"
    local state=""
    for _ in $(seq 150); do
        state=$(sinfo -h -n localhost -o %t 2>/dev/null || true)
        case "$state" in idle*|mix*|alloc*) break ;; esac
        sleep 0.2
    done
    case "$state" in
        idle*|mix*|alloc*) ;;
        *) scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
           sleep 1
           state=$(sinfo -h -n localhost -o %t 2>/dev/null || true)
           case "$state" in idle*|mix*|alloc*) ;; *)
               cannot "the node did not become idle (state '$state'; see $DIR/slurmctld.log, $DIR/slurmd.log)";;
           esac ;;
    esac
    say "up: node localhost ($CPUS CPUs), partition ci; export SLURM_CONF=$CONF"
}

case "${1:-}" in
    start) start ;;
    stop) stop_daemons ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
