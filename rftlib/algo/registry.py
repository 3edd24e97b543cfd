"""A name -> function table, so the trainer looks algorithms up instead of branching on names.

A bad name fails at lookup with the list of valid ones (verl's style), which turns a typo in a
config into an actionable error rather than a silent fallback.
"""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Registry:
    """Functions of one kind (e.g. "advantage estimator"), registered by name."""

    def __init__(self, kind: str):
        self.kind = kind  # used in error messages: "unknown <kind> 'x'; valid: ..."
        self._table: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: ``@REG.register("grpo")`` adds the function under ``name`` and returns it unchanged."""

        def add(fn: F) -> F:
            self.add(name, fn)
            return fn

        return add

    def add(self, name: str, value: Callable) -> None:
        """Register ``value`` under ``name`` (what ``register`` does, for a value made elsewhere)."""
        if name in self._table:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._table[name] = value

    def get(self, name: str) -> Callable:
        """The function registered as ``name``; ValueError listing the valid names otherwise."""
        if name not in self._table:
            raise ValueError(f"unknown {self.kind} '{name}'; valid: {', '.join(self.names())}")
        return self._table[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
