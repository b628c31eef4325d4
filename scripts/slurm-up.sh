#!/usr/bin/env bash
# Start a single-node Slurm on loopback without systemd: munged, a private mariadbd, slurmdbd,
# slurmctld and slurmd, with every config, pid, log, spool and database file under one folder.
# Idempotent: when everything already runs with the same config it only checks and exits.
#
#   PARITY_SLURM_DIR      state folder                  (default /var/tmp/parity-slurm)
#   PARITY_SLURM_DB_PORT  private mariadbd port         (default 3307; 3306 is often taken)
#   PARITY_SLURM_NO_APT=1 fail instead of apt-get installing missing packages
#   PARITY_SLURM_JOB_USER the user jobs run as under PARITY_JOB_USER, created if missing (default parity-job)
#
# Afterwards:  source "$PARITY_SLURM_DIR/env.sh"   (exports SLURM_CONF for sbatch/sacct/submitit)
# Stop with scripts/slurm-down.sh. Needs root (daemons run as root, munged as the munge user).
set -euo pipefail

DIR=${PARITY_SLURM_DIR:-/var/tmp/parity-slurm}
DB_PORT=${PARITY_SLURM_DB_PORT:-3307}
CLUSTER=parity
PARTITION=debug
ETC=$DIR/etc RUN=$DIR/run LOG=$DIR/log MUNGE=$DIR/munge DB=$DIR/mariadb
export SLURM_CONF=$ETC/slurm.conf
T0=$(date +%s%N)

LOG_TAG=slurm-up
# shellcheck source=lib/slurm-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/slurm-common.sh"
tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
sql() { mariadb --no-defaults -S "$DB/mysqld.sock" -u root "$@"; }

[[ $(id -u) == 0 ]] || die "run as root (slurmd and munged need it)"
log "starting single-node Slurm in $DIR"
install -d -m 755 "$DIR"
exec 9>"$DIR/.lock"
# two concurrent starts (or a start and a stop) would race on apt and pid files; every daemon is
# started with 9>&- so that none of them keeps holding the lock
flock 9

# ------------------------------------------------------------------------------------ packages
PKGS=(slurmctld slurmd slurmdbd slurm-client munge mariadb-server mariadb-client)
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
  log "apt-get update"
  apt-get update -qq
  log "apt-get install ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$DIR/apt.log" 2>&1 ||
    die "apt-get install failed, see $DIR/apt.log"
  (( made_policy )) && rm -f /usr/sbin/policy-rc.d
  log "packages installed ($(dpkg-query -W -f='${Version}' slurmctld))"
fi

install -d -m 755 "$ETC" "$RUN" "$LOG" "$DIR/spool/ctld" "$DIR/spool/d"

# PARITY_JOB_USER: builds and phases run as parity-job (PARITY_SLURM_JOB_USER), never as root or
# the service's user
"$(dirname "${BASH_SOURCE[0]}")/job-user.sh"
install -d -m 755 -o munge -g munge "$MUNGE"
install -d -m 755 -o mysql -g mysql "$DB"

# --------------------------------------------------------------------------------------- config
NODE=$(hostname -s)
CPUS=$(nproc)
MEM=$(( $(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo) * 9 / 10 ))
# Nothing of a job outlives it: proctrack/cgroup puts every process of a job in a cgroup (a `setsid`
# daemon included) and kills it whole when the job ends. Slurm 22.05 needs systemd for cgroup v2, so
# it takes the v1 hierarchy when the host mounts one (a v1 freezer: this VM does); without one,
# proctrack/linuxproc, which loses a process that left the job's session (the scheduler then kills
# what a job's user left: service/executors/job_leases.py).
if grep -qs '^cgroup /sys/fs/cgroup/freezer cgroup .*freezer' /proc/self/mounts; then
  PROCTRACK=proctrack/cgroup
else
  PROCTRACK=proctrack/linuxproc
fi
# Job users never submit Slurm jobs of their own (the review's job ran `sbatch --begin=now+75`, which ran as
# the pool user after its lease): a job_submit rule refuses every job the job users ask for themselves.
# The scheduler's own sbatch is root's (--uid/--gid); a job's srun inside its allocation is a step, which
# job_submit never sees. What a cluster without the rule lets through is cancelled with the lease
# (service/executors/job_leases.py).
JOB_UIDS=$(getent passwd | awk -F: -v base="${PARITY_SLURM_JOB_USER:-parity-job}" \
  '$1 == base || index($1, base "-") == 1 { printf "[%s]=true,", $3 }')
cat >"$ETC/job_submit.lua.new" <<EOF
-- written by scripts/slurm-up.sh; edits are overwritten
local job_users = {${JOB_UIDS}}
function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_users[submit_uid] then
    slurm.log_user("job users may not submit Slurm jobs (uid %d)", submit_uid)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if job_users[modify_uid] then
    return slurm.ERROR
  end
  return slurm.SUCCESS
end
return slurm.SUCCESS
EOF
cat >"$ETC/slurm.conf.new" <<EOF
# written by scripts/slurm-up.sh; edits are overwritten
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# proctrack/cgroup on a cgroup v1 hierarchy when the host has one, else /proc (see above)
ProctrackType=$PROCTRACK
# job users may not submit (job_submit.lua beside this file)
JobSubmitPlugins=lua
TaskPlugin=task/none
# CR_CPU: a task takes a CPU (not a whole core), so 2 tasks fit on any 2-CPU machine
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
cat >"$ETC/slurmdbd.conf.new" <<EOF
# written by scripts/slurm-up.sh; edits are overwritten
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
# cgroup/v1 on the mounted hierarchy, only to track processes (no limits: jobs are sized by CPUs)
cat >"$ETC/cgroup.conf.new" <<EOF
# written by scripts/slurm-up.sh; edits are overwritten
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
changed=0
for f in slurm.conf slurmdbd.conf cgroup.conf job_submit.lua; do
  if cmp -s "$ETC/$f.new" "$ETC/$f"; then rm "$ETC/$f.new"; else mv "$ETC/$f.new" "$ETC/$f"; changed=1; fi
done
chmod 600 "$ETC/slurmdbd.conf" # slurmdbd refuses a world-readable file holding a password
printf 'export SLURM_CONF=%q\n' "$SLURM_CONF" >"$DIR/env.sh"
if (( changed )) && { alive "$RUN/slurmctld.pid" slurmctld || alive "$RUN/slurmd.pid" slurmd ||
  alive "$RUN/slurmdbd.pid" slurmdbd; }; then
  log "config changed: restarting the Slurm daemons"
  PARITY_SLURM_LOCK_HELD=1 "$(dirname "$0")/slurm-down.sh" --keep-db --keep-munge
fi

# ---------------------------------------------------------------------------------------- munge
# Slurm 22.05 ignores AuthInfo=socket= on the slurmctld->slurmdbd connection, so munged must listen
# on the compiled-in socket; its key, pid, seed and log stay under $MUNGE. A munged someone else
# started there is used as it is (and left alone by slurm-down).
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

# -------------------------------------------------------------------------- mariadb + slurmdbd
if [[ ! -d $DB/data/mysql ]]; then
  install -d -m 750 -o mysql -g mysql "$DB/data"
  mariadb-install-db --no-defaults --user=mysql --datadir="$DB/data" --skip-test-db \
    --auth-root-authentication-method=socket >"$LOG/mariadb-install.log" 2>&1 ||
    die "mariadb-install-db failed, see $LOG/mariadb-install.log"
  log "mariadb datadir initialised"
fi
if alive "$DB/mysqld.pid" mariadbd; then
  log "mariadbd already running (pid $(<"$DB/mysqld.pid"), port $DB_PORT)"
else
  tcp_open "$DB_PORT" && die "port $DB_PORT is taken by another program; set PARITY_SLURM_DB_PORT"
  setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB/data" --socket="$DB/mysqld.sock" \
    --pid-file="$DB/mysqld.pid" --bind-address=127.0.0.1 --port="$DB_PORT" --log-error="$LOG/mariadb.log" \
    --skip-name-resolve --innodb-buffer-pool-size=64M --innodb-log-file-size=16M \
    </dev/null >/dev/null 2>&1 9>&- &
  wait_for 60 mariadbd sql -e 'select 1'
  log "mariadbd started (pid $(<"$DB/mysqld.pid"), port $DB_PORT)"
fi
sql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
  CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
if alive "$RUN/slurmdbd.pid" slurmdbd; then
  log "slurmdbd already running (pid $(<"$RUN/slurmdbd.pid"))"
else
  slurmdbd 9>&- # daemonises; finds slurmdbd.conf beside $SLURM_CONF
  wait_for 30 slurmdbd tcp_open 6819
  log "slurmdbd started (pid $(<"$RUN/slurmdbd.pid"))"
fi

# ----------------------------------------------------------------------- slurmctld + slurmd
if alive "$RUN/slurmctld.pid" slurmctld; then
  log "slurmctld already running (pid $(<"$RUN/slurmctld.pid"))"
else
  slurmctld 9>&-
  wait_for 30 slurmctld scontrol ping
  log "slurmctld started (pid $(<"$RUN/slurmctld.pid"))"
fi
if alive "$RUN/slurmd.pid" slurmd; then
  log "slurmd already running (pid $(<"$RUN/slurmd.pid"))"
else
  slurmd -N "$NODE" 9>&-
  wait_for 10 "slurmd pid file" alive "$RUN/slurmd.pid" slurmd
  log "slurmd started (pid $(<"$RUN/slurmd.pid"))"
fi
node_ready() { sinfo -h -n "$NODE" -o %t | grep -qE '^(idle|mix|alloc)$'; }
if ! node_ready; then
  # a node left down/drained by an earlier run comes back only when told to
  scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
  wait_for 60 "node $NODE idle" node_ready
fi
wait_for 30 "cluster $CLUSTER registered in slurmdbd" \
  bash -c "sacctmgr -n -P list cluster format=cluster | grep -qx $CLUSTER"
log "node up: $(sinfo -h -o '%P %a %D %c cpus %t %N' | tr '\n' ' ')"
log "READY: source $DIR/env.sh (SLURM_CONF=$SLURM_CONF)"
