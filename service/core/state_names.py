"""The run states that are final, named once (stdlib only: the client imports it too).

service/core/run_state.py's TERMINAL is these as RunStates; the suite view, the suite alerts and the
client's wait and reports read them here rather than spelling the states out."""

from __future__ import annotations

FINISHED_RUN_STATES = frozenset({"passed", "failed", "error", "cancelled"})
