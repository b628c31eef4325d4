#!/usr/bin/env bash
# Set up and run the demo on embedded defaults: embedded Postgres, local processes (or Slurm if one
# answers), a known-good and a known-bad parity run, their verdicts and the dashboard URLs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/parity demo "$@"
