"""Name -> function registries, so configs select estimators by string."""

from __future__ import annotations

from collections.abc import Callable


class Registry:
  def __init__(self, kind: str):
    self.kind = kind
    self._fns: dict[str, Callable] = {}

  def register(self, name: str):
    def deco(fn):
      if name in self._fns:
        raise ValueError(f"{self.kind} {name!r} registered twice")
      self._fns[name] = fn
      return fn

    return deco

  def get(self, name: str) -> Callable:
    if name not in self._fns:
      raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._fns))}")
    return self._fns[name]

  def names(self) -> list[str]:
    return sorted(self._fns)


ADVANTAGES = Registry("advantage estimator")
LOSSES = Registry("policy loss")
