#!/usr/bin/env bash
# Stop the single-node Slurm started by scripts/slurm-up.sh, by the pids in its pid files (never by
# name). Running jobs are cancelled first so no job process outlives slurmd. Safe to run twice.
#
#   PARITY_SLURM_DIR  state folder (default /var/tmp/parity-slurm)
#   --keep-db         leave mariadbd running        --keep-munge   leave munged running
#   --purge           also delete the state folder (job ids then restart at 1)
set -uo pipefail

DIR=${PARITY_SLURM_DIR:-/var/tmp/parity-slurm}
RUN=$DIR/run
export SLURM_CONF=$DIR/etc/slurm.conf
T0=$(date +%s%N)
keep_db=0 keep_munge=0 purge=0
for arg in "$@"; do
  case $arg in
    --keep-db) keep_db=1 ;;
    --keep-munge) keep_munge=1 ;;
    --purge) purge=1 ;;
    *) echo "usage: $0 [--keep-db] [--keep-munge] [--purge]" >&2; exit 2 ;;
  esac
done

log() {
  local ms=$(( ($(date +%s%N) - T0) / 1000000 ))
  printf '[slurm-down %s +%d.%03ds] %s\n' "$(date +%H:%M:%S)" $((ms / 1000)) $((ms % 1000)) "$*"
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
stop() { # stop <comm:pidfile>...: SIGTERM them together, wait up to 10 s each, then SIGKILL
  local item name pidfile pid
  local -A pids=()
  for item in "$@"; do
    name=${item%%:*} pidfile=${item#*:}
    if pid=$(pid_of "$pidfile" "$name"); then
      kill -TERM "$pid"
      pids[$name]=$pid
    else
      log "$name: not running"
    fi
    rm -f "$pidfile"
  done
  for name in "${!pids[@]}"; do
    pid=${pids[$name]}
    for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
    if running "$pid"; then
      log "$name: pid $pid ignored SIGTERM for 10 s, sending SIGKILL"
      kill -KILL "$pid"
    fi
    log "$name: stopped (pid $pid)"
  done
}

if [[ ! -d $DIR ]]; then
  log "nothing to stop: $DIR does not exist"
  exit 0
fi
if [[ ${PARITY_SLURM_LOCK_HELD:-0} != 1 ]]; then # slurm-up holds the lock when it calls us
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
# slurmctld and slurmd first, slurmdbd once they stopped talking to it, then its database and munged
stop "slurmd:$RUN/slurmd.pid" "slurmctld:$RUN/slurmctld.pid"
stop "slurmdbd:$RUN/slurmdbd.pid"
last=()
(( keep_db )) || last+=("mariadbd:$DIR/mariadb/mysqld.pid")
(( keep_munge )) || last+=("munged:$DIR/munge/munged.pid")
(( ${#last[@]} == 0 )) || stop "${last[@]}"
if (( purge )); then
  if (( keep_db || keep_munge )); then
    log "--purge ignored: --keep-db/--keep-munge leave daemons using $DIR"
  else
    rm -rf "$DIR"
    log "purged $DIR"
  fi
fi
log "done"
exit 0
