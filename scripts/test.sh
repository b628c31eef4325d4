#!/usr/bin/env bash
# Set up and run the whole test suite against real Postgres, real Slurm, real Megatron-Core and a
# real headless Chromium. Extra arguments go to pytest (e.g. scripts/test.sh -k scheduler).
#   scripts/test.sh --fast   the fast lane: everything that needs no Megatron, Slurm or browser and
#                            is not marked slow (Postgres only; ~5 minutes on 2 cores). Run it first.
#                            It creates the system user parity-job (scripts/job-user.sh; needs root).
#   scripts/test.sh --nightly  only the tests marked nightly (costlier repeats of what CI covers: the
#                            full local warm-pool walk, the "job" isolation runs of the parity
#                            scenarios CI runs in "process" only), with every service the full suite
#                            starts. Without it they are left out (tests/conftest.py), as in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
say() { printf '\n== [%s +%ds] %s\n' "$(date +%H:%M:%S)" $(( $(date +%s) - T0 )) "$*"; }

say "python environment"
scripts/setup.sh
if [[ "${1:-}" == "--fast" ]]; then
  shift
  say "postgres"
  scripts/postgres-up.sh
  scripts/job-user.sh
  export PARITY_REQUIRE_JOB_USER=1  # the hostile-build tests run as it: never skipped here
  say "pytest (fast lane)"
  .venv/bin/python -m pytest -q -m "not megatron and not slurm and not browser and not slow" "$@"
  say "fast lane done"
  exit 0
fi
MARKS=()
if [[ "${1:-}" == "--nightly" ]]; then
  shift
  MARKS=(-m nightly)
fi
say "chromium (browser tests)"
if ! command -v chromium >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
chromium --version
say "postgres"
scripts/postgres-up.sh
say "slurm"
scripts/slurm-up.sh
# shellcheck disable=SC1091 # written by slurm-up.sh; exports SLURM_CONF for sbatch, sacct and submitit
source "${PARITY_SLURM_DIR:-/var/tmp/parity-slurm}/env.sh"
sinfo
# the two-node Slurm of tests/infra (scripts/slurm-multinode-up.sh, started by its fixture) puts each
# node in network + UTS namespaces: ip (iproute2), nsenter and unshare (util-linux)
if ! command -v ip >/dev/null || ! command -v nsenter >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends iproute2 util-linux >/dev/null
fi
say "pytest"
# Here nothing may be skipped for want of infrastructure: missing Slurm or Chromium is a failure.
export PARITY_REQUIRE_SLURM=1 PARITY_REQUIRE_BROWSER=1 PARITY_REQUIRE_JOB_USER=1
.venv/bin/python -m pytest -q "${MARKS[@]}" "$@"
say "tests done"
