"""The routes behind the memory explorer, over HTTP: the page's files (from the gateway alone), the three
``/v1`` routes it added (in the schema with their scope; namespaced, bounded, checked)."""

from __future__ import annotations

import re
from datetime import timedelta

import httpx

from engram_gateway.ui import STATIC
from tests.support.explorer import T0, World
from tests.support.gateway import auth


def test_the_page_and_its_assets_come_from_the_gateway_alone(world: World, http: httpx.Client) -> None:
    """No key is needed for the files (they hold no data); nothing in them loads from another origin."""
    page = http.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    referenced = re.findall(r'(?:href|src)="(ui/assets/[^"]+)"', page.text)
    assert referenced == ["ui/assets/style.css", "ui/assets/app.js"]
    for path in STATIC.iterdir():
        text = path.read_text()
        # The SVG namespace is a name, not a fetch; no other absolute URL appears in any file.
        assert set(re.findall(r"https?://[^\s\"'`)]+", text)) <= {"http://www.w3.org/2000/svg"}, path.name
        if path.name != "index.html":
            served = http.get(f"/ui/assets/{path.name}")
            assert served.status_code == 200 and served.text == text
    modules = re.findall(r'from "\./([a-z]+\.js)"', "".join(p.read_text() for p in STATIC.glob("*.js")))
    assert modules and all((STATIC / m).is_file() for m in modules)
    assert http.get("/ui/assets/__init__.py").status_code == 404
    assert http.get("/ui/assets/..%2Fapi.py").status_code == 404


def test_the_explorer_routes_are_in_the_schema_with_their_scope(world: World, http: httpx.Client) -> None:
    schema = http.get("/openapi.json", headers=auth(world.secrets, "a_read")).json()
    for path, model in (
        ("/v1/whoami", "KeyInfo"),
        ("/v1/users", "UserList"),
        ("/v1/users/{user_id}/neighbourhood", "Neighbourhood"),
    ):
        operation = schema["paths"][path]["get"]
        assert operation["x-engram-scope"] == "read" and operation["security"] == [{"bearer": []}, {"apiKey": []}]
        assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{model}"
        }
    assert "/ui" not in schema["paths"] and not any(p.startswith("/ui/") for p in schema["paths"])


def test_whoami_and_the_user_list_answer_for_the_keys_namespace_only(world: World, http: httpx.Client) -> None:
    assert http.get("/v1/whoami").status_code == 401
    me = http.get("/v1/whoami", headers=auth(world.secrets, "a_read")).json()
    assert me == {"name": "a_read", "scopes": ["read"], "namespace": "appA", "local_mode": False}
    mine = http.get("/v1/users", headers=auth(world.secrets, "a_read")).json()
    assert {world.user, world.doomed} <= set(mine["users"]) and all(u.startswith("appA.") for u in mine["users"])
    assert mine["users"] == sorted(mine["users"]) and mine["truncated"] is False
    one = http.get("/v1/users", headers=auth(world.secrets, "a_read"), params={"limit": 1}).json()
    assert len(one["users"]) == 1 and one["truncated"] is True
    theirs = http.get("/v1/users", headers=auth(world.secrets, "b_rw"), params={"prefix": "appB.other"}).json()
    assert theirs == {"users": [world.other], "truncated": False}
    assert http.get("/v1/users", headers=auth(world.secrets, "a_read"), params={"limit": 0}).status_code == 400


def test_the_neighbourhood_is_bounded_checked_and_valid_at_as_of(world: World, http: httpx.Client) -> None:
    a = auth(world.secrets, "a_read")
    path = f"/v1/users/{world.user}/neighbourhood"
    now = http.get(path, headers=a).json()
    assert now["entities"][0]["id"] == now["entity_id"] and now["entities"][0]["hops"] == 0
    assert {"Denver", "Ana"} <= {e["name"] for e in now["entities"]}
    hops = [f["hops"] for f in now["facts"]]
    assert hops == sorted(hops) and now["truncated"] is False
    # In the Austin months the user lived in Austin: the graph at that instant says so.
    then = http.get(path, headers=a, params={"as_of": (T0 + timedelta(days=200)).isoformat()}).json()
    assert "Austin" in {e["name"] for e in then["entities"]} and "Denver" not in {e["name"] for e in then["entities"]}
    assert http.get(path, headers=a, params={"as_of": "2000-01-01T00:00:00Z"}).json()["facts"] == []
    bounded = http.get(path, headers=a, params={"limit": 1}).json()
    assert len(bounded["facts"]) == 1 and bounded["truncated"] is True
    assert http.get(path, headers=a, params={"hops": 9}).status_code == 400
    missing = http.get(path, headers=a, params={"entity_id": "ent_nope"})
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
    refused = http.get(f"/v1/users/{world.other}/neighbourhood", headers=a)
    assert refused.status_code == 403 and "Oslo" not in refused.text
