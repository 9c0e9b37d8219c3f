"""Reversible patching: every change recorded so that ``restore`` undoes it, in reverse order."""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional

MISSING = object()


class Patcher:
    """Records every change so ``restore`` can undo them in reverse order."""

    def __init__(self) -> None:
        self._undo: List[Callable[[], None]] = []

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        # Only look at obj.__dict__ so that restoring never turns an inherited
        # class attribute into an own attribute.
        own = vars(obj).get(name, MISSING) if hasattr(obj, "__dict__") else getattr(obj, name, MISSING)
        setattr(obj, name, value)

        def undo(obj=obj, name=name, own=own):
            if own is MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, own)

        self._undo.append(undo)

    def set_env(self, key: str, value: Optional[str]) -> None:
        old = os.environ.get(key)
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

        def undo(key=key, old=old):
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old

        self._undo.append(undo)

    def add_undo(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def restore(self) -> None:
        errors = []
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as e:  # keep restoring the rest
                errors.append(e)
        if errors:
            raise errors[0]
