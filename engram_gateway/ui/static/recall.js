// The recall playground (POST /v1/users/{id}/recall: each item's kind, score and its parts, channels,
// path, source messages; the recall's timings) and the get_context block (POST .../context).

import { call, userPath } from "./api.js";
import { byId, el, replace, showError, utcInput, when } from "./dom.js";

const num = (x) => (typeof x === "number" ? x.toFixed(3) : "");

export class RecallTab {
  constructor(app) {
    this.app = app;
    byId("recall-go").addEventListener("click", () => this.recall());
    byId("context-go").addEventListener("click", () => this.context());
  }

  clear() {
    replace(byId("recall-body"));
    replace(byId("recall-timings"));
    byId("recall-meta").textContent = "";
    byId("context").textContent = "";
  }

  async recall() {
    showError(byId("recall-error"), null);
    try {
      const result = await call("POST", userPath(this.app.user, "recall"), {
        body: {
          query: byId("recall-query").value,
          k: Number(byId("recall-k").value),
          as_of: utcInput(byId("recall-asof")),
          since: utcInput(byId("recall-since")),
          until: utcInput(byId("recall-until")),
          graph_expansion: byId("recall-graph").checked,
        },
      });
      this.render(result);
    } catch (error) {
      showError(byId("recall-error"), error);
    }
  }

  render(result) {
    byId("recall-meta").textContent =
      `${result.items.length} item(s) · recall ${result.recall_id} · weights ${result.weights}` +
      (result.cached ? " · from the reader's cache" : "") +
      (result.as_of ? ` · as of ${when(result.as_of)}` : "");
    replace(
      byId("recall-timings"),
      Object.entries(result.timings_ms).map(([step, ms]) =>
        el("li", { "data-step": step }, el("span", {}, step), el("b", {}, `${ms.toFixed(1)} ms`)),
      ),
    );
    const canForget = this.app.can("write");
    const rows = result.items.map((item, rank) =>
      el(
        "tr",
        { "data-id": item.id, class: `item ${item.kind}` },
        el("td", {}, String(rank + 1)),
        el("td", { class: "kind" }, item.kind),
        el(
          "td",
          { class: "statement" },
          item.statement,
          item.speaker ? el("small", {}, ` — ${item.speaker}`) : "",
          item.kind === "fact" && !item.current ? el("small", { class: "note" }, " (not current)") : "",
        ),
        el("td", { class: "score", title: breakdown(item.breakdown) }, num(item.score)),
        el("td", { class: "channels" }, item.channels.map((c) => el("span", { class: "channel", "data-channel": c }, c))),
        el("td", {}, `${item.path}${item.hops > 0 ? ` · ${item.hops} hop(s)` : ""}`),
        el("td", {}, when(item.event_time)),
        el("td", { class: "sources" }, item.source_ids.map((id) => this.app.sourceChip(id))),
        el("td", { class: "actions" }, canForget && this.app.forgetButton(item.id, `the ${item.kind} “${item.statement}”`)),
      ),
    );
    replace(byId("recall-body"), rows.length ? rows : el("tr", {}, el("td", { colspan: 9 }, "Nothing found.")));
  }

  async context() {
    showError(byId("context-error"), null);
    try {
      const answer = await call("POST", userPath(this.app.user, "context"), {
        body: { query: byId("context-query").value, max_tokens: Number(byId("context-tokens").value) },
      });
      byId("context").textContent = answer.context || "(empty: nothing relevant is stored)";
    } catch (error) {
      showError(byId("context-error"), error);
    }
  }
}

function breakdown(parts) {
  return Object.entries(parts)
    .map(([name, value]) => `${name} ${num(value)}`)
    .join(", ");
}
