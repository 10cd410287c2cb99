#!/usr/bin/env bash
# Writes (`write`) or checks (`check`, the default) the public-API baselines in API/, one file per
# library product, from the root package's debug build. Run from anywhere; builds what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
products=(Retry RequestEngine Reachability OfflineQueue ResponseCache Auth Observability Drainer OfflineFirst Resilience ResilienceTesting ResilienceSimulation)
swift build >/dev/null
modules="$(swift build --show-bin-path)/Modules"
swift build --package-path Scripts/APIBaseline -c release >/dev/null
"$(swift build --package-path Scripts/APIBaseline -c release --show-bin-path)/api-baseline" "$mode" "$modules" API -I "$(swift build --show-bin-path)/CNetlink.build" -I "$(swift build --show-bin-path)/CURLHandleRepair.build" "${products[@]}"
