// Typed errors: every non-2xx answer of the gateway is an RFC 9457 problem body (application/problem+json,
// engram_gateway/problems.py); `problemError` turns one into the class its `type` names, so callers catch
// `DuplicateMessageError` or `InvalidInputError` instead of comparing status codes. Invariant: a request
// that raised any of these changed nothing on the server (the gateway checks everything before writing).
import type { components } from "./generated/schema.js";

export type Problem = components["schemas"]["Problem"];
type Receipt = components["schemas"]["Receipt"];

/** Base of every error the client raises on purpose. `status` is the HTTP status, 0 for client-side ones. */
export class EngramError extends Error {
  readonly status: number;
  readonly problem: Problem | undefined;

  constructor(message: string, status: number, problem?: Problem) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.problem = problem;
  }

  /** The input that was wrong (`items[3].messages`, `user_id`), when the gateway named one. */
  get field(): string | undefined {
    return this.problem?.field ?? undefined;
  }
}

/** 400: a wrong type, an unknown field or a bad value; `field` names it. */
export class InvalidInputError extends EngramError {}
/** 401: no key, or a key the gateway does not know. */
export class UnauthorizedError extends EngramError {}
/** 403: the key lacks the scope, or the user id is outside the key's namespace. */
export class ForbiddenError extends EngramError {}
/** 404: no such memory, message or dead letter for this user. */
export class NotFoundError extends EngramError {}
/** 413: the body is over the gateway's ENGRAM_GATEWAY_MAX_BODY_BYTES. */
export class PayloadTooLargeError extends EngramError {}

/** 409: the message id is already known for this user; `receipt` is the first enqueue's. */
export class DuplicateMessageError extends EngramError {
  get receipt(): Receipt | undefined {
    return this.problem?.receipt ?? undefined;
  }
}

/** Try again later: `retryAfterS` is the gateway's Retry-After. */
export class RetryLaterError extends EngramError {
  readonly retryAfterS: number | undefined;

  constructor(message: string, status: number, problem: Problem | undefined, retryAfterS: number | undefined) {
    super(message, status, problem);
    this.retryAfterS = retryAfterS;
  }
}
/** 429: the extract queue is too long (ENGRAM_GATEWAY_MAX_QUEUE_DEPTH); nothing was enqueued. */
export class BackPressureError extends RetryLaterError {}
/** 429: this key is over its request rate. */
export class RateLimitedError extends RetryLaterError {}
/** 503: Redis or the graph store cannot be reached. */
export class StoreUnavailableError extends RetryLaterError {}

/** Client side: `waitApplied` ran out of time; `pending` are the message ids not finished. */
export class WaitTimeoutError extends EngramError {
  readonly pending: string[];

  constructor(pending: string[]) {
    super(`${pending.length} message(s) not applied in time: ${pending.join(", ")}`, 0);
    this.pending = pending;
  }
}

/** Client side: `waitApplied` found dead-lettered messages (the operator's `engram dlq` shows why). */
export class MessageDeadError extends EngramError {
  readonly dead: string[];

  constructor(dead: string[]) {
    super(`message(s) dead-lettered: ${dead.join(", ")}`, 0);
    this.dead = dead;
  }
}

type Plain = new (message: string, status: number, problem?: Problem) => EngramError;
type Retry = new (message: string, status: number, problem: Problem | undefined, retry: number | undefined) => EngramError;

// The problem types engram_gateway/problems.py sends (urn:engram:problem:<kind>).
const PLAIN: Record<string, Plain> = {
  "invalid-input": InvalidInputError,
  "unknown-field": InvalidInputError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  "not-found": NotFoundError,
  duplicate: DuplicateMessageError,
  "too-large": PayloadTooLargeError,
};
const RETRY: Record<string, Retry> = {
  "back-pressure": BackPressureError,
  "rate-limited": RateLimitedError,
  "store-unavailable": StoreUnavailableError,
};

function isProblem(body: unknown): body is Problem {
  const b = body as Record<string, unknown> | null;
  return typeof b === "object" && b !== null && typeof b.type === "string" && typeof b.status === "number";
}

/** The typed error for a failed response and its parsed body (anything, if it was not a problem body). */
export function problemError(response: Response, body: unknown): EngramError {
  if (!isProblem(body)) {
    const text = typeof body === "string" ? body : JSON.stringify(body);
    return new EngramError(`HTTP ${response.status}: ${text ?? ""}`.trim(), response.status);
  }
  const kind = body.type.replace(/^urn:engram:problem:/, "");
  const header = response.headers.get("Retry-After");
  const retryAfter = header === null || Number.isNaN(Number(header)) ? undefined : Number(header);
  const retry = RETRY[kind];
  if (retry) return new retry(body.detail, response.status, body, retryAfter);
  return new (PLAIN[kind] ?? EngramError)(body.detail, response.status, body);
}
