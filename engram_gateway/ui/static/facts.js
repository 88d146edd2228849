// The facts tab: every fact of the user (superseded and archived ones too), an as-of control that marks
// what held at an instant, and one fact's history timeline (its subject and predicate, oldest first).
//
// "Held at t" is the rule of engram_api/storage/graph/validity.py: not archived, valid_from <= t, and
// valid_until absent or later than t. Only the marking uses it; every record shown is the store's.

import { call, userPath } from "./api.js";
import { byId, el, replace, setUtcInput, showError, utcInput, when } from "./dom.js";

const PAGE_SIZE = 500;
const MAX_PAGES = 4; // the page shows at most 2,000 facts; the stats line says how many there are

export function heldAt(fact, ms) {
  if (fact.archived) return false;
  if (Date.parse(fact.valid_from) > ms) return false;
  return !fact.valid_until || Date.parse(fact.valid_until) > ms;
}

function status(fact) {
  if (fact.archived) return "archived";
  if (fact.superseded_by) return "superseded";
  if (fact.valid_until && Date.parse(fact.valid_until) <= Date.now()) return "ended";
  if (Date.parse(fact.valid_from) > Date.now()) return "future";
  return "current";
}

export class FactsTab {
  constructor(app) {
    this.app = app;
    this.facts = [];
    this.entities = [];
    byId("asof").addEventListener("change", () => {
      byId("asof-range").value = String(this.asOf());
      this.mark();
    });
    byId("asof-range").addEventListener("input", () => this.fromRange());
    byId("asof-now").addEventListener("click", () => {
      byId("asof").value = "";
      this.mark();
    });
    byId("only-held").addEventListener("change", () => this.mark());
  }

  async load(userId) {
    const [stats, ...pages] = await Promise.all([
      call("GET", userPath(userId, "stats")),
      call("GET", userPath(userId, "graph"), { query: { page: 1, page_size: PAGE_SIZE } }),
    ]);
    let facts = pages[0].facts;
    const entities = new Map(pages[0].entities.map((e) => [e.id, e]));
    const total = pages[0].total_facts;
    for (let page = 2; page <= MAX_PAGES && facts.length < total; page += 1) {
      const more = await call("GET", userPath(userId, "graph"), { query: { page, page_size: PAGE_SIZE } });
      facts = facts.concat(more.facts);
      more.entities.forEach((e) => entities.set(e.id, e));
    }
    this.facts = facts;
    this.entities = [...entities.values()];
    byId("stats").textContent =
      `${stats.facts} facts (${stats.current_facts} current, ${stats.superseded_facts} superseded, ` +
      `${stats.archived_facts} archived), ${stats.entities} entities, ${stats.episodes} messages, ` +
      `version ${stats.version}` + (facts.length < total ? ` — showing the first ${facts.length}` : "");
    this.setRange();
    this.render();
    replace(byId("timeline"));
  }

  setRange() {
    const starts = this.facts.map((f) => Date.parse(f.valid_from)).filter((t) => !Number.isNaN(t));
    const range = byId("asof-range");
    range.min = String(starts.length ? Math.min(...starts) : Date.now() - 86400000);
    range.max = String(Date.now());
    range.step = String(Math.max(1000, Math.round((Number(range.max) - Number(range.min)) / 1000)));
    range.value = range.max;
  }

  fromRange() {
    setUtcInput(byId("asof"), Number(byId("asof-range").value));
    this.mark();
  }

  asOf() {
    try {
      showError(byId("facts-error"), null);
      const iso = utcInput(byId("asof"));
      return iso ? Date.parse(iso) : Date.now();
    } catch (error) {
      showError(byId("facts-error"), error);
      return Date.now();
    }
  }

  render() {
    const canForget = this.app.can("write");
    const rows = this.facts.map((fact) =>
      el(
        "tr",
        { "data-fact-id": fact.id, class: `fact ${status(fact)}` },
        el("td", { class: "statement" }, fact.statement),
        el("td", {}, fact.subject_name, " · ", el("code", {}, fact.predicate), fact.object_name ? ` · ${fact.object_name}` : ""),
        el("td", { class: "status" }, status(fact)),
        el("td", {}, when(fact.valid_from)),
        el("td", {}, when(fact.valid_until)),
        el("td", { class: "sources" }, fact.source_ids.map((id) => this.app.sourceChip(id))),
        el(
          "td",
          { class: "actions" },
          el("button", { type: "button", "data-action": "history", onclick: () => this.history(fact) }, "History"),
          canForget && this.app.forgetButton(fact.id, `the fact “${fact.statement}”`),
        ),
      ),
    );
    replace(byId("facts-body"), rows.length ? rows : el("tr", {}, el("td", { colspan: 7 }, "No facts yet.")));
    this.mark();
  }

  /** Marks the rows (and timeline entries) that held at the as-of instant; hides the others if asked. */
  mark() {
    const at = this.asOf();
    const only = byId("only-held").checked;
    const byFact = new Map(this.facts.map((f) => [f.id, f]));
    for (const row of byId("facts-body").querySelectorAll("tr[data-fact-id]")) {
      const held = heldAt(byFact.get(row.dataset.factId), at);
      row.classList.toggle("held", held);
      row.hidden = only && !held;
    }
    for (const item of byId("timeline").querySelectorAll("li[data-fact-id]")) {
      item.classList.toggle("held", heldAt(JSON.parse(item.dataset.record), at));
    }
    byId("asof-label").textContent = byId("asof").value ? `held at ${when(new Date(at).toISOString())}` : "held now";
  }

  /** The history of the fact's subject and predicate: every value it had, superseded ones included. */
  async history(fact) {
    const target = byId("timeline");
    try {
      // History finds subjects by name or alias; another entity of the same name is left out.
      const named = await call("GET", userPath(this.app.user, "history"), {
        query: { subject: fact.subject_name, predicate: fact.predicate, limit: 100 },
      });
      const chain = named.filter((f) => f.subject_id === fact.subject_id);
      replace(
        target,
        el("h3", {}, `History of ${fact.subject_name} · ${fact.predicate}`),
        el(
          "ol",
          { class: "timeline" },
          chain.map((f) =>
            el(
              "li",
              { "data-fact-id": f.id, "data-record": JSON.stringify(f), class: status(f) },
              el("span", { class: "span" }, `${when(f.valid_from)} → ${f.valid_until ? when(f.valid_until) : "now"}`),
              el("span", { class: "value" }, f.object_name || f.statement),
              el("span", { class: "status" }, status(f)),
              f.superseded_by ? el("span", { class: "note" }, `superseded by ${f.superseded_by}`) : "",
              el("span", { class: "sources" }, f.source_ids.map((id) => this.app.sourceChip(id))),
            ),
          ),
        ),
      );
      this.mark();
    } catch (error) {
      showError(byId("facts-error"), error);
    }
  }
}
