#!/bin/sh
# Report a service's status (an example: fixed answers, no network).
set -eu
case "$1" in
  billing) echo "billing: up, 99.98% over 24 h, p50 41 ms" ;;
  search)  echo "search: degraded, index rebuild in progress (ETA 12 min)" ;;
  auth)    echo "auth: up, 100% over 24 h" ;;
  *) echo "unknown service: $1" >&2; exit 2 ;;
esac
