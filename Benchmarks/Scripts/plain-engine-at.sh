#!/usr/bin/env bash
# What the plain engine (AsyncRequestEngine(session:), default options: 30 s timeout, single flight
# for GET, no strategy) costs per request at several commits, over a session that answers at once:
# the check that the strategies beyond retry (issue 18) cost nothing when off, and that later
# changes keep it so. Each commit is checked out in a git worktree and measured by the same small
# harness (written below, depending on that worktree by path), so commits from before
# `strategies-benchmark` existed can be measured too.
#
#   Benchmarks/Scripts/plain-engine-at.sh [--cpu ROUNDS] COMMIT...
#
# Instructions per request (callgrind, every thread): (Ir(N2) − Ir(N1)) ÷ (N2 − N1) with
# N1 = 1 280 and N2 = 25 600, sequential (one task) and concurrent (64 tasks, each on a URL of its
# own so single flight does not merge them), three repeats each: valgrind serialises the threads,
# and a lock found held spins for a scheduling-dependent time, so the repeats differ by a few
# hundred instructions. With --cpu ROUNDS it also prints CPU µs per request (getrusage) of 100 000
# sequential and 64 000 concurrent sends, the commits alternating round by round.
#
# Needs valgrind; about 2 minutes a commit to build (release) and 3 to count. Work folder:
# ${PLAIN_ENGINE_WORK:-/tmp/plain-engine-at} (worktrees, builds; delete it when done).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="${PLAIN_ENGINE_WORK:-/tmp/plain-engine-at}"
rounds=0
if [ "${1:-}" = "--cpu" ]; then rounds=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: $0 [--cpu ROUNDS] COMMIT..."; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }

mkdir -p "$work/harness/Sources/plain"
cat > "$work/harness/Package.swift" <<'EOF'
// swift-tools-version:6.0
import PackageDescription
import Foundation

let resilience = ProcessInfo.processInfo.environment["RESILIENCE_PATH"] ?? "../.."
let package = Package(
    name: "plain-engine-harness",
    dependencies: [.package(name: "Resilience", path: resilience)],
    targets: [.executableTarget(name: "plain", dependencies: [.product(name: "RequestEngine", package: "Resilience")])],
    swiftLanguageModes: [.v6]
)
EOF
cat > "$work/harness/Sources/plain/main.swift" <<'EOF'
// plain count|cpu sequential|concurrent N: N sends of AsyncRequestEngine(session:) over a session
// that answers at once. A synchronous main: valgrind 3.19 crashes in an async one.
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import RequestEngine

final class InstantSession: NetworkSession {
    let body = Data(repeating: 0x61, count: 22)
    let response = HTTPURLResponse(
        url: URL(string: "http://127.0.0.1:8080/item")!, statusCode: 200, httpVersion: "HTTP/1.1",
        headerFields: ["Content-Length": "22"])!
    func data(for request: URLRequest) async throws -> (Data, URLResponse) { (body, response) }
}

struct Get: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
}

@Sendable func sends(_ shape: String, _ count: Int) async throws {
    let engine = AsyncRequestEngine(session: InstantSession())
    let urls = (0..<64).map { URL(string: "http://127.0.0.1:8080/item?worker=\($0)")! }
    if shape == "sequential" {
        for _ in 0..<count { _ = try await engine.send(Get(url: urls[0])) }
        return
    }
    try await withThrowingTaskGroup(of: Void.self) { group in
        for url in urls {
            group.addTask { for _ in 0..<max(1, count / 64) { _ = try await engine.send(Get(url: url)) } }
        }
        try await group.waitForAll()
    }
}

func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

let arguments = CommandLine.arguments
guard arguments.count == 4, ["count", "cpu"].contains(arguments[1]), ["sequential", "concurrent"].contains(arguments[2]),
      let count = Int(arguments[3]), count > 0
else { print("usage: plain count|cpu sequential|concurrent N"); exit(2) }
let (mode, shape) = (arguments[1], arguments[2])
let done = DispatchSemaphore(value: 0)
nonisolated(unsafe) var failure: (any Error)?
Task.detached {
    do {
        if mode == "cpu" { try await sends(shape, count / 10) }  // warm-up
        let before = cpuSeconds()
        try await sends(shape, count)
        if mode == "cpu" { print(String(format: "%.2f", (cpuSeconds() - before) / Double(count) * 1e6)) }
    } catch {
        failure = error
    }
    done.signal()
}
done.wait()
if let failure { print("failed: \(failure)"); exit(1) }
EOF

binary() { echo "$work/build-$1/release/plain"; }
for commit in "$@"; do
    sha=$(git -C "$repo" rev-parse --short "$commit")
    [ -d "$work/wt-$sha" ] || git -C "$repo" worktree add --detach "$work/wt-$sha" "$sha" >/dev/null
    RESILIENCE_PATH="$work/wt-$sha" swift build -c release --package-path "$work/harness" --scratch-path "$work/build-$sha" >"$work/build-$sha.log" 2>&1 \
        || { echo "build of $sha failed: $work/build-$sha.log"; exit 1; }
done

instructions() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | sed -n 's/^==[0-9]*== Collected : \([0-9]*\)$/\1/p'
}
n1=1280; n2=25600
echo "instructions per request, (Ir($n2) - Ir($n1)) / $((n2 - n1)), 3 repeats; $(valgrind --version); load average $(cut -d' ' -f1-3 /proc/loadavg)"
for commit in "$@"; do
    sha=$(git -C "$repo" rev-parse --short "$commit")
    for shape in sequential concurrent; do
        figures=()
        for _ in 1 2 3; do
            low=$(instructions "$(binary "$sha")" count "$shape" $n1)
            high=$(instructions "$(binary "$sha")" count "$shape" $n2)
            figures+=("$(( (high - low) / (n2 - n1) ))")
        done
        printf '%-10s %-11s %s\n' "$sha" "$shape" "${figures[*]}"
    done
done

[ "$rounds" -gt 0 ] || exit 0
echo "CPU µs per request (getrusage), $rounds rounds, commits alternating; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
    line="round $round:"
    for commit in "$@"; do
        sha=$(git -C "$repo" rev-parse --short "$commit")
        line="$line  $sha seq $("$(binary "$sha")" cpu sequential 100000) conc $("$(binary "$sha")" cpu concurrent 64000)"
    done
    echo "$line"
done
echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
