#!/usr/bin/env bash
# Create the users builds and phases run as under PARITY_JOB_USER (idempotent; needs root). They own
# nothing of the service's: no key, no config, no password file (service/executors/job_user.py).
#   PARITY_SLURM_JOB_USER   the base name (default parity-job): PARITY_JOB_USER names it
#   PARITY_JOB_USERS        how many pool users <name>-0 … <name>-(N-1) (default 16): one per live job
#                           (service/executors/job_leases.py); size it to the jobs live at once (local
#                           phases, builds and warm workers; Slurm: the jobs queued), beyond it jobs wait
set -euo pipefail
JOB_USER=${PARITY_SLURM_JOB_USER:-parity-job}
COUNT=${PARITY_JOB_USERS:-16}
[[ $(id -u) == 0 ]] || { echo "job-user: run as root" >&2; exit 1; }
[[ $COUNT =~ ^[0-9]+$ ]] || { echo "job-user: PARITY_JOB_USERS=$COUNT is not a number" >&2; exit 1; }
# No home of its own: every job gets a private, fresh HOME inside its granted folder
# (service/executors/launcher.py), so nothing one build writes under ~ reaches the next.
make_user() {
  local name=$1 home
  if ! id -u "$name" >/dev/null 2>&1; then
    # a group of its own too: no job user can read what another's job wrote for its group
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$name"
    echo "job-user: created $name (uid $(id -u "$name"))"
  fi
  home=$(getent passwd "$name" | cut -d: -f6)
  if [[ $home != /nonexistent ]]; then
    usermod --home /nonexistent "$name"
    echo "job-user: $name's home is now /nonexistent (was $home; left in place, no job uses it)"
  fi
}
make_user "$JOB_USER"
# the pool: each live job runs as one of these, alone (concurrent jobs cannot signal, ptrace or read
# each other; what a job leaves running is killed by uid when it ends)
for ((n = 0; n < COUNT; n++)); do make_user "$JOB_USER-$n"; done
