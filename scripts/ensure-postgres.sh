#!/usr/bin/env bash
# Make sure the PostgreSQL the test suite uses answers on 127.0.0.1:5432; a no-op when it already does.
#
# Shared by `make test` and .ci/run, so that a fresh machine needs no manual step:
#   - PostgreSQL answering: nothing to do.
#   - TRACKWAY_TEST_PG set: the developer points the suite at their own server; not ours to start.
#   - installed but stopped: start the newest cluster (Debian's pg_ctlcluster), then wait for it.
#   - not installed: install Debian's package, let local TCP connections in without a password
#     (tests/conftest.py connects as postgres@127.0.0.1 with none), start it, then wait for it.
set -euo pipefail

HOST=127.0.0.1
PORT=5432
WAIT_S=60

say() { echo "ensure-postgres: $*" >&2; }

pg_up() {
  python3 - "$HOST" "$PORT" <<'PY'
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex((sys.argv[1], int(sys.argv[2]))) == 0 else 1)
PY
}

# Root runs these as they are; anyone else through sudo, when it is there (never prompting).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
  else say "need root to run: $*"; return 1
  fi
}

newest_cluster() { ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1; }

install_postgres() {
  say "PostgreSQL is not installed; installing Debian's package"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql
  local version hba
  version=$(newest_cluster)
  hba="/etc/postgresql/$version/main/pg_hba.conf"
  # First match wins in pg_hba.conf: these lines go above the packaged password rules. Only a
  # cluster this script installed is changed; an existing one keeps its owner's rules.
  as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
  # The package may have started the cluster already: it must read the new rules.
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main reload 2>/dev/null || true
}

if [ -n "${TRACKWAY_TEST_PG:-}" ]; then
  exit 0
fi
if pg_up; then
  exit 0
fi
say "nothing answers on $HOST:$PORT; starting PostgreSQL"
if [ -z "$(ls -d /etc/postgresql/*/main 2>/dev/null)" ]; then
  install_postgres
fi
version=$(newest_cluster)
# Already "online" for pg_ctlcluster but not answering yet is fine: start says so and we wait.
as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 "$WAIT_S"); do
  pg_up && { say "PostgreSQL $version is up on $HOST:$PORT"; exit 0; }
  sleep 1
done
say "PostgreSQL $version did not answer on $HOST:$PORT within ${WAIT_S} s; see /var/log/postgresql/postgresql-$version-main.log"
exit 1
