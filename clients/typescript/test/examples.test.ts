// The README's example is examples/quickstart.ts, and it runs against the real gateway.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { it } from "node:test";

const PACKAGE = new URL("../../", import.meta.url); // from dist/test/

it("the README's example is examples/quickstart.ts and runs", () => {
  const source = readFileSync(new URL("examples/quickstart.ts", PACKAGE), "utf8");
  assert.ok(readFileSync(new URL("README.md", PACKAGE), "utf8").includes("```ts\n" + source + "```"));
  const compiled = fileURLToPath(new URL("dist/examples/quickstart.js", PACKAGE));
  const done = spawnSync(process.execPath, [compiled], { encoding: "utf8", env: process.env });
  assert.equal(done.status, 0, done.stderr);
  assert.match(done.stdout, /fact: .*Austin/);
  assert.match(done.stdout, /already queued as task [0-9a-f]+/);
  assert.match(done.stdout, /episodes: 1/);
});
