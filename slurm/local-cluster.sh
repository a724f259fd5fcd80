#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tests and for trying `fleet submit`.
#
#   slurm/local-cluster.sh start    install slurm-wlm + munge if missing (Debian/Ubuntu, as root),
#                                   start munged, slurmctld and slurmd, wait for the node to be idle
#   slurm/local-cluster.sh status   daemons and `sinfo`; exit 0 only when the node is up
#   slurm/local-cluster.sh stop     stop the daemons (state and logs stay for a look)
#   slurm/local-cluster.sh env      the line to give your shell: eval "$(slurm/local-cluster.sh env)"
#
# Everything lives under $FLEET_SLURM_DIR (default /tmp/fleet-slurm): slurm.conf, the munge key
# and socket, spool, state, logs and pid files; /etc is not touched. Clients find the cluster
# through SLURM_CONF=$FLEET_SLURM_DIR/slurm.conf (see `env`). The node claims
# $FLEET_SLURM_CPUS CPUs (default 16) whatever the machine has (SlurmdParameters=config_overrides),
# so a 2-core CI machine can run a job of 4+ tasks. Ports: $FLEET_SLURM_PORT (slurmctld, default
# 6817) and the next one (slurmd).
set -euo pipefail

DIR=${FLEET_SLURM_DIR:-/tmp/fleet-slurm}
CPUS=${FLEET_SLURM_CPUS:-16}
PORT=${FLEET_SLURM_PORT:-6817}
TIMEOUT=${FLEET_SLURM_TIMEOUT:-60}
# A requeued job waits cred_expire + 1 s before it may start again (Slurm's default is 120 s).
CRED_EXPIRE=${FLEET_SLURM_CRED_EXPIRE:-10}
NODE=$(hostname -s)
export SLURM_CONF=$DIR/slurm.conf

log() { echo "local-cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

install_packages() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return
    [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are missing; install them (apt-get install slurm-wlm munge) or run as root"
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get to install them"
    log "installing slurm-wlm and munge"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

pid_of() { cat "$1" 2>/dev/null || true; }
pid_alive() { local pid; pid=$(pid_of "$1"); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

write_config() {
    mkdir -p "$DIR"/{munge,state,spool,log,run}
    chmod 700 "$DIR/munge"
    [ -s "$DIR/munge/munge.key" ] || mungekey --create --keyfile="$DIR/munge/munge.key" --force
    chmod 400 "$DIR/munge/munge.key"
    cat >"$SLURM_CONF" <<EOF
# Written by slurm/local-cluster.sh: a one-node test cluster on $NODE.
ClusterName=fleet-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=$CRED_EXPIRE
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=pmi2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=10
InactiveLimit=0
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start_munge() {
    pid_alive "$DIR/run/munged.pid" && return
    munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
}

start_daemons() {
    pid_alive "$DIR/run/slurmctld.pid" || slurmctld -f "$SLURM_CONF"
    pid_alive "$DIR/run/slurmd.pid" || slurmd -f "$SLURM_CONF"
}

node_state() { sinfo -h -N -n "$NODE" -o %T 2>/dev/null | head -n1; }

wait_idle() {
    local waited=0 state=""
    while [ "$waited" -lt "$TIMEOUT" ]; do
        state=$(node_state)
        case "$state" in  # a trailing * means not responding (yet)
            idle|mixed|allocated) log "node $NODE is $state (SLURM_CONF=$SLURM_CONF)"; return 0 ;;
            down|drained|draining) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
        esac
        sleep 1; waited=$((waited + 1))
    done
    die "node $NODE not idle after ${TIMEOUT}s (state '${state:-none}'); see $DIR/log/slurmctld.log and $DIR/log/slurmd.log"
}

start() {
    install_packages
    write_config
    start_munge
    start_daemons
    wait_idle
}

stop_one() {
    local name=$1 pidfile=$DIR/run/$1.pid pid waited=0
    pid=$(pid_of "$pidfile")
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then rm -f "$pidfile"; return 0; fi
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 20 ]; do sleep 0.5; waited=$((waited + 1)); done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    rm -f "$pidfile"
    log "stopped $name"
}

stop() {
    [ -f "$SLURM_CONF" ] && scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    stop_one slurmd
    stop_one slurmctld
    stop_one munged
}

status() {
    local name rc=0
    for name in munged slurmctld slurmd; do
        if pid_alive "$DIR/run/$name.pid"; then echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"
        else echo "$name: stopped"; rc=1; fi
    done
    [ "$rc" = 0 ] && sinfo -N || true
    [ "$rc" = 0 ] && case "$(node_state)" in idle|mixed|allocated) ;; *) rc=1 ;; esac
    return "$rc"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) echo "export SLURM_CONF=$SLURM_CONF" ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
