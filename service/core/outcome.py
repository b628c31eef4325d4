"""What a run or a suite run means for CI, computed once, by the server: the result, and the exit code a client
should use with and without --strict. `parity submit` (one check or a suite), the JUnit writer's callers and the
forge status read it; nothing else decides "did CI pass?".

A check's result: `pass`; `known-failure` (every finding a registered upstream bug: passes unless strict);
`fails-on-base` (it fails, and the base track's latest run of it fails too: a PR on a broken main, not the PR's
doing: passes); `fail` (exit 1: the build's answer, or a regression); `error` (exit 2: couldn't tell, the
service's or the host's failure); `pending`. A suite: fail if any check fails, else error if any errs, else pass;
strict makes a known failure fail.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from jobs.verdict_names import ERROR, FAIL, KNOWN_FAILURE, PASS
from service.core.run_state import TERMINAL, RunState

FAILS_ON_BASE = "fails-on-base"
PENDING = "pending"
OUTCOMES = (PASS, KNOWN_FAILURE, FAILS_ON_BASE, FAIL, ERROR, PENDING)
_EXIT = {PASS: 0, KNOWN_FAILURE: 0, FAILS_ON_BASE: 0, FAIL: 1, ERROR: 2, PENDING: 2}


class CiOutcome(BaseModel):
    """A run's or a suite run's answer to CI."""

    result: str = Field(description="pass | known-failure | fails-on-base | fail | error | pending")
    exit_code: int = Field(description="What `parity submit` exits with: 0 pass, 1 fail, 2 error or not finished")
    exit_code_strict: int = Field(description="The same with --strict: a known failure exits 1")


def of_result(result: str) -> CiOutcome:
    strict = 1 if result == KNOWN_FAILURE else _EXIT[result]
    return CiOutcome(result=result, exit_code=_EXIT[result], exit_code_strict=strict)


def check_result(state: str, verdict: str | None, regression: bool, fails_on_base: str | None) -> str:
    """One check's result from its run's row (fails_on_base: the text stored with the verdict, or None)."""
    if RunState(state) not in TERMINAL:
        return PENDING
    if verdict == FAIL and not regression and fails_on_base:
        return FAILS_ON_BASE
    if regression or verdict == FAIL:
        return FAIL
    if verdict in (PASS, KNOWN_FAILURE):
        return str(verdict)
    return ERROR


def of_suite(results: list[str]) -> CiOutcome:
    """The suite run's answer from its checks' results; strict: any known failure fails it (an error stays 2)."""
    if PENDING in results:
        overall = PENDING
    elif FAIL in results:
        overall = FAIL
    elif ERROR in results:
        overall = ERROR
    else:
        overall = PASS
    out = of_result(overall)
    if overall == PASS and KNOWN_FAILURE in results:
        out.exit_code_strict = 1
    return out
