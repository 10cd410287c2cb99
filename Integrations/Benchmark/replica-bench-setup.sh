# Sourced by postgres-replicas.sh and postgres-concurrent.sh (from the repository's root): starts
# the PostgreSQL of Scripts/postgres.sh when none answers (and leaves it running), exports
# RESILIENCE_POSTGRES_URL, builds `postgres-queue-replica` in release, sets `binary` to it, and
# prints the date, the commit, the core count and `uptime`, for the README.
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
