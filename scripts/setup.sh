#!/usr/bin/env bash
# Create .venv and install the project with every extra (service, engine) and its dev tools (idempotent; torch is pinned to the CPU 2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
# torch 2.13.0 comes from the machine's wheel folder when it has one (PyPI otherwise).
[[ -d /opt/wheels ]] && export PIP_FIND_LINKS=${PIP_FIND_LINKS:-/opt/wheels}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[all,dev]'
echo "setup: $(.venv/bin/python --version), torch $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))'), megatron-core $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("megatron-core"))')"
# PARITY_JOB_USER's jobs (and every build's venv) run this interpreter as another user: make the
# folders above it passable (o+x only: nothing becomes listable or readable that was not already).
if [[ $(id -u) == 0 ]]; then
  real=$(readlink -f .venv/bin/python)
  dir=$(dirname "$real")
  while [[ $dir != / ]]; do
    if [[ $(( 0$(stat -c %a "$dir") & 01 )) == 0 ]]; then chmod o+x "$dir" && echo "setup: o+x on $dir (job user)"; fi
    dir=$(dirname "$dir")
  done
fi
# The Pythons a service build may make its venv on (Megatron-Core 0.17+ need 3.12): PARITY_PYTHONS, else
# python3.X on PATH or in pyenv (service/environments/interpreters.py). Set PARITY_PYTHONS to this line to pin it.
echo "setup: PARITY_PYTHONS=$(.venv/bin/python -c 'import os; from service.environments.interpreters import configured
print(",".join(f"{v}={p}" for v, p in configured(os.environ.get("PARITY_PYTHONS")).items()))')"
