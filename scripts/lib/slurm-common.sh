# Shell helpers shared by scripts/slurm-up.sh and scripts/slurm-multinode-up.sh (sourced, not run).
# The sourcing script sets LOG_TAG (the log prefix), T0 (start, `date +%s%N`) and LOG (its log folder).

log() { # log <message>: wall clock + seconds since the sourcing script started
  local ms=$(( ($(date +%s%N) - T0) / 1000000 ))
  printf '[%s %s +%d.%03ds] %s\n' "$LOG_TAG" "$(date +%H:%M:%S)" $((ms / 1000)) $((ms % 1000)) "$*"
}
die() { log "ERROR: $*"; exit 1; }
alive() { # alive <pidfile> <comm>: the pid in the file runs, is that program (not a reused pid), not a zombie
  local pid
  [[ -s $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] &&
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}
wait_for() { # wait_for <seconds> <what> <command...>
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < deadline )) || die "timed out after ${secs}s waiting for $what (logs: $LOG)"
    sleep 0.2
  done
}
