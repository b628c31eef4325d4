#!/usr/bin/env bash
# Create .venv and install the project with every extra (service, engine) and its dev tools (idempotent; torch is pinned to the CPU 2.13.0).
#   scripts/setup.sh --no-engine   the service and dev tools only: no torch, no Megatron-Core (the fast lane needs neither)
set -euo pipefail
cd "$(dirname "$0")/.."
# torch 2.13.0 comes from the machine's wheel folder when it has one (PyPI otherwise).
[[ -d /opt/wheels ]] && export PIP_FIND_LINKS=${PIP_FIND_LINKS:-/opt/wheels}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
EXTRAS=all,dev
[[ "${1:-}" == "--no-engine" ]] && EXTRAS=service,dev
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
echo "setup: $(.venv/bin/python --version), [$EXTRAS], $(.venv/bin/python -c '
import importlib.metadata as m
print(", ".join(f"{d} {m.version(d)}" if any(x.metadata["Name"] == d for x in m.distributions()) else f"no {d}" for d in ("torch", "megatron-core")))')"
# PARITY_JOB_USER's jobs (and every build's venv) run this interpreter, and import this checkout's jobs/,
# as another user: make the folders above both passable (o+x only: nothing becomes listable or readable
# that was not already), even for a clone in a private folder (mktemp -d makes it 0700). The service
# names any folder still in the way when it looks the job user up (service/executors/job_user.py).
if [[ $(id -u) == 0 ]]; then
  for start in "$(dirname "$(readlink -f .venv/bin/python)")" "$(pwd -P)/.venv/bin"; do
    dir=$start
    while [[ $dir != / ]]; do
      if [[ $(( 0$(stat -c %a "$dir") & 01 )) == 0 ]]; then chmod o+x "$dir" && echo "setup: o+x on $dir (job user)"; fi
      dir=$(dirname "$dir")
    done
  done
fi
# The Pythons a service build may make its venv on (Megatron-Core 0.17+ need 3.12): PARITY_PYTHONS, else
# python3.X on PATH or in pyenv (service/environments/interpreters.py). Set PARITY_PYTHONS to this line to pin it.
echo "setup: PARITY_PYTHONS=$(.venv/bin/python -c 'import os; from service.environments.interpreters import configured
print(",".join(f"{v}={p}" for v, p in configured(os.environ.get("PARITY_PYTHONS")).items()))')"
