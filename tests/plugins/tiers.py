"""The two test tiers for scenario-driven Megatron tests: run each scenario only when a test of this tier
reads it, and mark the parameters the PR tier leaves to the nightly tier.

A module lists its PR slice (one known-bad and one known-good side per detector and layout family); every
other scenario runs in the nightly tier (scripts/test.sh --nightly), so the PR tier pays only for what it
reads."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import pytest

T = TypeVar("T")


class LazyRuns(Generic[T]):
    """Scenario name -> its result, run the first time a test reads it and kept for the module."""

    def __init__(self, run: Callable[[str], T]) -> None:
        self._run, self._done = run, {}  # type: ignore[var-annotated]

    def __getitem__(self, name: str) -> T:
        if name not in self._done:
            self._done[name] = self._run(name)
        return self._done[name]


def tiered(names: Iterable[str], pr_slice: Iterable[str]) -> list[Any]:
    """Parameters for these scenario names: the PR slice as they are, the rest marked nightly."""
    keep = set(pr_slice)
    return [name if name in keep else pytest.param(name, marks=pytest.mark.nightly) for name in names]


def nightly_unless(condition: bool) -> tuple[pytest.MarkDecorator, ...]:
    """Marks for a test (or a parameter) the PR tier runs only when condition holds."""
    return () if condition else (pytest.mark.nightly,)
