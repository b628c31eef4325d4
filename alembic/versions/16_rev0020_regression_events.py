"""regression_events: each change of a regression's state, recorded as run_events records a run's

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04

Regressions already in the database get one event each, from nothing to the state they are in, so
every regression's history starts somewhere.
"""

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'regression_events',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('regression_id', sa.Integer(), nullable=False),
        sa.Column('from_state', sa.String(length=16), nullable=True),
        sa.Column('to_state', sa.String(length=16), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['regression_id'], ['regressions.id'],
                                name=op.f('fk_regression_events_regression_id_regressions'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_regression_events')),
    )
    op.create_index(op.f('ix_regression_events_regression_id'), 'regression_events', ['regression_id'], unique=False)
    op.execute("""
        INSERT INTO regression_events (regression_id, from_state, to_state, reason, at)
        SELECT id, NULL, state, 'recorded when transitions began to be', created_at FROM regressions
    """)


def downgrade() -> None:
    op.drop_index(op.f('ix_regression_events_regression_id'), table_name='regression_events')
    op.drop_table('regression_events')
