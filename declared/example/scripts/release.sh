#!/bin/sh
# Publish a release. In this example it only writes the release log it would
# keep; a real one would tag, build and upload.
set -eu
version="$1"; shift
channel=""; notes=""
for arg in "$@"; do
  case "$arg" in
    --channel=*) channel="${arg#--channel=}" ;;
    --notes=*) notes="${arg#--notes=}" ;;
    *) echo "release.sh: unexpected argument: $arg" >&2; exit 2 ;;
  esac
done
echo "release $version published to $channel"
echo "artifacts: product-$version.tar.gz, product-$version.sha256"
[ -n "$notes" ] && echo "notes: $notes"
exit 0
