"""The API's one error shape, produced here and nowhere else.

    {"error": {"type": "InputError", "message": "gpu_count: expected a whole number from 0 to 100000",
               "fields": [{"field": "gpu_count", "message": "..."}]}}

A TrackwayError answers with its class's `http_status` (errors.py draws the tree); a request
that does not validate answers 422 naming each field; anything else is a 500 whose body says
only that it is a bug (the traceback goes to the server's log, never to the client).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from trackway.errors import TrackwayError

log = logging.getLogger("trackway.server")


class FieldError(BaseModel):
    field: str
    message: str


class ErrorDetail(BaseModel):
    type: str
    message: str
    fields: list[FieldError] | None = None


class ErrorBody(BaseModel):
    """The shape of every error answer."""

    error: ErrorDetail


# Declared on every /api route, so the OpenAPI schema says what an error looks like (and clients can trust it).
RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": why}
    for status, why in (
        (400, "Bad input: the message names the field and what was expected (or a Host this server does not "
              "answer to: DNS rebinding)"),
        (401, "No token, or the wrong one"),
        (403, "Not allowed: the token's role is too low, a cross-site request, or a write through /api/sql"),
        (413, "The request body is larger than the server takes"),
        (404, "No such job, run, attempt or experiment"),
        (409, "A name that matches more than one thing"),
        (422, "The request does not validate: each field is named"),
        (500, "A bug in trackway: the server's log has the traceback"),
        (503, "The ledger cannot be reached"),
    )
}


def error_body(kind: str, message: str, fields: list[dict[str, str]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": kind, "message": message}
    if fields:
        body["fields"] = fields
    return {"error": body}


def respond(status: int, kind: str, message: str, fields: list[dict[str, str]] | None = None,
            headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(kind, message, fields), status_code=status, headers=headers)


def _field(loc: tuple | list) -> str:
    """`body.gpu_count` → `gpu_count`, `query.max_points` → `max_points`: the name the client sent."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(TrackwayError)
    async def trackway_error(request: Request, exc: TrackwayError) -> JSONResponse:
        return respond(exc.http_status, type(exc).__name__, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [{"field": _field(e.get("loc", ())), "message": str(e.get("msg", "invalid"))} for e in exc.errors()]
        message = "; ".join(f"{f['field']}: {f['message']}" for f in fields) or "invalid request"
        return respond(422, "ValidationError", message, fields)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kinds = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed"}
        return respond(exc.status_code, kinds.get(exc.status_code, "HTTPError"), str(exc.detail),
                       headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return respond(500, "InternalError", "trackway hit a bug answering this request; the server's log has the traceback")
