"""artifacts (uploaded builds), suites (named, versioned check lists) and suite runs

Revision ID: 0012
Revises: 0010
Create Date: 2026-12-01 12:00:00.000000
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0012'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('artifacts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('filename', sa.String(length=255), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('path', sa.String(length=1000), nullable=False),
    sa.Column('uploaded_by', sa.String(length=200), nullable=True),
    sa.Column('state', sa.String(length=16), server_default='stored', nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_artifacts')),
    sa.UniqueConstraint('sha256', name=op.f('uq_artifacts_sha256'))
    )
    op.create_index(op.f('ix_artifacts_created_at'), 'artifacts', ['created_at'], unique=False)
    op.create_index(op.f('ix_artifacts_state'), 'artifacts', ['state'], unique=False)
    op.create_table('suites',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('description', sa.String(length=2000), nullable=False),
    sa.Column('checks', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_suites')),
    sa.UniqueConstraint('name', 'version', name='uq_suites_name_version')
    )
    op.create_index(op.f('ix_suites_created_at'), 'suites', ['created_at'], unique=False)
    op.create_index(op.f('ix_suites_name'), 'suites', ['name'], unique=False)
    op.create_table('suite_runs',
    sa.Column('id', sa.String(length=12), nullable=False),
    sa.Column('suite_id', sa.Integer(), nullable=False),
    sa.Column('environment', sa.String(length=200), nullable=False),
    sa.Column('labels', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('requester', sa.String(length=200), nullable=True),
    sa.Column('token_id', sa.Integer(), nullable=True),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('runs', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['suite_id'], ['suites.id'], name=op.f('fk_suite_runs_suite_id_suites')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_suite_runs')),
    sa.UniqueConstraint('token_id', 'idempotency_key', name='uq_suite_runs_token_id_idempotency_key')
    )
    op.create_index(op.f('ix_suite_runs_created_at'), 'suite_runs', ['created_at'], unique=False)
    op.create_index(op.f('ix_suite_runs_suite_id'), 'suite_runs', ['suite_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_suite_runs_suite_id'), table_name='suite_runs')
    op.drop_index(op.f('ix_suite_runs_created_at'), table_name='suite_runs')
    op.drop_table('suite_runs')
    op.drop_index(op.f('ix_suites_name'), table_name='suites')
    op.drop_index(op.f('ix_suites_created_at'), table_name='suites')
    op.drop_table('suites')
    op.drop_index(op.f('ix_artifacts_state'), table_name='artifacts')
    op.drop_index(op.f('ix_artifacts_created_at'), table_name='artifacts')
    op.drop_table('artifacts')
