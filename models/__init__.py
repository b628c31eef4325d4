"""The ORM: one module per table; importing this package registers every table on Base.metadata."""

from models.artifact import Artifact
from models.base import Base
from models.bisect import Bisect
from models.environment import Environment
from models.event import PhaseEvent, RunEvent, SchedulerHeartbeat
from models.history_summary import HistorySummary
from models.known_failure import KnownFailure
from models.metric import StepMetric
from models.notification import NotificationChannel, OutboxMessage
from models.phase import Phase
from models.probe import ProbeFinding
from models.regression import Regression
from models.run import Run
from models.session import EndedSession
from models.source import Source
from models.suite import Suite
from models.suite_run import SuiteRun
from models.token import ApiToken
from models.track import Track

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
    "Run",
    "RunEvent",
    "SchedulerHeartbeat",
    "Source",
    "StepMetric",
    "Suite",
    "SuiteRun",
    "Track",
]
