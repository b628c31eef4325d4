"""api security: token expiry, idempotency keys scoped to the token, retention timestamps

Revision ID: 0004
Revises: 0001
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = '0004'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('api_tokens', sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('runs', sa.Column('token_id', sa.Integer(), nullable=True))
    op.add_column('runs', sa.Column('checkpoints_deleted_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('runs', sa.Column('files_deleted_at', sa.DateTime(timezone=True), nullable=True))
    op.create_foreign_key(op.f('fk_runs_token_id_api_tokens'), 'runs', 'api_tokens', ['token_id'], ['id'],
                          ondelete='SET NULL')
    op.drop_constraint(op.f('uq_runs_idempotency_key'), 'runs', type_='unique')
    op.create_unique_constraint(op.f('uq_runs_token_id_idempotency_key'), 'runs', ['token_id', 'idempotency_key'])


def downgrade() -> None:
    op.drop_constraint(op.f('uq_runs_token_id_idempotency_key'), 'runs', type_='unique')
    op.create_unique_constraint(op.f('uq_runs_idempotency_key'), 'runs', ['idempotency_key'])
    op.drop_constraint(op.f('fk_runs_token_id_api_tokens'), 'runs', type_='foreignkey')
    op.drop_column('runs', 'files_deleted_at')
    op.drop_column('runs', 'checkpoints_deleted_at')
    op.drop_column('runs', 'token_id')
    op.drop_column('api_tokens', 'expires_at')
