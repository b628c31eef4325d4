"""tokens own tracks (api_tokens.tracks) and quotas count what each token stored (artifacts.token_id,
environments.token_id)

Existing tokens get the track pattern "*" so that nothing that worked before is refused; a token
created from now on names the tracks it may write (`parity token create --track 'pr-*'`).

Revision ID: 0016
Revises: 0015
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('api_tokens', sa.Column('tracks', postgresql.JSONB(astext_type=sa.Text()),
                                          server_default='[]', nullable=False))
    op.execute("""UPDATE api_tokens SET tracks = '["*"]'::jsonb""")
    op.add_column('artifacts', sa.Column('token_id', sa.Integer(), nullable=True))
    op.create_foreign_key(op.f('fk_artifacts_token_id_api_tokens'), 'artifacts', 'api_tokens', ['token_id'], ['id'],
                          ondelete='SET NULL')
    op.create_index(op.f('ix_artifacts_token_id'), 'artifacts', ['token_id'], unique=False)
    op.add_column('environments', sa.Column('token_id', sa.Integer(), nullable=True))
    op.create_foreign_key(op.f('fk_environments_token_id_api_tokens'), 'environments', 'api_tokens', ['token_id'],
                          ['id'], ondelete='SET NULL')
    op.create_index(op.f('ix_environments_token_id'), 'environments', ['token_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_environments_token_id'), table_name='environments')
    op.drop_constraint(op.f('fk_environments_token_id_api_tokens'), 'environments', type_='foreignkey')
    op.drop_column('environments', 'token_id')
    op.drop_index(op.f('ix_artifacts_token_id'), table_name='artifacts')
    op.drop_constraint(op.f('fk_artifacts_token_id_api_tokens'), 'artifacts', type_='foreignkey')
    op.drop_column('artifacts', 'token_id')
    op.drop_column('api_tokens', 'tracks')
