"""scheduler faults: phase events, job names, local process start time, per-run failure count

Revision ID: 0003
Revises: 0008
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('phase_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('phase_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('from_state', sa.String(length=32), nullable=True),
    sa.Column('to_state', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['phase_id'], ['phases.id'], name=op.f('fk_phase_events_phase_id_phases'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_phase_events_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_phase_events'))
    )
    op.create_index(op.f('ix_phase_events_phase_id'), 'phase_events', ['phase_id'], unique=False)
    op.create_index(op.f('ix_phase_events_run_id'), 'phase_events', ['run_id'], unique=False)
    op.add_column('phases', sa.Column('job_name', sa.String(length=200), nullable=True))
    op.add_column('phases', sa.Column('job_folder', sa.String(length=1000), nullable=True))
    op.add_column('phases', sa.Column('process_started_at', sa.Float(), nullable=True))
    op.add_column('runs', sa.Column('scheduler_failures', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    op.drop_column('runs', 'scheduler_failures')
    op.drop_column('phases', 'process_started_at')
    op.drop_column('phases', 'job_folder')
    op.drop_column('phases', 'job_name')
    op.drop_index(op.f('ix_phase_events_run_id'), table_name='phase_events')
    op.drop_index(op.f('ix_phase_events_phase_id'), table_name='phase_events')
    op.drop_table('phase_events')
