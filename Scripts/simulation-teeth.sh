#!/usr/bin/env bash
# The simulation's teeth (issue 28): each patch in Scripts/simulation-teeth/ reverts one fix that
# once reached users; with it applied, the simulation must report a violated invariant within
# 10 000 seeds. For each patch this builds resilience-demo in a scratch clone with the patch
# applied and prints, per scenario, the first failing seed (or that none failed).
# Run by hand (about two minutes per patch on this machine): bash Scripts/simulation-teeth.sh [patch…]
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
    (cd "$scratch/tree" && git checkout -q -- . && git apply "$patch")
    (cd "$scratch/tree" && swift build --product resilience-demo >/dev/null 2>&1) || { echo "$name: build failed"; status=1; continue; }
    caught=no
    for scenario in engine auth queue; do
        first=$( (cd "$scratch/tree" && .build/debug/resilience-demo simulate --scenario "$scenario" --seeds "1..$limit" --stop-at-first || true) | sed -n 's/^FAIL [a-z]* seed \([0-9]*\):.*/\1/p' | head -1)
        if [ -n "$first" ]; then
            echo "$name: $scenario caught it at seed $first"
            caught=yes
        else
            echo "$name: $scenario found nothing in $limit seeds"
        fi
    done
    [ "$caught" = yes ] || status=1
done
exit $status
