"""The verdict names, defined once: what a parity run ends in, and the service's own known-failure.

Every module that compares against a verdict imports its name from here (tests/jobs/test_verdict_names.py
finds a spelled-out one). Stdlib only: the base client install and a bare environment Python import it.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

PASS: Final = "pass"
FAIL: Final = "fail"
ERROR: Final = "error"
# a service verdict: a fail or error every signature of which is a registered upstream bug on that build
KNOWN_FAILURE: Final = "known-failure"

# what a parity run's documents carry (the verdict of jobs/verdict/compare.py)
Verdict = Literal["pass", "fail", "error"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
# what a run's verdict can be in the service: the parity verdicts, then known-failure
RunVerdict = Literal["pass", "fail", "error", "known-failure"]
RUN_VERDICTS: tuple[RunVerdict, ...] = get_args(RunVerdict)

# groups the service decides by, named once
FAILED: Final = (FAIL, ERROR)  # "not the same run, or it could not tell": shown red, kept longer
# "couldn't tell" (the service's or the host's failure, never the build's answer: a crash in the build's own frames
# is a fail): a verdict that neither breaks nor restores a check's history and opens no regression
COULD_NOT_TELL: Final = (ERROR,)
GOOD: Final = (PASS, KNOWN_FAILURE)  # what CI lets through (exit 0, a green cell) unless --strict
BROKEN: Final = (FAIL, KNOWN_FAILURE)  # a bisect's "bad": the check ran and the build got it wrong
NOT_PASSED: Final = (FAIL, ERROR, KNOWN_FAILURE)  # something to triage or shrink
