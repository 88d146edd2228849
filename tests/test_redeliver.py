"""The redelivery sweep re-sends only messages stuck between stages past the threshold."""

from __future__ import annotations

import time

from engram_api import keys
from engram_workers.maintenance import redeliver_stuck


def test_only_old_stuck_messages_are_resent_once(redis_client, user_id):
    now = time.time()
    redis_client.hset(keys.status(user_id, "old:q"), mapping={"state": "queued", "enqueued_at": now - 120})
    redis_client.hset(keys.status(user_id, "old-x"), mapping={"state": "extracted", "extracted_at": now - 120})
    redis_client.hset(keys.status(user_id, "fresh"), mapping={"state": "queued", "enqueued_at": now - 5})
    redis_client.hset(keys.status(user_id, "done"), mapping={"state": "applied", "enqueued_at": now - 999})
    sent: list[tuple[str, tuple[str, ...]]] = []

    def send(task, args):
        sent.append((task, args))

    report = redeliver_stuck(client=redis_client, send=send, older_than_s=60, now=now)
    mine = sorted(s for s in sent if s[1][0] == user_id)
    assert mine == [
        (keys.APPLY_TASK, (user_id, "old-x")),
        (keys.EXTRACT_TASK, (user_id, "old:q")),  # message ids may contain ':'
    ]
    assert {f"{user_id}:old:q", f"{user_id}:old-x"} <= set(report.resent)

    sent.clear()
    redeliver_stuck(client=redis_client, send=send, older_than_s=60, now=now + 1)
    assert [s for s in sent if s[1][0] == user_id] == []  # re-stamped: not sent again at once
