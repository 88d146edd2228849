"""Fault injection for tests: middleware loaded by workers through ENGRAM_MIDDLEWARE, and a TCP link to a
service that a test can cut (the service goes down for whoever reaches it through the link)."""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

from engram_api.models import ApplyOutcome, DeadLetter, StageResult
from engram_api.settings import load_settings
from engram_workers.middleware import Middleware


class CrashAfterWriteOnce(Middleware):
    """Kill the worker process right after the graph commit of a message whose id starts with
    ``crash-after-write``, once per message (a marker file remembers it across the restart)."""

    def after_write(self, user_id: str, message_id: str, outcome: ApplyOutcome) -> None:
        if not message_id.startswith("crash-after-write"):
            return
        marker = Path(load_settings().data_dir) / "faults" / f"crashed-{message_id}"
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        os._exit(1)  # no cleanup, no ack: exactly what a crash looks like


class KillMidBatch(Middleware):
    """SIGKILL the worker process right after the 2nd committed member write of one apply run (two members
    committed, their index, stamp and statuses not yet finished; on Neo4j, whose batch is one transaction,
    that is after the batch's commit), once per data dir.

    Commits are counted since the last ``after_stage``: a batch runs each member's ``before_stage`` before
    its write, ``after_write`` once the write is committed, and every ``after_stage`` only once the whole
    batch is finished."""

    def __init__(self) -> None:
        self.commits = 0

    def after_stage(self, stage: str, user_id: str, message_id: str, outcome: StageResult, seconds: float) -> None:
        self.commits = 0

    def after_write(self, user_id: str, message_id: str, outcome: ApplyOutcome) -> None:
        self.commits += 1
        if self.commits >= 2:
            _kill_mid_batch_once(message_id)


class KillInsideBatch(Middleware):
    """SIGKILL the worker process at the 3rd ``before_stage`` of one apply run, once per data dir: members
    are written and, on Neo4j (one transaction per batch), not committed yet."""

    def __init__(self) -> None:
        self.starts = 0

    def after_stage(self, stage: str, user_id: str, message_id: str, outcome: StageResult, seconds: float) -> None:
        self.starts = 0

    def before_stage(self, stage: str, user_id: str, message_id: str) -> None:
        if stage != "apply":
            return
        self.starts += 1
        if self.starts >= 3:
            _kill_mid_batch_once(message_id)


def _kill_mid_batch_once(message_id: str) -> None:
    """SIGKILL this process, the first time only for this data dir (the marker the test checks)."""
    marker = Path(load_settings().data_dir) / "faults" / "killed-mid-batch"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(message_id)
    os.kill(os.getpid(), signal.SIGKILL)


class CrashAlways(Middleware):
    """A poison message: every attempt to process ``poison-*`` kills the worker process."""

    def before_stage(self, stage: str, user_id: str, message_id: str) -> None:
        if message_id.startswith("poison-") and stage == "apply":
            os._exit(1)


class RaisingHook(Middleware):
    """A hook that raises, chosen by the message id: ``hook-<before|after>-<extract|apply>-<once|always>-...``.

    ``once`` raises on the first call only (a marker file remembers it across processes and retries); an id
    containing ``-notify-`` also makes ``on_dead_letter`` raise."""

    def _maybe_raise(self, hook: str, stage: str, message_id: str) -> None:
        parts = message_id.split("-")
        if parts[0] != "hook" or parts[1:3] != [hook, stage]:
            return
        if parts[3] == "once":
            marker = Path(load_settings().data_dir) / "faults" / f"raised-{message_id}"
            if marker.exists():
                return
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        raise RuntimeError(f"injected {hook}_stage failure ({stage})")

    def before_stage(self, stage: str, user_id: str, message_id: str) -> None:
        self._maybe_raise("before", stage, message_id)

    def after_stage(self, stage: str, user_id: str, message_id: str, outcome: StageResult, seconds: float) -> None:
        self._maybe_raise("after", stage, message_id)

    def on_dead_letter(self, letter: DeadLetter) -> None:
        if "-notify-" in letter.message_id:
            raise RuntimeError("injected on_dead_letter failure")


class CuttableLink:
    """A TCP forwarder on a loopback port of its own to ``host:port``. ``cut()`` closes every connection
    and stops listening: from then on a client reaching the service through ``port`` is refused, exactly
    as if the service were down, while the service itself stays up for everyone else (the session's Neo4j)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._cut = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="cuttable-link", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # cut
            with self._lock:
                if self._cut:  # accepted as the cut happened: refused like every later one
                    client.close()
                    return
                upstream = socket.create_connection(self._target)
                self._open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass  # the other side closed, or the link was cut
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        with self._lock:
            self._cut = True
        # shutdown, not only close: close leaves an accept blocked in another thread listening (Linux).
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
