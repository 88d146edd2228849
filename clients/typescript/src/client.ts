// A small hand-written face over the generated client (`api`, openapi-fetch typed by src/generated/schema.ts):
// one method per gateway call returning the body or throwing a typed error (./errors.ts), plus what the raw
// calls make awkward: enqueueing more than one request's worth, and waiting until messages are applied.
//
// Invariants: every method is one or more calls of `api` (nothing here knows a URL the schema does not);
// a non-2xx answer always becomes an `EngramError` subclass, never a value.
import createClient, { type Client } from "openapi-fetch";
import { MessageDeadError, WaitTimeoutError, problemError } from "./errors.js";
import type { components, paths } from "./generated/schema.js";

type Schemas = components["schemas"];
export type EnqueueRequest = Schemas["EnqueueRequest"];
export type Receipt = Schemas["Receipt"];
export type MessageStatus = Schemas["MessageStatus"];
export type RecallRequest = Schemas["RecallRequest"];
export type RecallResult = Schemas["RecallResult"];
export type RecallItem = Schemas["RecallItem"];
export type SearchResult = Schemas["SearchResult"];
export type FactRecord = Schemas["FactRecord"];
export type ForgetResult = Schemas["ForgetResult"];
export type UserStats = Schemas["UserStats"];

export interface EngramClientOptions {
  /** The gateway's root, e.g. http://127.0.0.1:8080 (`engram serve`). */
  baseUrl: string;
  /** A key from `engram keys new`; leave it out for a local gateway with no keys configured. */
  apiKey?: string;
  /** Another fetch (a test double is not needed: tests run against a real gateway). */
  fetch?: typeof globalThis.fetch;
}

export interface WaitOptions {
  /** Give up after this long (default 60 s): `WaitTimeoutError` names the messages still pending. */
  timeoutMs?: number;
  /** Pause between polls (default 100 ms). */
  intervalMs?: number;
}

type Result<T> = { data?: T; error?: unknown; response: Response };

function ok<T>(result: Result<T>): T {
  if (!result.response.ok || result.data === undefined) throw problemError(result.response, result.error);
  return result.data;
}

const POLL_CONCURRENCY = 16; // status reads in flight at once while waiting

export class EngramClient {
  /** The generated client: every route of the schema, typed. */
  readonly api: Client<paths>;

  constructor(options: EngramClientOptions) {
    const headers: Record<string, string> = {};
    if (options.apiKey) headers.Authorization = `Bearer ${options.apiKey}`;
    this.api = createClient<paths>({ baseUrl: options.baseUrl.replace(/\/+$/, ""), headers, fetch: options.fetch });
  }

  // ------------------------------------------------------------------------------------- write side
  /** Queue one message; returns at once. A known `message_id` throws `DuplicateMessageError`. */
  async enqueue(item: EnqueueRequest): Promise<Receipt> {
    return ok(await this.api.POST("/v1/messages", { body: item }));
  }

  /** Queue many messages, `batchSize` per request. Each request is all or nothing (validated before any of
   * it is queued); when one fails, the earlier ones stay queued and the error is thrown. Known ids come back
   * with `duplicate: true`, so sending the same items again (with message ids) is safe. */
  async enqueueMany(items: EnqueueRequest[], { batchSize = 500 }: { batchSize?: number } = {}): Promise<Receipt[]> {
    if (!Number.isInteger(batchSize) || batchSize < 1) throw new RangeError(`batchSize must be >= 1: ${batchSize}`);
    const receipts: Receipt[] = [];
    for (let start = 0; start < items.length; start += batchSize) {
      const body = { items: items.slice(start, start + batchSize) };
      receipts.push(...ok(await this.api.POST("/v1/messages/batch", { body })).receipts);
    }
    return receipts;
  }

  async status(userId: string, messageId: string): Promise<MessageStatus> {
    const path = { user_id: userId, message_id: messageId };
    return ok(await this.api.GET("/v1/users/{user_id}/messages/{message_id}", { params: { path } }));
  }

  /** Resolve when every message is applied; `MessageDeadError` if any was dead-lettered, `WaitTimeoutError`
   * past the timeout. Only demos and tests wait: a chat backend enqueues and moves on. */
  async waitApplied(receipts: Receipt[], { timeoutMs = 60_000, intervalMs = 100 }: WaitOptions = {}): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let pending = receipts;
    const dead: string[] = [];
    while (pending.length) {
      const still: Receipt[] = [];
      for (let i = 0; i < pending.length; i += POLL_CONCURRENCY) {
        const group = pending.slice(i, i + POLL_CONCURRENCY);
        const states = await Promise.all(group.map((r) => this.status(r.user_id, r.message_id)));
        states.forEach((s, j) => {
          if (s.state === "dead") dead.push(s.message_id);
          else if (s.state !== "applied") still.push(group[j]);
        });
      }
      pending = still;
      if (!pending.length) break;
      if (Date.now() >= deadline) throw new WaitTimeoutError(pending.map((r) => r.message_id));
      await new Promise((resolve) => setTimeout(resolve, intervalMs));
    }
    if (dead.length) throw new MessageDeadError(dead);
  }

  async feedback(userId: string, recallId: string, usefulIds: string[]): Promise<number> {
    const body = { recall_id: recallId, useful_ids: usefulIds };
    return ok(await this.api.POST("/v1/users/{user_id}/feedback", { params: { path: { user_id: userId } }, body }))
      .rows;
  }

  /** Forget a message, a fact or an excerpt (a recall item's `id`). */
  async forget(userId: string, memoryId: string): Promise<ForgetResult> {
    const path = { user_id: userId, memory_id: memoryId };
    return ok(await this.api.DELETE("/v1/users/{user_id}/memories/{memory_id}", { params: { path } }));
  }

  /** Forget everything of one user. */
  async forgetUser(userId: string): Promise<ForgetResult> {
    return ok(await this.api.DELETE("/v1/users/{user_id}", { params: { path: { user_id: userId } } }));
  }

  // -------------------------------------------------------------------------------------- read side
  async recall(userId: string, query: string, options: Omit<RecallRequest, "query"> = {}): Promise<RecallResult> {
    const body = { ...options, query };
    return ok(await this.api.POST("/v1/users/{user_id}/recall", { params: { path: { user_id: userId } }, body }));
  }

  async search(userId: string, query: string, k = 10): Promise<SearchResult> {
    const body = { query, k };
    return ok(await this.api.POST("/v1/users/{user_id}/search", { params: { path: { user_id: userId } }, body }));
  }

  /** The memory block to put into a prompt (`get_context`), at most `maxTokens` long. */
  async context(userId: string, query: string, maxTokens = 800): Promise<string> {
    const body = { query, max_tokens: maxTokens };
    const path = { user_id: userId };
    return ok(await this.api.POST("/v1/users/{user_id}/context", { params: { path }, body })).context;
  }

  /** A subject's facts, superseded ones included (`subject` "user" is the user themself). */
  async history(
    userId: string,
    { subject = "user", predicate, limit }: { subject?: string; predicate?: string; limit?: number } = {},
  ): Promise<FactRecord[]> {
    const params = { path: { user_id: userId }, query: { subject, predicate, limit } };
    return ok(await this.api.GET("/v1/users/{user_id}/history", { params }));
  }

  async stats(userId: string): Promise<UserStats> {
    return ok(await this.api.GET("/v1/users/{user_id}/stats", { params: { path: { user_id: userId } } }));
  }
}
