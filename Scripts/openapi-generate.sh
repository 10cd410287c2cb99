#!/usr/bin/env bash
# The notes API's generated code (Integrations/Sources/NotesAPI/Generated: types, client and server,
# from Integrations/Sources/NotesAPI/openapi.yaml and openapi-generator-config.yaml) is committed,
# so the Integrations build never runs the generator. This writes it (`write`) or checks that the
# committed files are what the pinned generator (Scripts/OpenAPIGenerator, 1.14.3) makes from the
# document today (`check`, the default; `.ci/run` runs it). The generator's first release build
# takes about 4 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
api=Integrations/Sources/NotesAPI
swift build --package-path Scripts/OpenAPIGenerator -c release --product swift-openapi-generator >/dev/null
generator="$(swift build --package-path Scripts/OpenAPIGenerator -c release --show-bin-path)/swift-openapi-generator"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The file comment keeps swift-format's lint (in .ci/run) off code no one writes by hand.
if ! "$generator" generate "$api/openapi.yaml" --config "$api/openapi-generator-config.yaml" --output-directory "$out" \
    --additional-file-comment "swift-format-ignore-file" >"$out.log" 2>&1; then
    cat "$out.log"; exit 1
fi
rm -f "$out.log"
# `package import` of a module a file does not use in its declarations is a warning on this
# compiler, and the build must have none: the imports are made plain (what `package` access of the
# declarations needs, and no more than the generator meant).
for file in "$out"/*.swift; do  # not `sed -i`: GNU and BSD sed spell it differently
    sed -E 's/^(@_spi\(Generated\) )?package import /\1import /' "$file" > "$file.tmp" && mv "$file.tmp" "$file"
done
case "$mode" in
write)
    mkdir -p "$api/Generated"
    rm -f "$api"/Generated/*.swift
    cp "$out"/*.swift "$api/Generated/"
    echo "wrote $(ls "$api/Generated" | tr '\n' ' ')"
    ;;
check)
    if ! diff -ru "$out" "$api/Generated"; then
        echo "FAIL: $api/Generated is not what the generator makes from openapi.yaml; run Scripts/openapi-generate.sh write"
        exit 1
    fi
    echo "the generated notes API is current"
    ;;
*) echo "usage: $0 [check|write]"; exit 2 ;;
esac
