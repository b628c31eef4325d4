"""notify waiting API requests when a run changes state (trigger on runs)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04

What `parity submit --wait` long-polls on (service/runs/changes.py): every change of a run's state,
whoever makes it (the scheduler's transitions, a cancel through the API), notifies with the run's id
when its transaction commits. A trigger, as for queued runs (0008): no path can forget it.
"""

from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

# keep in step with service/runs/changes.py CHANNEL
CHANNEL = "parity_run_changed"


def upgrade() -> None:
    op.execute(f"""
        CREATE FUNCTION parity_notify_run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', NEW.id::text);
            RETURN NULL;
        END $$
    """)
    op.execute("""
        CREATE TRIGGER runs_notify_changed AFTER UPDATE OF state ON runs
        FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION parity_notify_run_changed()
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS runs_notify_changed ON runs")
    op.execute("DROP FUNCTION IF EXISTS parity_notify_run_changed()")
