#!/bin/sh
# The image's HEALTHCHECK (ops/Dockerfile): one image runs every role, so "alive" is whichever of them this
# container runs. A worker or Beat touches ${TMPDIR:-/tmp}/engram-<role>.alive every 10 s
# (engram_workers/probes.py): healthy while one is younger than a minute. The gateway answers /v1/livez on
# port 8080 (compose's and the chart's; a gateway on another port needs its own healthcheck, as Flower has). Like liveness, it checks no dependency:
# compose's per-service healthchecks and the chart's readiness probes do (`engram probe ready`, /v1/readyz).
find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'engram-*.alive' -mmin -1 | grep -q . && exit 0
exec python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" \
  "http://127.0.0.1:8080/v1/livez" >/dev/null 2>&1
