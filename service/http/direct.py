"""Direct routes: endpoints that read their own request and return their own Response.

Every endpoint of the service validates what it reads itself (`service.http.parsing`), so FastAPI's
per-request machinery (dependency solving, parameter validation, response serialisation) would
only add event-loop work to every request. A `DirectRoute` skips it, and `service.http.dispatch`
calls its endpoint before FastAPI's router is reached at all. Each route also carries the error
table its refusals are rendered with, so that an API's error shape follows its routes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any, ClassVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

from service.http.errors import REST_ERRORS, ErrorTable
from service.lifecycle.state import ServiceState


class DirectRoute(APIRoute):
    """A route whose endpoint takes the Request (and the route's path parameters, as strings) and
    returns a Response, with the error table of the API it belongs to (`errors`).

    It is still an APIRoute, so OpenAPI documents its body, parameters (`query_parameters`) and
    response model as for any other. In the app, the direct dispatch serves it; `get_route_handler`
    serves it wherever FastAPI's router runs it instead. Anything FastAPI would have to inject is
    refused when the route is declared. `errors` is a class attribute: a router declares its API's
    table with `APIRouter(route_class=DirectRoute.answering(TABLE))`.
    """

    errors: ClassVar[ErrorTable] = REST_ERRORS

    @classmethod
    def answering(cls, errors: ErrorTable) -> type[DirectRoute]:
        """The direct route class whose refusals are rendered with `errors`."""
        return type(f"{cls.__name__}_{errors.transport}", (cls,), {"errors": errors})

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        dependant = self.dependant
        injected = (
            dependant.query_params,
            dependant.header_params,
            dependant.cookie_params,
            dependant.body_params,
            dependant.dependencies,
        )
        if any(injected) or dependant.request_param_name is None:
            raise TypeError(f"{self.path}: a direct endpoint takes the Request and path parameters only")
        endpoint = self.endpoint
        if not dependant.path_params:
            return endpoint

        async def with_path(request: Request) -> Response:
            return await endpoint(request, **request.path_params)

        return with_path


def error_namespaces(routers: Iterable[APIRouter]) -> dict[str, ErrorTable]:
    """The error table of each router that has a prefix, by prefix: how a path below it that none
    of its routes takes (an unknown v2 path) is answered."""
    return {
        router.prefix: router.route_class.errors
        for router in routers
        if router.prefix and issubclass(router.route_class, DirectRoute)
    }


def get_state(request: Request) -> ServiceState:
    """The app's `ServiceState`."""
    return request.app.state.service


def model_response(body: BaseModel) -> JSONResponse:
    """A direct route's document, built as its response model and serialised as FastAPI would."""
    return JSONResponse(body.model_dump(mode="json"))


__all__ = ["DirectRoute", "error_namespaces", "get_state", "model_response"]
