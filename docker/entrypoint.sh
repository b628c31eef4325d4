#!/usr/bin/env bash
# Entrypoint of every parity container: write the Slurm config, start munged, run the role.
#   munge-key                     create the shared munge key once, then exit (one-shot service)
#   slurmdbd | slurmctld | slurmd run that Slurm daemon in the foreground (its log on stdout)
#   anything else                 run it as given (parity serve, parity scheduler, sh -c "..."), as the
#                                 unprivileged $PARITY_RUN_AS user when started as root
#
# Only the Slurm daemons keep root (slurmd must start jobs as their submitter; slurmctld/slurmdbd
# run as the `slurm` user from slurm.conf) and DisableRootJobs keeps any job from running as root.
# The scheduler keeps root when PARITY_JOB_USER is set: it runs every job as that user.
# munged starts only where the munge key is mounted: the scheduler and the Slurm containers.
#
# The Slurm settings come from CLUSTER_* variables that docker-compose.yml gives every container,
# so that all of them render the same slurm.conf (Slurm requires it identical everywhere). Not
# SLURM_* names: srun, sbatch and the jobs themselves read SLURM_* variables as options.
set -euo pipefail

CLUSTER=${CLUSTER_NAME:-parity}
CTLD_HOST=${CLUSTER_CTLD_HOST:-slurmctld}
DBD_HOST=${CLUSTER_DBD_HOST:-slurmdbd}
NODE_NAME=${CLUSTER_NODE_NAME:-slurmd}
NODE_CPUS=${CLUSTER_NODE_CPUS:-2}
NODE_MEMORY_MB=${CLUSTER_NODE_MEMORY_MB:-4000}
PARTITION=${CLUSTER_PARTITION:-debug}
KEY=/etc/munge/munge.key
# Slurm reads this file and no other, whatever the environment says (slurmdbd.conf sits beside it)
export SLURM_CONF=/etc/slurm/slurm.conf

log() { printf '[entrypoint %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

write_slurm_conf() {
  mkdir -p /etc/slurm
  cat >/etc/slurm/slurm.conf <<EOF
# written by docker/entrypoint.sh from CLUSTER_* variables
ClusterName=$CLUSTER
SlurmctldHost=$CTLD_HOST
SlurmUser=slurm
SlurmdUser=root
DisableRootJobs=YES
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
# containers: no cgroups, track job processes through /proc
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# the node's resources are what this file says, whatever the container reports; the submitting
# container's ulimits need not fit the compute container
SlurmdParameters=config_overrides
PropagateResourceLimits=NONE
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$DBD_HOST
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$NODE_NAME CPUs=$NODE_CPUS RealMemory=$NODE_MEMORY_MB State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

write_slurmdbd_conf() {
  : "${CLUSTER_DB_PASSWORD:?CLUSTER_DB_PASSWORD must be set}"
  cat >/etc/slurm/slurmdbd.conf <<EOF
# written by docker/entrypoint.sh
AuthType=auth/munge
DbdHost=$DBD_HOST
DbdPort=6819
SlurmUser=slurm
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=${CLUSTER_DB_HOST:-mariadb}
StoragePort=${CLUSTER_DB_PORT:-3306}
StorageUser=${CLUSTER_DB_USER:-slurm}
StoragePass=$CLUSTER_DB_PASSWORD
StorageLoc=${CLUSTER_DB_NAME:-slurm_acct_db}
EOF
  chown slurm:slurm /etc/slurm/slurmdbd.conf
  chmod 600 /etc/slurm/slurmdbd.conf
}

start_munged() {
  for _ in $(seq 60); do [[ -s $KEY ]] && break; sleep 1; done
  [[ -s $KEY ]] || { log "no munge key at $KEY (is the munge-key service done?)"; exit 1; }
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n | unmunge >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "munged did not come up"
  exit 1
}

role=${1:-}
if [[ $role == munge-key ]]; then
  if [[ -s $KEY ]]; then
    log "munge key exists"
  else
    mungekey -c -k "$KEY"
    chown munge:munge "$KEY"
    chmod 400 "$KEY"
    log "munge key created"
  fi
  exit 0
fi

drop_privileges() { # exec "$@" as $PARITY_RUN_AS when running as root
  if [[ $(id -u) != 0 ]]; then exec "$@"; fi
  local user=${PARITY_RUN_AS:-}
  if [[ -z $user ]] || ! id -u "$user" >/dev/null 2>&1; then
    log "refusing to run '$*' as root: set PARITY_RUN_AS to an existing unprivileged user"
    exit 2
  fi
  HOME=$(getent passwd "$user" | cut -d: -f6) exec setpriv --reuid="$(id -u "$user")" \
    --regid="$(id -g "$user")" --init-groups -- "$@"
}

write_slurm_conf
case $role in
  slurmdbd) start_munged; write_slurmdbd_conf; exec slurmdbd -D ;;
  slurmctld)
    start_munged
    mkdir -p /var/spool/slurmctld
    chown -R slurm:slurm /var/spool/slurmctld
    exec slurmctld -D ;;
  slurmd) start_munged; exec slurmd -D -N "$NODE_NAME" ;;
  "") log "no command given"; exit 2 ;;
  *)
    # the API has no munge key (it needs none); the scheduler does, for sbatch/sacct/scancel
    if [[ -e $KEY ]]; then start_munged; fi
    if [[ ${1:-} == parity && ${2:-} == scheduler && -n ${PARITY_JOB_USER:-} ]]; then
      # the scheduler hands folders to the job user and submits as it (chown, sbatch --uid): root only
      # here; the jobs themselves never run as root or as the service's user
      exec "$@"
    fi
    drop_privileges "$@" ;;
esac
