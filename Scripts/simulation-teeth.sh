#!/usr/bin/env bash
# The simulation's teeth (issue 28): each patch in Scripts/simulation-teeth/ reverts one fix that
# once reached users; with it applied, the simulation must report a violated invariant within
# 10 000 seeds. For each patch this builds resilience-demo in a scratch clone with the patch
# applied, runs every scenario on blocks of 100 seeds until one fails, and prints the first
# failing scenario and seed (or that none failed).
# Run by hand (a few minutes per patch on this machine): bash Scripts/simulation-teeth.sh [patch…]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
limit=${SEEDS:-10000}
patches=("$@")
[ ${#patches[@]} -gt 0 ] || patches=("$root"/Scripts/simulation-teeth/*.patch)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
git clone -q "$root" "$scratch/tree"
status=0
for patch in "${patches[@]}"; do
    name=$(basename "$patch" .patch)
    (cd "$scratch/tree" && git checkout -q -- . && git apply "$patch") || { echo "$name: the patch does not apply"; status=1; continue; }
    (cd "$scratch/tree" && swift build --product resilience-demo >/dev/null 2>&1) || { echo "$name: build failed"; status=1; continue; }
    found=""
    for ((first = 1; first <= limit; first += 100)); do
        last=$((first + 99 > limit ? limit : first + 99))
        found=$( (cd "$scratch/tree" && .build/debug/resilience-demo simulate --scenario all --seeds "$first..$last" --stop-at-first || true) \
            | grep -A1 '^FAIL' | head -2 | tr '\n' ' ' || true)  # no match: a block with no failure
        [ -z "$found" ] || break
    done
    if [ -n "$found" ]; then
        echo "$name: caught — $found"
    else
        echo "$name: nothing found in $limit seeds of each scenario"
        status=1
    fi
done
exit $status
