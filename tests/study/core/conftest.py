"""Fixtures of the study core's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """A local Ray instance with 2 CPUs for the tests of one module (``pytestmark = usefixtures("ray_instance")``)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
