"""vLLM's generation routes, called without the app's user middleware or its route matching.

A front hands every chat, completion, Responses and Messages request to vLLM's
FastAPI app in its own process (actors/finisher.py wraps it). There each request
crossed the app's user middleware (CORS, the Prometheus instrumentator's HTTP
metrics, elastic EP's scaling check) and Starlette's router, which matches the
path against the app's routes one by one (the chat route is one of ~50). At 200
req/s those were 3.6% of a front's CPU samples on their own (py-spy, the
instrumentator's histograms not counted), work `vllm serve` does too but a
Baton front has no use for:
- CORS: the front answers no preflight (`OPTIONS` is not a route of its), so a
  browser on another origin never reaches these routes;
- the instrumentator's request counts and latencies: the front keeps its own
  per tenant, route and status (deployments/front/metrics.py);
- the scaling check: Baton runs no elastic expert parallelism.

`DirectRoutes` calls each of `paths`' route with the layers FastAPI itself puts
around every route (the app's own `build_middleware_stack`, less the user
middleware): ServerErrorMiddleware with the app's handler for `Exception`,
ExceptionMiddleware with its other handlers (vLLM's OpenAI-shaped 400s,
Baton's engine-dead 503 from openai_app.py) and FastAPI's AsyncExitStack. The
route's own handler is unchanged: its body validation, `with_cancellation`,
`load_aware_call`. Other paths and methods go through the whole app. An app
with a user middleware not named in SKIPPED (an `--api-key`'s authentication,
a `--middleware` of its operator's) is called whole on every path.
"""

from __future__ import annotations

import copy
import logging

logger = logging.getLogger(__name__)

# The user middleware a direct call leaves out (see the module docstring).
SKIPPED = frozenset({"CORSMiddleware", "PrometheusInstrumentatorMiddleware", "ScalingMiddleware"})


class DirectRoutes:
    """An ASGI app: `app` (vLLM's FastAPI app), with `paths`' POSTs called directly."""

    def __init__(self, app, paths) -> None:
        """Reads `app`'s routes, exception handlers and user middleware once (build it after its
        exception handlers are added: later ones reach only the whole app). Changes nothing."""
        self.app = app
        self.direct: dict[str, object] = {}
        others = sorted({m.cls.__name__ for m in app.user_middleware} - SKIPPED)
        if others:
            logger.info("vLLM's app has middleware %s: every request goes through the whole app", others)
            return
        for path in paths:
            found = _post_route(app, path)
            if found is not None:
                self.direct[path] = _layers(app, _Routed(app, *found))

    async def __call__(self, scope, receive, send) -> None:
        direct = self.direct.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if direct is None:
            return await self.app(scope, receive, send)
        scope["app"] = self.app  # as Starlette sets it: handlers read `request.app.state`
        if self.app.root_path:
            scope["root_path"] = self.app.root_path
        await direct(scope, receive, send)


class _Routed:
    """The innermost layer: one route, as the router hands it a request it matched."""

    def __init__(self, app, route, child_scope: dict) -> None:
        self.router, self.route, self.child_scope = app.router, route, child_scope

    async def __call__(self, scope, receive, send) -> None:
        scope.setdefault("router", self.router)
        scope.update(self.child_scope)
        await self.route.handle(scope, receive, send)


def _post_route(app, path: str):
    """(route, the scope it adds) of the route the router gives a POST to `path`, or None when that
    is not one fully matching route (a mount, or no route at all). Changes nothing."""
    from starlette.routing import Match, Route

    scope = {"type": "http", "path": path, "method": "POST", "root_path": app.root_path or ""}
    for route in app.router.routes:
        match, child = route.matches(scope)
        if match == Match.FULL:  # (a PARTIAL match, the path under another method, the router passes over too)
            return (route, child) if isinstance(route, Route) else None
    return None


def _layers(app, inner):
    """`inner` within the layers FastAPI puts around the router (the app's error handler, its other
    exception handlers, the AsyncExitStack), less the user middleware: built by the app's own
    `build_middleware_stack`, on a shallow copy of `app` whose router is `inner`."""
    shell = copy.copy(app)
    shell.user_middleware, shell.router = [], inner
    return shell.build_middleware_stack()
