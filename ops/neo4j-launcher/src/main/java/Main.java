import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicReference;

import org.neo4j.configuration.Config;
import org.neo4j.configuration.GraphDatabaseInternalSettings;
import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.GraphDatabaseService;
import org.neo4j.graphdb.config.Setting;

/**
 * Starts an embedded Neo4j Community DBMS (5.26 LTS) with a Bolt listener and auth disabled,
 * for tests that talk to it with a Bolt driver (e.g. the Python "neo4j" package).
 *
 * Usage: ./run.sh <dataDir> [port]   (or java [flags] -cp 'target/classes:target/lib/*' Main ...)
 *
 *   dataDir   Neo4j "home" for this instance; store files go to <dataDir>/data,
 *             the debug log to <dataDir>/logs/debug.log. Created if missing.
 *   port      Bolt port; default $NEO4J_BOLT_PORT, else 7687. 0 = pick a free port.
 *
 * Environment (all optional):
 *   NEO4J_BOLT_HOST           listen host (default 127.0.0.1)
 *   NEO4J_BOLT_PORT           port if not given as an argument
 *   NEO4J_PAGECACHE_MB        page cache size in MiB (default 128)
 *   NEO4J_RAW_CONF            extra neo4j.conf-style settings, ';'-separated k=v pairs,
 *                             e.g. "db.transaction.timeout=60s;server.logs.debug.enabled=false"
 *                             (unknown keys make startup fail: strict validation is on by default)
 *   NEO4J_EXIT_ON_STDIN_EOF   if "1", shut down when stdin reaches EOF (parent process died)
 *
 * Prints exactly one line "READY bolt://host:port" on stdout once Bolt accepts connections
 * and a Cypher query has run; everything else goes to stderr. SIGTERM/SIGINT shut the DBMS
 * down cleanly (shutdown hook; the JVM then reports 143/130), stdin EOF does the same and
 * exits 0, a failed startup exits 1.
 */
public final class Main {

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: Main <dataDir> [port]");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        Files.createDirectories(home);

        String host = env("NEO4J_BOLT_HOST", "127.0.0.1");
        int port = Integer.parseInt(args.length > 1 ? args[1] : env("NEO4J_BOLT_PORT", "7687"));
        if (port == 0) {
            port = freePort(host); // small race window; fine for tests
        }
        long pageCacheBytes = Long.parseLong(env("NEO4J_PAGECACHE_MB", "128")) * 1024L * 1024L;

        DatabaseManagementServiceBuilder builder = new DatabaseManagementServiceBuilder(home)
                // Bolt: off by default in embedded mode, so switch it on explicitly.
                .setConfig(BoltConnector.enabled, true)
                .setConfig(BoltConnector.listen_address, new SocketAddress(host, port))
                .setConfig(BoltConnector.encryption_level, BoltConnector.EncryptionLevel.DISABLED)
                // No auth: driver can use auth=None (or any basic token, it is ignored).
                .setConfig(GraphDatabaseSettings.auth_enabled, false)
                // Small footprint for CI boxes.
                .setConfig(GraphDatabaseSettings.pagecache_memory, pageCacheBytes)
                // Otherwise each tx log file is preallocated at 256 MiB (x2: neo4j + system db).
                .setConfig(GraphDatabaseSettings.preallocate_logical_logs, false)
                // No phoning home from CI boxes and test runs.
                .setConfig(GraphDatabaseSettings.udc_enabled, false)
                // Netty's default 5 s quiet period, paid twice, made every stop take ~10 s;
                // tests restart the server, so shutdown must be quick.
                .setConfig(GraphDatabaseInternalSettings.netty_server_shutdown_quiet_period, 0)
                .setConfig(GraphDatabaseInternalSettings.netty_server_shutdown_timeout, Duration.ofSeconds(5));

        Map<String, String> raw = parseRaw(System.getenv("NEO4J_RAW_CONF"));
        if (!raw.isEmpty()) {
            // 5.26's builder has no raw-string setter: let Config parse and strictly validate
            // the strings, then hand the typed values to the builder one setting at a time.
            Config parsed = Config.newBuilder().setRaw(raw).build();
            for (String key : raw.keySet()) {
                Setting<Object> setting = parsed.getSetting(key);
                builder.setConfig(setting, parsed.get(setting));
            }
        }

        // Registered before build() so SIGTERM or a dead parent during startup still stops
        // whatever part of the DBMS exists; the hook sees null until build() returns.
        AtomicReference<DatabaseManagementService> dbmsRef = new AtomicReference<>();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            DatabaseManagementService dbms = dbmsRef.get();
            if (dbms != null) {
                System.err.println("Shutting down Neo4j ...");
                try {
                    dbms.shutdown();
                } catch (Throwable t) {
                    System.err.println("shutdown error: " + t);
                }
                System.err.println("STOPPED");
            }
        }, "neo4j-shutdown"));

        // Watch stdin from the very start: a parent that dies while we are still starting
        // (a killed test run) must not leave an orphaned JVM holding ports and memory.
        if ("1".equals(System.getenv("NEO4J_EXIT_ON_STDIN_EOF"))) {
            Thread watcher = new Thread(() -> {
                try {
                    InputStream in = System.in;
                    byte[] buf = new byte[256];
                    while (in.read(buf) >= 0) {
                        // discard: only EOF matters
                    }
                } catch (IOException ignored) {
                    // a broken stdin means the parent is gone, same as EOF
                }
                System.err.println("stdin closed: parent gone, exiting");
                System.exit(0); // runs the shutdown hook
            }, "stdin-eof-watcher");
            watcher.setDaemon(true);
            watcher.start();
        }

        try {
            dbmsRef.set(builder.build());
        } catch (Throwable t) {
            System.err.println("FAILED to start Neo4j: " + t);
            t.printStackTrace();
            System.exit(1);
            return;
        }

        try {
            GraphDatabaseService db = dbmsRef.get().database("neo4j");
            // Runs (and compiles) a first query so the first test does not pay for it.
            db.executeTransactionally("RETURN 1");
            waitForPort(host, port, 60_000);
        } catch (Throwable t) {
            System.err.println("FAILED readiness check: " + t);
            t.printStackTrace();
            System.exit(1); // shutdown hook stops the DBMS
            return;
        }

        System.out.println("READY bolt://" + host + ":" + port);
        System.out.flush();

        new CountDownLatch(1).await(); // park main thread; JVM exits via signal/System.exit
    }

    private static String env(String name, String dflt) {
        String v = System.getenv(name);
        return (v == null || v.isBlank()) ? dflt : v.trim();
    }

    private static Map<String, String> parseRaw(String spec) {
        Map<String, String> out = new LinkedHashMap<>();
        if (spec == null || spec.isBlank()) {
            return out;
        }
        for (String part : spec.split(";")) {
            String p = part.trim();
            if (p.isEmpty()) {
                continue;
            }
            int eq = p.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("bad NEO4J_RAW_CONF entry: " + p);
            }
            out.put(p.substring(0, eq).trim(), p.substring(eq + 1).trim());
        }
        return out;
    }

    private static int freePort(String host) throws IOException {
        try (ServerSocket s = new ServerSocket()) {
            s.setReuseAddress(true);
            s.bind(new InetSocketAddress(host, 0));
            return s.getLocalPort();
        }
    }

    private static void waitForPort(String host, int port, long timeoutMillis) throws Exception {
        long deadline = System.currentTimeMillis() + timeoutMillis;
        IOException last = null;
        while (System.currentTimeMillis() < deadline) {
            try (Socket s = new Socket()) {
                s.connect(new InetSocketAddress(host, port), 1000);
                return;
            } catch (IOException e) {
                last = e;
                Thread.sleep(100);
            }
        }
        throw new IllegalStateException("Bolt port " + host + ":" + port + " not listening", last);
    }
}
