"""Answers to repeated session queries, served without executing GraphQL while no session changed.

Dashboards and scripts poll the same listing again and again; executing a page of 50 sessions costs
milliseconds of graphql-core time, the same every time while nothing changed. This cache keeps the final
response body of such queries (per worker process, bounded in entries and bytes) and proves each reuse
fresh against one counter in Redis (``Keys.sessions_version``), which ``SessionStore`` increments in the
MULTI of every write of a session document or listing index:

- What may be cached is decided once per document (kept next to the parse cache): a query (never a
  mutation or subscription) whose root fields are in :data:`ROOT_FIELDS` and whose every other selected
  field is a pure function of the object it is read from: a field without a resolver, or one listed in
  :data:`PURE_RESOLVERS`. Anything reaching other data (``owner`` reads users, ``idleChecks`` the idle
  checker's reports, ``logs`` Nomad, ``viewer``, policies, the clock) has a resolver and is refused.
- The key is the document text, the operation name, the variables and the viewer's id, role and projects
  (what ``domain.access`` decides visibility by): a viewer never gets an answer made for another scope.
- The version is read before execution (by the admission script with the token check and the rate limit's count,
  ``gateway.graphql.rate_limit.ADMIT``; by a GET of its own when that failed); a stored answer of that version is
  the answer. A miss executes and is stored only if the version is still the one read before execution, so an answer
  that a racing write may have torn is never kept. Answers with errors (or extensions) are never stored. (An answer
  is kept under the version read *before* it executed, so one torn by a racing write could never be served anyway:
  the version has moved past it. The check keeps such dead answers from pushing out live ones.) Misses of one key
  and version that arrive together execute once: the others wait for that answer (after a write, every polling
  client misses at once).
- The counter only grows while Redis keeps its data (Caravan's runs with ``appendfsync always``). A Redis restored
  from an older backup can count up to a number already seen: restart the gateways with it.

Authentication and the rate limit run for every request, hit or not (the view does them before this).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    SelectionNode,
    SelectionSetNode,
    get_named_type,
    is_leaf_type,
)
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.requests import Request
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types import ExecutionResult

from core.keys import Keys
from domain.users import User
from gateway.graphql.document_cache import CACHED_DOCUMENTS, parsed_document

log = logging.getLogger(__name__)

ROOT_FIELDS = frozenset({"session", "sessions"})
"""Query fields whose answer depends only on stored sessions, listing indexes and the viewer's scope."""
PURE_RESOLVERS = frozenset({("Session", "mainKernel")})
"""Fields with a resolver that only reads the object it is called on (type name, field name)."""
TRANSPARENT_DIRECTIVES = frozenset({"include", "skip"})
"""Directives that only select fields (by variables, which are part of the key)."""

WAITS = 3
"""Executions of newer versions a request waits for before it executes on its own (under constant writes)."""
MAX_ENTRIES = 512
"""Answers kept per worker process (least recently used dropped first)."""
MAX_BYTES = 32 << 20
"""Bytes of answers kept per worker process."""
MAX_ENTRY_BYTES = MAX_BYTES // 8
"""A larger answer is not kept: it would push out many small ones."""


# -- what may be cached: decided once per document -----------------------------------------------


def cacheable_operation(schema: GraphQLSchema, document: DocumentNode, operation_name: str | None) -> bool:
    """Is the operation a query whose every selected field is a pure function of stored sessions (and the viewer)?"""
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    if operation_name is not None:
        operations = [o for o in operations if o.name is not None and o.name.value == operation_name]
    if len(operations) != 1 or operations[0].operation is not OperationType.QUERY or schema.query_type is None:
        return False
    operation = operations[0]
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    return _only_transparent(operation) and _pure(
        schema, schema.query_type, operation.selection_set, fragments, root=True, spreading=frozenset()
    )


def _only_transparent(node: Any) -> bool:
    return all(d.name.value in TRANSPARENT_DIRECTIVES for d in getattr(node, "directives", None) or ())


def _pure_field(parent: GraphQLObjectType, name: str, *, root: bool) -> bool:
    if root:
        return name in ROOT_FIELDS
    if (parent.name, name) in PURE_RESOLVERS:
        return True
    field = parent.fields[name]
    definition = field.extensions.get(GraphQLCoreConverter.DEFINITION_BACKREF)
    return (
        definition is not None
        and definition.base_resolver is None
        and not definition.extensions
        and not definition.permission_classes
    )


def _pure(
    schema: GraphQLSchema,
    parent: GraphQLObjectType,
    selection_set: SelectionSetNode,
    fragments: dict[str, FragmentDefinitionNode],
    *,
    root: bool,
    spreading: frozenset[str],
) -> bool:
    return all(
        _only_transparent(selection)
        and _pure_selection(schema, parent, selection, fragments, root=root, spreading=spreading)
        for selection in selection_set.selections
    )


def _pure_selection(
    schema: GraphQLSchema,
    parent: GraphQLObjectType,
    selection: SelectionNode,
    fragments: dict[str, FragmentDefinitionNode],
    *,
    root: bool,
    spreading: frozenset[str],
) -> bool:
    if isinstance(selection, FieldNode):
        return _pure_field_selection(schema, parent, selection, fragments, root=root, spreading=spreading)
    if isinstance(selection, InlineFragmentNode):
        on = schema.get_type(selection.type_condition.name.value) if selection.type_condition else parent
        return on is parent and _pure(
            schema, parent, selection.selection_set, fragments, root=root, spreading=spreading
        )
    if isinstance(selection, FragmentSpreadNode):
        name = selection.name.value
        fragment = fragments.get(name)
        return (
            fragment is not None
            and name not in spreading
            and _only_transparent(fragment)
            and schema.get_type(fragment.type_condition.name.value) is parent
            and _pure(schema, parent, fragment.selection_set, fragments, root=root, spreading=spreading | {name})
        )
    return False


def _pure_field_selection(
    schema: GraphQLSchema,
    parent: GraphQLObjectType,
    selection: FieldNode,
    fragments: dict[str, FragmentDefinitionNode],
    *,
    root: bool,
    spreading: frozenset[str],
) -> bool:
    name = selection.name.value
    if name == "__typename":
        return True
    if name not in parent.fields or not _pure_field(parent, name, root=root):
        return False
    returned = get_named_type(parent.fields[name].type)
    if is_leaf_type(returned):
        return True
    if not isinstance(returned, GraphQLObjectType) or selection.selection_set is None:
        return False  # an interface or union: left to execution
    return _pure(schema, returned, selection.selection_set, fragments, root=False, spreading=spreading)


@lru_cache(maxsize=CACHED_DOCUMENTS)
def cacheable(schema: GraphQLSchema, query: str, max_tokens: int | None, operation_name: str | None) -> bool:
    """``cacheable_operation`` of the (cached) parse of ``query``; False if it does not parse."""
    document = parsed_document(query, max_tokens)
    return document is not None and cacheable_operation(schema, document, operation_name)


# -- the stored answers -------------------------------------------------------------------------------


CacheKey = tuple[str, str | None, str, str, str, tuple[str, ...]]
"""Document, operation name, variables (canonical JSON), viewer id, role, projects."""


def cache_key(data: GraphQLRequestData, viewer: User) -> CacheKey | None:
    try:
        variables = json.dumps(data.variables, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    assert data.query is not None
    return (data.query, data.operation_name, variables, viewer.id, viewer.role.value, viewer.projects)


@dataclass(frozen=True)
class Entry:
    version: str
    body: bytes


class Answers:
    """An LRU of answer bodies bounded in entries and in bytes.

    Hand-written: a few lines, and the usual libraries (cachetools, functools) bound only one of the two.
    """

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[CacheKey, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey, version: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None or entry.version != version:
            return None
        self._entries.move_to_end(key)
        return entry.body

    def put(self, key: CacheKey, version: str, body: bytes) -> None:
        if len(body) > min(MAX_ENTRY_BYTES, self.max_bytes):
            return
        self._drop(key)
        self._entries[key] = Entry(version, body)
        self.bytes += len(body)
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: CacheKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= len(entry.body)


# -- in the request path ------------------------------------------------------------------------------


@dataclass
class CachedResult(ExecutionResult):
    """An answer already encoded as the response body (``body``): a stored one, or a miss just stored."""

    body: bytes = b""


class EncodedBody(GraphQLHTTPResponse):
    """A response body already encoded, so that the view does not encode it again: what the view's
    ``process_result`` returns for a :class:`CachedResult`, handed by Strawberry untouched to its
    ``create_response``."""

    encoded_body: bytes
    """The body as sent. No GraphQL response has this member, so its presence marks an encoded body."""


Encode = Callable[[Any], str | bytes]


@dataclass(frozen=True)
class Shared:
    """What one execution hands the requests that waited for it: its kept answer, or why there is none."""

    body: bytes | None
    outdated: bool
    """A write landed while it executed: its answer was not kept (those waiting read the version again)."""


class ResultCache:
    """One per gateway worker process (per app): its answers, and the steps the HTTP view calls.

    Misses of one key and version that arrive together execute once: the first executes, the others wait
    for its answer (polling dashboards all miss at once after each write).
    """

    def __init__(
        self,
        redis: Callable[[], Redis],
        keys: Keys,
        schema: GraphQLSchema,
        max_tokens: int | None,
        answers: Answers | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.schema = schema
        self.max_tokens = max_tokens
        self.answers = answers or Answers()
        self._executing: dict[tuple[CacheKey, str], asyncio.Future[Shared]] = {}
        self.hits = 0
        self.stored = 0
        self.outdated = 0
        """Misses not stored because a write landed while they executed."""

    @property
    def reads(self) -> tuple[str, ...]:
        """Keys to read at admission (with the token check and the rate limit's count), at the start of every
        request."""
        return (self.keys.sessions_version,)

    def started(self, request: Request, values: Sequence[Any] | None) -> None:
        """Note the version read at admission (None: not read, the cache reads it if it needs it)."""
        request.state.sessions_version = _version(values[0]) if values else None

    async def answer(
        self,
        request: Request,
        viewer: User | None,
        data: GraphQLRequestData,
        execute: Callable[[], Awaitable[ExecutionResult]],
        encode: Encode,
    ) -> ExecutionResult:
        """The stored answer if it is current, else ``execute()`` (kept if clean and nothing was written meanwhile)."""
        if (
            viewer is None
            or data.query is None
            or not cacheable(self.schema, data.query, self.max_tokens, data.operation_name)
        ):
            return await execute()
        key = cache_key(data, viewer)
        version = getattr(request.state, "sessions_version", None) or await self._current_version()
        for _ in range(WAITS):
            if key is None or version is None:
                break
            body = self.answers.get(key, version)
            if body is None and (executing := self._executing.get((key, version))) is not None:
                shared = await asyncio.shield(executing)
                if shared.outdated:  # a write landed while it executed: wait for an answer of the new version
                    version = await self._current_version()
                    continue
                if shared.body is None:  # it failed (errors are not shared): execute on our own
                    break
                body = shared.body
            if body is not None:
                self.hits += 1
                request.state.operation = OperationType.QUERY.value  # for the request metrics, as an execution notes
                return CachedResult(data=None, errors=None, body=body)
            return await self._execute_and_keep(key, version, execute, encode)
        return await execute()

    async def _execute_and_keep(
        self, key: CacheKey, version: str, execute: Callable[[], Awaitable[ExecutionResult]], encode: Encode
    ) -> ExecutionResult:
        executing: asyncio.Future[Shared] = asyncio.get_running_loop().create_future()
        self._executing[(key, version)] = executing
        shared = Shared(None, outdated=False)
        try:
            result = await execute()
            if result.errors or result.extensions or result.data is None:
                return result
            # the body the view would make of a clean result (strawberry.http.process_result), encoded once
            encoded = encode({"data": result.data})
            body = encoded.encode() if isinstance(encoded, str) else encoded
            if await self._current_version() == version:
                self.answers.put(key, version, body)
                self.stored += 1
                shared = Shared(body, outdated=False)
            else:
                self.outdated += 1
                shared = Shared(None, outdated=True)
            return CachedResult(data=None, errors=None, body=body)
        finally:
            del self._executing[(key, version)]
            executing.set_result(shared)

    async def _current_version(self) -> str | None:
        try:
            return _version(await self.redis().get(self.keys.sessions_version))
        except (RedisError, OSError) as exc:  # nothing is served or stored without a version
            log.debug("session version not read: %s", exc)
            return None


def _version(value: Any) -> str:
    """No counter yet (nothing written since Redis started empty) is version 0."""
    return str(value) if value is not None else "0"
