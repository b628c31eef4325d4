#!/usr/bin/env bash
# Create the user builds and phases run as under PARITY_JOB_USER (idempotent; needs root). It owns
# nothing of the service's: no key, no config, no password file (service/executors/job_user.py).
#   PARITY_SLURM_JOB_USER   its name (default parity-job)
set -euo pipefail
JOB_USER=${PARITY_SLURM_JOB_USER:-parity-job}
[[ $(id -u) == 0 ]] || { echo "job-user: run as root" >&2; exit 1; }
# No home of its own: every job gets a private, fresh HOME inside its granted folder
# (service/executors/launcher.py), so nothing one build writes under ~ reaches the next.
if ! id -u "$JOB_USER" >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$JOB_USER"
  echo "job-user: created $JOB_USER (uid $(id -u "$JOB_USER"))"
fi
home=$(getent passwd "$JOB_USER" | cut -d: -f6)
if [[ $home != /nonexistent ]]; then
  usermod --home /nonexistent "$JOB_USER"
  echo "job-user: $JOB_USER's home is now /nonexistent (was $home; left in place, no job uses it)"
fi
