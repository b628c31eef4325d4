"""The ORM, grouped by the flow a run takes: the run (run), what it runs in (environment), the runs asked for
together (suite), what watches the history (oncall) and who may act (access); importing this package
registers every table on Base.metadata."""

from models.access import ApiToken, EndedSession
from models.base import Base
from models.environment import Artifact, Environment, Source
from models.oncall import (
    HistorySummary,
    KnownFailure,
    NotificationChannel,
    OutboxMessage,
    Regression,
    RegressionEvent,
    Track,
)
from models.run import Phase, PhaseEvent, ProbeFinding, Run, RunEvent, SchedulerHeartbeat, StepMetric
from models.suite import Bisect, Suite, SuiteRun

__all__ = [
    "ApiToken",
    "Artifact",
    "Base",
    "Bisect",
    "EndedSession",
    "Environment",
    "HistorySummary",
    "KnownFailure",
    "NotificationChannel",
    "OutboxMessage",
    "Phase",
    "PhaseEvent",
    "ProbeFinding",
    "Regression",
    "RegressionEvent",
    "Run",
    "RunEvent",
    "SchedulerHeartbeat",
    "Source",
    "StepMetric",
    "Suite",
    "SuiteRun",
    "Track",
]
