#!/usr/bin/env bash
# Starts or stops the nginx that integrations-benchmark's external-server mode targets:
#   Integrations/Benchmark/nginx.sh start [PORT]   # default 8089; prints the URL to pass to --url
#   Integrations/Benchmark/nginx.sh stop
# Debian's nginx (`apt-get install nginx-light`); the benchmark is not run in CI. It serves a
# 200-byte file at /bench on 127.0.0.1 with one worker and long-lived keep-alive (nginx.conf).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix="${NGINX_BENCH_PREFIX:-/tmp/resilience-bench-nginx}"
nginx="$(command -v nginx || echo /usr/sbin/nginx)"
[ -x "$nginx" ] || { echo "nginx not found: apt-get install nginx-light" >&2; exit 1; }

case "${1:-}" in
start)
    port="${2:-8089}"
    if [ -f "$prefix/nginx.pid" ] && kill -0 "$(cat "$prefix/nginx.pid")" 2>/dev/null; then
        echo "already running (pid $(cat "$prefix/nginx.pid")); stop it first" >&2; exit 1
    fi
    mkdir -p "$prefix/html" "$prefix/tmp"
    chmod 755 "$prefix" "$prefix/html"
    printf 'x%.0s' $(seq 200) > "$prefix/html/bench.txt"
    chmod 644 "$prefix/html/bench.txt"
    sed "s/PORT/$port/" "$here/nginx.conf" > "$prefix/nginx.conf"
    "$nginx" -p "$prefix/" -c "$prefix/nginx.conf"
    for _ in $(seq 50); do [ -s "$prefix/nginx.pid" ] && break; sleep 0.1; done
    echo "http://127.0.0.1:$port/bench"
    ;;
stop)
    if [ -f "$prefix/nginx.pid" ]; then
        "$nginx" -p "$prefix/" -c "$prefix/nginx.conf" -s quit
        for _ in $(seq 50); do [ -f "$prefix/nginx.pid" ] || break; sleep 0.1; done
    fi
    ;;
*)
    echo "usage: $0 start [PORT] | stop" >&2; exit 2
    ;;
esac
