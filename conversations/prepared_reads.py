"""Reads whose SQL the ORM builds once per database connection.

For the short reads of an answer's creation (a conversation's row, its messages, the
user's live answers, its documents), building the queryset and compiling its SQL costs
several times what the database spends running it. A :class:`PreparedRead` builds its
queryset once per connection with a placeholder for each varying value, keeps the SQL,
its parameters and the row converters the ORM chose, and on each call runs that SQL with
the call's values in the placeholders' places. It returns what the queryset would have:
model instances (``Model.from_db``, as the ORM makes them) or ``values_list`` rows.

What it takes: a function from the varying values (ints or strings, each used as a
lookup's value) to a queryset of model instances without ``select_related`` or
annotations, or a ``values_list``. Every other value in the queryset is a constant, since
the first build is the only one (no ``timezone.now()``). Building it per connection,
rather than once per process, keeps each thread's converters bound to its own connection.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import QuerySet
from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesListIterable

# Values no real lookup uses: their places among the compiled parameters are the slots.
_INT_MARK = -(7 * 10**15)
_STR_MARK = "\x1fprepared-read-{}\x1f"


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]  # the compiled parameters, placeholders included
    slots: tuple[tuple[int, int], ...]  # (parameter position, argument index)
    kinds: tuple[type, ...]  # each argument's type, as the placeholders had it
    converters: tuple[tuple[int, tuple[Callable, ...], Any], ...]
    make: Callable[[list], Any]  # a converted row -> what the queryset yields


class PreparedRead:
    def __init__(self, build: Callable[..., QuerySet]) -> None:
        self.build = build
        self._compiled: weakref.WeakKeyDictionary[Any, _Compiled] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> list:
        connection = connections["default"]
        compiled = self._compiled.get(connection)
        if compiled is None:
            compiled = self._compile(connection, args)
            with self._lock:
                self._compiled[connection] = compiled
        params = list(compiled.params)
        values = [kind(arg) for kind, arg in zip(compiled.kinds, args, strict=True)]
        for position, index in compiled.slots:
            params[position] = values[index]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        make = compiled.make
        if not compiled.converters:
            return [make(row) for row in rows]
        out = []
        for row in rows:
            row = list(row)
            for position, convs, expression in compiled.converters:
                value = row[position]
                for converter in convs:
                    value = converter(value, expression, connection)
                row[position] = value
            out.append(make(row))
        return out

    def _compile(self, connection: Any, args: tuple[Any, ...]) -> _Compiled:
        kinds = tuple(_kind(arg) for arg in args)
        marks = [_INT_MARK - i if kind is int else _STR_MARK.format(i) for i, kind in enumerate(kinds)]
        queryset = self.build(*marks)
        if queryset.db != connection.alias:
            raise ValueError("a prepared read runs on the default database")
        compiler = queryset.query.get_compiler(connection=connection)
        sql, params = compiler.as_sql()
        slots = tuple((p, marks.index(value)) for p, value in enumerate(params) if value in marks)
        if sorted({index for _, index in slots}) != list(range(len(marks))):
            raise ValueError("every argument of a prepared read must be a lookup's value")
        fields = [s[0] for s in compiler.select[: compiler.col_count]]
        converters = tuple(
            (position, tuple(convs), expression)
            for position, (convs, expression) in compiler.get_converters(fields).items()
        )
        return _Compiled(sql, tuple(params), slots, kinds, converters, _row_maker(queryset, compiler))


def _kind(value: Any) -> type:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"a prepared read takes ints and strings, not {type(value).__name__}")
    return int if isinstance(value, int) else str


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
