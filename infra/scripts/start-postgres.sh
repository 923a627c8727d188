#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and trials (never for the lab's real data: fsync is off).
#
#   infra/scripts/start-postgres.sh DIR [PORT]   initdb DIR/data, start it on 127.0.0.1:PORT
#                                                (default 55432), create database `prefect`,
#                                                print the SQLAlchemy URL for Prefect
#   infra/scripts/start-postgres.sh --stop DIR   stop it (DIR can then be deleted)
#
# Installs the `postgresql` package with apt-get when no initdb is found (CI machines).
# As root the server runs as the `postgres` user (PostgreSQL refuses to run as root).
set -euo pipefail

find_bin() {
    local d
    for d in /usr/lib/postgresql/*/bin /usr/local/pgsql/bin; do
        if [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
    done
    if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
    return 1
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ "${1:-}" = "--stop" ]; then
    DIR=${2:?usage: start-postgres.sh --stop DIR}
    PGBIN=$(find_bin)
    as_owner "$PGBIN/pg_ctl" -D "$DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    exit 0
fi

DIR=${1:?usage: start-postgres.sh DIR [PORT]}
PORT=${2:-55432}

if ! PGBIN=$(find_bin); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "start-postgres: installing postgresql with apt-get" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
        PGBIN=$(find_bin)
    else
        echo "start-postgres: no initdb found and cannot apt-get install postgresql" >&2
        exit 1
    fi
fi

mkdir -p "$DIR"
if [ "$(id -u)" = 0 ]; then
    chown postgres: "$DIR"
    if ! runuser -u postgres -- test -w "$DIR"; then
        echo "start-postgres: user postgres cannot reach $DIR (a parent is not o+x)" >&2
        exit 1
    fi
fi
as_owner "$PGBIN/initdb" -D "$DIR/data" --auth=trust -U postgres -E UTF8 >"$DIR/initdb.log" 2>&1
as_owner "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/postgres.log" -w -t 60 \
    -o "-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$DIR -c fsync=off -c max_connections=200" \
    start >/dev/null
"$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres prefect
echo "postgresql+asyncpg://postgres@127.0.0.1:$PORT/prefect"
