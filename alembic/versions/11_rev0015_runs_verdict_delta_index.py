"""The failed-runs-by-delta list in one index: (verdict, max_abs_loss_delta, id) for finished,
non-self-test runs.

`/runs?verdict=fail&sort=delta` (on-call's "worst regressions first") found its rows through
ix_runs_verdict_id, then fetched every failed run's heap page to read the self-test label and the
delta, sorted them all, and read the same pages again for the capped count: p95 103-184 ms at 100k
runs. This index is in the list's own order and its predicate is the dashboard's default filter
(finished, not a self-test), so the page walks 50 entries and the count is an index-only scan.
Queued runs (no verdict) never enter it, so a POST pays nothing for it.

Revision ID: 0015
Revises: 0014
"""

from alembic import op
import sqlalchemy as sa

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        'ix_runs_verdict_delta', 'runs',
        ['verdict', sa.text('max_abs_loss_delta DESC NULLS LAST'), sa.text('id DESC')], unique=False,
        postgresql_where=sa.text("verdict IS NOT NULL AND NOT (labels ? 'selftest')"),
    )


def downgrade() -> None:
    op.drop_index('ix_runs_verdict_delta', table_name='runs')
