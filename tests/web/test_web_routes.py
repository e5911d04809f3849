"""The web router without a browser: public shell pages, the redirect, assets, security headers, no schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.assembly import build_context
from heteroflow.platform_server.routes.web import WEB_ROOT
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.db import create_db_engine
from tests.web.seed import build_app


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'web.db'}")
    ctx = build_context(
        settings=ServerSettings.load(database_url=str(engine.url)),
        health_settings=HealthStorageSettings.load(),
        prediction_settings=PredictionSettings.load(),
        delivery_settings=AlertDeliverySettings.load(),
        engine=engine,
    )
    with TestClient(build_app(ctx), follow_redirects=False) as client:
        yield client
    engine.dispose()


def test_root_redirects_to_the_gpu_health_page(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 307
    assert response.headers["location"] == "/nodes/gpu-health"


@pytest.mark.parametrize(
    ("path", "page"), [("/nodes/gpu-health", "gpu-health"), ("/nodes", "nodes"), ("/alerts", "alerts")]
)
def test_pages_are_public_shells_without_data(client: TestClient, path: str, page: str) -> None:
    response = client.get(path)  # no token: the shell must load before sign-in
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert f'<body data-page="{page}">' in response.text
    assert '<script type="module" src="/ui/app.js">' in response.text
    # The calibration notice is in the static shell: it shows before any script or API call.
    assert "Initial empirical thresholds, pending calibration with real data." in response.text
    csp = response.headers["content-security-policy"]
    assert "default-src 'self'" in csp
    assert "script-src 'self'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "http://" not in response.text
    assert "https://" not in response.text


@pytest.mark.parametrize(
    ("path", "media_type"),
    [
        ("/ui/app.js", "text/javascript"),
        ("/ui/logic/hourly.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ],
)
def test_assets_are_served_with_their_media_type(client: TestClient, path: str, media_type: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(media_type)
    assert response.headers["cache-control"] == "no-cache"


@pytest.mark.parametrize(
    "path", ["/ui/missing.js", "/ui/../routes/web.py", "/ui/%2e%2e/shell.html", "/ui/", "/ui/pages", "/ui/../../app.py"]
)
def test_anything_else_under_ui_is_404(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_web_routes_are_not_in_the_api_schema(client: TestClient) -> None:
    schema = client.app.openapi()  # type: ignore[attr-defined]
    assert not [p for p in schema["paths"] if p == "/" or p.startswith(("/ui", "/nodes", "/alerts"))]


def test_no_asset_refers_to_another_origin() -> None:
    for path in WEB_ROOT.rglob("*"):
        if path.suffix in {".js", ".css", ".html"}:
            text = path.read_text(encoding="utf-8").replace("http://www.w3.org/2000/svg", "")  # a namespace name
            assert "http://" not in text, path
            assert "https://" not in text, path
