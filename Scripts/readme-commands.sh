#!/usr/bin/env bash
# Runs every `resilience-demo` command the README shows, at a small size, and fails when one exits
# non-zero, prints the wrong result, or when the README shows a command this script does not run.
#
#   Scripts/readme-commands.sh [DEMO]   DEMO: a built resilience-demo (default: swift build's)
#
# The README's `swift run -c release …` stress lines run here on the debug build (same code, same
# arguments but a smaller size): a release build would add minutes to CI and test nothing more.
# `swift run resilience-demo` itself and `swift test` are steps of their own in .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ge 1 ]; then
    demo=$1
else
    swift build --product resilience-demo >/dev/null
    demo="$(swift build --show-bin-path)/resilience-demo"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*"; exit 1; }
# The command's output must contain a line matching the pattern.
expect() {  # output-file pattern what
    grep -Eq "$2" "$1" || { cat "$1"; fail "$3: no line matching '$2'"; }
}

# Every README line that runs the demo, reduced to its command words ("stress queue", "serve", …):
# each must be one this script runs (the case below), so a new README command cannot go unrun.
covered="--list|stress dedup|stress auth|stress queue|queue inspect|serve|drain|simulate"
grep -oE 'resilience-demo( +[a-z-]+)*' README.md | sed -E 's/^resilience-demo *//' | sort -u |
    while read -r words; do
        [ -z "$words" ] && continue  # `swift run resilience-demo`: a step of .ci/run
        echo "$words" | grep -Eq "^($covered)( |$)" || fail "the README shows 'resilience-demo $words', which Scripts/readme-commands.sh does not run"
    done

echo "resilience-demo --list"
"$demo" --list >"$work/out"
expect "$work/out" "offline notes" "--list"

echo "resilience-demo stress dedup --callers 500"
timeout 300 "$demo" stress dedup --callers 500 >"$work/out" 2>&1 || { cat "$work/out"; fail "stress dedup"; }
expect "$work/out" "^upstream_calls=1 " "stress dedup"

echo "resilience-demo stress auth --callers 500"
timeout 300 "$demo" stress auth --callers 500 >"$work/out" 2>&1 || { cat "$work/out"; fail "stress auth"; }
expect "$work/out" "^refreshes=1 callers=500 succeeded=500 " "stress auth"

echo "resilience-demo stress queue --entries 500"
timeout 300 "$demo" stress queue --entries 500 >"$work/out" 2>&1 || { cat "$work/out"; fail "stress queue"; }
expect "$work/out" "^entries=500 acknowledged=500 delivered=500 lost=0 " "stress queue"

# A queue folder with entries and a file that is not one: the committed fuzz seeds of the entry
# decoder (valid entries and a damaged one), each named as the store names its files: <id>.json.
echo "resilience-demo queue inspect DIR"
mkdir -p "$work/queue"
for seed in Fuzz/Corpus/queue-entry/*; do
    id=$(grep -oE '"id":"[0-9A-Fa-f-]{36}"' "$seed" | head -1 | cut -d'"' -f4 | tr a-f A-F || true)
    cp "$seed" "$work/queue/${id:-$(basename "$seed")}.json"
done
before=$(cd "$work/queue" && ls -la | md5sum)
"$demo" queue inspect "$work/queue" >"$work/out" 2>&1 || { cat "$work/out"; fail "queue inspect"; }
expect "$work/out" "^queue .*: [1-9][0-9]* entries in replay order" "queue inspect"
expect "$work/out" "unreadable files" "queue inspect"
[ "$(cd "$work/queue" && ls -la | md5sum)" = "$before" ] || fail "queue inspect changed the folder it read"

# serve on a port outside the ephemeral range, scraped once while it runs, stopping by itself.
echo "resilience-demo serve --port 25480 --duration 4"
"$demo" serve --port 25480 --duration 4 >"$work/out" 2>&1 &
serve=$!
scraped=""
for _ in $(seq 1 30); do
    if curl -fsS http://127.0.0.1:25480/metrics >"$work/metrics" 2>/dev/null; then scraped=yes; break; fi
    sleep 0.1
done
wait "$serve" || { cat "$work/out"; fail "serve exited non-zero"; }
[ -n "$scraped" ] || { cat "$work/out"; fail "serve: /metrics did not answer"; }
expect "$work/metrics" "^# TYPE " "serve /metrics"

# drain until SIGTERM, which must stop it cleanly (exit 0, the cycle in flight ended).
echo "resilience-demo drain --interval 0.2 --budget 1 (SIGTERM once ready)"
"$demo" drain --interval 0.2 --budget 1 >"$work/out" 2>&1 &
drain=$!
for _ in $(seq 1 100); do
    grep -q "^ready: pid" "$work/out" && break
    sleep 0.1
done
expect "$work/out" "^ready: pid" "drain"
kill -TERM "$drain"
wait "$drain" || { cat "$work/out"; fail "drain exited non-zero after SIGTERM"; }
expect "$work/out" "^stopped cleanly on SIGTERM after [0-9]+ cycles?; 0 entries left" "drain"

echo "resilience-demo simulate --seeds 1..3"
"$demo" simulate --seeds 1..3 >"$work/out" 2>&1 || { cat "$work/out"; fail "simulate"; }

echo "every README command of resilience-demo ran"
