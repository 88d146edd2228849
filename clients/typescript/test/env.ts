// What the tests run against: a real `engram serve` with workers behind it. tests/test_typescript_client.py
// starts one on the embedded default (SQLite, rule-based extractor) and sets these; by hand, see README.md.
import { randomUUID } from "node:crypto";

function need(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: the tests need a running gateway (see clients/typescript/README.md)`);
  return value;
}

export const gatewayUrl = need("ENGRAM_URL");
/** A key with the read and write scopes in `namespace`. */
export const writeKey = need("ENGRAM_KEY");
/** A key with only the read scope in the same namespace. */
export const readKey = need("ENGRAM_READ_KEY");
export const namespace = need("ENGRAM_NAMESPACE");

/** A user id no other test uses. */
export function freshUser(): string {
  return `${namespace}.ts-${randomUUID().slice(0, 8)}`;
}
