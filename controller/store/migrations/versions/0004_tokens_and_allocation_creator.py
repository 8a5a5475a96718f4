"""bearer tokens, and who created each allocation

``tokens`` holds operator and agent bearer tokens: the public id a token is
looked up by, its name and role, and a salted scrypt hash of its secret (the
secret itself is never stored). ``allocations.created_by`` records the
identity that asked for an allocation, so a provisioner may release only its
own; allocations from before it have none.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("role", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("secret_hash", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("node", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("created_by", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tokens_name"), ["name"], unique=True)
        batch_op.create_index(batch_op.f("ix_tokens_node"), ["node"], unique=False)
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "created_by",
                sqlmodel.sql.sqltypes.AutoString(),
                nullable=False,
                server_default="",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("created_by")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tokens_node"))
        batch_op.drop_index(batch_op.f("ix_tokens_name"))
    op.drop_table("tokens")
