#!/usr/bin/env bash
# Instructions per request of the plain engine and of the engine with deadline, per-host breakers
# and per-host limiter on (issue 18), counted by valgrind's callgrind over strategies-benchmark's
# `count` mode: each variant and shape is run at two request counts, and
#   instructions per request = (Ir(N2) - Ir(N1)) / (N2 - N1)
# so that start-up and tear-down cancel out. Total Ir only: no debug info or symbols are needed.
# Compare the lowest of several repeats: now and then a run's jobs take libdispatch's slower
# lane path (about +1 400 instructions per request, all in libdispatch), whichever the variant.
# `binary=PATH` runs another build (the previous commit's, say); its debug info is stripped from a
# copy first.
#
# Usage (from Benchmarks/): Scripts/callgrind-strategies.sh [N1] [N2] [repeats]
# (variants="plain strategies" Scripts/callgrind-strategies.sh for only those two)
# Needs valgrind (apt-get install valgrind) and the release build:
#   swift build -c release --product strategies-benchmark
set -euo pipefail
cd "$(dirname "$0")/.."
n1=${1:-1280}
n2=${2:-12800}
repeats=${3:-2}
binary=${binary:-.build/release/strategies-benchmark}
[ -x "$binary" ] || { echo "build first: swift build -c release --product strategies-benchmark"; exit 1; }
command -v valgrind >/dev/null || { echo "valgrind is not installed"; exit 1; }
# valgrind 3.19 cannot read the DWARF 5 debug info Swift 6 writes ("Possibly corrupted debuginfo
# file ... Giving up"): count a copy without it (symbols kept, for callgrind_annotate).
stripped=$(mktemp)
trap 'rm -f "$stripped"' EXIT
objcopy --strip-debug "$binary" "$stripped"
binary=$stripped

# Total instructions of one run ("Collected : N" on valgrind's stderr).
instructions() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$binary" count "$@" 2>&1 \
        | sed -n 's/^==[0-9]*== Collected : \([0-9]*\)$/\1/p'
}

echo "callgrind, $(valgrind --version), N1=$n1 N2=$n2, $repeats repeats; load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-11s %-13s %-8s %s\n' shape variant lowest "instructions per request (each repeat)"
for shape in sequential concurrent; do
    for variant in ${variants:-plain deadline breakers limiter strategies}; do
        figures=()
        for _ in $(seq "$repeats"); do
            low=$(instructions "$variant" "$shape" "$n1")
            high=$(instructions "$variant" "$shape" "$n2")
            [ -n "$low" ] && [ -n "$high" ] || { echo "valgrind gave no count for $variant $shape"; exit 1; }
            figures+=("$(( (high - low) / (n2 - n1) ))")
        done
        lowest=$(printf '%s\n' "${figures[@]}" | sort -n | head -1)
        printf '%-11s %-13s %-8s %s\n' "$shape" "$variant" "$lowest" "${figures[*]}"
    done
done
