"""Sources and tracks: Megatron-LM built from a source's commits, watched on a schedule, bisected by commit.

`sources` (a git URL or local repository at a ref, or a plain tree) and `tracks` (a suite run on a
source's latest commit every so often) are new; an environment records the commit it was built from
(its date and subject line); a bisect may walk a source's commits; a regression keeps the first bad
commit its bisect named.

Revision ID: 0018
Revises: 0016 (0017 is on another branch: re-chained on merge)
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0018'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'sources',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=100), nullable=False),
        sa.Column('kind', sa.String(length=8), nullable=False),
        sa.Column('location', sa.String(length=1000), nullable=False),
        sa.Column('ref', sa.String(length=200), nullable=True),
        sa.Column('created_by', sa.String(length=200), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_sources')),
        sa.UniqueConstraint('name', name=op.f('uq_sources_name')),
    )
    op.create_index(op.f('ix_sources_created_at'), 'sources', ['created_at'], unique=False)
    op.create_table(
        'tracks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=100), nullable=False),
        sa.Column('source_id', sa.Integer(), nullable=False),
        sa.Column('suite', sa.String(length=100), nullable=False),
        sa.Column('every_seconds', sa.Integer(), nullable=False),
        sa.Column('auto_bisect', sa.Boolean(), nullable=False),
        sa.Column('next_run_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_run_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_commit', sa.String(length=64), nullable=True),
        sa.Column('last_suite_run_id', sa.String(length=12), nullable=True),
        sa.Column('last_error', sa.String(length=2000), nullable=True),
        sa.Column('created_by', sa.String(length=200), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['source_id'], ['sources.id'], name=op.f('fk_tracks_source_id_sources')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_tracks')),
        sa.UniqueConstraint('name', name=op.f('uq_tracks_name')),
    )
    op.create_index(op.f('ix_tracks_created_at'), 'tracks', ['created_at'], unique=False)
    op.create_index(op.f('ix_tracks_source_id'), 'tracks', ['source_id'], unique=False)
    op.add_column('environments', sa.Column('source', sa.String(length=100), nullable=True))
    op.add_column('environments', sa.Column('source_commit', sa.String(length=64), nullable=True))
    op.add_column('environments', sa.Column('source_commit_date', sa.DateTime(timezone=True), nullable=True))
    op.add_column('environments', sa.Column('source_commit_subject', sa.String(length=500), nullable=True))
    op.create_index(op.f('ix_environments_source_commit'), 'environments', ['source_commit'], unique=False)
    op.add_column('bisects', sa.Column('source', sa.String(length=100), nullable=True))
    op.add_column('bisects', sa.Column('commits', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('regressions', sa.Column('bisect_id', sa.String(length=12), nullable=True))
    op.add_column('regressions', sa.Column('first_bad_commit', sa.String(length=64), nullable=True))
    op.add_column('regressions', sa.Column('first_bad_subject', sa.String(length=500), nullable=True))


def downgrade() -> None:
    op.drop_column('regressions', 'first_bad_subject')
    op.drop_column('regressions', 'first_bad_commit')
    op.drop_column('regressions', 'bisect_id')
    op.drop_column('bisects', 'commits')
    op.drop_column('bisects', 'source')
    op.drop_index(op.f('ix_environments_source_commit'), table_name='environments')
    op.drop_column('environments', 'source_commit_subject')
    op.drop_column('environments', 'source_commit_date')
    op.drop_column('environments', 'source_commit')
    op.drop_column('environments', 'source')
    op.drop_index(op.f('ix_tracks_source_id'), table_name='tracks')
    op.drop_index(op.f('ix_tracks_created_at'), table_name='tracks')
    op.drop_table('tracks')
    op.drop_index(op.f('ix_sources_created_at'), table_name='sources')
    op.drop_table('sources')
