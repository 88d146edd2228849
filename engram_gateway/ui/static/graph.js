// The graph tab: one entity's neighbourhood (GET /v1/users/{id}/neighbourhood: the facts within a few
// graph steps, valid now or at an instant), drawn as SVG in rings by distance. Click a node to centre it.

import { call, userPath } from "./api.js";
import { byId, el, replace, showError, svg, utcInput } from "./dom.js";

const SIZE = 640;
const RING = 110; // pixels between rings (hops)

export class GraphTab {
  constructor(app) {
    this.app = app;
    byId("graph-go").addEventListener("click", () => this.draw());
  }

  /** The entity choices: the user themself, then the entities the facts tab loaded. */
  load(entities) {
    const options = [el("option", { value: "" }, "the user themself")];
    for (const e of [...entities].sort((a, b) => a.name.localeCompare(b.name))) {
      options.push(el("option", { value: e.id }, `${e.name} (${e.label})`));
    }
    replace(byId("graph-entity"), options);
    replace(byId("graph"));
    replace(byId("graph-facts"));
  }

  async draw(entityId) {
    if (entityId !== undefined) byId("graph-entity").value = entityId;
    showError(byId("graph-error"), null);
    try {
      const found = await call("GET", userPath(this.app.user, "neighbourhood"), {
        query: {
          entity_id: byId("graph-entity").value,
          hops: byId("graph-hops").value,
          limit: byId("graph-limit").value,
          as_of: utcInput(byId("graph-asof")),
        },
      });
      this.render(found);
    } catch (error) {
      showError(byId("graph-error"), error);
    }
  }

  render(found) {
    const place = layout(found.entities);
    const edges = found.facts
      .filter((item) => item.fact.object_id && place.has(item.fact.subject_id) && place.has(item.fact.object_id))
      .map(({ fact }) => {
        const [a, b] = [place.get(fact.subject_id), place.get(fact.object_id)];
        return svg(
          "g",
          { class: "edge", "data-fact-id": fact.id },
          svg("title", {}, fact.statement),
          svg("line", { x1: a.x, y1: a.y, x2: b.x, y2: b.y }),
          svg("text", { x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 - 4, "text-anchor": "middle" }, fact.predicate),
        );
      });
    const nodes = found.entities.map((entity) => {
      const p = place.get(entity.id);
      return svg(
        "g",
        {
          class: `node hop${Math.min(entity.hops, 3)}`,
          "data-entity-id": entity.id,
          tabindex: 0,
          onclick: () => this.draw(entity.id === found.entity_id ? undefined : entity.id),
        },
        svg("title", {}, `${entity.name} (${entity.label}), ${entity.hops} step(s) away`),
        svg("circle", { cx: p.x, cy: p.y, r: entity.hops === 0 ? 14 : 9 }),
        svg("text", { x: p.x, y: p.y + 26, "text-anchor": "middle" }, entity.name),
      );
    });
    replace(byId("graph"), ...edges, ...nodes);
    byId("graph").setAttribute("viewBox", `0 0 ${SIZE} ${SIZE}`);
    replace(
      byId("graph-facts"),
      found.facts.map(({ fact, hops }) => el("li", { "data-fact-id": fact.id }, `${fact.statement} `, el("small", {}, `(${hops} hop${hops === 1 ? "" : "s"})`))),
      found.truncated ? el("li", { class: "note" }, "…more facts lie within these steps; raise the limit to see them.") : "",
    );
  }
}

/** id -> {x, y}: the centre in the middle, each further distance on its own ring, evenly spread. */
function layout(entities) {
  const rings = new Map();
  for (const e of entities) rings.set(e.hops, [...(rings.get(e.hops) || []), e]);
  const place = new Map();
  const middle = SIZE / 2;
  for (const [hops, members] of rings) {
    const radius = Math.min(hops * RING, middle - 40);
    members.forEach((e, i) => {
      const angle = (2 * Math.PI * i) / members.length + hops * 0.4;
      place.set(e.id, { x: middle + radius * Math.cos(angle), y: middle + radius * Math.sin(angle) });
    });
  }
  return place;
}
