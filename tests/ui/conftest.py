"""One explorer world (a fleet, a gateway, users written through the pipeline) for every test of tests/ui/."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.explorer import World, explorer_world


@pytest.fixture(scope="package")
def world(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with explorer_world(redis_url, tmp_path_factory.mktemp("explorer")) as here:
        yield here


@pytest.fixture(scope="package")
def http(world: World) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=world.url, timeout=60) as client:
        yield client
