"""Print the gateway's OpenAPI schema (what ``engram serve`` answers at ``/openapi.json``) as JSON.

Builds the app the way ``engram serve`` does (``engram_gateway.app.create_app``) without serving it: building
it opens no connection, so this runs with no Redis, graph store or key. ``scripts/generate.mjs`` runs it;
the TypeScript types are generated from its output, never written by hand.
"""

from __future__ import annotations

import json
import sys

from engram_api.settings import load_settings
from engram_gateway.app import create_app
from engram_gateway.service import Gateway


def main() -> None:
    app = create_app(Gateway(load_settings()))
    json.dump(app.openapi(), sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
