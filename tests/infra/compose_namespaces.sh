#!/usr/bin/env bash
# Run the compose deployment's Slurm side without Docker: docker/entrypoint.sh in Linux namespaces.
# Must run as pid 1 of fresh pid+mount+net namespaces (see test_compose.py), so that every process
# it starts dies with it:  unshare -mnup --fork --kill-child --mount-proc compose_namespaces.sh WORK
# One network namespace plays the compose network, and each "container" gets its own hostname and
# /run (so each runs its own munged, as in Docker). The last container plays the scheduler: it
# submits a 2-task job through submitit with the Python in $PYTHON and prints the results.
set -euo pipefail
# nothing may point at the host's own Slurm (its SLURM_CONF names its pid files and state folder)
unset SLURM_CONF
for var in $(compgen -e); do [[ $var == SLURM_* ]] && unset "$var"; done

WORK=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
EP=$ROOT/docker/entrypoint.sh
PYTHON=${PYTHON:-python3}
DB_PASSWORD=compose-test

# glibc's AI_ADDRCONFIG (used by Slurm) wants a non-loopback address, as a container's eth0 has
ip link set lo up
ip addr add 10.99.0.1/32 dev lo
# tmpfs over the paths the containers would own; the host's copies stay untouched
for dir in /etc/slurm /etc/munge /var/spool /var/lib/munge /var/log/munge /var/lib/mysql /run/mysqld; do
  mkdir -p "$dir"
  mount -t tmpfs tmpfs "$dir"
done
chown munge:munge /etc/munge /var/lib/munge /var/log/munge
chown mysql:mysql /var/lib/mysql /run/mysqld
chmod 700 /etc/munge
printf '127.0.0.1 localhost\n10.99.0.1 mariadb slurmdbd slurmctld slurmd scheduler\n' >"$WORK/hosts"
mount --bind "$WORK/hosts" /etc/hosts
# the scheduler container runs as an unprivileged user (as the image's `parity`), so its run folder
# must be reachable by it: pytest's tmp_path sits under a root-only folder
RUNS=$(mktemp -d /tmp/parity-compose-runs.XXXXXX)
chown nobody "$RUNS"
# ... and so must the Python: a pyenv under root's 0700 home is re-exposed, in this mount namespace
# only, by a world-readable tmpfs over /root holding a bind mount of just that one folder
REAL_HOME=""
PY_REAL=$(readlink -f "$PYTHON")
if [[ $PY_REAL == /root/* ]]; then
  top=${PY_REAL#/root/}; top=${top%%/*}
  REAL_HOME=$(mktemp -d /tmp/parity-root-home.XXXXXX)
  mount --bind /root "$REAL_HOME"
  mount -t tmpfs -o mode=755 tmpfs /root
  mkdir "/root/$top"
  mount --bind "$REAL_HOME/$top" "/root/$top"
fi
# never rm -r a folder that may hold a bind mount of the real /root: unmount, then rmdir only
trap 'rm -rf "$RUNS"; if [[ -n $REAL_HOME ]]; then umount -l /root; umount -l "$REAL_HOME"; rmdir "$REAL_HOME"; fi' EXIT

# the mariadb service (the official image does this from MARIADB_* variables)
mariadb-install-db --no-defaults --user=mysql --datadir=/var/lib/mysql --skip-test-db \
  --auth-root-authentication-method=socket >"$WORK/mariadb-install.log" 2>&1
/usr/sbin/mariadbd --no-defaults --user=mysql --datadir=/var/lib/mysql --socket=/run/mysqld/sock \
  --port=3306 --skip-name-resolve >"$WORK/mariadb.log" 2>&1 &
for _ in $(seq 100); do mariadb --no-defaults -S /run/mysqld/sock -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
mariadb --no-defaults -S /run/mysqld/sock -e "CREATE DATABASE slurm_acct_db;
  CREATE USER 'slurm'@'%' IDENTIFIED BY '$DB_PASSWORD'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%';"

container() { # container <hostname> <command...>
  unshare -mu bash -c 'mount -t tmpfs tmpfs /run && hostname "$0" && exec "$@"' "$@"
}
"$EP" munge-key
"$EP" munge-key # a second run (compose restart) keeps the key
container slurmdbd env CLUSTER_DB_HOST=mariadb CLUSTER_DB_PASSWORD="$DB_PASSWORD" "$EP" slurmdbd \
  >"$WORK/slurmdbd.log" 2>&1 &
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break; sleep 0.2; done
container slurmctld "$EP" slurmctld >"$WORK/slurmctld.log" 2>&1 &
container slurmd "$EP" slurmd >"$WORK/slurmd.log" 2>&1 &
container scheduler env PARITY_RUN_AS=nobody "$EP" bash -c '
  set -e
  for _ in $(seq 100); do scontrol ping | grep -q UP && break; sleep 0.3; done
  for _ in $(seq 100); do sinfo -h -n slurmd -o %t | grep -Eq "^(idle|mix|alloc)" && break; sleep 0.3; done
  sinfo -h -o "sinfo: %P %a %D %t %N"
  timeout 120 "$0" - "$1" <<PY
import os, socket, sys
import submitit
def rank_and_host():
    return submitit.JobEnvironment().global_rank, socket.gethostname(), os.getuid()
executor = submitit.AutoExecutor(folder=sys.argv[1] + "/%j", cluster="slurm")
executor.update_parameters(tasks_per_node=2, cpus_per_task=1, timeout_min=2, slurm_partition="debug")
print("results:", executor.submit(rank_and_host).results())
PY
  for _ in $(seq 50); do sacct -X -n -P -o State | grep -q COMPLETED && break; sleep 0.3; done
  echo "sacct: $(sacct -X -n -P -o JobID,State,NodeList | tr "\n" " ")"
  echo "cluster: $(sacctmgr -n -P list cluster format=cluster)"
' "$PYTHON" "$RUNS"
