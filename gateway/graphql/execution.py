"""graphql-core's executor, with plain data fields read straight off their objects.

Most of what a page of sessions answers are plain data fields: a value read from an attribute of an object already in
hand (``Session.name``, ``SessionEdge.cursor``, ``SessionEdge.node``...), with no resolver, argument, permission or
field extension of its own (Strawberry's "basic" fields). graphql-core executes each of them as it executes any
field: a ``Path``, a resolve-info object, Strawberry's resolver wrapper, two awaitable checks and the nested
``complete_value`` steps, about 450 times for ``sessions(first: 50)``, which made them most of what an uncached page
cost.

:class:`PlainFieldsExecution` reads such a field as those steps would end up reading it: the attribute (by
Strawberry's default resolver, as the field itself would call it), then for a scalar or an enum the type's
``coerce_output_value``, for an object (without ``is_type_of``) its selection set executed, its errors handled as
``execute_field`` handles them. A plain field whose value is null, an error, or not coercible goes the ordinary way,
so every such error, its path and the nulls it propagates are graphql-core's own. Fields with a resolver, and every
field while an extension resolves through middleware, are executed as before.

A selection set whose fields are all plain (lists of scalars, enums or plain objects included, and ``__typename``), and
so are those of the objects below it, is read by a :data:`Plan` compiled from it (once per operation; across
operations of a cached document without directives): one pass building the answer, no ``Path``, resolve info or
completion per field. It answers only when every value is one graphql-core would complete without an error; anything
else (a null where none is allowed, an error as a value, a value its scalar or enum refuses or coerces to null, a list
that is not a Python list) makes the plan give up on that selection set, which then goes field by field as above (its
objects' selection sets get their own plans again). A plan's reads are attribute reads: reading again changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from enum import Enum
from typing import Any

from graphql import (
    FieldNode,
    GraphQLLeafType,
    GraphQLList,
    GraphQLNamedOutputType,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLSchema,
    OperationDefinitionNode,
    SelectionSetNode,
    Undefined,
    is_leaf_type,
    is_list_type,
)
from graphql.execution.collect_fields import FieldDetails, FieldDetailsList, GroupedFieldSet
from graphql.pyutils import AwaitableOrValue, Path, gather_with_cancel
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import CustomGraphQLEnumType, GraphQLCoreConverter
from strawberry.types.field import StrawberryField

PlainField = tuple[Callable[[Any, str], object], str, GraphQLNamedOutputType, GraphQLOutputType]
"""How to read one plain field: Strawberry's default resolver, the attribute's name, the named type (a leaf, or an
object type to complete) and the field's type as declared (with its non-null wrapper)."""


def plain_fields(schema: GraphQLSchema) -> dict[tuple[str, str], PlainField]:
    """The plain data fields of ``schema`` by (object type, field): Strawberry fields without resolver or field
    extensions (its own test: ``is_basic_field``, whose resolver is its ``_get_basic_result``) and without arguments,
    whose type is a scalar, an enum or an object type without ``is_type_of``, or a list of one of those, nullable or
    not (a list of lists is not). The named type of a list field is its items'."""
    found: dict[tuple[str, str], PlainField] = {}
    for type_ in schema.type_map.values():
        if not isinstance(type_, GraphQLObjectType) or type_.name.startswith("__"):
            continue
        for name, field in type_.fields.items():
            definition = field.extensions.get(GraphQLCoreConverter.DEFINITION_BACKREF)
            named = item_type(field.type)
            if (
                isinstance(definition, StrawberryField)
                and definition.is_basic_field
                and getattr(field.resolve, "_is_default", False)
                and not field.args
                and (is_leaf_type(named) or (isinstance(named, GraphQLObjectType) and named.is_type_of is None))
                and definition.default_resolver is not None
            ):
                assert isinstance(named, GraphQLLeafType | GraphQLObjectType)
                found[type_.name, name] = (definition.default_resolver, definition.python_name, named, field.type)
    return found


def item_type(type_: GraphQLOutputType) -> GraphQLOutputType:
    """The named type of a field's type, through its non-null wrappers and one list (a list of lists stays a list)."""
    if isinstance(type_, GraphQLNonNull):
        type_ = type_.of_type
    if isinstance(type_, GraphQLList):
        type_ = type_.of_type
        if isinstance(type_, GraphQLNonNull):
            type_ = type_.of_type
    return type_


TYPENAME, SINGLE_LEAF, SINGLE_OBJECT, LIST_LEAF, LIST_OBJECT = range(5)
SHARED_PLANS = 1024
"""Plans (and operations' directive checks) kept across operations per worker; past it, all are dropped."""
Coerce = Callable[[Any], Any]
Step = tuple[str, int, Callable[[Any, str], object] | None, str, "Coerce | Plan | str", bool, bool]
"""One field of a :data:`Plan`: its response name, its kind (one of the above), how to read it (Strawberry's default
resolver and the attribute), what completes its value (a leaf type's :func:`coercer`, the plan of its object type's
selection set; ``__typename``: the parent type's name), whether it may be null, whether its list's items may."""
Plan = tuple[Step, ...]
"""A selection set compiled: its fields in the selection's order."""

Reading = tuple[tuple[str, PlainField | None], ...]
"""A selection set's fields in order, each with how to read it when it is plain (else None: the ordinary way)."""


class PlainFieldsExecution(StrawberryGraphQLCoreExecutionContext):
    """Strawberry's execution context; :func:`execution_for` makes one per schema, with its :data:`plain` fields."""

    plain: Mapping[tuple[str, str], PlainField] = {}
    coercers: Mapping[str, Coerce] = {}
    """Each leaf type's :func:`coercer`, by name."""
    shared_plans: dict[tuple[Any, ...], tuple[GroupedFieldSet, Plan | None]] = {}
    """Plans kept across operations (per schema: :func:`execution_for` gives each its own), by parent type and the
    identity of the selection set's field nodes."""
    undirected: dict[int, tuple[OperationDefinitionNode, bool]] = {}
    """Per operation node (kept with it): :meth:`fixed_selections`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plans: dict[tuple[int, str], tuple[GroupedFieldSet, Plan | None]] = {}
        self._fixed: bool | None = None
        self._readings: dict[tuple[int, str], tuple[GroupedFieldSet, Reading]] = {}
        """Per selection set (graphql-core collects each once per operation: the 50 nodes of a page share theirs)
        and parent type, how its fields are read; the set itself is kept with it, so its id is not reused."""

    def plan(self, parent_type: GraphQLObjectType, grouped_field_set: GroupedFieldSet) -> Plan | None:
        """How to read this whole selection set (and those below it) in one go, or None if any field in it is not
        plain (a resolver, an argument, an abstract type, a list of lists, a deferred fragment...).

        Compiled once per operation; and kept across operations of the same (cached, so the same objects) document
        when it has no directive at all: its selection sets are then collected the same whatever the variables."""
        key = (id(grouped_field_set), parent_type.name)
        kept = self._plans.get(key)
        if kept is not None and kept[0] is grouped_field_set:
            return kept[1]
        shared_key = None
        if self.fixed_selections():
            shared_key = (parent_type.name, *((n, *map(id, map(node_of, d))) for n, d in grouped_field_set.items()))
            shared = self.shared_plans.get(shared_key)
            if shared is not None:
                self._plans[key] = (grouped_field_set, shared[1])
                return shared[1]
        plan = self.compile(parent_type, grouped_field_set)
        self._plans[key] = (grouped_field_set, plan)
        if shared_key is not None:
            if len(self.shared_plans) >= SHARED_PLANS:
                self.shared_plans.clear()
            self.shared_plans[shared_key] = (grouped_field_set, plan)  # the set holds its nodes: their ids stay theirs
        return plan

    def fixed_selections(self) -> bool:
        """True if the operation and its fragments carry no directive (so no @skip, @include or @defer)."""
        if self._fixed is None:
            key = id(self.operation)
            kept = self.undirected.get(key)
            if kept is None or kept[0] is not self.operation:
                if len(self.undirected) >= SHARED_PLANS:
                    self.undirected.clear()
                fixed = not has_directives(self.operation.selection_set) and not any(
                    has_directives(f.selection_set) for f in self.fragment_definitions.values()
                )
                kept = self.undirected[key] = (self.operation, fixed)
            self._fixed = kept[1]
        return self._fixed

    def compile(self, parent_type: GraphQLObjectType, grouped_field_set: GroupedFieldSet) -> Plan | None:
        steps: list[Step] = []
        for response_name, details in grouped_field_set.items():
            node = details[0].node
            if node.name.value == "__typename":
                steps.append((response_name, TYPENAME, None, "", parent_type.name, False, False))
                continue
            read = None if node.arguments else self.plain.get((parent_type.name, node.name.value))
            if read is None or any(detail.node.directives and has_stream(detail.node) for detail in details):
                return None
            resolver, attribute, named, declared = read
            nullable = not isinstance(declared, GraphQLNonNull)
            listed = declared.of_type if isinstance(declared, GraphQLNonNull) else declared
            items_nullable = False
            if isinstance(listed, GraphQLList):
                items_nullable = not isinstance(listed.of_type, GraphQLNonNull)
            target: Coerce | Plan
            if isinstance(named, GraphQLLeafType):
                target = self.coercers[named.name]
            else:
                assert isinstance(named, GraphQLObjectType)
                collected = self.collect_subfields(named, details)
                if collected.new_defer_usages or collected.forbidden_directive_instances:
                    return None
                sub = self.plan(named, collected.grouped_field_set)
                if sub is None:
                    return None
                target = sub
            is_leaf = isinstance(named, GraphQLLeafType)
            if isinstance(listed, GraphQLList):
                kind = LIST_LEAF if is_leaf else LIST_OBJECT
            else:
                kind = SINGLE_LEAF if is_leaf else SINGLE_OBJECT
            steps.append((response_name, kind, resolver, attribute, target, nullable, items_nullable))
        return tuple(steps)

    def reading(self, parent_type: GraphQLObjectType, grouped_field_set: GroupedFieldSet) -> Reading:
        key = (id(grouped_field_set), parent_type.name)
        kept = self._readings.get(key)
        if kept is not None and kept[0] is grouped_field_set:
            return kept[1]
        plain, parent = self.plain, parent_type.name
        reading = tuple(
            (name, read if read is not None and not is_listed(read[3]) else None)
            for name, details in grouped_field_set.items()
            for read in [None if details[0].node.arguments else plain.get((parent, details[0].node.name.value))]
        )
        self._readings[key] = (grouped_field_set, reading)
        return reading

    def execute_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Path | None,
        grouped_field_set: GroupedFieldSet,
        position_context: Any,
    ) -> AwaitableOrValue[dict[str, Any]]:
        manager = self.middleware_manager
        if manager is not None and manager.middlewares:  # an extension wraps every resolver: each field goes through it
            return super().execute_fields(parent_type, source_value, path, grouped_field_set, position_context)
        plan = self.plan(parent_type, grouped_field_set)
        if plan is not None:
            try:
                return run(plan, source_value)
            except Exception:  # anything but plain values: field by field below, graphql-core's errors and nulls
                pass
        done: dict[str, Any] = {}
        waiting: list[str] = []
        try:
            rest = self.read_fields(parent_type, source_value, path, grouped_field_set, position_context, done, waiting)
            if not rest and not waiting:
                return done  # in the selection's order already
            if not done:
                return super().execute_fields(parent_type, source_value, path, grouped_field_set, position_context)
            executed = super().execute_fields(parent_type, source_value, path, rest, position_context) if rest else {}
        except Exception:
            if waiting:  # as graphql-core does: what was started is settled, its errors observed
                self.settle_in_background([done[name] for name in waiting])
            raise
        order = list(grouped_field_set)
        if not waiting and not self.is_awaitable(executed):
            assert isinstance(executed, dict)
            return in_order(order, done, executed)

        async def merged() -> dict[str, Any]:
            ordinary = await executed if self.is_awaitable(executed) else executed
            assert isinstance(ordinary, dict)
            if waiting:
                done.update(zip(waiting, await gather_with_cancel(*(done[n] for n in waiting)), strict=True))
            return in_order(order, done, ordinary)

        return merged()

    def read_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Path | None,
        grouped_field_set: GroupedFieldSet,
        position_context: Any,
        done: dict[str, Any],
        waiting: list[str],
    ) -> GroupedFieldSet:
        """Read the plain fields into ``done`` (``waiting``: those still to await); the fields left to graphql-core."""
        rest: GroupedFieldSet = {}
        for response_name, read in self.reading(parent_type, grouped_field_set):
            if read is not None and isinstance(leaf := read[2], GraphQLLeafType):  # the most common case, inline
                try:
                    value = read[0](source_value, read[1])
                    if value is not None and value is not Undefined and not isinstance(value, Exception):
                        coerced = leaf.coerce_output_value(value)
                        if coerced is not None and coerced is not Undefined:
                            done[response_name] = coerced
                            continue
                except Exception:  # the ordinary way raises it again, located
                    pass
                rest[response_name] = grouped_field_set[response_name]
                continue
            details = grouped_field_set[response_name]
            if read is None or not self.read_plain(
                read, source_value, path, parent_type, response_name, details, position_context, done
            ):
                rest[response_name] = details
            elif self.is_awaitable(done[response_name]):
                waiting.append(response_name)
        return rest

    def read_plain(
        self,
        read: PlainField,
        source_value: Any,
        path: Path | None,
        parent_type: GraphQLObjectType,
        response_name: str,
        details: FieldDetailsList,
        position_context: Any,
        done: dict[str, Any],
    ) -> bool:
        """Put a plain object field's value in ``done`` as ``execute_field`` would complete it (its selection set
        executed, its errors handled as that handles them); False to leave it to graphql-core (a null, an error)."""
        resolver, attribute, named, declared = read
        assert isinstance(named, GraphQLObjectType)
        try:
            value = resolver(source_value, attribute)
        except Exception:  # the ordinary way raises it again, located
            return False
        if value is None or value is Undefined or isinstance(value, Exception):
            return False  # null (and an error if the field is non-null): the ordinary way
        field_path = Path(path, response_name, parent_type.name)
        try:
            completed = self.collect_and_execute_subfields(named, details, field_path, value, position_context)
        except Exception as error:
            self.handle_field_error(error, declared, details, field_path)  # raises it on if the field is non-null
            completed = None
        if self.is_awaitable(completed):
            completed = self.settled(completed, declared, details, field_path)
        done[response_name] = completed
        return True

    async def settled(
        self, completed: Awaitable[Any], declared: GraphQLOutputType, details: FieldDetailsList, path: Path
    ) -> Any:
        """An object field's completion once awaited, its error handled as ``execute_field`` handles it."""
        try:
            return await completed
        except Exception as error:
            self.handle_field_error(error, declared, details, path)
            return None


def is_listed(declared: GraphQLOutputType) -> bool:
    return is_list_type(declared.of_type if isinstance(declared, GraphQLNonNull) else declared)


def node_of(details: FieldDetails) -> FieldNode:
    return details.node


def has_directives(selection_set: SelectionSetNode | None) -> bool:
    """Does any selection in this set, or below it, carry a directive?"""
    if selection_set is None:
        return False
    return any(
        bool(selection.directives) or has_directives(getattr(selection, "selection_set", None))
        for selection in selection_set.selections
    )


def has_stream(node: FieldNode) -> bool:
    return any(directive.name.value == "stream" for directive in node.directives or ())


class Irregular(Exception):
    """A value the plan does not read (a null where one is not allowed, an error, not a list...)."""


def run(plan: Plan, source: Any) -> dict[str, Any]:
    """The answer of a selection set over ``source`` by ``plan``, as graphql-core completes it when every value is
    plain; raises (:class:`Irregular`, or whatever reading or coercing raised) on anything else."""
    answer: dict[str, Any] = {}
    for response_name, kind, resolver, attribute, target, nullable, items_nullable in plan:
        if kind == TYPENAME:
            answer[response_name] = target
            continue
        value = resolver(source, attribute)  # type: ignore[misc]
        if value is None:
            if not nullable:
                raise Irregular
            answer[response_name] = None
        elif kind == SINGLE_LEAF:
            if value is Undefined or isinstance(value, Exception):
                raise Irregular
            coerced = target(value)  # type: ignore[operator]
            if coerced is None or coerced is Undefined:
                raise Irregular
            answer[response_name] = coerced
        elif kind == SINGLE_OBJECT:
            if value is Undefined or isinstance(value, Exception):
                raise Irregular
            answer[response_name] = run(target, value)  # type: ignore[arg-type]
        elif type(value) is not list:
            raise Irregular  # any other iterable: graphql-core's completion
        elif kind == LIST_LEAF:
            answer[response_name] = [
                None if item is None and items_nullable else leaf(target, item)  # type: ignore[arg-type]
                for item in value
            ]
        else:
            answer[response_name] = [
                None if item is None and items_nullable else run(target, object_item(item))  # type: ignore[arg-type]
                for item in value
            ]
    return answer


def leaf(coerce: Coerce, value: Any) -> Any:
    if value is None or value is Undefined or isinstance(value, Exception):
        raise Irregular
    coerced = coerce(value)
    if coerced is None or coerced is Undefined:
        raise Irregular
    return coerced


def coercer(type_: GraphQLLeafType) -> Coerce:
    """``type_.coerce_output_value``; for an enum of Strawberry's, the same answers read from a table of its members
    (its own looks through the enum's values, comparing each, for every value it is given)."""
    wrapped = getattr(type_, "wrapped_cls", None)
    if not isinstance(type_, CustomGraphQLEnumType) or not isinstance(wrapped, type) or not issubclass(wrapped, Enum):
        return type_.coerce_output_value
    names: dict[object, str] = {}
    for member in wrapped:
        with contextlib.suppress(Exception):  # not a value of the GraphQL enum: its own coercion raises as before
            names[member] = type_.coerce_output_value(member)
    ordinary = type_.coerce_output_value

    def coerce(value: Any) -> Any:
        name = names.get(value) if type(value) is wrapped else None
        return ordinary(value) if name is None else name

    return coerce


def object_item(value: Any) -> Any:
    if value is None or value is Undefined or isinstance(value, Exception):
        raise Irregular
    return value


def in_order(order: list[str], done: dict[str, Any], executed: dict[str, Any]) -> dict[str, Any]:
    """The fields' results in the order they were selected (as the answer must list them)."""
    return {name: done[name] if name in done else executed[name] for name in order if name in done or name in executed}


def execution_for(schema: GraphQLSchema) -> type[PlainFieldsExecution]:
    """The execution context class of ``schema``: :class:`PlainFieldsExecution` with its plain fields."""
    coercers = {name: coercer(t) for name, t in schema.type_map.items() if isinstance(t, GraphQLLeafType)}
    members = {"plain": plain_fields(schema), "coercers": coercers, "shared_plans": {}, "undirected": {}}
    return type("SchemaExecution", (PlainFieldsExecution,), members)
