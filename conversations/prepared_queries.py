"""Reads, updates and inserts whose SQL the ORM builds once per database connection.

For the short statements of an answer's life (a conversation's row, its messages, the
user's live answers, its documents, the answer's saves), building the queryset and
compiling its SQL costs several times what the database spends running it. A prepared
query builds its queryset once per connection with a placeholder for each varying value,
keeps the SQL and its parameters, and on each call runs that SQL with the call's values in
the placeholders' places:

- :class:`PreparedRead` returns what the queryset would have: model instances
  (``Model.from_db``, as the ORM makes them, with its row converters) or ``values_list`` rows;
- :class:`PreparedUpdate` is ``queryset.update(**values)``: its SQL is kept per set of
  column names, and each value is prepared by its field as the ORM prepares it;
- :class:`PreparedInsert` is ``Model.objects.create(**values)`` for a model of one table
  with an automatic primary key: the same instance, signals and returned columns.

What they take: a function from the varying values (ints or strings, each used as a
lookup's value) to a queryset; a read's yields plain model rows (no ``select_related``, no
annotations) or ``values_list`` rows. Every other value in the queryset is a constant,
since the first build is the only one (no ``timezone.now()``). Building per connection,
rather than once per process, keeps each thread's converters bound to its own connection.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import Expression, Model, QuerySet, signals
from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesListIterable
from django.db.models.sql import InsertQuery, UpdateQuery

# Values no real lookup uses: their places among the compiled parameters are the slots.
# (Negative, as no id is, and within a 32-bit integer column's range: the ORM finds a
# lookup past a column's range empty without compiling it.)
_INT_MARK = -2_147_483_000
_STR_MARK = "\x1fprepared-query-{}\x1f"


class _PerConnection:
    """What each database connection compiled, by key."""

    def __init__(self) -> None:
        self._compiled: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _cached(self, connection: Any, key: Any, compile: Callable[[], Any]) -> Any:
        per_connection = self._compiled.get(connection)
        if per_connection is None:
            with self._lock:
                per_connection = self._compiled.setdefault(connection, {})
        compiled = per_connection.get(key)
        if compiled is None:
            compiled = per_connection[key] = compile()
        return compiled


class _Prepared(_PerConnection):
    """A queryset built with placeholders for its varying values (reads and updates)."""

    def __init__(self, build: Callable[..., QuerySet]) -> None:
        super().__init__()
        self.build = build

    def _marked(self, connection: Any, args: tuple[Any, ...]) -> tuple[QuerySet, tuple[type, ...], list[Any]]:
        kinds = tuple(_kind(arg) for arg in args)
        marks = [_INT_MARK - i if kind is int else _STR_MARK.format(i) for i, kind in enumerate(kinds)]
        queryset = self.build(*marks)
        if queryset.db != connection.alias:
            raise ValueError("a prepared query runs on the default database")
        return queryset, kinds, marks


def _kind(value: Any) -> type:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"a prepared query takes ints and strings, not {type(value).__name__}")
    return int if isinstance(value, int) else str


def _argument_slots(params: list[Any] | tuple[Any, ...], marks: list[Any]) -> dict[int, int]:
    """Parameter position -> the index of the argument it takes."""
    slots = {p: marks.index(value) for p, value in enumerate(params) if value in marks}
    if sorted(set(slots.values())) != list(range(len(marks))):
        raise ValueError("every argument of a prepared query must be a lookup's value")
    return slots


def _converted(row: list[Any], converters: tuple, connection: Any) -> list[Any]:
    """``row`` with the ORM's converters applied to its columns, in place."""
    for position, convs, expression in converters:
        value = row[position]
        for converter in convs:
            value = converter(value, expression, connection)
        row[position] = value
    return row


def _execute(connection: Any, sql: str, params: list[Any]) -> Any:
    """An open cursor past the statement (as the ORM runs one: a failure inside a
    transaction marks it for rollback)."""
    cursor = connection.cursor()
    try:
        with transaction.mark_for_rollback_on_error(using=connection.alias):
            cursor.execute(sql, params)
    except BaseException:
        cursor.close()
        raise
    return cursor


@dataclass(frozen=True)
class _CompiledRead:
    sql: str
    params: tuple[Any, ...]  # the compiled parameters, placeholders included
    slots: tuple[tuple[int, int], ...]  # (parameter position, argument index)
    kinds: tuple[type, ...]  # each argument's type, as the placeholders had it
    converters: tuple[tuple[int, tuple[Callable, ...], Any], ...]
    make: Callable[[list], Any]  # a converted row -> what the queryset yields


class PreparedRead(_Prepared):
    def __call__(self, *args: Any) -> list:
        connection = connections["default"]
        compiled: _CompiledRead = self._cached(connection, None, lambda: self._compile(connection, args))
        params = list(compiled.params)
        values = [kind(arg) for kind, arg in zip(compiled.kinds, args, strict=True)]
        for position, index in compiled.slots:
            params[position] = values[index]
        with _execute(connection, compiled.sql, params) as cursor:
            rows = cursor.fetchall()
        make = compiled.make
        if not compiled.converters:
            return [make(row) for row in rows]
        return [make(_converted(list(row), compiled.converters, connection)) for row in rows]

    def _compile(self, connection: Any, args: tuple[Any, ...]) -> _CompiledRead:
        queryset, kinds, marks = self._marked(connection, args)
        compiler = queryset.query.get_compiler(connection=connection)
        sql, params = compiler.as_sql()
        slots = tuple(_argument_slots(params, marks).items())
        fields = [s[0] for s in compiler.select[: compiler.col_count]]
        converters = tuple(
            (position, tuple(convs), expression)
            for position, (convs, expression) in compiler.get_converters(fields).items()
        )
        return _CompiledRead(sql, tuple(params), slots, kinds, converters, _row_maker(queryset, compiler))


def _row_maker(queryset: QuerySet, compiler: Any) -> Callable[[list], Any]:
    iterable = queryset._iterable_class
    if iterable is FlatValuesListIterable:
        return lambda row: row[0]
    if iterable is ValuesListIterable:
        return tuple
    if iterable is not ModelIterable:
        raise ValueError(f"a prepared read cannot yield {iterable.__name__} rows")
    info = compiler.klass_info
    if info.get("related_klass_infos") or compiler.annotation_col_map or queryset._known_related_objects:
        raise ValueError("a prepared read yields plain model rows (no related rows or annotations)")
    model, db = info["model"], queryset.db
    start, end = info["select_fields"][0], info["select_fields"][-1] + 1
    names = [column[0].target.attname for column in compiler.select[start:end]]
    return lambda row: model.from_db(db, names, row[start:end])


class _ValueMark(Expression):
    """A SET value's placeholder: compiled as one parameter, whatever the field. (A plain
    ``None`` would compile to ``= NULL``; the call's value is prepared by its field.)"""

    def __init__(self, mark: str) -> None:
        super().__init__()
        self.mark = mark

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return "%s", [self.mark]


@dataclass(frozen=True)
class _CompiledUpdate:
    sql: str
    params: tuple[Any, ...]
    slots: tuple[tuple[int, int], ...]  # (parameter position, argument index)
    kinds: tuple[type, ...]
    fields: tuple[tuple[int, Any], ...]  # (parameter position, the field whose value goes there)


class PreparedUpdate(_Prepared):
    def __call__(self, *args: Any, **values: Any) -> int:
        """``build(*args).update(**values)``: the number of rows it matched."""
        connection = connections["default"]
        names = tuple(values)
        compiled: _CompiledUpdate = self._cached(
            connection, names, lambda: self._compile(connection, args, names)
        )
        params = list(compiled.params)
        arguments = [kind(arg) for kind, arg in zip(compiled.kinds, args, strict=True)]
        for position, index in compiled.slots:
            params[position] = arguments[index]
        for (position, field), value in zip(compiled.fields, values.values(), strict=True):
            params[position] = field.get_db_prep_save(value, connection=connection)
        with _execute(connection, compiled.sql, params) as cursor:
            return cursor.rowcount

    def _compile(self, connection: Any, args: tuple[Any, ...], names: tuple[str, ...]) -> _CompiledUpdate:
        queryset, kinds, marks = self._marked(connection, args)
        value_marks = {name: _STR_MARK.format(f"value-{name}") for name in names}
        query = queryset.query.chain(UpdateQuery)
        query.add_update_values({name: _ValueMark(mark) for name, mark in value_marks.items()})
        if query.related_updates:
            raise ValueError("a prepared update writes one table")
        query.clear_select_clause()
        sql, params = query.get_compiler(connection=connection).as_sql()
        meta = queryset.model._meta
        by_mark = {mark: meta.get_field(name) for name, mark in value_marks.items()}
        fields = tuple(
            (p, by_mark[value])
            for p, value in enumerate(params)
            if isinstance(value, str) and value in by_mark
        )
        if [field for _, field in fields] != [by_mark[value_marks[name]] for name in names]:
            raise ValueError("a prepared update sets each value once, in order")
        slots = tuple(_argument_slots(params, marks).items())
        return _CompiledUpdate(sql, tuple(params), slots, kinds, fields)


@dataclass(frozen=True)
class _CompiledInsert:
    sql: str
    fields: tuple[Any, ...]  # the inserted fields, in the order of their parameters
    returning: tuple[Any, ...]  # the columns the database returns (the primary key)
    returning_params: Any
    converters: tuple[tuple[int, tuple[Callable, ...], Any], ...]


class PreparedInsert(_PerConnection):
    def __init__(self, model: type[Model]) -> None:
        super().__init__()
        meta = model._meta
        if meta.parents or meta.order_with_respect_to or meta.auto_field is None:
            raise ValueError("a prepared insert writes one table with an automatic primary key")
        self.model = model

    def __call__(self, **values: Any) -> Model:
        """``Model.objects.create(**values)``: the saved instance."""
        obj = self.model(**values)
        if obj._is_pk_set():
            raise ValueError("a prepared insert takes no primary key")
        obj._prepare_related_fields_for_save(operation_name="save")
        connection = connections["default"]
        compiled: _CompiledInsert = self._cached(connection, None, lambda: self._compile(connection, obj))
        origin, alias = self.model, connection.alias
        if signals.pre_save.has_listeners(origin):
            signals.pre_save.send(sender=origin, instance=obj, raw=False, using=alias, update_fields=None)
        params = [
            field.get_db_prep_save(field.pre_save(obj, True), connection=connection)
            for field in compiled.fields
        ]
        with _execute(connection, compiled.sql, params) as cursor:
            if compiled.returning_params is not None:
                row = list(connection.ops.fetch_returned_insert_columns(cursor, compiled.returning_params))
            else:
                row = [
                    connection.ops.last_insert_id(
                        cursor, self.model._meta.db_table, compiled.returning[0].column
                    )
                ]
        for value, field in zip(
            _converted(row, compiled.converters, connection), compiled.returning, strict=True
        ):
            setattr(obj, field.attname, value)
        obj._state.db, obj._state.adding = alias, False
        if signals.post_save.has_listeners(origin):
            signals.post_save.send(
                sender=origin, instance=obj, created=True, update_fields=None, raw=False, using=alias
            )
        return obj

    def _compile(self, connection: Any, obj: Model) -> _CompiledInsert:
        meta = self.model._meta
        fields = tuple(f for f in meta.local_concrete_fields if not f.generated and f is not meta.auto_field)
        if any(hasattr(f, "get_placeholder") for f in fields):
            raise ValueError("a prepared insert's fields take plain parameters")
        query = InsertQuery(self.model)
        query.insert_values(fields, [obj])
        compiler = query.get_compiler(connection=connection)
        returning = tuple(meta.db_returning_fields)
        if connection.features.can_return_columns_from_insert:
            compiler.returning_fields = list(returning)
        elif returning != (meta.auto_field,):
            raise ValueError("this database returns no columns from an insert but the primary key")
        [(sql, params)] = compiler.as_sql()
        if len(params) != len(fields):
            raise ValueError("a prepared insert's values are one parameter each")
        returning_params = getattr(compiler, "returning_params", None) if compiler.returning_fields else None
        cols = [field.get_col(meta.db_table) for field in returning]
        converters = tuple(
            (position, tuple(convs), expression)
            for position, (convs, expression) in compiler.get_converters(cols).items()
        )
        return _CompiledInsert(sql, fields, returning, returning_params, converters)
