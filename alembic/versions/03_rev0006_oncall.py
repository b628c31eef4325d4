"""check identity and tracks on runs (data migration computes each run's key); regressions,
notification channels and outbox, known upstream failures

Revision ID: 0006
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0006'
down_revision = '0004'
branch_labels = None
depends_on = None


def _identify_existing_runs() -> None:
    # The key is computed by the service's own function, so a row migrated here and a run queued
    # afterwards with the same spec get the same key (the whole point of a stable check identity).
    from service.core.checks import check_key, check_name, track_of

    conn = op.get_bind()
    rows = conn.execute(sa.text(
        "SELECT runs.id, runs.spec, runs.labels, environments.name FROM runs "
        "JOIN environments ON environments.id = runs.environment_id"
    )).all()
    update = sa.text("UPDATE runs SET check_key = :key, check_name = :name, track = :track WHERE id = :id")
    for run_id, spec, labels, env_name in rows:
        conn.execute(update, {"id": run_id, "key": check_key(spec or {}), "name": check_name(spec or {})[:500],
                              "track": track_of(labels, env_name)[:200]})


def upgrade() -> None:
    op.add_column('runs', sa.Column('check_key', sa.String(length=16), nullable=True))
    op.add_column('runs', sa.Column('check_name', sa.String(length=500), nullable=True))
    op.add_column('runs', sa.Column('track', sa.String(length=200), nullable=True))
    op.add_column('runs', sa.Column('compared_track', sa.String(length=200), nullable=True))
    _identify_existing_runs()
    for column in ('check_key', 'check_name', 'track'):
        op.alter_column('runs', column, nullable=False)
    op.drop_index('ix_runs_config_env_finished', table_name='runs')
    op.create_index('ix_runs_check_track_finished', 'runs', ['check_key', 'track', 'finished_at'], unique=False)
    op.create_index(op.f('ix_runs_check_key'), 'runs', ['check_key'], unique=False)
    op.create_index(op.f('ix_runs_track'), 'runs', ['track'], unique=False)
    _create_oncall_tables()


def _create_oncall_tables() -> None:
    jsonb = postgresql.JSONB(astext_type=sa.Text())
    tz = sa.DateTime(timezone=True)
    op.create_table('regressions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('check_key', sa.String(length=16), nullable=False),
    sa.Column('check_name', sa.String(length=500), nullable=False),
    sa.Column('config', sa.String(length=100), nullable=False),
    sa.Column('track', sa.String(length=200), nullable=False),
    sa.Column('compared_track', sa.String(length=200), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('first_failing_run_id', sa.Integer(), nullable=False),
    sa.Column('last_good_run_id', sa.Integer(), nullable=True),
    sa.Column('latest_failing_run_id', sa.Integer(), nullable=False),
    sa.Column('failing_run_ids', jsonb, nullable=False),
    sa.Column('signatures', jsonb, nullable=False),
    sa.Column('acknowledged_by', sa.String(length=200), nullable=True),
    sa.Column('acknowledged_at', tz, nullable=True),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('upstream_url', sa.String(length=1000), nullable=True),
    sa.Column('resolved_at', tz, nullable=True),
    sa.Column('fixed_by_run_id', sa.Integer(), nullable=True),
    sa.Column('created_at', tz, nullable=False),
    sa.ForeignKeyConstraint(['first_failing_run_id'], ['runs.id'], name=op.f('fk_regressions_first_failing_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['fixed_by_run_id'], ['runs.id'], name=op.f('fk_regressions_fixed_by_run_id_runs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['last_good_run_id'], ['runs.id'], name=op.f('fk_regressions_last_good_run_id_runs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['latest_failing_run_id'], ['runs.id'], name=op.f('fk_regressions_latest_failing_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_regressions'))
    )
    op.create_index(op.f('ix_regressions_created_at'), 'regressions', ['created_at'], unique=False)
    op.create_index('ix_regressions_state', 'regressions', ['state'], unique=False)
    op.create_index('uq_regressions_unresolved', 'regressions', ['check_key', 'track'], unique=True,
                    postgresql_where=sa.text("state <> 'resolved'"))
    op.create_table('notification_channels',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('url', sa.String(length=2000), nullable=False),
    sa.Column('secret', sa.String(length=500), nullable=True),
    sa.Column('events', jsonb, nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('created_at', tz, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notification_channels')),
    sa.UniqueConstraint('name', name=op.f('uq_notification_channels_name'))
    )
    op.create_index(op.f('ix_notification_channels_created_at'), 'notification_channels', ['created_at'], unique=False)
    op.create_table('notification_outbox',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('channel_id', sa.Integer(), nullable=False),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('dedup_key', sa.String(length=300), nullable=False),
    sa.Column('payload', jsonb, nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', tz, nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('delivered_at', tz, nullable=True),
    sa.Column('created_at', tz, nullable=False),
    sa.ForeignKeyConstraint(['channel_id'], ['notification_channels.id'], name=op.f('fk_notification_outbox_channel_id_notification_channels'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notification_outbox')),
    sa.UniqueConstraint('channel_id', 'dedup_key', name='uq_notification_outbox_channel_dedup')
    )
    op.create_index(op.f('ix_notification_outbox_created_at'), 'notification_outbox', ['created_at'], unique=False)
    op.create_index('ix_notification_outbox_due', 'notification_outbox', ['state', 'next_attempt_at'], unique=False)
    op.create_table('known_failures',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('signature', sa.String(length=100), nullable=False),
    sa.Column('environments', jsonb, nullable=False),
    sa.Column('mcore_versions', sa.String(length=200), nullable=False),
    sa.Column('link', sa.String(length=1000), nullable=False),
    sa.Column('note', sa.Text(), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=True),
    sa.Column('retired_at', tz, nullable=True),
    sa.Column('created_at', tz, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_known_failures'))
    )
    op.create_index(op.f('ix_known_failures_created_at'), 'known_failures', ['created_at'], unique=False)
    op.create_index(op.f('ix_known_failures_signature'), 'known_failures', ['signature'], unique=False)


def downgrade() -> None:
    op.drop_table('known_failures')
    op.drop_table('notification_outbox')
    op.drop_table('notification_channels')
    op.drop_table('regressions')
    op.drop_index(op.f('ix_runs_track'), table_name='runs')
    op.drop_index(op.f('ix_runs_check_key'), table_name='runs')
    op.drop_index('ix_runs_check_track_finished', table_name='runs')
    op.create_index('ix_runs_config_env_finished', 'runs', ['config', 'environment_id', 'finished_at'], unique=False)
    op.drop_column('runs', 'compared_track')
    op.drop_column('runs', 'track')
    op.drop_column('runs', 'check_name')
    op.drop_column('runs', 'check_key')
