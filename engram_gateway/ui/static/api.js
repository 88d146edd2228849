// The gateway's /v1 API, called with this tab's key.
//
// The key is kept in sessionStorage (this tab only; gone when the tab closes) and sent as
// "Authorization: Bearer <key>"; it never goes into a URL, so it is in no history, log or Referer.
// Paths are relative to the page, so a gateway behind a path prefix works unchanged.

const KEY = "engram.explorer.key";

export const storedKey = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (value) => (value ? sessionStorage.setItem(KEY, value) : sessionStorage.removeItem(KEY)),
};

/** An answer that was not 2xx: the gateway's problem body (status, title, detail, field). */
export class ApiError extends Error {
  constructor(status, problem) {
    const detail = problem && problem.detail ? problem.detail : "";
    super(`${status} ${(problem && problem.title) || "Error"}${detail ? ": " + detail : ""}`);
    this.status = status;
    this.problem = problem;
  }
}

/** `path` is the part after "/v1/", its pieces already encoded (see `userPath`). */
export async function call(method, path, { query, body } = {}) {
  const url = new URL(`v1/${path}`, document.baseURI);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, String(value));
  }
  const headers = { Accept: "application/json" };
  const key = storedKey.get();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
  });
  const text = await response.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = { title: "Not JSON", detail: text.slice(0, 200) };
  }
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

export const userPath = (userId, rest = "") =>
  `users/${encodeURIComponent(userId)}${rest ? "/" + rest : ""}`;
