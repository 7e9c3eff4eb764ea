#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for the kit's cluster tests.
#
#   bash dev/slurm-cluster.sh install   # Debian packages slurm-wlm and munge (needs root)
#   bash dev/slurm-cluster.sh start     # munged, slurmctld and two slurmd (node1, node2); waits until idle
#   bash dev/slurm-cluster.sh status    # sinfo
#   bash dev/slurm-cluster.sh stop      # cancel every job, stop the daemons
#
# Both nodes run on this host (NodeAddr 127.0.0.1, one slurmd per port) with 4 CPUs and 4 fake
# GPUs each (gres on character devices nothing opens), so `--gpus-per-node=1` is satisfiable on a
# CPU machine and up to four such jobs of the tests run side by side (the CPUs are oversubscribed
# on purpose, config_overrides: the jobs spend much of their time starting up and waiting).
# Processes are tracked by their parent chain (proctrack/linuxproc): no cgroups are needed.
# The timings are a test cluster's: a requeued job may start again after cred_expire seconds (the
# default, 120, is the whole wait of a requeue test), and the schedulers look at pending jobs every
# few seconds instead of every 30-60 s, so a job starts as soon as its begin time or its nodes allow.
# Root only: it writes /etc/slurm, /etc/hosts and spool folders under /var.
set -euo pipefail

CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
HOST=$(hostname -s)
CPUS=${PRISM_SLURM_CPUS:-4}

die() { echo "slurm-cluster: $*" >&2; exit 1; }

install_packages() {
    [ "$(id -u)" = 0 ] || die "install needs root (apt-get)."
    if command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
}

write_config() {
    mkdir -p "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd/node1 /var/spool/slurmd/node2
    cat > "$CONF_DIR/slurm.conf" <<CONF
# Written by dev/slurm-cluster.sh: two nodes on one host, for tests.
ClusterName=prismtest
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
AuthInfo=cred_expire=10
SchedulerParameters=sched_interval=2,bf_interval=1
SlurmdParameters=config_overrides
KillWait=30
MinJobAge=3600
SlurmdTimeout=300
InactiveLimit=0
GresTypes=gpu
NodeName=node[1-2] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=$CPUS Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
CONF
    cat > "$CONF_DIR/gres.conf" <<CONF
AutoDetect=off
NodeName=node1 Name=gpu File=/dev/null,/dev/zero,/dev/full,/dev/urandom
NodeName=node2 Name=gpu File=/dev/null,/dev/zero,/dev/full,/dev/urandom
CONF
    # the node names must resolve to this host
    grep -qE '^[^#]*[[:space:]]node1([[:space:]]|$)' /etc/hosts || echo "127.0.0.1 node1 node2" >> /etc/hosts
}

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0
    fi
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "munged did not start (see /var/log/munge/munged.log)."
}

wait_idle() {
    for _ in $(seq 150); do
        if [ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -cE '^(idle|mixed|allocated)$')" = 2 ]; then
            return 0
        fi
        scontrol update nodename=node[1-2] state=resume >/dev/null 2>&1 || true
        sleep 0.2
    done
    sinfo -N >&2 || true
    die "the nodes did not become idle (see $LOG_DIR)."
}

start() {
    [ "$(id -u)" = 0 ] || die "start needs root."
    command -v slurmd >/dev/null || die "Slurm is not installed: run 'bash dev/slurm-cluster.sh install' first."
    write_config
    start_munge
    pgrep -x slurmctld >/dev/null || slurmctld
    for _ in $(seq 50); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
    for n in node1 node2; do
        pgrep -f "slurmd -N $n\$" >/dev/null || slurmd -N "$n"
    done
    wait_idle
    sinfo -N
}

stop() {
    scancel --full --quiet $(squeue -h -o %A 2>/dev/null) 2>/dev/null || true
    for f in /run/slurmd-node1.pid /run/slurmd-node2.pid /run/slurmctld.pid; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
    done
    pkill -x slurmstepd 2>/dev/null || true
    for _ in $(seq 50); do
        pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break
        sleep 0.2
    done
    pkill -9 -x slurmd 2>/dev/null || true
    pkill -9 -x slurmctld 2>/dev/null || true
    rm -rf /var/spool/slurmctld/* /var/spool/slurmd/node1/* /var/spool/slurmd/node2/*
}

case "${1:-}" in
    install) install_packages ;;
    start) start ;;
    stop) stop ;;
    status) sinfo -N ;;
    *) die "usage: bash dev/slurm-cluster.sh install|start|status|stop" ;;
esac
