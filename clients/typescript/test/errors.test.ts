// The problem bodies the gateway sends for a busy or unreachable backend (429, 503) cannot be provoked
// cheaply against a healthy gateway; their mapping to classes is checked on bodies of the same shape
// (engram_gateway/problems.py), Retry-After included. The other kinds are provoked for real in gateway.test.ts.
import assert from "node:assert/strict";
import { it } from "node:test";
import {
  BackPressureError,
  EngramError,
  RateLimitedError,
  RetryLaterError,
  StoreUnavailableError,
  problemError,
} from "../src/index.js";

function answer(status: number, retryAfter?: string): Response {
  const headers: Record<string, string> = { "Content-Type": "application/problem+json" };
  if (retryAfter !== undefined) headers["Retry-After"] = retryAfter;
  return new Response(null, { status, headers });
}

const body = (status: number, kind: string) => ({
  type: `urn:engram:problem:${kind}`,
  title: kind,
  status,
  detail: `${kind} detail`,
});

it("429 and 503 become retry-later errors with the server's Retry-After", () => {
  const cases = [
    [429, "back-pressure", BackPressureError],
    [429, "rate-limited", RateLimitedError],
    [503, "store-unavailable", StoreUnavailableError],
  ] as const;
  for (const [status, kind, cls] of cases) {
    const err = problemError(answer(status, "7"), body(status, kind));
    assert.ok(err instanceof cls && err instanceof RetryLaterError, `${kind}: ${err.name}`);
    assert.equal(err.retryAfterS, 7);
    assert.equal(err.message, `${kind} detail`);
    assert.equal(err.status, status);
  }
});

it("an unknown problem type, or a body that is no problem, is a plain EngramError", () => {
  const unknown = problemError(answer(500), body(500, "internal"));
  assert.equal(unknown.constructor, EngramError);
  assert.equal(unknown.status, 500);
  const proxy = problemError(answer(502), "<html>Bad Gateway</html>");
  assert.equal(proxy.constructor, EngramError);
  assert.match(proxy.message, /^HTTP 502: <html>Bad Gateway<\/html>$/);
});
