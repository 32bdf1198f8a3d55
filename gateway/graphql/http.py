"""GraphQL over HTTP (graphql/graphql-over-http, Stage 2 draft) on top of Strawberry's ASGI view.

What Strawberry leaves out and this view adds:

- ``Accept`` negotiation between ``application/graphql-response+json`` and ``application/json``
  (``*/*`` or no ``Accept``: ``application/json``; neither acceptable: 406).
- Request errors (parse, validation, variable coercion) answer without a ``data`` entry, and with
  ``application/graphql-response+json`` with 400 (5xx if a backing service failed); with
  ``application/json`` (the legacy media type) with 200.
- A mutation over GET is 405 with ``Allow: POST``; a POST that is not ``application/json`` is 415.
- A body that is not a JSON object, or whose ``operationName`` is not a string, is 400.
- Batches: a JSON array of operations (as npm ``graphql-request``'s ``batchRequests`` sends) of at most
  ``CARAVAN_GRAPHQL_MAX_BATCH``, run one after the other, each counted by the rate limit and held to the cost limit;
  the answer is the array of their answers, in order (200; an operation's request error is its own element).
- Every refusal has a JSON body of GraphQL errors with ``extensions.code``, like every other error.
- The URL, body-size and rate limits of :mod:`gateway.graphql.guard`, and request metrics.
- Repeated session queries answered by :mod:`gateway.graphql.result_cache` while no session changed.

``tests/gateway/test_audit.py`` holds it to every audit of npm ``graphql-http``'s ``serverAudits``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import msgspec
from cross_web import HTTPException, StarletteRequestAdapter
from graphql import GraphQLError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.extensions import SchemaExtension
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.http.parse_content_type import parse_content_type
from strawberry.schema.base import BaseSchema
from strawberry.schema.exceptions import InvalidOperationTypeError
from strawberry.types import ExecutionResult
from strawberry.types.execution import PreExecutionError
from strawberry.types.graphql import OperationType

from gateway.graphql.context import Context
from gateway.graphql.guard import Guard, RequestError
from gateway.graphql.known_operations import KnownOperations
from gateway.graphql.result_cache import CachedResult, EncodedBody, ResultCache
from gateway.prometheus import Metrics

JSON = "application/json"
ENCODER = msgspec.json.Encoder()
"""Answers are encoded by msgspec: compact JSON as Strawberry's ``json.dumps`` writes it, in UTF-8, several times
faster (a page of 50 sessions took longer to encode than to execute its plain fields)."""
GRAPHQL_RESPONSE = "application/graphql-response+json"

CODES = {400: "BAD_REQUEST", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}
"""Codes of the refusals Strawberry raises itself (as ``HTTPException``)."""
OPERATION_MEMBERS = (
    ("query", (str, type(None)), "a string"),
    ("operationName", (str, type(None)), "a string"),
    ("variables", (dict, type(None)), "an object"),
    ("extensions", (dict, type(None)), "an object"),
)
"""The members of an operation in a request body, their types and how a refusal names them."""
REQUEST_ERROR_STATUS = {"INTERNAL": 500, "UNAVAILABLE": 503}
"""With graphql-response+json, a request error is 400 unless it is one of these."""


def negotiate(accept: str | None) -> str | None:
    """The response media type ``accept`` prefers, or None if it accepts neither of ours.

    Each type takes the quality of its most specific matching range. On a tie,
    graphql-response+json wins only when it is named; ``*/*`` alone means ``application/json``.
    """
    if not accept or not accept.strip():
        return JSON
    ranges: dict[str, float] = {}
    for item in accept.split(","):
        media, *params = (part.strip().lower() for part in item.split(";"))
        q_value = next((p[2:] for p in params if p.startswith("q=")), "1")
        try:
            ranges.setdefault(media, min(max(float(q_value), 0.0), 1.0))
        except ValueError:
            ranges.setdefault(media, 0.0)

    def quality(media: str) -> float:
        return next((ranges[r] for r in (media, media.split("/")[0] + "/*", "*/*") if r in ranges), 0.0)

    ours, legacy = quality(GRAPHQL_RESPONSE), quality(JSON)
    if max(ours, legacy) <= 0:
        return None
    return GRAPHQL_RESPONSE if ours > legacy or (ours == legacy and GRAPHQL_RESPONSE in ranges) else JSON


def is_request_error(result: ExecutionResult) -> bool:
    """True if the operation never executed: it did not parse or validate, or its variables did not coerce.

    Coercion errors come out of graphql-core's ``execute`` like field errors but without a ``path``.
    """
    if isinstance(result, PreExecutionError):
        return True
    errors = result.errors or []
    return result.data is None and bool(errors) and all(e.path is None for e in errors)


@functools.lru_cache(maxsize=64)
def media_type_of(content_type: str) -> str:
    """The media type of a Content-Type header (Strawberry's parse, through the standard library's email parser,
    costs more than some whole answers; clients send the same few headers)."""
    return parse_content_type(content_type)[0]


def with_charset(media_type: str) -> str:
    return f"{media_type}; charset=utf-8"


class RecordOperation(SchemaExtension):
    """Notes the operation's type on the HTTP request, for the request metrics."""

    def on_operation(self) -> Iterator[None]:
        yield
        request = getattr(self.execution_context.context, "request", None)
        try:
            if request is not None:
                request.state.operation = self.execution_context.operation_type.value
        except RuntimeError:  # the document did not parse
            pass


class GraphQLOverHTTP(GraphQL[Context, None]):
    def __init__(
        self,
        schema: BaseSchema,
        *,
        guard: Guard,
        metrics: Metrics,
        result_cache: ResultCache | None = None,
        **options: Any,
    ) -> None:
        super().__init__(schema, **options)
        self.guard = guard
        self.metrics = metrics
        self.result_cache = result_cache
        self.known: KnownOperations | None = getattr(schema, "known_operations", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        started = time.perf_counter()
        request = Request(scope, receive=self.guard.bounded(receive))
        media_type = negotiate(request.headers.get("accept"))
        request.state.media_type = media_type or JSON
        request.state.operation = "none"
        status = 500  # unless an answer is made: a bug, which uvicorn answers with 500
        try:
            try:
                self.guard.check_url(request)
                read = await self.guard.admit(request, self.result_cache.reads if self.result_cache else ())
                if self.result_cache is not None:
                    self.result_cache.started(request, read)
                self.check_media_types(request, media_type)
                response = await self.run_known(request) or await self.run(request)
            except RequestError as refused:
                response = self.refusal(request, refused)
            except HTTPException as exc:
                allow = {"Allow": "GET, POST"} if exc.status_code == 405 else {}
                code = CODES.get(exc.status_code, "BAD_REQUEST")
                response = self.refusal(request, RequestError(exc.status_code, exc.reason, code, allow))
            status = response.status_code
        finally:
            self.metrics.observe(request.state.operation, status, time.perf_counter() - started)
        await response(scope, receive, send)

    async def run_known(self, request: Request) -> Response | None:
        """A POSTed query the schema knows (:mod:`gateway.graphql.known_operations`) answered without Strawberry's
        view: the body parsed as it parses it, the same context, result processing and response. None when the
        request is anything else (a batch, a GET, an unknown document, a streaming ``Accept``...): Strawberry's view
        answers it, from the same (cached) body."""
        if self.known is None or request.method != "POST" or self._get_stream_transport_from_headers(request.headers):
            return None
        try:
            body = self.decode_json(await request.body())
        except (ValueError, RecursionError):
            return None
        if type(body) is not dict or body.get("extensions") is not None:
            return None
        query, variables, name = body.get("query"), body.get("variables"), body.get("operationName")
        if type(query) is not str or not isinstance(variables, dict | None) or not isinstance(name, str | None):
            return None
        data = GraphQLRequestData(query=query, variables=variables, operation_name=name, extensions=None)
        if self.known.document(data) is None:
            return None
        sub_response = await self.get_sub_response(request)
        context = await self.get_context(request, response=sub_response)
        adapter = self.request_adapter_class(request)
        result = await self.execute_single(request, adapter, sub_response, context, None, data)
        return self.create_response(await self.process_result(request, result), sub_response)

    def check_media_types(self, request: Request, accepted: str | None) -> None:
        if accepted is None and not self.should_render_graphql_ide(StarletteRequestAdapter(request)):
            raise RequestError(406, f"the Accept header allows neither {GRAPHQL_RESPONSE} nor {JSON}", "NOT_ACCEPTABLE")
        if request.method == "POST" and media_type_of(request.headers.get("content-type", "")) != JSON:
            raise RequestError(415, f"send the request body as {JSON}", "UNSUPPORTED_MEDIA_TYPE")

    def refusal(self, request: Request, refused: RequestError) -> Response:
        body = {"errors": [{"message": refused.message, "extensions": {"code": refused.code, **refused.details}}]}
        return Response(self.encode_json(body), refused.status, refused.headers, with_charset(request.state.media_type))

    # -- Strawberry's hooks ---------------------------------------------------------------------

    async def get_sub_response(self, request: Request | WebSocket) -> Response:
        sub_response = await super().get_sub_response(request)
        sub_response.media_type = request.state.media_type
        request.state.sub_response = sub_response
        return sub_response

    def encode_json(self, data: object) -> str:
        # text, not bytes: the same method encodes graphql-transport-ws messages, which bytes would send as binary
        # frames, and a browser's client cannot read those
        return ENCODER.encode(data).decode()

    def parse_json(self, data: str | bytes) -> Any:
        try:
            parsed = self.decode_json(data)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, absurd nesting
            raise HTTPException(400, "the request is not valid JSON") from exc
        if not isinstance(parsed, dict | list):
            raise HTTPException(400, "the request must be a JSON object (or, to batch operations, an array of them)")
        return parsed

    async def parse_http_body(self, request: Any) -> GraphQLRequestData | list[GraphQLRequestData]:
        data = await super().parse_http_body(request)
        if isinstance(data, GraphQLRequestData) and not isinstance(data.operation_name, str | None):
            raise HTTPException(400, "The GraphQL operation's `operationName` must be a string or null, if provided.")
        return data

    def _validate_batch_request(self, request_data: list[Any], protocol: Any) -> None:
        """Strawberry's hook for a batch (a JSON array body, not parsed further yet): refused when batching is off,
        past the size cap, or when an operation is malformed (none runs then)."""
        limit = self.guard.limits.max_batch
        if limit == 0:
            raise RequestError(
                400,
                "batched requests (a JSON array of operations) are off here: send one operation per request",
                "BATCHING_DISABLED",
            )
        if not request_data:
            raise RequestError(400, f"an empty batch: give 1 to {limit} operations", "BAD_REQUEST")
        if len(request_data) > limit:
            raise RequestError(
                400,
                f"a batch holds at most {limit} operations, not {len(request_data)}",
                "BATCH_TOO_LARGE",
                details={"limit": limit},
            )
        for index, item in enumerate(request_data):
            check_operation(item, f"operation {index} of the batch")

    async def execute_operation(
        self,
        request: Request,
        request_adapter: Any,
        request_data: GraphQLRequestData | list[GraphQLRequestData],
        context: Context,
        root_value: None,
        sub_response: Response,
    ) -> Any:
        """A batch's operations run one after the other, each counted by the rate limit (the request was counted
        once at admission) and each with its own cost limit; a refusal of one is its answer, not the batch's."""
        if not isinstance(request_data, list):
            return await super().execute_operation(
                request, request_adapter, request_data, context, root_value, sub_response
            )
        request.state.batch = True
        await self.guard.count_more(request, len(request_data) - 1)
        results: list[ExecutionResult] = []
        for data in request_data:
            if results and self.result_cache is not None:  # the version read at admission: an operation may have
                self.result_cache.started(request, None)  # written since, so the cache reads it again
            try:
                results.append(
                    await self.execute_single(request, request_adapter, sub_response, context, root_value, data)
                )
            except HTTPException as exc:  # no operation to run (a missing query, an unknown operationName...)
                results.append(refused_operation(exc.reason, CODES.get(exc.status_code, "BAD_REQUEST")))
        return results

    async def execute_single(
        self,
        request: Request,
        request_adapter: Any,
        sub_response: Response,
        context: Context,
        root_value: None,
        request_data: GraphQLRequestData,
    ) -> ExecutionResult:
        async def execute() -> ExecutionResult:
            known = self.known.document(request_data) if self.known is not None else None
            if known is not None:
                assert self.known is not None
                return await self.known.execute(known, request_data, context)
            return await super(GraphQLOverHTTP, self).execute_single(
                request, request_adapter, sub_response, context, root_value, request_data
            )

        try:
            if self.result_cache is None:
                return await execute()
            return await self.result_cache.answer(
                request, context.user if context.auth_failure is None else None, request_data, execute, self.encode_json
            )
        except HTTPException as exc:
            cause = exc.__cause__
            if isinstance(cause, InvalidOperationTypeError) and cause.operation_type == OperationType.MUTATION:
                raise RequestError(
                    405, "mutations must be sent with POST", "METHOD_NOT_ALLOWED", {"Allow": "POST"}
                ) from exc
            raise

    async def process_result(self, request: Request, result: ExecutionResult) -> GraphQLHTTPResponse:
        if isinstance(result, CachedResult):
            return EncodedBody(encoded_body=result.body)
        body = await super().process_result(request, result)
        if is_request_error(result):
            body.pop("data", None)
            if request.state.media_type == GRAPHQL_RESPONSE and not getattr(request.state, "batch", False):
                codes = [(e.extensions or {}).get("code") for e in result.errors or ()]
                request.state.sub_response.status_code = max(REQUEST_ERROR_STATUS.get(str(c), 400) for c in codes)
        return body

    def create_response(self, response_data: Any, sub_response: Response) -> Response:
        if isinstance(response_data, list):  # a batch: its answers in order, each encoded once
            content = b"[" + b",".join(self._encoded(item) for item in response_data) + b"]"
        else:
            content = self._encoded(response_data)
        response = Response(
            content, sub_response.status_code or 200, media_type=with_charset(sub_response.media_type or JSON)
        )
        response.headers.raw.extend(sub_response.headers.raw)
        response.background = sub_response.background
        return response

    def _encoded(self, body: Any) -> bytes:
        encoded = body["encoded_body"] if "encoded_body" in body else self.encode_json(body)
        return encoded.encode() if isinstance(encoded, str) else encoded


def check_operation(item: Any, where: str) -> None:
    """An operation of a batch is an object whose members have the types GraphQL over HTTP says."""
    if not isinstance(item, dict):
        raise HTTPException(400, f"{where} must be a JSON object")
    for member, types, what in OPERATION_MEMBERS:
        if not isinstance(item.get(member), types):
            raise HTTPException(400, f"{where}: `{member}` must be {what} or null, if provided")


def refused_operation(message: str, code: str) -> ExecutionResult:
    """The answer of a batch's operation that cannot run: a request error of its own."""
    return PreExecutionError(data=None, errors=[GraphQLError(message, extensions={"code": code})])
