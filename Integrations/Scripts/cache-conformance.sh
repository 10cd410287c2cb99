#!/usr/bin/env bash
# Measures the response cache (CachedRequestEngine over DiskResponseCache) against the
# HTTP-caching conformance suite behind cache-tests.fyi, the way the suite measures proxies: its
# client talks to cache-conformance-gateway, which answers through the engine, whose requests go
# to the suite's origin server. Prints a Markdown summary: our results beside the browsers'
# (SUITE_DIR/results/{chrome,firefox,safari}.json) over the private-cache tests, and our failures.
#
#   Integrations/Scripts/cache-conformance.sh SUITE_DIR [RESULTS_JSON]
#
# SUITE_DIR is a checkout of https://github.com/http-tests/cache-tests (it is not part of this
# repository: `git clone https://github.com/http-tests/cache-tests SUITE_DIR`). Its npm
# dependencies are not needed: Node 18+'s own fetch drives it (the interim-response tests, which
# do not apply to a private cache, need the `undici` package). RESULTS_JSON keeps the raw results
# (default: a file in a temporary folder, printed at the end).
# Environment: CACHE_TEST_MODE=shared runs the proxy set instead of the private-cache set;
# CACHE_TEST_ID=<id> runs one test with the suite's dump of its exchanges.
# Takes a few minutes: tests pause 3 s between requests in places.
set -euo pipefail

suite="${1:-}"
if [ -z "$suite" ] || [ ! -f "$suite/tests/index.mjs" ] || [ ! -f "$suite/test-engine/server/server.mjs" ]; then
    echo "usage: $0 SUITE_DIR [RESULTS_JSON]" >&2
    echo "SUITE_DIR: a checkout of https://github.com/http-tests/cache-tests (tests/ and test-engine/)" >&2
    exit 64
fi
suite="$(cd "$suite" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
integrations="$(cd "$here/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/cache-conformance.XXXXXX")"
results="${2:-$work/results.json}"
mode="${CACHE_TEST_MODE:-private}"

origin_pid=""
gateway_pid=""
cleanup() {
    [ -n "$gateway_pid" ] && kill "$gateway_pid" 2>/dev/null || true
    [ -n "$origin_pid" ] && kill "$origin_pid" 2>/dev/null || true
    rm -rf "$work/cache"
}
trap cleanup EXIT

free_port() {
    node -e "const s = require('net').createServer().listen(0, '127.0.0.1', () => { console.log(s.address().port); s.close() })"
}

# Waits until FILE has a line matching PATTERN, or fails after 30 s.
wait_for_line() {
    for _ in $(seq 300); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "timed out waiting for '$2' in $1:" >&2
    cat "$1" >&2
    return 1
}

echo "building cache-conformance-gateway..." >&2
swift build --package-path "$integrations" --product cache-conformance-gateway >&2
gateway="$(swift build --package-path "$integrations" --show-bin-path)/cache-conformance-gateway"

origin_port="$(free_port)"
npm_config_protocol=http npm_config_port="$origin_port" npm_config_pidfile="$work/origin.pid" \
    node "$suite/test-engine/server/server.mjs" > "$work/origin.log" 2>&1 &
origin_pid=$!
wait_for_line "$work/origin.log" "Listening on"

gateway_port="$(free_port)"
"$gateway" --upstream "http://127.0.0.1:$origin_port" --port "$gateway_port" --cache-dir "$work/cache" \
    > "$work/gateway.log" 2>&1 &
gateway_pid=$!
wait_for_line "$work/gateway.log" "listening on"

echo "running the suite ($mode-cache tests) through the gateway on port $gateway_port..." >&2
node "$here/cache-conformance-driver.mjs" "$suite" "http://127.0.0.1:$gateway_port" "$mode" > "$results"

if [ -n "${CACHE_TEST_ID:-}" ]; then
    cat "$results"
    exit 0
fi
browsers=()
for browser in chrome firefox safari; do
    [ -f "$suite/results/$browser.json" ] && browsers+=("$browser=$suite/results/$browser.json")
done
node "$here/cache-conformance-summary.mjs" "$suite" "ours=$results" "${browsers[@]}" --failures ours
echo >&2
if grep -q " for " "$work/gateway.log"; then
    echo "answers the gateway made itself (501: method the engine cannot send; 502: engine error):" >&2
    grep " for " "$work/gateway.log" >&2
fi
echo "raw results: $results; logs: $work" >&2
