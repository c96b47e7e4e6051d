"""Python tasks: an App of named, versioned functions, each with a pydantic model per
payload version, upcasters from older versions, and pinned and fresh fields.

    import corral
    from corral.worker import Fresh, Pinned
    from pydantic import BaseModel

    app = corral.App("billing", version="2.0.0")

    class InvoiceV1(BaseModel):
        customer_id: Pinned[int]
        amount: Pinned[float]

    class Invoice(BaseModel):                     # version 2: cents, and a fresh e-mail
        customer_id: Pinned[int]
        amount_cents: Pinned[int]
        email: Fresh[str | None] = None           # read at run time, by the resolver below

    @app.task("send-invoice", version=2)
    def send_invoice(invoice: Invoice) -> None:
        ...

    @send_invoice.upcaster(from_version=1)
    def cents(old: InvoiceV1) -> Invoice:
        return Invoice(customer_id=old.customer_id, amount_cents=round(old.amount * 100))

    @send_invoice.resolver("email")
    def email_of(invoice: Invoice) -> str:
        return customers.email(invoice.customer_id)

A job's payload is the envelope {task, version, data}. A worker reads a task's current
version and every older one an upcaster chain leads up from; it registers what it reads,
with each version's JSON Schema, so a submit is checked against the schema the newest
live worker writes, and a job no live worker reads is parked instead of failed.

A `Pinned` field (and a field not marked at all) runs with the value it had at submit;
a `Fresh` field is resolved when the task runs, by the resolver the task declares for it,
so a job scheduled today and run tomorrow charges today's amount to tomorrow's address.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TypeVar, get_type_hints

import pydantic
from pydantic import BaseModel

from corral import errors
from corral.python_tasks import TaskRead, envelope

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class _Pin:
    def __repr__(self) -> str:
        return "Pinned"


class _Fresh:
    def __repr__(self) -> str:
        return "Fresh"


PIN, FRESH = _Pin(), _Fresh()

Pinned = Annotated[T, PIN]
"""A payload field whose value at submit is what runs (an amount, a discount)."""

Fresh = Annotated[T, FRESH]
"""A payload field read when the task runs, by the resolver its task declares (an e-mail
address by customer id). Give it a default: a submit need not carry it."""

_TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")


def fresh_fields(cls: type[BaseModel]) -> list[str]:
    """The fields of a payload model marked Fresh."""
    return [name for name, f in cls.model_fields.items() if any(m is FRESH for m in f.metadata)]


def pinned_fields(cls: type[BaseModel]) -> list[str]:
    """The fields of a payload model that run with their value at submit (all but Fresh)."""
    fresh = set(fresh_fields(cls))
    return [name for name in cls.model_fields if name not in fresh]


@dataclass(frozen=True, slots=True)
class Upcaster:
    """Turns a payload of `from_version` into one of the next version."""

    from_version: int
    model: type[BaseModel] | None  # the old version's model; None: a dict is passed
    fn: Callable[[Any], Any]


@dataclass(slots=True)
class Task(Generic[M]):
    """One named function with its payload's current version and model."""

    name: str
    version: int
    model: type[M]
    fn: Callable[..., Any]
    app: App
    upcasters: dict[int, Upcaster] = field(default_factory=dict)
    resolvers: dict[str, Callable[[M], Any]] = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def upcaster(self, *, from_version: int) -> Callable[[Callable[[Any], T]], Callable[[Any], T]]:
        """Declare a function that turns a payload of `from_version` into the next
        version's (a model of it, or a dict). Its parameter's annotation, when it is a
        pydantic model, is the old version's model: what workers register as its schema."""

        def add(fn: Callable[[Any], T]) -> Callable[[Any], T]:
            if not 1 <= from_version < self.version:
                raise errors.ConfigError(
                    f"task {self.name}: upcaster from_version={from_version}: must be at least 1"
                    f" and below the task's version {self.version}"
                )
            if from_version in self.upcasters:
                raise errors.ConfigError(
                    f"task {self.name}: two upcasters from version {from_version}"
                )
            self.upcasters[from_version] = Upcaster(from_version, _first_model(fn), fn)
            return fn

        return add

    def resolver(self, name: str) -> Callable[[Callable[[M], T]], Callable[[M], T]]:
        """Declare the function that reads Fresh field `name` when the task runs (sync or
        async; it gets the payload as submitted, returns the field's value)."""

        def add(fn: Callable[[M], T]) -> Callable[[M], T]:
            fresh = fresh_fields(self.model)
            if name not in fresh:
                raise errors.ConfigError(
                    f"task {self.name}: resolver for {name!r}: {self.model.__name__} has no"
                    f" Fresh field of that name (Fresh: {', '.join(fresh) or 'none'})"
                )
            self.resolvers[name] = fn
            return fn

        return add

    def reads(self) -> list[int]:
        """The payload versions this task reads: its own, and each older one from which
        upcasters lead, one version at a time, up to it."""
        out = [self.version]
        v = self.version - 1
        while v in self.upcasters:
            out.append(v)
            v -= 1
        return sorted(out)

    def schema(self, version: int) -> dict[str, Any]:
        """The JSON Schema of payload `version` (of its data): the model's, or {} (any
        JSON) for an old version whose upcaster takes a plain dict."""
        if version == self.version:
            return self.model.model_json_schema()
        up = self.upcasters.get(version)
        if up is None:
            raise errors.InvalidInput(f"task {self.name} does not read payload version {version}")
        return up.model.model_json_schema() if up.model is not None else {}

    def read(self, version: int, data: Any) -> M:
        """The payload `data` of `version` as this task's current model: validated against
        its version's model, then upcast one version at a time. InvalidInput names the
        field and the rule when it does not fit."""
        if version not in self.reads():
            raise errors.InvalidInput(
                f"task {self.name}: payload version {version} is not one this worker reads"
                f" (it reads {', '.join(map(str, self.reads()))})"
            )
        value: Any = data
        for v in range(version, self.version):
            up = self.upcasters[v]
            arg = _validated(up.model, value, self.name, v) if up.model is not None else value
            value = up.fn(arg)
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json")
        return _validated(self.model, value, self.name, self.version)

    def payload(self, data: M | Mapping[str, Any]) -> dict[str, Any]:
        """The envelope of `data` (a model of this version, or its fields), checked."""
        if isinstance(data, BaseModel):
            checked = _validated(self.model, data.model_dump(mode="json"), self.name, self.version)
        else:
            checked = _validated(self.model, dict(data), self.name, self.version)
        return envelope(self.name, self.version, checked.model_dump(mode="json"))

    def spec(self) -> dict[str, Any]:
        return {"task": self.name, "version": self.version}

    def task_reads(self) -> list[TaskRead]:
        return [
            TaskRead(self.name, v, self.schema(v), newest=v == self.version) for v in self.reads()
        ]

    async def resolve(
        self, value: M, call: Callable[[Callable[[], Any]], Awaitable[Any]]
    ) -> tuple[M, dict[str, Any]]:
        """`value` with its Fresh fields read now by their resolvers (`call` runs a sync
        resolver off the event loop); returns it and what was resolved."""
        got: dict[str, Any] = {}
        for name in fresh_fields(self.model):
            fn = self.resolvers[name]
            if inspect.iscoroutinefunction(fn):
                got[name] = await fn(value)
            else:
                got[name] = await call(lambda fn=fn: fn(value))  # type: ignore[misc]
        if not got:
            return value, got
        return _validated(
            self.model, {**value.model_dump(mode="json"), **_json(got)}, self.name, self.version
        ), got


class App:
    """A named set of Python tasks, at one app version (what workers of it register)."""

    def __init__(self, name: str, *, version: str | None = None) -> None:
        if not _TASK_NAME.match(name):
            raise errors.ConfigError(f"App name {name!r}: 1-200 characters of [A-Za-z0-9_.:-]")
        self.name = name
        self.version = version or os.environ.get("CORRAL_CODE_VERSION") or "0"
        self.tasks: dict[str, Task[Any]] = {}
        self._on_shutdown: list[Callable[[], Any]] = []

    def task(
        self, name: str, *, version: int = 1, model: type[BaseModel] | None = None
    ) -> Callable[[Callable[..., Any]], Task[Any]]:
        """Declare a task: `name`, its payload's current `version`, and its model (default:
        the annotation of the function's first parameter, a pydantic model)."""
        if not _TASK_NAME.match(name):
            raise errors.ConfigError(f"task name {name!r}: 1-200 characters of [A-Za-z0-9_.:-]")
        if version < 1:
            raise errors.ConfigError(f"task {name}: version {version}: must be at least 1")
        if name in self.tasks:
            raise errors.ConfigError(f"task {name}: declared twice in app {self.name}")

        def add(fn: Callable[..., Any]) -> Task[Any]:
            found = model or _first_model(fn)
            if found is None:
                raise errors.ConfigError(
                    f"task {name}: give its payload model (model=...) or annotate the first"
                    " parameter with a pydantic model"
                )
            task: Task[Any] = Task(name, version, found, fn, self)
            self.tasks[name] = task
            return task

        return add

    def on_shutdown(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Declare a function a worker of this app calls once when told to stop (SIGTERM),
        while its running tasks still run: a place to ask them to checkpoint."""
        self._on_shutdown.append(fn)
        return fn

    @property
    def shutdown_hooks(self) -> list[Callable[[], Any]]:
        return list(self._on_shutdown)

    def check(self) -> None:
        """ConfigError when a task cannot run: a Fresh field without a resolver."""
        for task in self.tasks.values():
            if missing := [f for f in fresh_fields(task.model) if f not in task.resolvers]:
                raise errors.ConfigError(
                    f"task {task.name}: Fresh field(s) {', '.join(missing)} have no resolver"
                    f" (@{task.fn.__name__}.resolver({missing[0]!r}))"
                )

    def reads(self) -> list[TaskRead]:
        return [r for task in self.tasks.values() for r in task.task_reads()]

    def __iter__(self) -> Iterator[Task[Any]]:
        return iter(self.tasks.values())

    def get(self, name: str) -> Task[Any]:
        try:
            return self.tasks[name]
        except KeyError:
            raise errors.NotFound(
                f"app {self.name} has no task {name!r} (it has: {', '.join(self.tasks) or 'none'})"
            ) from None


def load_app(target: str) -> App:
    """`MODULE:ATTRIBUTE` (e.g. `billing.tasks:app`) as an App; ConfigError naming what is
    wrong. The current folder is importable, as for `python -m`."""
    import importlib
    import sys

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise errors.ConfigError(f"{target!r}: give MODULE:APP, e.g. billing.tasks:app")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise errors.ConfigError(f"{target}: cannot import {module_name}: {exc}") from exc
    found = getattr(module, attr, None)
    if not isinstance(found, App):
        raise errors.ConfigError(
            f"{target}: {module_name}.{attr} is {type(found).__name__}, not a corral.App"
        )
    return found


def _first_model(fn: Callable[..., Any]) -> type[BaseModel] | None:
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return None
    try:
        hints = get_type_hints(fn, include_extras=False)
    except (NameError, TypeError):
        return None
    hint = hints.get(params[0].name)
    return hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None


def _validated(cls: type[M], data: Any, task: str, version: int) -> M:
    try:
        return cls.model_validate(data)
    except pydantic.ValidationError as exc:
        raise errors.InvalidInput(
            f"payload of task {task} version {version}: {_first_problem(exc)}"
        ) from None


def _first_problem(exc: pydantic.ValidationError) -> str:
    problems = exc.errors()
    first = problems[0]
    where = ".".join(str(p) for p in first["loc"]) or "(the payload)"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"data.{where}: {first['msg']}{more}"


def _json(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in values.items()
    }
