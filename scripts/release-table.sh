#!/usr/bin/env bash
# The README's release table, produced by the service: one environment built by the service per
# Megatron-Core release (`megatron-core==X`, torch shared with the service), one sweep of every
# config x release x sharding type, then the Markdown table of verdicts and signatures. Each build
# gets the lowest Python its Requires-Python accepts (0.17+ need 3.12: a Python 3.12 must be on PATH,
# in pyenv, or in PARITY_PYTHONS; its torch is installed once into a shared base venv, several GB).
#
#   scripts/release-table.sh                          # a service of its own (embedded Postgres under
#                                                     # $PARITY_DATA_DIR, default /var/tmp/parity-release)
#   PARITY_SERVICE_URL=... PARITY_TOKEN=... scripts/release-table.sh   # an existing service
#
# RELEASES and SHARDINGS (space-separated) choose the rows (BUILDS: requirement lines instead of release pins,
# e.g. BUILDS=/path/megatron_core-0.20.0-cp312-cp312-linux_x86_64.whl for Megatron-LM main), CONFIGS (space-separated, default all) the
# columns; DP, STEPS, SAVE_STEP the check; TIMEOUT (s) how long the sweep is waited for.
set -euo pipefail
cd "$(dirname "$0")/.."
RELEASES=${RELEASES:-"0.12.3 0.13.1 0.14.0 0.15.3 0.16.1 0.17.1 0.18.2 0.19.2"}
CONFIGS=${CONFIGS:-all}
SHARDINGS=${SHARDINGS:-"dp_reshardable fully_sharded_model_space"}
PY=.venv/bin/python
[[ -x $PY ]] || scripts/setup.sh >&2

args=(--dp "${DP:-2}" --steps "${STEPS:-6}" --save-step "${SAVE_STEP:-3}" --wait --release-table
      --timeout "${TIMEOUT:-14400}")
for config in $CONFIGS; do args+=(--config "$config"); done
# BUILDS (space-separated requirement lines, e.g. a wheel built from Megatron-LM main) replaces the release pins
if [[ -n ${BUILDS:-} ]]; then
  for build in $BUILDS; do args+=(--build "$build"); done
else
  for release in $RELEASES; do args+=(--build "megatron-core==$release"); done
fi
for sharding in $SHARDINGS; do args+=(--variation "{\"sharding\": \"$sharding\"}"); done

if [[ -n ${PARITY_SERVICE_URL:-} ]]; then
  exec $PY -m service.cli.main sweep "${args[@]}"
fi

export PARITY_DATA_DIR=${PARITY_DATA_DIR:-/var/tmp/parity-release}
export PARITY_API_PORT=${PARITY_API_PORT:-8124}
# this service exists for the table: no detector self-test batch (50 runs) queued ahead of the sweep's
export PARITY_SELFTEST_INTERVAL_HOURS=${PARITY_SELFTEST_INTERVAL_HOURS:-0}
export PARITY_SERVICE_URL=http://127.0.0.1:$PARITY_API_PORT
mkdir -p "$PARITY_DATA_DIR"
$PY -m service.cli.main db upgrade >&2
PARITY_TOKEN=$($PY -m service.cli.main token create --name release-table --scope submit --scope admin)
export PARITY_TOKEN
$PY -m service.cli.main serve >"$PARITY_DATA_DIR/serve.log" 2>&1 &
serve=$!
$PY -m service.cli.main scheduler >"$PARITY_DATA_DIR/scheduler.log" 2>&1 &
scheduler=$!
trap 'kill $serve $scheduler 2>/dev/null; wait $serve $scheduler 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  curl -fsS "$PARITY_SERVICE_URL/api/v1/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
$PY -m service.cli.main sweep "${args[@]}"
