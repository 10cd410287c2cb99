#!/usr/bin/env bash
# Builds the DocC documentation of every library product with the toolchain's own `docc`, from the
# symbol graphs of the root package's debug build and each target's catalog
# (Sources/<Target>/<Target>.docc): no plugin, no dependency in the root manifest. Fails on any
# warning (a broken symbol link, a parameter documented under the wrong name, …). The archives go
# to .build/docc/<Target>.doccarchive.
set -euo pipefail
cd "$(dirname "$0")/.."
products=(Retry RequestEngine Reachability OfflineQueue ResponseCache Auth Observability Drainer OfflineFirst ResilienceTesting ResilienceSimulation)
swift build >/dev/null
bin="$(swift build --show-bin-path)"
out=.build/docc
rm -rf "$out"
mkdir -p "$out"
for target in "${products[@]}"; do
    graphs="$out/symbol-graphs/$target"
    mkdir -p "$graphs"
    swift-symbolgraph-extract -module-name "$target" -I "$bin/Modules" -I "$bin/CNetlink.build" -I "$bin/CURLHandleRepair.build" \
        -minimum-access-level public -skip-inherited-docs -emit-extension-block-symbols -output-dir "$graphs"
    docc convert "Sources/$target/$target.docc" --additional-symbol-graph-dir "$graphs" \
        --fallback-display-name "$target" --fallback-bundle-identifier "dev.resilience.$target" \
        --warnings-as-errors --output-path "$out/$target.doccarchive" >/dev/null
    echo "$target: $out/$target.doccarchive"
done
