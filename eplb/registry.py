"""One registry mechanism: named entries of one kind (solvers, DP balancers, dispatch policies).

An unknown name is an `InputError` listing the known ones; a name taken by another entry is an
`InputError` too. Names list in registration order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from eplb.errors import InputError

T = TypeVar("T")


class Registry(Generic[T]):
    """``kind``: what the entries are, as error messages name them ("solver")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T, *, same: Callable[[T, T], bool] | None = None) -> T:
        """Register ``entry`` as ``name``; re-adding an entry ``same`` as the old one is a no-op."""
        if not isinstance(name, str) or not name:
            raise InputError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        old = self._entries.get(name)
        if old is not None and not (same or (lambda a, b: a is b))(old, entry):
            raise InputError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> T:
        """Unregister ``name`` (e.g. a test's spy policy); returns its entry."""
        self.get(name)
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        if not isinstance(name, str):
            raise InputError(f"{self.kind} name must be a string, got {name!r}")
        try:
            return self._entries[name]
        except KeyError:
            raise InputError(
                f"unknown {self.kind} {name!r}; available: {', '.join(sorted(self._entries))}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)
