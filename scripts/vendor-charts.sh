#!/usr/bin/env bash
# Vendor the dashboard's chart library (uPlot) from npm into service/web/dashboard/static/vendor/.
# Run by a person when bumping the version; the copied files are committed, so CI and the
# service never need npm or the network.
set -euo pipefail

VERSION="${1:-1.6.32}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/service/web/dashboard/static/vendor"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

command -v npm >/dev/null || { echo "vendor-charts: npm is required" >&2; exit 1; }
# npm pack fetches the published tarball only (no install scripts run).
(cd "$TMP" && npm pack --silent "uplot@$VERSION" >/dev/null)
tar -xzf "$TMP"/uplot-"$VERSION".tgz -C "$TMP"

mkdir -p "$DEST"
cp "$TMP/package/dist/uPlot.iife.min.js" "$TMP/package/dist/uPlot.min.css" "$DEST/"
cp "$TMP/package/LICENSE" "$DEST/uPlot.LICENSE"
echo "uplot $VERSION" > "$DEST/VERSION"
echo "vendored uPlot $VERSION into ${DEST#"$ROOT"/}"
