#!/usr/bin/env bash
# Model-checks every Promela model in Models/ with spin, exhaustively: assertions and invalid end
# states (no process left waiting) in a safety run, then each `ltl` property of the model as a
# search for acceptance cycles. The models have no loops: every infinite run is a finished (or
# stuck) state repeated, so no fairness assumption is needed (and -f multiplies the search).
# Fails on any error or an incomplete search. Needs spin (Debian's package `spin`) and a C
# compiler. Run from anywhere; a few minutes and about 3 GB on the CI machine.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check() { # model, label, pan's output
    local model=$1 label=$2 output=$3
    if ! grep -q "errors: 0" <<<"$output" || grep -q "search not completed\|max search depth too small" <<<"$output"; then
        printf '%s\n' "$output"
        echo "FAIL: $model ($label)"
        exit 1
    fi
    local states
    states=$(grep -oE '[0-9.e+]+ states, stored' <<<"$output" | head -1)
    echo "ok: $model ($label): $states"
}

for model in "$root"/Models/*.pml; do
    name=$(basename "$model" .pml)
    mkdir -p "$work/$name"
    cd "$work/$name"
    spin -a "$model" >/dev/null
    # Safety: assertions and end states, no never claim.
    gcc -O2 -w -DSAFETY -DNOCLAIM -DCOLLAPSE -o pan-safety pan.c
    check "$name" "assertions, end states" "$(./pan-safety -m100000 -n 2>&1)"
    # Each LTL property, at the size the model names in a `/* spin-ltl: -DNAME=VALUE */` line (the
    # safety run above already found no process left waiting at full size; the models have no
    # loops, so the property restates that, and a smaller size keeps CI's time down).
    ltlflags=$(sed -n 's|^/\* spin-ltl: \(.*\) \*/$|\1|p' "$model")
    # shellcheck disable=SC2086
    spin $ltlflags -a "$model" >/dev/null
    gcc -O2 -w -DCOLLAPSE -o pan-ltl pan.c
    for claim in $(grep -oE '^ltl [A-Za-z_][A-Za-z0-9_]*' "$model" | awk '{print $2}'); do
        check "$name" "ltl $claim${ltlflags:+ ($ltlflags)}" "$(./pan-ltl -m100000 -a -N "$claim" -n 2>&1)"
    done
    cd "$root"
done
