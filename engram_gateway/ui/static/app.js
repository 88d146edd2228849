// The memory explorer: a key, a user, then tabs over that user's memory. Every read and forget is a /v1
// call with the key (api.js); what the key may do comes from GET /v1/whoami, and the forget controls
// are built only for a key with the write scope (the gateway refuses the others anyway).

import { ApiError, call, storedKey, userPath } from "./api.js";
import { byId, confirmForget, el, replace, showError, when } from "./dom.js";
import { FactsTab } from "./facts.js";
import { GraphTab } from "./graph.js";
import { RecallTab } from "./recall.js";

class Explorer {
  constructor() {
    this.who = null;
    this.user = "";
    this.facts = new FactsTab(this);
    this.graph = new GraphTab(this);
    this.recall = new RecallTab(this);
    byId("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      storedKey.set(byId("key").value.trim());
      byId("key").value = "";
      this.signIn();
    });
    byId("sign-out").addEventListener("click", () => {
      storedKey.set("");
      location.hash = "";
      location.reload();
    });
    byId("user-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.open(byId("user").value.trim());
    });
    for (const button of document.querySelectorAll("nav button[data-tab]")) {
      button.addEventListener("click", () => this.tab(button.dataset.tab));
    }
    byId("dead-go").addEventListener("click", () => this.deadLetters());
    byId("forget-user-confirm").addEventListener("input", () => {
      byId("forget-user").disabled = byId("forget-user-confirm").value !== this.user;
    });
    byId("forget-user").addEventListener("click", () => this.forgetUser());
    byId("confirm-no").addEventListener("click", () => byId("confirm").close());
  }

  can(scope) {
    return Boolean(this.who && this.who.scopes.includes(scope));
  }

  async signIn() {
    showError(byId("key-error"), null);
    try {
      this.who = await call("GET", "whoami");
    } catch (error) {
      this.who = null;
      byId("signed-in").hidden = true;
      byId("key-form").hidden = false;
      if (!(error instanceof ApiError && error.status === 401 && !storedKey.get())) showError(byId("key-error"), error);
      return;
    }
    const who = this.who;
    byId("key-form").hidden = true;
    byId("signed-in").hidden = false;
    byId("who").textContent =
      `key ${who.name} · scopes ${who.scopes.join(", ")} · ` +
      (who.namespace === "*" ? "every namespace" : `users ${who.namespace}.*`) +
      (who.local_mode ? " · local mode (no keys configured)" : "");
    byId("user-form").hidden = false;
    document.body.classList.toggle("read-only", !this.can("write"));
    byId("danger").hidden = !this.can("write");
    try {
      const listed = await call("GET", "users", { query: { limit: 1000 } });
      replace(byId("users"), listed.users.map((u) => el("option", { value: u })));
    } catch (error) {
      showError(byId("user-error"), error);
    }
    const wanted = new URLSearchParams(location.hash.slice(1)).get("user");
    if (wanted) this.open(wanted);
  }

  async open(userId) {
    showError(byId("user-error"), null);
    byId("notice").hidden = true;
    byId("main").hidden = true;
    this.user = userId;
    byId("user").value = userId;
    this.recall.clear();
    replace(byId("dead-body"));
    byId("forget-user-confirm").value = "";
    byId("forget-user").disabled = true;
    try {
      await this.facts.load(userId);
    } catch (error) {
      this.user = "";
      replace(byId("facts-body"));
      showError(byId("user-error"), error);
      return;
    }
    history.replaceState(null, "", `#user=${encodeURIComponent(userId)}`);
    byId("current-user").textContent = userId;
    this.graph.load(this.facts.entities);
    byId("main").hidden = false;
    this.tab(document.querySelector("nav button.active")?.dataset.tab || "facts");
  }

  tab(name) {
    for (const button of document.querySelectorAll("nav button[data-tab]")) {
      button.classList.toggle("active", button.dataset.tab === name);
    }
    for (const section of document.querySelectorAll("section.tab")) section.hidden = section.id !== `tab-${name}`;
    if (name === "graph" && !byId("graph").childElementCount) this.graph.draw();
    if (name === "dead") this.deadLetters();
  }

  /** A source message id; with the write scope, a button to forget that message. */
  sourceChip(messageId) {
    return el(
      "span",
      { class: "source", "data-message-id": messageId },
      el("code", {}, messageId),
      this.can("write") && this.forgetButton(messageId, `the message ${messageId} (and the facts only it stated)`),
    );
  }

  /** The forget control of a fact, excerpt or message id: a confirm step, then DELETE, then a reload. */
  forgetButton(memoryId, what) {
    return el(
      "button",
      {
        type: "button",
        class: "danger",
        "data-action": "forget",
        "data-target": memoryId,
        onclick: async () => {
          if (!(await confirmForget(`Forget ${what}? This cannot be undone.`))) return;
          try {
            const done = await call("DELETE", userPath(this.user, `memories/${encodeURIComponent(memoryId)}`));
            this.notice(`Forgotten: ${done.facts} fact(s), ${done.episodes} message(s), ${done.entities} entity(ies).`);
            for (const row of document.querySelectorAll(`[data-id="${CSS.escape(memoryId)}"]`)) row.remove();
            await this.facts.load(this.user);
            this.graph.load(this.facts.entities);
          } catch (error) {
            this.notice(error.message, true);
          }
        },
      },
      "Forget",
    );
  }

  notice(text, isError = false) {
    const node = byId("notice");
    node.textContent = text;
    node.classList.toggle("error", isError);
    node.hidden = false;
  }

  async deadLetters() {
    const note = byId("dead-note");
    if (!this.can("operator")) {
      note.textContent = "Dead letters need a key with the operator scope.";
      replace(byId("dead-body"));
      return;
    }
    try {
      const letters = await call("GET", "dead-letters", { query: { user_id: this.user } });
      note.textContent = `${letters.length} dead letter(s).`;
      replace(
        byId("dead-body"),
        letters.map((d) =>
          el(
            "tr",
            { "data-message-id": d.message_id },
            el("td", {}, el("code", {}, d.message_id)),
            el("td", {}, d.stage),
            el("td", { class: "statement" }, d.reason),
            el("td", {}, String(d.attempts)),
            el("td", {}, when(d.failed_at)),
          ),
        ),
      );
    } catch (error) {
      note.textContent = error.message;
    }
  }

  async forgetUser() {
    const userId = this.user;
    if (!(await confirmForget(`Forget everything of ${userId}? This cannot be undone.`))) return;
    try {
      const done = await call("DELETE", userPath(userId));
      await this.open(userId);
      this.notice(`Forgot ${userId}: ${done.facts} fact(s), ${done.episodes} message(s), ${done.entities} entity(ies).`);
    } catch (error) {
      this.notice(error.message, true);
    }
  }
}

// Without a stored key this still asks: local mode answers anyone; otherwise the key form stays.
new Explorer().signIn();
