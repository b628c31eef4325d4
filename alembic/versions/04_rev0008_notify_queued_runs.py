"""notify listening schedulers when a run is queued (trigger on runs)

Revision ID: 0008
Revises: 0006
Create Date: 2026-11-30

A trigger rather than a NOTIFY from the API: it costs the request no extra round trip, and every
path that queues a run (the API, a rerun, a script inserting rows) wakes the schedulers alike.
Postgres delivers the notification when the inserting transaction commits, never before.
"""

from alembic import op

revision = '0008'
down_revision = '0006'
branch_labels = None
depends_on = None

# keep in step with service/scheduler/wakeup.py RUNS_CHANNEL
CHANNEL = "parity_runs_queued"


def upgrade() -> None:
    op.execute(f"""
        CREATE FUNCTION parity_notify_run_queued() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', NEW.id::text);
            RETURN NULL;
        END $$
    """)
    op.execute("""
        CREATE TRIGGER runs_notify_queued AFTER INSERT ON runs
        FOR EACH ROW WHEN (NEW.state = 'queued') EXECUTE FUNCTION parity_notify_run_queued()
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS runs_notify_queued ON runs")
    op.execute("DROP FUNCTION IF EXISTS parity_notify_run_queued()")
