"""A name -> object table, so the trainer looks algorithms up instead of branching on names.

A bad name fails at lookup with the list of valid ones (verl's style), which turns a typo in a
config into an actionable error rather than a silent fallback.

Built-in entries are *declared*: ``REG.declare("grpo", "rftlib.algo.advantages:grpo_advantages",
scale_rewards=True)`` names the object by ``"module:attr"`` and holds what must be known before it is
built (a loss's clip fields, an engine's config rules, ...). Nothing is imported until ``get`` asks
for the object, so a config can check every name and every declared rule without importing torch
(``decl`` reads the declarations alone). An object made elsewhere (a test's toy loss, a notebook's
task) is registered directly with ``register``/``add``. Each name is registered once, in one place.

This module is torch-free and imports nothing of rftlib.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, TypeVar

F = TypeVar("F")
_NO_OBJECT = object()


class _Entry:
    """One registered name: its target (``"module:attr"``, imported on first ``get``) or its object, and its
    declarations."""

    __slots__ = ("target", "obj", "decl")

    def __init__(self, target: str | None, obj: Any, decl: dict[str, Any]):
        self.target, self.obj, self.decl = target, obj, decl


class Registry:
    """Objects of one kind (e.g. "advantage estimator"), registered by name.

    ``make(name, obj, decl)``: what ``get`` returns for a registered object and its declarations (e.g. a
    loss's LossSpec); None: the object itself. ``declarations_of(obj)``: the declarations of an object
    registered without any (read off the object, e.g. a backend class's ``check_config``).
    """

    def __init__(self, kind: str, *, make: Callable[[str, Any, dict], Any] | None = None,
                 declarations_of: Callable[[Any], dict[str, Any]] | None = None):
        self.kind = kind  # used in error messages: "unknown <kind> 'x'; valid: ..."
        self._make = make
        self._declarations_of = declarations_of
        self._table: dict[str, Any] = {}  # name -> _Entry (or a plain object put there by a test)

    def declare(self, name: str, target: str, **declarations: Any) -> None:
        """Declare ``name`` as the object at ``target`` ("package.module:attr"), imported on first ``get``."""
        if ":" not in target:
            raise ValueError(f"{self.kind} '{name}': target {target!r} is not 'package.module:attr'")
        self._put(name, _Entry(target, _NO_OBJECT, declarations))

    def register(self, name: str, obj: Any = _NO_OBJECT, **declarations: Any):
        """Register ``obj`` (already imported) under ``name`` with its declarations; without ``obj``, a
        decorator (``@REG.register("grpo")``) that registers the function and returns it unchanged."""
        if obj is not _NO_OBJECT:
            self.add(name, obj, **declarations)
            return obj

        def add(fn: F) -> F:
            self.add(name, fn, **declarations)
            return fn

        return add

    def add(self, name: str, value: Any, **declarations: Any) -> None:
        """Register ``value`` under ``name`` (what ``register`` does, for a value made elsewhere)."""
        if not declarations and self._declarations_of is not None:
            declarations = dict(self._declarations_of(value))
        self._put(name, _Entry(None, self._built(name, value, declarations), declarations))

    def _put(self, name: str, entry: _Entry) -> None:
        if name in self._table:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._table[name] = entry

    def _built(self, name: str, obj: Any, declarations: dict[str, Any]) -> Any:
        return self._make(name, obj, declarations) if self._make is not None else obj

    def _entry(self, name: str) -> Any:
        if name not in self._table:
            raise ValueError(f"unknown {self.kind} '{name}'; valid: {', '.join(self.names())}")
        return self._table[name]

    def get(self, name: str) -> Any:
        """The object registered as ``name`` (its module imported on first use); ValueError listing the valid
        names otherwise."""
        entry = self._entry(name)
        if not isinstance(entry, _Entry):
            return entry
        if entry.obj is _NO_OBJECT:
            module, attr = entry.target.split(":", 1)
            entry.obj = self._built(name, getattr(importlib.import_module(module), attr), entry.decl)
        return entry.obj

    def decl(self, name: str) -> dict[str, Any]:
        """What ``name`` declares, read without importing it; ValueError listing the valid names otherwise."""
        entry = self._entry(name)
        if isinstance(entry, _Entry):
            return dict(entry.decl)
        return dict(self._declarations_of(entry)) if self._declarations_of is not None else {}

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
