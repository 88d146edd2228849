// The client against a real gateway and real workers: enqueue, wait, recall, context, forget, and every
// error typed from its problem body.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  DuplicateMessageError,
  EngramClient,
  ForbiddenError,
  InvalidInputError,
  NotFoundError,
  PayloadTooLargeError,
  UnauthorizedError,
  WaitTimeoutError,
} from "../src/index.js";
import { freshUser, gatewayUrl, namespace, readKey, writeKey } from "./env.js";

const client = new EngramClient({ baseUrl: gatewayUrl, apiKey: writeKey });
const reader = new EngramClient({ baseUrl: gatewayUrl, apiKey: readKey });
const WAIT = { timeoutMs: 240_000 }; // a hang guard for cold workers on a loaded machine, not a timing bound

const mentions = (items: { statement: string }[], word: string) => items.some((i) => i.statement.includes(word));

describe("enqueue, wait, recall, forget", () => {
  it("recalls what was enqueued once it is applied, and forgets it", async () => {
    const user = freshUser();
    const receipt = await client.enqueue({ user_id: user, messages: "I live in Austin", message_id: "m1" });
    assert.equal(receipt.message_id, "m1");
    assert.equal(receipt.duplicate, false);
    await client.waitApplied([receipt], WAIT);
    assert.equal((await client.status(user, "m1")).state, "applied");

    const found = await reader.recall(user, "where does the user live?", { k: 5 });
    assert.ok(mentions(found.items, "Austin"), JSON.stringify(found.items));
    const fact = found.items.find((i) => i.kind === "fact" && i.statement.includes("Austin"));
    assert.ok(fact, "the rule extractor makes a fact of 'I live in Austin'");
    assert.match(await reader.context(user, "where does the user live?", 300), /Austin/);
    const history = await reader.history(user, { predicate: "LIVES_IN" });
    assert.deepEqual(
      history.map((f) => f.object_name),
      ["Austin"],
    );

    const forgotten = await client.forget(user, "m1"); // the message: its excerpt and the facts only it stated
    assert.equal(forgotten.episodes, 1);
    assert.ok(forgotten.removed_fact_ids?.includes(fact.id), JSON.stringify(forgotten));
    const after = await reader.recall(user, "where does the user live?", { k: 5 });
    assert.ok(!mentions(after.items, "Austin"), JSON.stringify(after.items));
    await assert.rejects(client.forget(user, "m1"), NotFoundError);
  });

  it("enqueues many in several requests, waits for all, and forgets the user", async () => {
    const user = freshUser();
    const items = ["I work at Dell", "My sister Maya lives in Denver", "I love climbing"].map((text, i) => ({
      user_id: user,
      messages: [{ role: "user" as const, content: text }],
      message_id: `b${i}`,
    }));
    const receipts = await client.enqueueMany(items, { batchSize: 2 });
    assert.deepEqual(
      receipts.map((r) => [r.message_id, r.duplicate]),
      [
        ["b0", false],
        ["b1", false],
        ["b2", false],
      ],
    );
    await client.waitApplied(receipts, WAIT);
    const again = await client.enqueueMany(items.slice(0, 2)); // known ids: nothing new is queued
    assert.deepEqual(
      again.map((r) => r.duplicate),
      [true, true],
    );
    assert.ok(mentions((await reader.recall(user, "where does the user work?")).items, "Dell"));

    const erased = await client.forgetUser(user);
    assert.equal(erased.episodes, 3);
    assert.equal((await reader.stats(user)).facts, 0);
    assert.deepEqual((await reader.recall(user, "where does the user work?")).items, []);
  });
});

describe("errors are typed from the problem bodies", () => {
  it("a duplicate message id carries the first receipt", async () => {
    const user = freshUser();
    const first = await client.enqueue({ user_id: user, messages: "I like tea", message_id: "dup" });
    const err = await client.enqueue({ user_id: user, messages: "I like tea", message_id: "dup" }).catch((e) => e);
    assert.ok(err instanceof DuplicateMessageError, String(err));
    assert.equal(err.status, 409);
    assert.deepEqual([err.receipt?.message_id, err.receipt?.task_id], [first.message_id, first.task_id]);
    await client.waitApplied([first], WAIT);
  });

  it("bad input names the field, and nothing is queued", async () => {
    const user = freshUser();
    const bad = [
      { user_id: user, messages: "fine", message_id: "ok" },
      { user_id: user, messages: [{ role: "wizard", content: "x" }], message_id: "bad" },
    ];
    // @ts-expect-error: a role the schema does not allow, sent anyway (as untyped callers would)
    const err = await client.enqueueMany(bad).catch((e) => e);
    assert.ok(err instanceof InvalidInputError, String(err));
    assert.equal(err.status, 400);
    assert.match(err.field ?? "", /^items\[1\]\.messages/);
    await assert.rejects(client.status(user, "ok"), NotFoundError); // the valid first item was not queued
    await assert.rejects(client.recall(user, "x", { k: "ten" as unknown as number }), (e: unknown) => {
      return e instanceof InvalidInputError && e.field === "k";
    });
  });

  it("a body over the gateway's limit is refused before it is read", async () => {
    const user = freshUser();
    const huge = "x".repeat(5 * 1024 * 1024); // the default limit is 4 MiB
    const err = await client.enqueue({ user_id: user, messages: huge }).catch((e) => e);
    assert.ok(err instanceof PayloadTooLargeError, String(err));
    assert.equal(err.status, 413);
  });

  it("keys: none, read-only, another namespace", async () => {
    const user = freshUser();
    const anonymous = new EngramClient({ baseUrl: gatewayUrl });
    await assert.rejects(anonymous.recall(user, "anything"), UnauthorizedError);
    const wrongKey = new EngramClient({ baseUrl: gatewayUrl, apiKey: "not-a-key" });
    await assert.rejects(wrongKey.stats(user), UnauthorizedError);
    await assert.rejects(reader.enqueue({ user_id: user, messages: "hello" }), ForbiddenError);
    await assert.rejects(reader.forgetUser(user), ForbiddenError);
    const other = `${namespace}x.someone`;
    await assert.rejects(client.recall(other, "anything"), ForbiddenError);
  });

  it("waiting past the timeout names the pending message", async () => {
    const user = freshUser();
    const never = { user_id: user, message_id: "never-enqueued", task_id: "none", duplicate: false };
    // an id that was never enqueued has no status: NotFoundError, not a silent wait
    await assert.rejects(client.waitApplied([never], { timeoutMs: 0 }), NotFoundError);
    const receipt = await client.enqueue({ user_id: user, messages: "I live in Oslo", message_id: "slow" });
    const err = await client.waitApplied([receipt], { timeoutMs: 0 }).catch((e) => e);
    // Either the wait gave up naming the message, or the workers were quicker than one status read.
    if (err === undefined) assert.equal((await client.status(user, "slow")).state, "applied");
    else {
      assert.ok(err instanceof WaitTimeoutError, String(err));
      assert.deepEqual(err.pending, ["slow"]);
    }
    await client.waitApplied([receipt], WAIT);
  });
});
