"""The pages: the playground at `/`, the status view's `/stats`, and the API docs, all offline.

`GET /` answers a browser (`Accept: text/html`) with the playground, a static page
(`service/http/static/`, no build step) whose script calls only the public API: `GET /models`,
`GET /stats`, `POST /classify` and `POST /fill-mask`, with the key typed into it as
`Authorization: Bearer KEY`. Any other client, and every client when the setting `ui` is off, gets
a small JSON index of the API. `/docs` (Swagger UI) and `/redoc` load their scripts from
`/ui/vendor/`, the copies the `fastapi-offline` package ships, so the docs need no CDN.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from contract.formats import package_version
from service.access.scope import Scope
from service.http.routing import DirectRoute, get_state, model_response, public, requires
from service.http.schemas import ModelStatus, StatsResponse
from service.telemetry.recent import StatsHistory

STATIC = Path(__file__).resolve().parent / "static"
VENDOR = Path(str(files("fastapi_offline") / "static"))
ASSETS, VENDOR_ASSETS = "/ui", "/ui/vendor"
DOCS, OAUTH2_REDIRECT, REDOC = "/docs", "/docs/oauth2-redirect", "/redoc"
# The page may load and call only its own origin (its images: blobs of the picked files).
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
    "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)

router = APIRouter(route_class=DirectRoute)


def _prefix(request: Request) -> str:
    """The root path the server runs under (behind a proxy's prefix), for absolute asset URLs."""
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/", include_in_schema=False)
@public
async def home(request: Request) -> Response:
    """The page to a browser; else what a client can call: the documented operations, the docs, and
    whether the page is on."""
    settings = get_state(request).settings
    headers = {"Vary": "Accept"}
    if settings.ui and "text/html" in request.headers.get("accept", ""):
        page = (STATIC / "index.html").read_bytes()
        return HTMLResponse(page, headers={**headers, "Content-Security-Policy": PAGE_POLICY})
    paths = request.app.openapi()["paths"]
    index = {
        "name": request.app.title,
        "version": package_version(),
        "playground": settings.ui,
        "docs": DOCS,
        "redoc": REDOC,
        "openapi": request.app.openapi_url,
        "operations": [f"{method.upper()} {path}" for path, methods in paths.items() for method in methods],
    }
    return JSONResponse(index, headers=headers)


@router.get(
    "/stats",
    response_model=StatsResponse,
    tags=["health"],
    summary="Readiness and recent traffic (rate, latency, queue, batches) as JSON",
)
@requires(Scope.INFER)
async def stats(request: Request) -> JSONResponse:
    """The figures of the playground's status view, from the same series as /metrics over the
    last `stats_window_s` seconds. Probes, scrapes and these stats are not counted as requests."""
    state = get_state(request)
    history: StatsHistory = request.app.state.stats
    models = [ModelStatus(name=m.name, task=m.task, ready=m.ready) for m in state.newest_ready().values()]
    body = StatsResponse(status=state.phase, ready=state.ready, models=models, **history.report())
    return model_response(body)


@router.get("/favicon.ico", include_in_schema=False)
@public
async def favicon(request: Request) -> Response:
    """The page's icon, for browsers that ask for it at the root whatever the page declares."""
    return Response((STATIC / "favicon.svg").read_bytes(), media_type="image/svg+xml")


@router.get(DOCS, include_in_schema=False)
@public
async def swagger_ui(request: Request) -> HTMLResponse:
    prefix = _prefix(request)
    return get_swagger_ui_html(
        openapi_url=prefix + str(request.app.openapi_url),
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{prefix}{VENDOR_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{prefix}{VENDOR_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{prefix}{ASSETS}/favicon.svg",
        oauth2_redirect_url=prefix + OAUTH2_REDIRECT,
        # No badge from the public validator: nothing leaves the server.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get(OAUTH2_REDIRECT, include_in_schema=False)
@public
async def swagger_ui_redirect(request: Request) -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get(REDOC, include_in_schema=False)
@public
async def redoc(request: Request) -> HTMLResponse:
    prefix = _prefix(request)
    page = get_redoc_html(
        openapi_url=prefix + str(request.app.openapi_url),
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{prefix}{VENDOR_ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{prefix}{ASSETS}/favicon.svg",
        with_google_fonts=False,
    )
    # ReDoc always shows its maker's logo from their CDN (hidden when it fails to load): the
    # browser is told to load images from here only, so that the docs make no outside request.
    page.headers["Content-Security-Policy"] = "img-src 'self' data:"
    return page


def mount_assets(app: FastAPI) -> None:
    """Serve the page's files under /ui/ and the docs' scripts under /ui/vendor/ (the more
    specific mount first: the first match wins), open to all (`service.http.routing`)."""
    app.mount(VENDOR_ASSETS, StaticFiles(directory=VENDOR), name="vendor")
    app.mount(ASSETS, StaticFiles(directory=STATIC), name="ui")
    # The files are open like the pages that load them, and so is FastAPI's own OpenAPI document.
    for route in app.routes:
        if (
            getattr(route, "name", None) in ("vendor", "ui")
            or getattr(route, "path", None) == app.openapi_url
        ):
            public(route)
