"""The run states and the wait bound the client shares with the service, named once (stdlib only: the client
imports it too).

service/core/run_state.py's TERMINAL is the finished states as RunStates; the suite view, the suite alerts and the
client's wait and reports read them here rather than spelling the states out."""

from __future__ import annotations

FINISHED_RUN_STATES = frozenset({"passed", "failed", "error", "cancelled"})
# past the queue and not finished: a phase submitted or running, or the verdict being computed
RUNNING_RUN_STATES = frozenset({"train_submitted", "train_running", "resume_submitted", "resume_running", "evaluating"})
QUEUED_RUN_STATE = "queued"
# the longest the service holds a long poll (GET …/wait), and so the longest a client's one wait lasts
MAX_WAIT_S = 20.0
