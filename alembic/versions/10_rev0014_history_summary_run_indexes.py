"""history_summary kept by a trigger (the overview's cost no longer grows with history); runs indexes
the queries use

Revision ID: 0014
Revises: 0012
Create Date: 2026-12-01 16:00:00.000000

Indexes on runs (every POST inserted into eleven): ix_runs_check_key duplicated the first column of
ix_runs_check_track_finished; ix_runs_verdict and ix_runs_regression indexed every run, queued ones
included, for filters that want finished or flagged runs newest first, now partial (verdict, id)
and (id) indexes a queued run never enters; the labels GIN (jsonb_ops: an entry per key and per
value) becomes jsonb_path_ops (one per pair; the filters are @> containment) plus a partial index
for the one key-existence filter (self-test runs). EXPLAIN of each list query: docs/measurements-archive.md.
"""

from alembic import op
import sqlalchemy as sa

revision = '0014'
down_revision = '0012'
branch_labels = None
depends_on = None

# Maintains history_summary from runs: decrement what the old row counted, add what the new row
# counts. Queued runs (no verdict) do not fire it (see the WHEN clauses), so a POST pays nothing.
SUMMARY_FUNCTION = """
CREATE FUNCTION parity_history_summary() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.verdict IS NOT NULL AND NOT (OLD.labels ? 'selftest') THEN
        UPDATE history_summary SET runs = runs - 1
        WHERE check_key = OLD.check_key AND track = OLD.track AND verdict = OLD.verdict;
        -- the old row may have been the latest: find the latest again (rare: a verdict rewritten)
        UPDATE history_summary s SET (latest_run_id, latest_finished_at) = (
            SELECT r.id, r.finished_at FROM runs r
            WHERE r.check_key = OLD.check_key AND r.track = OLD.track AND r.verdict = OLD.verdict
              AND NOT (r.labels ? 'selftest')
            ORDER BY r.finished_at DESC NULLS LAST, r.id DESC LIMIT 1)
        WHERE s.check_key = OLD.check_key AND s.track = OLD.track AND s.verdict = OLD.verdict
          AND s.latest_run_id = OLD.id;
        DELETE FROM history_summary
        WHERE check_key = OLD.check_key AND track = OLD.track AND verdict = OLD.verdict
          AND (runs <= 0 OR latest_run_id IS NULL);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.verdict IS NOT NULL AND NOT (NEW.labels ? 'selftest') THEN
        INSERT INTO history_summary AS s (check_key, track, verdict, runs, latest_run_id, latest_finished_at)
        VALUES (NEW.check_key, NEW.track, NEW.verdict, 1, NEW.id, NEW.finished_at)
        ON CONFLICT (check_key, track, verdict) DO UPDATE SET
            runs = s.runs + 1,
            (latest_run_id, latest_finished_at) = (
                SELECT CASE WHEN later THEN NEW.id ELSE s.latest_run_id END,
                       CASE WHEN later THEN NEW.finished_at ELSE s.latest_finished_at END
                FROM (SELECT s.latest_run_id = NEW.id
                          OR (NEW.finished_at IS NOT NULL AND s.latest_finished_at IS NULL)
                          OR NEW.finished_at > s.latest_finished_at
                          OR (NEW.finished_at IS NOT DISTINCT FROM s.latest_finished_at AND NEW.id > s.latest_run_id)
                      AS later) AS o);
    END IF;
    RETURN NULL;
END $$
"""

TRIGGERS = (
    "CREATE TRIGGER runs_history_summary_insert AFTER INSERT ON runs FOR EACH ROW "
    "WHEN (NEW.verdict IS NOT NULL) EXECUTE FUNCTION parity_history_summary()",
    "CREATE TRIGGER runs_history_summary_update AFTER UPDATE ON runs FOR EACH ROW "
    "WHEN (OLD.verdict IS DISTINCT FROM NEW.verdict OR OLD.finished_at IS DISTINCT FROM NEW.finished_at "
    "OR OLD.check_key IS DISTINCT FROM NEW.check_key OR OLD.track IS DISTINCT FROM NEW.track "
    "OR (OLD.labels ? 'selftest') IS DISTINCT FROM (NEW.labels ? 'selftest')) "
    "EXECUTE FUNCTION parity_history_summary()",
    "CREATE TRIGGER runs_history_summary_delete AFTER DELETE ON runs FOR EACH ROW "
    "WHEN (OLD.verdict IS NOT NULL) EXECUTE FUNCTION parity_history_summary()",
)

BACKFILL = """
INSERT INTO history_summary (check_key, track, verdict, runs, latest_run_id, latest_finished_at)
SELECT check_key, track, verdict, count(*),
       (array_agg(id ORDER BY finished_at DESC NULLS LAST, id DESC))[1],
       (array_agg(finished_at ORDER BY finished_at DESC NULLS LAST, id DESC))[1]
FROM runs WHERE verdict IS NOT NULL AND NOT (labels ? 'selftest')
GROUP BY check_key, track, verdict
"""


def upgrade() -> None:
    op.create_table('history_summary',
    sa.Column('check_key', sa.String(length=16), nullable=False),
    sa.Column('track', sa.String(length=200), nullable=False),
    sa.Column('verdict', sa.String(length=16), nullable=False),
    sa.Column('runs', sa.Integer(), nullable=False),
    sa.Column('latest_run_id', sa.Integer(), nullable=True),
    sa.Column('latest_finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('check_key', 'track', 'verdict', name=op.f('pk_history_summary'))
    )
    op.execute(SUMMARY_FUNCTION)
    for trigger in TRIGGERS:
        op.execute(trigger)
    op.execute(BACKFILL)

    op.drop_index('ix_runs_check_key', table_name='runs')
    op.drop_index('ix_runs_verdict', table_name='runs')
    op.drop_index('ix_runs_regression', table_name='runs')
    op.drop_index('ix_runs_labels', table_name='runs', postgresql_using='gin')
    op.create_index('ix_runs_verdict_id', 'runs', ['verdict', 'id'], unique=False,
                    postgresql_where=sa.text('verdict IS NOT NULL'))
    op.create_index('ix_runs_regression_id', 'runs', ['id'], unique=False, postgresql_where=sa.text('regression IS TRUE'))
    op.create_index('ix_runs_labels_path', 'runs', ['labels'], unique=False, postgresql_using='gin',
                    postgresql_ops={'labels': 'jsonb_path_ops'})
    op.create_index('ix_runs_selftest', 'runs', ['id'], unique=False,
                    postgresql_where=sa.text("labels ? 'selftest'"))


def downgrade() -> None:
    op.drop_index('ix_runs_selftest', table_name='runs')
    op.drop_index('ix_runs_labels_path', table_name='runs', postgresql_using='gin')
    op.drop_index('ix_runs_regression_id', table_name='runs')
    op.drop_index('ix_runs_verdict_id', table_name='runs')
    op.create_index('ix_runs_labels', 'runs', ['labels'], unique=False, postgresql_using='gin')
    op.create_index('ix_runs_regression', 'runs', ['regression'], unique=False)
    op.create_index('ix_runs_verdict', 'runs', ['verdict'], unique=False)
    op.create_index('ix_runs_check_key', 'runs', ['check_key'], unique=False)
    for name in ('insert', 'update', 'delete'):
        op.execute(f"DROP TRIGGER IF EXISTS runs_history_summary_{name} ON runs")
    op.execute("DROP FUNCTION IF EXISTS parity_history_summary()")
    op.drop_table('history_summary')
