"""graphql-core's executor, with plain data fields read straight off their objects.

Most of what a page of sessions answers are plain data fields: a scalar or an enum read from an attribute of an
object already in hand (``Session.name``, ``SessionEdge.cursor``...), with no resolver, argument, permission or field
extension of its own (Strawberry's "basic" fields). graphql-core executes each of them as it executes any field: a
``Path``, a resolve-info object, Strawberry's resolver wrapper, two awaitable checks and the nested ``complete_value``
steps, about 400 times for ``sessions(first: 50)``, which made them most of what an uncached page cost.

:class:`PlainFieldsExecution` reads such a field as those steps would end up reading it: the attribute (by
Strawberry's default resolver, as the field itself would call it), then the leaf type's ``coerce_output_value``.
Anything else, and any such field whose value is null, an error, or not coercible, goes the ordinary way, so every
error, its path and the nulls it propagates are graphql-core's own. Fields with a resolver, object and list fields,
and every field while an extension resolves through middleware are executed as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from graphql import (
    GraphQLLeafType,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLSchema,
    Undefined,
    is_leaf_type,
)
from graphql.execution.collect_fields import GroupedFieldSet
from graphql.pyutils import AwaitableOrValue, Path
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types.field import StrawberryField

PlainField = tuple[Callable[[Any, str], object], str, GraphQLLeafType]
"""How to read one plain field: Strawberry's default resolver, the attribute's name, and the leaf type to coerce to."""


def plain_fields(schema: GraphQLSchema) -> dict[tuple[str, str], PlainField]:
    """The plain data fields of ``schema`` by (object type, field): Strawberry fields without resolver or field
    extensions (its own test: ``is_basic_field``, whose resolver is its ``_get_basic_result``) and without arguments,
    whose type is a scalar or an enum, nullable or not."""
    found: dict[tuple[str, str], PlainField] = {}
    for type_ in schema.type_map.values():
        if not isinstance(type_, GraphQLObjectType) or type_.name.startswith("__"):
            continue
        for name, field in type_.fields.items():
            definition = field.extensions.get(GraphQLCoreConverter.DEFINITION_BACKREF)
            leaf = field.type.of_type if isinstance(field.type, GraphQLNonNull) else field.type
            if (
                isinstance(definition, StrawberryField)
                and definition.is_basic_field
                and getattr(field.resolve, "_is_default", False)
                and not field.args
                and is_leaf_type(leaf)
                and definition.default_resolver is not None
            ):
                assert isinstance(leaf, GraphQLLeafType)
                found[type_.name, name] = (definition.default_resolver, definition.python_name, leaf)
    return found


class PlainFieldsExecution(StrawberryGraphQLCoreExecutionContext):
    """Strawberry's execution context; :func:`execution_for` makes one per schema, with its :data:`plain` fields."""

    plain: Mapping[tuple[str, str], PlainField] = {}

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
        plain = self.plain
        parent = parent_type.name
        done: dict[str, Any] = {}
        rest: GroupedFieldSet = {}
        for response_name, details in grouped_field_set.items():
            node = details[0].node
            read = plain.get((parent, node.name.value))
            if read is not None and not node.arguments:
                resolver, attribute, leaf = read
                try:
                    value = resolver(source_value, attribute)
                    if value is not None and value is not Undefined and not isinstance(value, Exception):
                        coerced = leaf.coerce_output_value(value)
                        if coerced is not None and coerced is not Undefined:
                            done[response_name] = coerced
                            continue
                except Exception:  # the ordinary way below raises it again, located
                    pass
            rest[response_name] = details
        if not rest:
            return done
        if not done:
            return super().execute_fields(parent_type, source_value, path, grouped_field_set, position_context)
        executed = super().execute_fields(parent_type, source_value, path, rest, position_context)
        order = list(grouped_field_set)
        if self.is_awaitable(executed):

            async def merged() -> dict[str, Any]:
                return in_order(order, done, await executed)

            return merged()
        assert isinstance(executed, dict)
        return in_order(order, done, executed)


def in_order(order: list[str], done: dict[str, Any], executed: dict[str, Any]) -> dict[str, Any]:
    """The fields' results in the order they were selected (as the answer must list them)."""
    return {name: done[name] if name in done else executed[name] for name in order if name in done or name in executed}


def execution_for(schema: GraphQLSchema) -> type[PlainFieldsExecution]:
    """The execution context class of ``schema``: :class:`PlainFieldsExecution` with its plain fields."""
    return type("SchemaExecution", (PlainFieldsExecution,), {"plain": plain_fields(schema)})
