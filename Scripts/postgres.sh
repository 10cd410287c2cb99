#!/usr/bin/env bash
# A throwaway PostgreSQL for the ResiliencePostgres tests: its own data folder, loopback only,
# trust authentication, and a database `resilience_test`.
#
#   bash Scripts/postgres.sh start   # initialises the folder if needed, starts the server, prints the settings
#   bash Scripts/postgres.sh stop    # stops it (nothing to do when it is not running)
#   bash Scripts/postgres.sh url     # prints the URL the tests read from RESILIENCE_POSTGRES_URL
#
# Settings (environment): RESILIENCE_PG_DIR (default /tmp/resilience-pg), RESILIENCE_PG_PORT
# (default 25432: below the kernel's ephemeral range, 32768-60999 on Linux, so no client
# connection of the tests can be holding it, as one held 55432 once). The binaries are looked up
# on PATH, then under /usr/lib/postgresql/*/bin; when neither has them, Debian's `postgresql`
# package is installed (as root). PostgreSQL refuses to run as root: as root, the server runs as
# the `postgres` user (or `nobody` when there is none).
set -euo pipefail

dir=${RESILIENCE_PG_DIR:-/tmp/resilience-pg}
port=${RESILIENCE_PG_PORT:-25432}
database=resilience_test
data="$dir/data"
logfile="$dir/server.log"

url() { echo "postgres://$user@127.0.0.1:$port/$database"; }

find_bin() {
    local name=$1 candidate
    if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
    for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$candidate/$name" ]; then echo "$candidate/$name"; return 0; fi
    done
    return 1
}

# Runs a command as the server's user (the caller itself unless that is root).
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u "$user" -- "$@"
    else
        "$@"
    fi
}

if [ "$(id -u)" = 0 ]; then
    if id postgres >/dev/null 2>&1; then user=postgres; else user=nobody; fi
else
    user=$(id -un)
fi

command=${1:-}
case "$command" in
start)
    if ! find_bin pg_ctl >/dev/null || ! find_bin initdb >/dev/null; then
        if [ "$(id -u)" = 0 ]; then
            echo "PostgreSQL not found: installing Debian's postgresql package"
            timeout 600 bash -c 'apt-get update -qq && apt-get install -y -qq postgresql >/dev/null'
        fi
        if ! find_bin pg_ctl >/dev/null; then echo "postgres.sh: no PostgreSQL binaries (pg_ctl, initdb)" >&2; exit 1; fi
        # Debian's package makes a `postgres` user: the server runs as it from now on.
        if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then user=postgres; fi
    fi
    pg_ctl=$(find_bin pg_ctl)
    initdb=$(find_bin initdb)
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then chown "$user" "$dir"; fi
    chmod 700 "$dir"
    if [ ! -f "$data/PG_VERSION" ]; then
        as_owner "$initdb" --pgdata="$data" --username="$user" --auth=trust --encoding=UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    if as_owner "$pg_ctl" --pgdata="$data" status >/dev/null 2>&1; then
        echo "PostgreSQL already running in $data"
    else
        # Loopback only, no Unix socket outside the folder, enough connections for parallel tests.
        as_owner "$pg_ctl" --pgdata="$data" --log="$logfile" --wait --timeout=60 \
            -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories='$dir' -c max_connections=200 -c fsync=off -c shared_preload_libraries=pg_stat_statements" \
            start >/dev/null || { cat "$logfile" >&2; exit 1; }
    fi
    # The test database; `postgres` is the maintenance database every cluster has.
    psql=$(find_bin psql || true)
    if [ -n "$psql" ]; then
        exists=$(as_owner "$psql" -h 127.0.0.1 -p "$port" -U "$user" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$database'")
        if [ "$exists" != 1 ]; then as_owner "$psql" -h 127.0.0.1 -p "$port" -U "$user" -d postgres -qc "CREATE DATABASE $database"; fi
    else
        createdb=$(find_bin createdb)
        as_owner "$createdb" -h 127.0.0.1 -p "$port" -U "$user" "$database" 2>/dev/null || true
    fi
    echo "PostgreSQL on 127.0.0.1:$port, user $user, database $database (data: $data, log: $logfile)"
    echo "RESILIENCE_POSTGRES_URL=$(url)"
    ;;
stop)
    if [ -f "$data/PG_VERSION" ] && pg_ctl=$(find_bin pg_ctl); then
        if as_owner "$pg_ctl" --pgdata="$data" status >/dev/null 2>&1; then
            as_owner "$pg_ctl" --pgdata="$data" --mode=fast --wait stop >/dev/null
            echo "PostgreSQL stopped ($data)"
        fi
    fi
    ;;
url)
    url
    ;;
*)
    echo "usage: $0 start|stop|url" >&2
    exit 2
    ;;
esac
