"""environments the service builds: state, requirements, content hash, build results

Revision ID: 0007
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0007'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('environments', sa.Column('state', sa.String(length=16), server_default='ready', nullable=False))
    op.add_column('environments', sa.Column('requirements', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('environments', sa.Column('content_hash', sa.String(length=64), nullable=True))
    op.add_column('environments', sa.Column('folder', sa.String(length=1000), nullable=True))
    op.add_column('environments', sa.Column('executor', sa.String(length=16), nullable=True))
    op.add_column('environments', sa.Column('job_id', sa.String(length=64), nullable=True))
    op.add_column('environments', sa.Column('error_message', sa.Text(), nullable=True))
    op.add_column('environments', sa.Column('freeze', postgresql.JSONB(astext_type=sa.Text()), server_default='[]', nullable=False))
    op.add_column('environments', sa.Column('megatron_core', sa.String(length=100), nullable=True))
    op.add_column('environments', sa.Column('torch', sa.String(length=100), nullable=True))
    op.add_column('environments', sa.Column('build_seconds', sa.Float(), nullable=True))
    op.add_column('environments', sa.Column('built_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('environments', sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index(op.f('ix_environments_state'), 'environments', ['state'], unique=False)
    op.create_unique_constraint(op.f('uq_environments_content_hash'), 'environments', ['content_hash'])


def downgrade() -> None:
    op.drop_constraint(op.f('uq_environments_content_hash'), 'environments', type_='unique')
    op.drop_index(op.f('ix_environments_state'), table_name='environments')
    for column in ('last_used_at', 'built_at', 'build_seconds', 'torch', 'megatron_core', 'freeze', 'error_message',
                   'job_id', 'executor', 'folder', 'content_hash', 'requirements', 'state'):
        op.drop_column('environments', column)
