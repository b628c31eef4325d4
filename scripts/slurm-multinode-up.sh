#!/usr/bin/env bash
# Start a SEPARATE multi-node Slurm on this one machine: one slurmctld on a bridge in the host's
# network namespace, and N slurmd "nodes", each in its own network namespace (veth on the bridge,
# its own address) and its own UTS namespace (its own hostname). Every config, pid, log and spool
# file lives under one folder; it never touches the single-node cluster of scripts/slurm-up.sh.
# Nodes share the host's filesystem (no mount namespace of their own), as a cluster shares NFS.
# Idempotent: when everything already runs with the same config it only checks and exits.
#
#   --nodes N                  number of nodes pnode1..pnodeN        (default 2, at most 9)
#   PARITY_SLURM2_DIR          state folder                          (default /var/tmp/parity-slurm2)
#   PARITY_SLURM2_SUBNET       first three octets of the node network (default 10.77.0: ctld .1, nodes .11..)
#   PARITY_SLURM2_PORT         slurmctld port; slurmd uses PORT+1    (default 6827)
#   PARITY_SLURM2_CPUS         CPUs each node declares               (default: nproc, the whole host per
#                              node; 1 on a 2-core host makes two nodes claim no more than the host has)
#   PARITY_SLURM2_DBD_PORT     a running slurmdbd on 127.0.0.1 to register with (default 6819); when
#                              none answers the cluster runs without accounting (sacct then fails)
#   PARITY_SLURM_NO_APT=1      fail instead of apt-get installing missing packages
#
# Afterwards:  source "$PARITY_SLURM2_DIR/env.sh"   (exports SLURM_CONF)
# Stop with scripts/slurm-multinode-down.sh. Needs root (namespaces, daemons).
set -euo pipefail

DIR=${PARITY_SLURM2_DIR:-/var/tmp/parity-slurm2}
SUBNET=${PARITY_SLURM2_SUBNET:-10.77.0}
PORT=${PARITY_SLURM2_PORT:-6827}
DBD_PORT=${PARITY_SLURM2_DBD_PORT:-6819}
CPUS=${PARITY_SLURM2_CPUS:-$(nproc)}
NODES=2
while (( $# )); do
  case $1 in
    --nodes) NODES=${2:-}; shift 2 ;;
    --nodes=*) NODES=${1#--nodes=}; shift ;;
    *) echo "usage: $0 [--nodes N]" >&2; exit 2 ;;
  esac
done
[[ $NODES =~ ^[1-9]$ ]] || { echo "--nodes: must be 1..9, got '$NODES'" >&2; exit 2; }
[[ $CPUS =~ ^[1-9][0-9]*$ ]] || { echo "PARITY_SLURM2_CPUS: must be a whole number >= 1, got '$CPUS'" >&2; exit 2; }
CLUSTER=parity2
PARTITION=debug
BRIDGE=parity2br # interface names are at most 15 characters
CTLD_ADDR=$SUBNET.1
ETC=$DIR/etc RUN=$DIR/run LOG=$DIR/log MUNGE=$DIR/munge
export SLURM_CONF=$ETC/slurm.conf
T0=$(date +%s%N)

LOG_TAG=slurm2-up
# shellcheck source=lib/slurm-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/slurm-common.sh"
tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
node_name() { echo "pnode$1"; }
node_addr() { echo "$SUBNET.$((10 + $1))"; }
netns_of() { echo "parity2-pnode$1"; }

[[ $(id -u) == 0 ]] || die "run as root (network namespaces and slurmd need it)"
log "starting a $NODES-node Slurm in $DIR"
install -d -m 755 "$DIR"
exec 9>"$DIR/.lock"
flock 9 # every daemon is started with 9>&- so that none of them keeps holding the lock

# ------------------------------------------------------------------------------------ packages
PKGS=(slurmctld slurmd slurm-client munge iproute2 util-linux)
missing=()
for pkg in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
if (( ${#missing[@]} )); then
  [[ ${PARITY_SLURM_NO_APT:-0} == 1 ]] && die "missing packages: ${missing[*]}"
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then # postinst must not start daemons through init.d
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$DIR/apt.log" 2>&1 ||
    die "apt-get install failed, see $DIR/apt.log"
  (( made_policy )) && rm -f /usr/sbin/policy-rc.d
fi
install -d -m 755 "$ETC" "$RUN" "$LOG" "$DIR/spool/ctld"
for i in $(seq "$NODES"); do install -d -m 755 "$DIR/spool/$(node_name "$i")"; done
install -d -m 755 -o munge -g munge "$MUNGE"

# ------------------------------------------------------------------------------------- network
# A bridge in the host namespace carries the controller's address; each node is a namespace with
# one end of a veth pair on the bridge. The nodes reach each other and the controller, nothing else.
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
  log "bridge $BRIDGE created"
fi
# (tests on captured output: with pipefail, `ip ... | grep -q` fails when grep stops reading early)
[[ $(ip addr show dev "$BRIDGE") == *"inet $CTLD_ADDR/"* ]] || ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
for i in $(seq "$NODES"); do
  ns=$(netns_of "$i") host_end="p2veth$i"
  [[ -e /run/netns/$ns ]] || ip netns add "$ns"
  if ! ip link show "$host_end" >/dev/null 2>&1; then
    ip link add "$host_end" type veth peer name eth0 netns "$ns"
    log "node $(node_name "$i"): namespace $ns, $host_end <-> eth0 $(node_addr "$i")"
  fi
  ip link set "$host_end" master "$BRIDGE"
  ip link set "$host_end" up
  ip -n "$ns" link set lo up
  [[ $(ip -n "$ns" addr show dev eth0) == *"inet $(node_addr "$i")/"* ]] || ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
done

# --------------------------------------------------------------------------------------- config
MEM=$(( $(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo) * 9 / 10 / NODES ))
ACCOUNTING="AccountingStorageType=accounting_storage/none"
if tcp_open 127.0.0.1 "$DBD_PORT"; then
  # a slurmdbd (the single-node cluster's) answers: register this cluster with it under its own
  # name, so that sacct works here too; slurmctld adds the cluster by itself
  ACCOUNTING="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT"
fi
{
  cat <<EOF
# written by scripts/slurm-multinode-up.sh; edits are overwritten
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
$ACCOUNTING
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
EOF
  for i in $(seq "$NODES"); do
    echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
  done
  echo "PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} >"$ETC/slurm.conf.new"
changed=0
if cmp -s "$ETC/slurm.conf.new" "$ETC/slurm.conf"; then rm "$ETC/slurm.conf.new"; else
  mv "$ETC/slurm.conf.new" "$ETC/slurm.conf"; changed=1
fi
printf 'export SLURM_CONF=%q\n' "$SLURM_CONF" >"$DIR/env.sh"
if (( changed )) && alive "$RUN/slurmctld.pid" slurmctld; then
  log "config changed: restarting the Slurm daemons"
  PARITY_SLURM_LOCK_HELD=1 "$(dirname "$0")/slurm-multinode-down.sh" --keep-network
fi

# ---------------------------------------------------------------------------------------- munge
# munged serves the compiled-in socket under /run/munge, which every namespace sees (same
# filesystem): one already running there (the single-node cluster's) is used as it is.
munge_ok() { munge -n | unmunge; }
if alive "$MUNGE/munged.pid" munged; then
  log "munged already running (pid $(<"$MUNGE/munged.pid"))"
elif munge_ok >/dev/null 2>&1; then
  log "using the munged already serving /run/munge (not started by this script)"
else
  if [[ ! -s $MUNGE/munge.key ]]; then
    runuser -u munge -- mungekey -c -k "$MUNGE/munge.key"
    chmod 400 "$MUNGE/munge.key"
  fi
  install -d -m 755 -o munge -g munge /run/munge
  runuser -u munge -- /usr/sbin/munged --key-file="$MUNGE/munge.key" --pid-file="$MUNGE/munged.pid" \
    --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed" 9>&-
  wait_for 10 munged munge_ok
  log "munged started (pid $(<"$MUNGE/munged.pid"))"
fi

# ----------------------------------------------------------------------- slurmctld + slurmd
if alive "$RUN/slurmctld.pid" slurmctld; then
  log "slurmctld already running (pid $(<"$RUN/slurmctld.pid"))"
else
  slurmctld 9>&-
  wait_for 30 slurmctld scontrol ping
  log "slurmctld started (pid $(<"$RUN/slurmctld.pid"), $CTLD_ADDR:$PORT)"
fi
for i in $(seq "$NODES"); do
  name=$(node_name "$i")
  if alive "$RUN/slurmd-$name.pid" slurmd; then
    log "slurmd $name already running (pid $(<"$RUN/slurmd-$name.pid"))"
    continue
  fi
  # its own network namespace and its own hostname: jobs on it see only this node's address and name
  # nsenter, not `ip netns exec`: that one mounts a fresh /sys, hiding /sys/fs/cgroup from slurmd
  nsenter --net="/run/netns/$(netns_of "$i")" unshare --uts -- sh -c "hostname $name && exec slurmd -N $name" 9>&-
  wait_for 10 "slurmd $name pid file" alive "$RUN/slurmd-$name.pid" slurmd
  log "slurmd $name started (pid $(<"$RUN/slurmd-$name.pid"), $(node_addr "$i"))"
done
nodes_ready() {
  local states
  states=$(sinfo -h -N -o '%N %t' | awk '$2 ~ /^(idle|mix|alloc)$/ {n++} END {print n + 0}')
  [[ $states == "$NODES" ]]
}
if ! nodes_ready; then
  # nodes left down/drained by an earlier run come back only when told to
  scontrol update nodename="pnode[1-$NODES]" state=resume >/dev/null 2>&1 || true
  wait_for 60 "$NODES nodes idle" nodes_ready
fi
if [[ $ACCOUNTING == *slurmdbd* ]]; then
  wait_for 30 "cluster $CLUSTER registered in slurmdbd" \
    bash -c "sacctmgr -n -P list cluster format=cluster | grep -qx $CLUSTER"
else
  log "no slurmdbd on 127.0.0.1:$DBD_PORT: running without accounting (sacct fails here)"
fi
log "nodes up: $(sinfo -h -N -o '%N(%t)' | tr '\n' ' ')"
log "READY: source $DIR/env.sh (SLURM_CONF=$SLURM_CONF)"
