#!/usr/bin/env bash
# A real Slurm cluster on this one machine: munged, MariaDB, slurmdbd, slurmctld, two slurmd nodes.
#
#   bash slurm/cluster.sh up       install the packages if missing, start everything (idempotent)
#   bash slurm/cluster.sh down     stop everything, orphan job steps included
#   bash slurm/cluster.sh status   what runs, and sinfo
#   bash slurm/cluster.sh running  exit 0 when this state folder's slurmctld runs and answers
#   bash slurm/cluster.sh env      the export line for SLURM_CONF
#
# Everything lives under one state folder (HPCDL_SLURM_STATE, default /var/tmp/hpcdl-slurm) with its
# own ports (from HPCDL_SLURM_PORT_BASE, default 16800) and munge key and socket, so a second
# cluster with another folder and base never collides with this one. When /etc/slurm/slurm.conf is
# absent (or is a link made by this script), `up` links it to this cluster's slurm.conf, so that
# sbatch, squeue and `python -m hpcdl.submit cluster=slurm` reach it with no other setting.
set -euo pipefail

STATE=${HPCDL_SLURM_STATE:-/var/tmp/hpcdl-slurm}
BASE=${HPCDL_SLURM_PORT_BASE:-16800}
CLUSTER=${HPCDL_SLURM_CLUSTER:-hpcdl}
NODES=(n1 n2)
CPUS_PER_NODE=${HPCDL_SLURM_CPUS_PER_NODE:-4}
MEMORY_PER_NODE_MB=${HPCDL_SLURM_MEMORY_MB:-4000}
# MaxArraySize low by default, so that tests see a sweep split into several arrays (100 points still fit
# one); HPCDL_SLURM_MAX_ARRAY_SIZE=10001 for a 10,000-point sweep in one array (benchmarks/sweep_submit.py)
MAX_ARRAY_SIZE=${HPCDL_SLURM_MAX_ARRAY_SIZE:-101}
CTLD_PORT=$((BASE + 17)); DBD_PORT=$((BASE + 19)); DB_PORT=$((BASE + 6)); NODE_PORT=$((BASE + 21))
CONF=$STATE/etc/slurm.conf
MUNGE_SOCKET=$STATE/munge/munge.socket
DB_SOCKET=$STATE/mysql/mysqld.sock
export SLURM_CONF=$CONF

log() { printf '[slurm/cluster.sh] %s\n' "$*" >&2; }

install_packages() {
  local missing=()
  for cmd in slurmctld:slurm-wlm slurmdbd:slurmdbd munged:munge mariadbd:mariadb-server mpirun:openmpi-bin \
             mpicc:libopenmpi-dev sshd:openssh-server ssh:openssh-client rsync:rsync; do
    command -v "${cmd%%:*}" >/dev/null 2>&1 || missing+=("${cmd##*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

write_configs() {
  mkdir -p "$STATE"/{etc,munge,mysql,log,ctld,run} "$STATE"/spool
  chmod 711 "$STATE"  # other accounts reach slurm.conf and the munge socket, as on a site
  if [ ! -s "$STATE/munge/munge.key" ]; then
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$STATE/munge/munge.key"
  fi
  chmod 711 "$STATE/munge"  # the socket reachable by every account; the key stays root's
  local node_list="${NODES[0]}"
  [ ${#NODES[@]} -gt 1 ] && node_list="n[1-${#NODES[@]}]"
  cat > "$CONF" <<CONF
# Written by slurm/cluster.sh: a test cluster on one host.
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=120
MessageTimeout=20
MaxArraySize=$MAX_ARRAY_SIZE
# jobs queued or recently ended at once (an array task counts as one): a 10,000-point sweep and more
MaxJobCount=100000
# urgent preempts debug: Slurm sends USR2, then TERM after the preempted job's partition's GraceTime
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
NodeName=$node_list NodeAddr=127.0.0.1 Port=$NODE_PORT-$((NODE_PORT + ${#NODES[@]} - 1)) CPUs=$CPUS_PER_NODE RealMemory=$MEMORY_PER_NODE_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 OverSubscribe=NO GraceTime=20
PartitionName=urgent Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=10 OverSubscribe=NO GraceTime=20
CONF
  cat > "$STATE/etc/slurmdbd.conf" <<CONF
# Written by slurm/cluster.sh
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=hpcdl-test-only
StorageLoc=slurm_acct_db_$CLUSTER
CONF
  chmod 600 "$STATE/etc/slurmdbd.conf"
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq $((limit * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  log "timed out waiting for $what"; return 1
}

start_munge() {
  running "$STATE/run/munged.pid" && return 0
  munged --force --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/run/munged.pid" --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/munge.seed"
  wait_for 10 munged test -S "$MUNGE_SOCKET"
}

start_mariadb() {
  if ! running "$STATE/run/mariadbd.pid"; then
    if [ ! -d "$STATE/mysql/mysql" ]; then
      mariadb-install-db --datadir="$STATE/mysql" --user=root --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1
    fi
    (setsid mariadbd --no-defaults --datadir="$STATE/mysql" --socket="$DB_SOCKET" --port="$DB_PORT" \
       --bind-address=127.0.0.1 --user=root --pid-file="$STATE/run/mariadbd.pid" \
       --log-error="$STATE/log/mariadb.log" --skip-name-resolve </dev/null >/dev/null 2>&1 &)
    wait_for 60 MariaDB mariadb --no-defaults --socket="$DB_SOCKET" -e "SELECT 1"
  fi
  mariadb --no-defaults --socket="$DB_SOCKET" <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'hpcdl-test-only';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'hpcdl-test-only';
CREATE DATABASE IF NOT EXISTS slurm_acct_db_$CLUSTER;
GRANT ALL ON slurm_acct_db_$CLUSTER.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db_$CLUSTER.* TO 'slurm'@'localhost';
SQL
}

start_slurmdbd() {
  if ! running "$STATE/run/slurmdbd.pid"; then
    slurmdbd
    wait_for 30 slurmdbd sacctmgr -n list cluster
  fi
  sacctmgr -n list cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
}

start_slurmctld() {
  running "$STATE/run/slurmctld.pid" || slurmctld -f "$CONF"
  wait_for 30 slurmctld scontrol ping
}

start_slurmd() {
  for node in "${NODES[@]}"; do
    mkdir -p "$STATE/spool/$node"
    running "$STATE/run/slurmd-$node.pid" || slurmd -f "$CONF" -N "$node"
  done
  wait_for 60 "idle nodes" idle_nodes
  for node in "${NODES[@]}"; do  # a node left DOWN by an earlier failure comes back
    scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
  done
}

idle_nodes() { [ "$(sinfo -h -N -o '%t' -p debug | grep -cE '^(idle|mix|alloc)')" -ge "${#NODES[@]}" ]; }

link_default_conf() {
  local default=/etc/slurm/slurm.conf
  if [ ! -e "$default" ] || { [ -L "$default" ] && readlink "$default" | grep -q '/etc/slurm.conf$'; }; then
    mkdir -p /etc/slurm && ln -sfn "$CONF" "$default"
  else
    log "$default exists and is not ours: export SLURM_CONF=$CONF"
  fi
}

up() {
  install_packages
  write_configs
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurmctld
  start_slurmd
  link_default_conf
  log "cluster '$CLUSTER' is up: $(sinfo -h -o '%P %D %t' | tr '\n' ';')"
  echo "export SLURM_CONF=$CONF"
}

stop_pidfile() {  # stop_pidfile FILE NAME
  if running "$1"; then
    local pid; pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

down() {
  [ -d "$STATE" ] || { log "no cluster at $STATE"; return 0; }
  if running "$STATE/run/slurmctld.pid"; then
    scancel --cluster="$CLUSTER" --full -u "$(id -un)" >/dev/null 2>&1 || true
  fi
  for node in "${NODES[@]}"; do stop_pidfile "$STATE/run/slurmd-$node.pid"; done
  # job steps outlive a killed slurmd; end those of this cluster's spool
  pkill -9 -f "slurmstepd.*$STATE" 2>/dev/null || true
  for pid in $(pgrep -x slurmstepd 2>/dev/null); do
    grep -qs "$STATE" "/proc/$pid/environ" "/proc/$pid/cmdline" && kill -9 "$pid" 2>/dev/null || true
  done
  stop_pidfile "$STATE/run/slurmctld.pid"
  stop_pidfile "$STATE/run/slurmdbd.pid"
  stop_pidfile "$STATE/run/mariadbd.pid"
  stop_pidfile "$STATE/run/munged.pid"
  log "cluster '$CLUSTER' is down (state kept in $STATE; remove it for a clean start)"
}

answering() {  # a missing config or a dead slurmctld says no at once (scontrol retries a missing config for 60 s)
  [ -f "$CONF" ] && running "$STATE/run/slurmctld.pid" && scontrol ping >/dev/null 2>&1
}

status() {
  for name in munged mariadbd slurmdbd slurmctld; do
    running "$STATE/run/$name.pid" && echo "$name: running" || echo "$name: stopped"
  done
  for node in "${NODES[@]}"; do
    running "$STATE/run/slurmd-$node.pid" && echo "slurmd $node: running" || echo "slurmd $node: stopped"
  done
  running "$STATE/run/slurmctld.pid" && sinfo
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  running) answering ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 up|down|status|running|env" >&2; exit 2 ;;
esac
