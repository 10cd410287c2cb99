#!/usr/bin/env bash
# Deliveries per second of 1, 2 and 4 `postgres-queue-replica drain` replicas on one PostgreSQL
# table, beside the disk queue's replay of the same entries, against one loopback origin
# (`postgres-queue-replica bench`, release build). See Benchmarks/README.md for the figures.
#
#   Integrations/Benchmark/postgres-replicas.sh                  # 5 000 entries, no ordering keys, then 200 keys; 3 rounds each
#   Integrations/Benchmark/postgres-replicas.sh --rounds 5       # extra flags go to both runs of `bench`
#
# It starts the PostgreSQL of Scripts/postgres.sh when none answers (and leaves it running), and
# prints the date, the commit, the core count and `uptime` before and after, for the README.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

bash Scripts/postgres.sh start >/dev/null
RESILIENCE_POSTGRES_URL="${RESILIENCE_POSTGRES_URL:-$(bash Scripts/postgres.sh url)}"
export RESILIENCE_POSTGRES_URL

build_log=$(mktemp)
trap 'rm -f "$build_log"' EXIT
swift build -c release --package-path Integrations --product postgres-queue-replica >"$build_log" 2>&1 || { cat "$build_log"; exit 1; }
tail -1 "$build_log"
binary="$(swift build -c release --package-path Integrations --show-bin-path)/postgres-queue-replica"

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- Sources Integrations/Sources Integrations/Package.swift || echo ' (with uncommitted changes)'), $(nproc) cores"
echo "uptime before: $(uptime)"
echo
echo "## no ordering keys"
"$binary" bench --replicas 1,2,4 --entries 5000 --keys 0 "$@"
echo
echo "## 200 ordering keys"
"$binary" bench --replicas 1,2,4 --entries 5000 --keys 200 "$@"
echo
echo "uptime after: $(uptime)"
