"""Runs a recursive computation written as generators on an explicit stack, so its depth is not Python's."""

from __future__ import annotations
from typing import Any, Generator

# a step yields the sub-step whose result it needs and receives that result; its return value is its result
Step = Generator["Step", Any, Any]


def run_steps(step: Step) -> Any:
    """The result of `step`; a `yield sub_step` inside a step suspends it until sub_step has returned."""
    stack: list[Step] = [step]
    result: Any = None
    while True:
        try:
            sub = stack[-1].send(result)
        except StopIteration as stop:
            stack.pop()
            if not stack:
                return stop.value
            result = stop.value
            continue
        stack.append(sub)
        result = None
