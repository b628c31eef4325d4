"""The run list: query-string filters parsed leniently, sorted and paginated in SQL."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from jobs.configs import config_names
from jobs.verdict_names import RUN_VERDICTS
from models import Environment, Run
from service.core.inputs import EARLIEST, LATEST
from service.core.run_state import RunState
from service.runs.records import RunFilter, filtered_runs

PER_PAGE = 50
# The list counts its matches only this far ("5000+ runs", "page 3 of 100+"): an exact count read
# every matching row, the whole history for the default view (200 ms at 100k runs), on every view.
COUNT_CAP = 5000
SORTS: dict[str, Any] = {
    "id": Run.id,
    "created": Run.created_at,
    "config": Run.config,
    "verdict": Run.verdict,
    "delta": Run.max_abs_loss_delta,
}
STATES = tuple(s.value for s in RunState)
FILTER_KEYS = ("config", "check", "track", "environment", "state", "verdict", "regression", "label", "since", "until",
               "selftest")
# self-test runs fail on purpose (injected bugs): hidden unless asked for, shown on the detector-health view
SELFTEST_CHOICES = {"": False, "include": None, "only": True}


@dataclass
class ListQuery:
    """What the run list was asked for, after validation; `problems` lists what was ignored."""

    filters: RunFilter
    params: dict[str, Any]
    sort: str = "id"
    descending: bool = True
    page: int = 1
    problems: list[str] = field(default_factory=list)

    def url(self, **changes: Any) -> str:
        """The /runs URL for this query with some parameters changed (None removes one)."""
        params = {**self.params, "sort": self.sort, "dir": "desc" if self.descending else "asc", "page": self.page}
        params.update(changes)
        pairs: list[tuple[str, Any]] = []
        for key, value in params.items():
            if value in (None, "", []):
                continue
            pairs += [(key, v) for v in value] if isinstance(value, list) else [(key, value)]
        return "/runs?" + urlencode(pairs)

    def sort_url(self, key: str) -> str:
        """Link for a column header: sort by key, toggling direction when already sorted by it."""
        descending = not self.descending if key == self.sort else key in ("id", "created", "delta")
        return self.url(sort=key, dir="desc" if descending else "asc", page=1)


def _date(text: str, problems: list[str], name: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        problems.append(f"{name}: expected a date like 2026-11-30, got {text!r}")
        return None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    # year 9999 plus the day added below overflowed datetime (a 500): the same bounds as the API's
    if not EARLIEST <= value <= LATEST:
        problems.append(f"{name}: expected a date between {EARLIEST.date()} and {LATEST.date()}, got {text!r}")
        return None
    return value


def _labels(values: list[str], problems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    # one key=value per parameter: label values may contain spaces and commas
    for item in (v.strip() for v in values if v.strip()):
        key, sep, val = item.partition("=")
        if not sep or not key:
            problems.append(f"label: expected key=value, got {item!r}")
            continue
        out[key] = val
    return out


def parse_query(args: dict[str, list[str]]) -> ListQuery:
    """Turn query-string values into a filter; bad values are reported, not a 422 on a human page."""
    one = {k: (v[-1].strip() if v else "") for k, v in args.items()}
    problems: list[str] = []
    verdict = one.get("verdict") or None
    if verdict and verdict not in RUN_VERDICTS:
        problems.append(f"verdict: expected one of {', '.join(RUN_VERDICTS)}, got {verdict!r}")
        verdict = None
    state = one.get("state") or None
    if state and state not in STATES:
        problems.append(f"state: unknown state {state!r}")
        state = None
    regression = {"yes": True, "no": False}.get(one.get("regression", ""))
    since = _date(one["since"], problems, "since") if one.get("since") else None
    until = _date(one["until"], problems, "until") if one.get("until") else None
    if until is not None and len(one["until"]) <= 10:
        until += timedelta(days=1)  # a bare date means "through the end of that day"
    labels = _labels(args.get("label", []), problems)
    filters = RunFilter(config=one.get("config") or None, check=one.get("check") or None,
                        track=one.get("track") or None, environment=one.get("environment") or None,
                        state=state, verdict=verdict, regression=regression, labels=labels or None,
                        since=since, until=until, selftest=SELFTEST_CHOICES.get(one.get("selftest", ""), False))
    sort = one.get("sort") or "id"
    if sort not in SORTS:
        problems.append(f"sort: expected one of {', '.join(SORTS)}, got {sort!r}")
        sort = "id"
    # ASCII digits only: str.isdigit() accepts "²", which int() then refuses (a 500 before)
    raw_page = one.get("page", "")
    page = int(raw_page) if re.fullmatch(r"[0-9]{1,9}", raw_page) and int(raw_page) > 0 else 1
    if raw_page and page == 1 and raw_page != "1":
        problems.append(f"page: expected a positive whole number, got {raw_page[:20]!r}")
    params: dict[str, Any] = {k: one.get(k, "") for k in FILTER_KEYS if k != "label"}
    params["label"] = [f"{k}={v}" for k, v in labels.items()]
    return ListQuery(filters=filters, params=params, sort=sort, descending=one.get("dir", "desc") != "asc",
                     page=page, problems=problems)


@dataclass
class RunPage:
    """One page of the run list."""

    runs: list[Run]
    total: int
    page: int
    pages: int
    capped: bool = False  # total is COUNT_CAP and there are more


def page_of_runs(session: Session, query: ListQuery, per_page: int = PER_PAGE) -> RunPage:
    """Count the matches and fetch one sorted page, both in SQL."""
    base = filtered_runs(query.filters)
    counted = base.order_by(None).with_only_columns(Run.id).limit(COUNT_CAP + 1).subquery()
    total = session.scalar(select(func.count()).select_from(counted)) or 0
    capped = total > COUNT_CAP
    total = min(total, COUNT_CAP)
    pages = max(1, math.ceil(total / per_page))
    page = query.page if capped else min(query.page, pages)
    column = SORTS[query.sort]
    order = column.desc() if query.descending else column.asc()
    if column.nullable:  # NULLS LAST on a NOT NULL column (id, created, config) kept Postgres from
        order = order.nulls_last()  # walking an index in order: it sorted every matching row instead
    tiebreak = Run.id.desc() if query.descending else Run.id.asc()
    rows = session.scalars(
        base.options(selectinload(Run.environment)).order_by(order, tiebreak)
        .limit(per_page).offset((page - 1) * per_page)
    )
    return RunPage(runs=list(rows), total=total, page=page, pages=max(pages, page), capped=capped)


def choices(session: Session) -> dict[str, list[str]]:
    """Values for the filter drop-downs (configs come from code: every run was validated against them)."""
    envs = session.scalars(select(Environment.name).order_by(Environment.name))
    return {"configs": config_names(), "environments": list(envs), "verdicts": list(RUN_VERDICTS),
            "states": list(STATES)}
