#!/usr/bin/env bash
# Make sure the machine's Postgres server answers on 127.0.0.1:5432 (no systemd needed):
# install the Debian package if absent, start the first cluster with pg_ctlcluster if it is down.
#
#   PARITY_PG_HOST / PARITY_PG_PORT   where to check (default 127.0.0.1 / 5432)
set -euo pipefail

HOST=${PARITY_PG_HOST:-127.0.0.1}
PORT=${PARITY_PG_PORT:-5432}
T0=$(date +%s%N)
log() {
  local ms=$(( ($(date +%s%N) - T0) / 1000000 ))
  printf '[postgres-up %s +%d.%03ds] %s\n' "$(date +%H:%M:%S)" $((ms / 1000)) $((ms % 1000)) "$*"
}
ready() { pg_isready -q -h "$HOST" -p "$PORT" -t 2; }

if ! command -v pg_ctlcluster >/dev/null; then
  [[ $(id -u) == 0 ]] || { log "ERROR: postgresql is not installed and this is not root"; exit 1; }
  log "installing postgresql with apt-get"
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then # postinst must not start it through init.d
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  (( made_policy )) && rm -f /usr/sbin/policy-rc.d
  log "postgresql installed"
fi

if ready; then
  log "postgres already accepting connections on $HOST:$PORT"
  exit 0
fi
VERSION=$(ls /etc/postgresql | sort -V | tail -n1)
[[ -n $VERSION ]] || { log "ERROR: no cluster under /etc/postgresql"; exit 1; }
log "starting cluster $VERSION/main"
pg_ctlcluster --skip-systemctl-redirect "$VERSION" main start
for _ in $(seq 50); do ready && break; sleep 0.2; done
if ! ready; then
  log "ERROR: postgres $VERSION/main does not answer on $HOST:$PORT"
  tail -n 20 "/var/log/postgresql/postgresql-$VERSION-main.log" 2>/dev/null || true
  exit 1
fi
log "postgres $VERSION/main accepting connections on $HOST:$PORT"
