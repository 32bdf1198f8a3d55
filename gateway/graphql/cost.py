"""What an operation may cost, computed before it runs, and the limit it must stay within.

One alias-rich query can fan out to thousands of Nomad calls (15 aliases × a page of 100 sessions × their kernels'
logs); the document limits of :mod:`gateway.graphql.document_limits` bound its size and shape, not that. The cost is
computed from the operation, its fragments and its variables, after validation and before execution:

- a field read from an object already loaded (a scalar, a part of a stored session) costs 0;
- a field with a resolver of its own costs 1 (it may read Redis: a page, a session, the owner, the idle verdict);
- a field that calls Nomad costs :data:`NOMAD_CALL` per call it makes (:data:`NOMAD_CALLS`);
- what is selected under a list is paid once per item it may hold: a connection's ``edges`` its page size
  (``first``/``last``, else the largest page), a list sized by an argument (``destroySession(ids)``) that
  argument's length, any other list its bound in :data:`LIST_SIZES` (else the largest page).

An operation over ``CARAVAN_GRAPHQL_MAX_COST`` is refused unexecuted, with ``QUERY_TOO_COSTLY`` and its cost and
the limit (400 with ``application/graphql-response+json``, like the other document limits). A subscription has a
single root field by the spec, and is not costed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any
from weakref import WeakKeyDictionary

from graphql import (
    DocumentNode,
    ExecutionResult,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    get_named_type,
    get_nullable_type,
    is_list_type,
    value_from_ast_untyped,
)
from graphql.utilities import get_operation_ast
from strawberry.extensions import SchemaExtension
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types.graphql import OperationType

from domain.apps import MAX_APPS
from domain.inference import MAX_REPLICAS
from domain.session_requests import MAX_CLUSTER_SIZE, MAX_COUNT, MAX_PREOPEN_PORTS
from gateway.graphql.sessions.mutations import MAX_DESTROY

Coordinate = tuple[str, str]
"""A field of the schema: (type name, field name)."""

NOMAD_CALL = 10
"""Cost of one Nomad call, in units of a field that reads Redis."""
MAX_KERNELS = max(MAX_CLUSTER_SIZE, MAX_REPLICAS)
"""Most kernels one session has."""

NOMAD_CALLS: Mapping[Coordinate, int] = {
    ("Kernel", "logs"): 2,  # stdout and stderr
    ("Query", "resourceGroups"): 2,  # the nodes and their live allocations
    ("Subscription", "kernelLogs"): 2,  # its log files, then the follow
    ("Mutation", "execInKernel"): 1,  # one exec (its WebSocket)
}
"""Nomad calls one resolution of the field makes (at most). Mutations make none: the gateway only asks the scheduler's
job owner to stop or restart jobs (``scheduler.job_owner``), in Redis; but execInKernel runs a command through Nomad."""
SIZED_BY: Mapping[Coordinate, tuple[str, int]] = {
    ("Mutation", "destroySession"): ("ids", MAX_DESTROY),
}
"""List fields with one item per element of a list argument (and their own cost paid per item): the argument, and
the most elements it takes (when its length is not known before execution)."""
LIST_SIZES: Mapping[Coordinate, int] = {
    ("Session", "kernels"): MAX_KERNELS,
    ("CreateSessionPayload", "sessions"): MAX_COUNT,
    ("Session", "apps"): MAX_APPS + MAX_PREOPEN_PORTS,  # declared apps, and each preopened port
    ("SessionSpec", "apps"): MAX_APPS,
}
"""The most items of other lists whose items may cost something; any other list counts as the largest page."""


def operation_cost(
    schema: GraphQLSchema,
    document: DocumentNode,
    operation_name: str | None,
    variables: Mapping[str, Any] | None,
    max_page: int,
) -> int:
    """The cost of the operation ``operation_name`` of ``document`` (0 if there is no such operation).

    ``variables`` as sent (uncoerced; a missing one takes its default); ``max_page``: the largest page of a connection.
    """
    operation = get_operation_ast(document, operation_name)
    if operation is None:
        return 0
    root = schema.get_root_type(operation.operation)
    if root is None:
        return 0
    walk = _Walk(schema, document, operation, variables or {}, max_page)
    return walk.selections(root, operation.selection_set, 1, frozenset())


class _Walk:
    def __init__(
        self,
        schema: GraphQLSchema,
        document: DocumentNode,
        operation: OperationDefinitionNode,
        variables: Mapping[str, Any],
        max_page: int,
    ) -> None:
        self.schema = schema
        self.max_page = max_page
        self.fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
        defaults = {
            v.variable.name.value: value_from_ast_untyped(v.default_value)
            for v in operation.variable_definitions or ()
            if v.default_value is not None
        }
        self.variables = {**defaults, **variables}

    def selections(
        self, parent: GraphQLObjectType, selection_set: SelectionSetNode | None, times: int, spreading: frozenset[str]
    ) -> int:
        """Cost of a selection set on ``parent`` resolved ``times`` times; ``spreading``: the fragments around it."""
        return sum(
            self.field(on, node, times, inside) for node, on, inside in self.fields_of(parent, selection_set, spreading)
        )

    def field(self, parent: GraphQLObjectType, node: FieldNode, times: int, spreading: frozenset[str]) -> int:
        name = node.name.value
        definition = parent.fields.get(name)
        if definition is None:  # __typename and introspection: nothing of ours runs
            return 0
        coordinate = (parent.name, name)
        arguments = {a.name.value: value_from_ast_untyped(a.value, self.variables) for a in node.arguments or ()}
        items = self.items(coordinate, arguments) if is_list_type(get_nullable_type(definition.type)) else 1
        own = _weight(coordinate, definition.extensions) * times * (items if coordinate in SIZED_BY else 1)
        returned = get_named_type(definition.type)
        if not isinstance(returned, GraphQLObjectType) or node.selection_set is None:
            return own
        if _is_connection(returned):
            return own + self.connection(
                returned, node.selection_set, times, _page(arguments, self.max_page), spreading
            )
        return own + self.selections(returned, node.selection_set, times * items, spreading)

    def connection(
        self,
        connection: GraphQLObjectType,
        selection_set: SelectionSetNode,
        times: int,
        page: int,
        spreading: frozenset[str],
    ) -> int:
        """A connection's selections: its ``edges`` (and what is under them) hold ``page`` items."""
        total = 0
        for node, on, inside in self.fields_of(connection, selection_set, spreading):
            if node.name.value == "edges":
                edge = get_named_type(on.fields["edges"].type)
                assert isinstance(edge, GraphQLObjectType)
                total += self.selections(edge, node.selection_set, times * page, inside)
            else:
                total += self.field(on, node, times, inside)
        return total

    def fields_of(
        self, parent: GraphQLObjectType, selection_set: SelectionSetNode | None, spreading: frozenset[str]
    ) -> Iterator[tuple[FieldNode, GraphQLObjectType, frozenset[str]]]:
        """The fields selected on ``parent`` through its fragments, each with the type it is read on and the named
        fragments it is inside (validation refuses cycles; they are never followed here either)."""
        for selection in selection_set.selections if selection_set else ():
            if self.skipped(selection):
                continue
            if isinstance(selection, FieldNode):
                yield selection, parent, spreading
            elif isinstance(selection, InlineFragmentNode):
                yield from self.fields_of(self.on(selection, parent), selection.selection_set, spreading)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = self.fragments.get(name)
                if fragment is not None and name not in spreading:
                    yield from self.fields_of(self.on(fragment, parent), fragment.selection_set, spreading | {name})

    def items(self, coordinate: Coordinate, arguments: Mapping[str, Any]) -> int:
        """How many items a list field may hold."""
        if coordinate in SIZED_BY:
            argument, most = SIZED_BY[coordinate]
            value = arguments.get(argument)
            if isinstance(value, list):
                return len(value)
            return most if value is None else 1  # unknown; or one value, which GraphQL reads as a list of one
        return LIST_SIZES.get(coordinate, self.max_page)

    def on(self, fragment: InlineFragmentNode | FragmentDefinitionNode, parent: GraphQLObjectType) -> GraphQLObjectType:
        """The type a fragment's fields are read on (the schema has no interfaces or unions: its parent)."""
        if fragment.type_condition is None:
            return parent
        named = self.schema.get_type(fragment.type_condition.name.value)
        return named if isinstance(named, GraphQLObjectType) else parent

    def skipped(self, selection: Any) -> bool:
        """Left out by ``@skip(if: true)`` or ``@include(if: false)`` (an unknown condition counts it in)."""
        for directive in getattr(selection, "directives", None) or ():
            if directive.name.value in ("skip", "include"):
                condition = next(
                    (
                        value_from_ast_untyped(a.value, self.variables)
                        for a in directive.arguments or ()
                        if a.name.value == "if"
                    ),
                    None,
                )
                if condition is (directive.name.value == "skip"):
                    return True
        return False


def _weight(coordinate: Coordinate, extensions: Mapping[str, Any]) -> int:
    if coordinate in NOMAD_CALLS:
        return NOMAD_CALLS[coordinate] * NOMAD_CALL
    definition = extensions.get(GraphQLCoreConverter.DEFINITION_BACKREF)
    return 1 if definition is not None and definition.base_resolver is not None else 0


def _is_connection(type_: GraphQLObjectType) -> bool:
    return "edges" in type_.fields and "pageInfo" in type_.fields


def _page(arguments: Mapping[str, Any], max_page: int) -> int:
    """Items of the page a connection's arguments ask for (the largest page unless first/last says fewer)."""
    for name in ("first", "last"):
        value = arguments.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return max(0, min(value, max_page))
    return max_page


CACHED_COSTS = 1024
"""Costs kept per schema (per worker process), by document text, operation and variables: clients send the same few
operations again and again, and the walk cost about a twentieth of an uncached page."""
_COSTS: WeakKeyDictionary[GraphQLSchema, dict[tuple[str, str | None, str, int], int]] = WeakKeyDictionary()


def known_cost(
    schema: GraphQLSchema,
    query: str | None,
    document: DocumentNode,
    operation_name: str | None,
    variables: Mapping[str, Any] | None,
    max_page: int,
) -> int:
    """:func:`operation_cost`, kept for the document's text (a pure function of it, the operation, the variables and
    the page limit); computed afresh when the variables are not plain JSON or there is no text."""
    try:
        key = (query, operation_name, json.dumps(variables or {}, sort_keys=True), max_page) if query else None
    except (TypeError, ValueError):
        key = None
    if key is None:
        return operation_cost(schema, document, operation_name, variables, max_page)
    costs = _COSTS.setdefault(schema, {})
    cost = costs.get(key)
    if cost is None:
        cost = operation_cost(schema, document, operation_name, variables, max_page)
        if len(costs) >= CACHED_COSTS:
            del costs[next(iter(costs))]  # the oldest
        costs[key] = cost
    return cost


class CostLimit(SchemaExtension):
    """Refuses a query or mutation costing more than ``max_cost`` before it executes (``QUERY_TOO_COSTLY``)."""

    def __init__(self, max_cost: int, max_page: int) -> None:
        self.max_cost = max_cost
        self.max_page = max_page

    def on_execute(self) -> Iterator[None]:
        context = self.execution_context
        if context.graphql_document is not None and context.operation_type is not OperationType.SUBSCRIPTION:
            cost = known_cost(
                context.schema._schema,
                context.query,
                context.graphql_document,
                context.operation_name,
                context.variables,
                self.max_page,
            )
            if cost > self.max_cost:
                error = GraphQLError(
                    f"the operation costs {cost}, more than the limit of {self.max_cost}: ask for smaller pages, "
                    "fewer aliases, or fewer fields that call Nomad (kernel logs cost "
                    f"{NOMAD_CALLS[('Kernel', 'logs')] * NOMAD_CALL} each)",
                    extensions={"code": "QUERY_TOO_COSTLY", "cost": cost, "limit": self.max_cost},
                )
                context.result = ExecutionResult(data=None, errors=[error])  # Strawberry then does not execute
        yield
