#!/usr/bin/env bash
# Set up and run a test tier against real Postgres, real Slurm, real Megatron-Core and a real headless
# Chromium. Extra arguments go to pytest (e.g. scripts/test.sh -k scheduler).
#   scripts/test.sh            the PR tier (what CI runs on every push): every behaviour at least once,
#                              one representative slice of each costly family; ~15 minutes on 2 cores
#   scripts/test.sh --nightly  the nightly tier: what the PR tier leaves out (tests marked nightly: the
#                              full self-test catalogue, every injected pull request, isolation repeats,
#                              two-node Slurm, the full schemathesis pass, the release rows)
#   scripts/test.sh --fast     the fast lane, for a contributor with a plain Python and a Postgres: no
#                              root, no torch, no Megatron, Slurm or browser (setup.sh --no-engine)
# Each section's seconds go to $PARITY_SECTION_TIMES when set (.ci/run prints them as a table).
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
SECTION="" SECTION_T0=$T0
say() {
  local now; now=$(date +%s)
  if [[ -n $SECTION && -n ${PARITY_SECTION_TIMES:-} ]]; then
    printf '%s\t%d\n' "$SECTION" $(( now - SECTION_T0 )) >>"$PARITY_SECTION_TIMES"
  fi
  SECTION=$1 SECTION_T0=$now
  printf '\n== [%s +%ds] %s\n' "$(date +%H:%M:%S)" $(( now - T0 )) "$*"
}
# This machine class exports PYTHONDONTWRITEBYTECODE=1. Under it every pytest process (each xdist
# worker, each pass) rewrites the asserts of every test and plugin module again, and every CLI or job
# subprocess a test starts compiles the service from source again: collection alone measured 84 s,
# then 60 s once the bytecode could be kept (load 8). Bytecode goes to __pycache__ (git-ignored); the
# job user cannot write the checkout, so it only reads what the tests' processes wrote.
unset PYTHONDONTWRITEBYTECODE
# pytest's own options for every tier: a per-test ceiling comes from pyproject.toml (pytest-timeout)
PYTEST=(.venv/bin/python -m pytest -q)
# What runs real jobs, Slurm, a browser, a build or the job user: run in order on one process (they share
# the session's run-local references and the one Slurm node); the rest needs only Postgres and runs on
# two xdist workers beside nothing else.
HEAVY="megatron or slurm or browser or slow or job_user or engine"

TIER=pr
case "${1:-}" in
  --fast) TIER=fast; shift ;;
  --nightly) TIER=nightly; shift ;;
esac

if [[ $TIER == fast ]]; then
  say "python environment (no engine)"
  scripts/setup.sh --no-engine
  say "postgres"
  scripts/postgres-up.sh
  say "pytest (fast lane)"
  status=0
  "${PYTEST[@]}" -n 2 -m "not ($HEAVY)" "$@" || status=$?
  say "done"
  exit $status
fi

say "python environment"
scripts/setup.sh
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
# Here nothing may be skipped for want of infrastructure: missing Slurm or Chromium is a failure.
export PARITY_REQUIRE_SLURM=1 PARITY_REQUIRE_BROWSER=1 PARITY_REQUIRE_JOB_USER=1
# What the main-snapshot tests build once per machine (the shared 3.12 torch base, ~2 min; the snapshot's
# wheels): built beside the first tests, not inside the one test that needs them. Under locks the test
# shares, so it waits for a piece under way or builds one itself; a failure here only costs that time.
# The run waits for it at the end (on a machine that has the cache it is done in seconds).
PREP_LOG=$(mktemp)
.venv/bin/python -m tests.plugins.main_snapshot >"$PREP_LOG" 2>&1 &
PREP=$!
status=0
if [[ $TIER == nightly ]]; then
  say "pytest (nightly tier)"
  "${PYTEST[@]}" -m nightly "$@" || status=$?
else
  say "pytest (PR tier: Postgres-only tests, two workers)"
  "${PYTEST[@]}" -n 2 -m "not ($HEAVY)" "$@" || status=$?
  say "pytest (PR tier: jobs, Slurm, browser, builds)"
  "${PYTEST[@]}" -m "$HEAVY" "$@" || status=$?
fi
wait "$PREP" || echo "the main snapshot's cache was not prepared ahead (the tests built what they needed): $(tail -3 "$PREP_LOG")"
rm -f "$PREP_LOG"
say "done"
exit $status
