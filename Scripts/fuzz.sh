#!/usr/bin/env bash
# Fuzzes the parsers of untrusted bytes with libFuzzer: builds every target of Fuzz/ (AddressSanitizer
# and SanitizerCoverage) and runs each for N seconds (default 60) over its seed corpus
# Fuzz/Corpus/<target>/, with Fuzz/Dictionaries/<target>.dict.
#
#   Scripts/fuzz.sh [seconds] [target...]      e.g. Scripts/fuzz.sh 300 cache-file
#
# Targets: queue-entry, cache-file, stale-marks, cache-headers, http-date, loopback-request. Prints executions
# and coverage per target. A crash, a broken contract, a hang (10 s on one input) or a leak fails the
# run; the input is kept in Fuzz/Crashes/<target>/ (git-ignored) with the command that replays it.
# New corpus entries go to a temporary folder, never into Fuzz/Corpus/ (seeds are written by
# `swift run --package-path Fuzz fuzz-seeds Fuzz/Corpus`; the run fails if the committed ones differ
# from what that writes, running the same writer from the fuzz build).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(queue-entry cache-file stale-marks cache-headers http-date loopback-request)
scratch=Fuzz/.build-fuzz

# -sanitize=fuzzer would link libFuzzer's main, which clashes with the entry point SwiftPM gives an
# executable; so the targets are instrumented as -sanitize=fuzzer does, linked with libFuzzer's
# no-main library, and each starts the driver from its own @main (Fuzz/Sources/FuzzSupport).
toolchain=$(dirname "$(dirname "$(readlink -f "$(command -v swiftc)")")")
libfuzzer=$(ls "$toolchain"/lib/clang/*/lib/linux/libclang_rt.fuzzer_no_main-"$(uname -m)".a 2>/dev/null | head -n 1)
[ -n "$libfuzzer" ] || { echo "FAIL: no libclang_rt.fuzzer_no_main in $toolchain"; exit 1; }

log=$(mktemp)
work=$(mktemp -d)
trap 'rm -rf "$log" "$work"' EXIT

echo "building the fuzz targets ($scratch)"
start=$(date +%s)
swift build --package-path Fuzz --scratch-path "$scratch" \
    -Xswiftc -sanitize=address \
    -Xswiftc -sanitize-coverage=edge,indirect-calls,trace-cmp,inline-8bit-counters,pc-table \
    -Xlinker "$libfuzzer" -Xlinker -lstdc++ >"$log" 2>&1 || { grep -v "Cannot export local symbol" "$log"; exit 1; }
# The gold linker warns that it cannot export ASan's local helper symbols: harmless, and not ours.
if grep -E "warning:" "$log" | grep -v "Cannot export local symbol"; then
    echo "FAIL: the fuzz targets build with warnings"; exit 1
fi
echo "built in $(($(date +%s) - start)) s"
bin=$(swift build --package-path Fuzz --scratch-path "$scratch" --show-bin-path)

# Swift's own crash handler reads memory ASan guards; libFuzzer and ASan report crashes here.
export SWIFT_BACKTRACE=enable=no

# The committed seeds are what fuzz-seeds writes today (a format change rewrites them, not rots them).
"$bin/fuzz-seeds" "$work/seeds" >/dev/null
diff -r "$work/seeds" Fuzz/Corpus >/dev/null || {
    echo "FAIL: Fuzz/Corpus differs from what fuzz-seeds writes; run: swift run --package-path Fuzz fuzz-seeds Fuzz/Corpus"
    exit 1
}
echo "the seed corpora match fuzz-seeds"
failed=()
for target in "${targets[@]}"; do
    corpus=Fuzz/Corpus/$target
    [ -d "$corpus" ] || { echo "FAIL: no seed corpus $corpus"; exit 1; }
    crashes=Fuzz/Crashes/$target
    mkdir -p "$crashes" "$work/$target"
    # New inputs go to the first folder (temporary); the seeds are only read.
    began=$(date +%s)
    set +e
    "$bin/fuzz-$target" "$work/$target" "$corpus" -dict="Fuzz/Dictionaries/$target.dict" \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$crashes/" >"$log" 2>&1
    status=$?
    set -e
    elapsed=$(($(date +%s) - began))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    coverage=$(grep -E '^#[0-9]+' "$log" | grep -oE 'cov: [0-9]+ ft: [0-9]+' | tail -n 1 || true)
    entries=$(find "$work/$target" -type f | wc -l)
    printf '%-17s %10s executions in %3s s, %s, %s new corpus entries\n' "$target" "${runs:-?}" "$elapsed" "${coverage:-no coverage}" "$entries"
    if [ "$status" -ne 0 ]; then
        failed+=("$target")
        echo "FAIL: fuzz-$target exited with $status; the last lines of its log:"
        grep -vE '^#[0-9]+' "$log" | tail -n 40
        for artifact in "$crashes"/*; do
            [ -f "$artifact" ] && echo "replay: $bin/fuzz-$target $artifact"
        done
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "FAIL: ${failed[*]}"
    exit 1
fi
rmdir Fuzz/Crashes/* Fuzz/Crashes 2>/dev/null || true
echo "fuzzing passed: ${targets[*]}"
