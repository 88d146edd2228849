#!/usr/bin/env bash
# Builds the launcher only when needed: target/ missing, or pom.xml / Main.java changed since the
# last successful build (sha256 of both kept in target/.build-stamp). Safe to call from several
# processes at once (flock), and cheap when nothing changed, so callers can run it every time.
# Usage: ./build.sh [--force]      Env: MVN (default mvn), MVN_ARGS (extra Maven arguments)
set -euo pipefail
cd "$(dirname "$0")"

stamp=target/.build-stamp
want=$(cat pom.xml src/main/java/Main.java | sha256sum | cut -d' ' -f1)

up_to_date() {
  [[ -f target/classes/Main.class && -d target/lib && -f $stamp && "$(cat "$stamp")" == "$want" ]]
}

if [[ "${1:-}" != "--force" ]] && up_to_date; then
  exit 0
fi

mkdir -p target
# Concurrent test sessions would otherwise run Maven into the same target/ at the same time.
exec 9>target/.build-lock
flock 9
if [[ "${1:-}" != "--force" ]] && up_to_date; then
  exit 0  # another process built it while we waited for the lock
fi

rm -f "$stamp"
# Stale jars from an older neo4j.version would end up on the classpath next to the new ones.
rm -rf target/lib target/classes
# Quiet on success (Maven -q still emits colour codes); the whole log on failure.
# shellcheck disable=SC2086
if ! "${MVN:-mvn}" -B -q ${MVN_ARGS:-} package >target/build.log 2>&1; then
  cat target/build.log >&2
  echo "build.sh: Maven build failed (log: $PWD/target/build.log)" >&2
  exit 1
fi
echo "$want" >"$stamp"
