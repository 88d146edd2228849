// @engram/client: the Engram gateway from TypeScript. `EngramClient` (hand-written, ./client.ts) over the
// generated types (./generated/schema.ts); errors are typed (./errors.ts).
export * from "./client.js";
export * from "./errors.js";
export type { components, operations, paths } from "./generated/schema.js";
