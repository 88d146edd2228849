// The committed openapi.json and src/generated/schema.ts are what the running gateway's schema generates:
// a change to the gateway's routes or models fails here until `npm run generate` is run.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";
import { gatewayUrl, readKey } from "./env.js";

const GENERATE = fileURLToPath(new URL("../../scripts/generate.mjs", import.meta.url)); // from dist/test/

async function liveSchema(): Promise<Record<string, unknown>> {
  const response = await fetch(`${gatewayUrl}/openapi.json`, { headers: { Authorization: `Bearer ${readKey}` } });
  assert.equal(response.status, 200);
  return (await response.json()) as Record<string, unknown>;
}

function check(schema: unknown): { status: number | null; stderr: string } {
  const file = join(mkdtempSync(join(tmpdir(), "engram-schema-")), "openapi.json");
  writeFileSync(file, JSON.stringify(schema));
  const done = spawnSync(process.execPath, [GENERATE, "--check", file], { encoding: "utf8" });
  return { status: done.status, stderr: done.stderr };
}

describe("the generated client", () => {
  it("is up to date with the gateway's schema", async () => {
    const { status, stderr } = check(await liveSchema());
    assert.equal(status, 0, stderr);
  });

  it("is stale once the schema changes", async () => {
    const schema = await liveSchema();
    const schemas = (schema.components as { schemas: Record<string, { properties: Record<string, unknown> }> }).schemas;
    schemas.Receipt.properties.queued_at = { type: "string", title: "Queued At" }; // a field added to a model
    const { status, stderr } = check(schema);
    assert.equal(status, 1);
    assert.match(stderr, /stale: openapi\.json, src\/generated\/schema\.ts .*npm run generate/);
  });
});
