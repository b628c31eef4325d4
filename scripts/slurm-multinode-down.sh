#!/usr/bin/env bash
# Stop the multi-node Slurm started by scripts/slurm-multinode-up.sh, by the pids in its pid files
# (never by name), then remove its network namespaces and bridge. Running jobs are cancelled first
# so no job process outlives its slurmd. Safe to run twice; never touches scripts/slurm-up.sh's cluster.
#
#   PARITY_SLURM2_DIR  state folder (default /var/tmp/parity-slurm2)
#   --keep-network     leave the namespaces and the bridge (a restart after a config change)
#   --purge            also delete the state folder (job ids then restart at 1)
set -uo pipefail

DIR=${PARITY_SLURM2_DIR:-/var/tmp/parity-slurm2}
RUN=$DIR/run
BRIDGE=parity2br
export SLURM_CONF=$DIR/etc/slurm.conf
T0=$(date +%s%N)
keep_network=0 purge=0
for arg in "$@"; do
  case $arg in
    --keep-network) keep_network=1 ;;
    --purge) purge=1 ;;
    *) echo "usage: $0 [--keep-network] [--purge]" >&2; exit 2 ;;
  esac
done

log() {
  local ms=$(( ($(date +%s%N) - T0) / 1000000 ))
  printf '[slurm2-down %s +%d.%03ds] %s\n' "$(date +%H:%M:%S)" $((ms / 1000)) $((ms % 1000)) "$*"
}
pid_of() { # pid_of <pidfile> <comm>: print the pid if it runs and is that program
  local pid
  [[ -s $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] && echo "$pid"
}
running() { # running <pid>: alive and not a zombie waiting for init to reap it
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [[ $state != Z ]]
}
stop() { # stop <label:comm:pidfile>...: SIGTERM them together, wait up to 10 s each, then SIGKILL
  local item label name pidfile pid rest
  local -A pids=()
  for item in "$@"; do
    label=${item%%:*} rest=${item#*:}
    name=${rest%%:*} pidfile=${rest#*:}
    if pid=$(pid_of "$pidfile" "$name"); then
      kill -TERM "$pid"
      pids[$label]=$pid
    else
      log "$label: not running"
    fi
    rm -f "$pidfile"
  done
  for label in "${!pids[@]}"; do
    pid=${pids[$label]}
    for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then
      log "$label: pid $pid ignored SIGTERM for 10 s, sending SIGKILL"
      kill -KILL "$pid"
    fi
    log "$label: stopped (pid $pid)"
  done
}

if [[ -d $DIR ]]; then
  if [[ ${PARITY_SLURM_LOCK_HELD:-0} != 1 ]]; then # slurm-multinode-up holds the lock when it calls us
    exec 9>"$DIR/.lock"
    flock 9
  fi
  if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null; then
    jobs=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
    if [[ -n ${jobs// /} ]]; then
      log "cancelling jobs: $jobs"
      # shellcheck disable=SC2086 # one argument per job id
      scancel $jobs
      for _ in $(seq 75); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.2; done
    fi
  fi
  daemons=()
  for pidfile in "$RUN"/slurmd-*.pid; do
    [[ -e $pidfile ]] || continue
    node=${pidfile##*/slurmd-}
    daemons+=("slurmd ${node%.pid}:slurmd:$pidfile")
  done
  stop "${daemons[@]}" "slurmctld:slurmctld:$RUN/slurmctld.pid"
  # a munged this cluster started itself (none when the single-node cluster's was there first)
  [[ -e $DIR/munge/munged.pid ]] && stop "munged:munged:$DIR/munge/munged.pid"
else
  log "no state folder $DIR"
fi

if (( ! keep_network )); then
  # job steps of a node live in its namespace too: anything still there would keep it alive
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^parity2-pnode[0-9]+$/ {print $1}'); do
    left=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [[ -n ${left// /} ]] && log "namespace $ns still holds pids $left (left running)"
    ip netns del "$ns" && log "namespace $ns removed" # its veth pair goes with it
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link del "$BRIDGE" && log "bridge $BRIDGE removed"
  fi
fi
if (( purge )) && [[ -d $DIR ]]; then
  rm -rf "$DIR"
  log "purged $DIR"
fi
log "done"
exit 0
