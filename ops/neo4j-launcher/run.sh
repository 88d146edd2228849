#!/usr/bin/env sh
# Usage: ./run.sh <dataDir> [port]     Builds first if needed (build.sh), then execs the JVM, so
# the caller's child PID is the JVM itself and signals reach it directly.
# Env: NEO4J_HEAP (max heap, default 1g), NEO4J_PAGECACHE_MB (default 128), NEO4J_EXIT_ON_STDIN_EOF=1
# (exit when the parent closes stdin / dies), plus the others documented in Main.java.
# JVM flags mirror the --add-opens set in Neo4j 5's shipped neo4j.conf
# (server.jvm.additional=...); java.nio is required (UnsafeUtil links DirectByteBuffer,
# vector-index population relies on it), java.lang is harmless extra for older paths.
set -e
cd "$(dirname "$0")"
# Build output goes to stderr: stdout carries only the READY line that callers wait for.
./build.sh >&2
exec java \
  -Xms128m -Xmx"${NEO4J_HEAP:-1g}" \
  -XX:+UseG1GC -XX:-OmitStackTraceInFastThrow \
  -XX:+UnlockExperimentalVMOptions -XX:+TrustFinalNonStaticFields \
  -Djdk.nio.maxCachedBufferSize=1024 \
  -Dio.netty.tryReflectionSetAccessible=true \
  -Dlog4j2.disable.jmx=true \
  --add-opens=java.base/java.nio=ALL-UNNAMED \
  --add-opens=java.base/java.io=ALL-UNNAMED \
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED \
  --add-opens=java.base/java.lang=ALL-UNNAMED \
  --enable-native-access=ALL-UNNAMED \
  -cp 'target/classes:target/lib/*' Main "$@"
