import { DuplicateMessageError, EngramClient } from "@engram/client";

const engram = new EngramClient({ baseUrl: process.env.ENGRAM_URL!, apiKey: process.env.ENGRAM_KEY });
const alice = `${process.env.ENGRAM_NAMESPACE}.alice-${Date.now()}`; // '<namespace>.<user>' of the key's namespace
const receipt = await engram.enqueue({ user_id: alice, messages: "I just moved to Austin", message_id: "t1" });
await engram.waitApplied([receipt], { timeoutMs: 240_000 }); // only demos and tests wait
const { items } = await engram.recall(alice, "where does the user live?", { k: 5 });
console.log(items.map((item) => `${item.kind}: ${item.statement}`));
console.log(await engram.context(alice, "where does the user live?", 300)); // for the prompt
try {
  await engram.enqueue({ user_id: alice, messages: "again", message_id: "t1" });
} catch (err) {
  if (!(err instanceof DuplicateMessageError)) throw err;
  console.log("already queued as task", err.receipt?.task_id);
}
console.log(await engram.forget(alice, "t1")); // a message, a fact or an excerpt id
