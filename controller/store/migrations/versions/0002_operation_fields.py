"""a node's operation in flight as two fields

``nodes.operation`` held either an out-of-service state (the end of a drain)
or ``profile:NAME`` (preparing to an allocation's profile). Each now has its
own column, so a drain no longer forgets the profile a node was being
prepared to.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

PREFIX = "profile:"
nodes = sa.table(
    "nodes",
    sa.column("operation", sa.String()),
    sa.column("drain_target", sa.String()),
    sa.column("allocation_profile", sa.String()),
)


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("drain_target", sa.String(), nullable=False, server_default="")
        )
        batch_op.add_column(
            sa.Column("allocation_profile", sa.String(), nullable=False, server_default="")
        )
    op.execute(
        nodes.update()
        .where(nodes.c.operation.like(PREFIX + "%"))
        .values(allocation_profile=sa.func.substr(nodes.c.operation, len(PREFIX) + 1))
    )
    op.execute(
        nodes.update()
        .where(nodes.c.operation != "")
        .where(sa.not_(nodes.c.operation.like(PREFIX + "%")))
        .values(drain_target=nodes.c.operation)
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("operation")


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("operation", sa.String(), nullable=False, server_default=""))
    op.execute(
        nodes.update()
        .where(nodes.c.allocation_profile != "")
        .values(operation=PREFIX + nodes.c.allocation_profile)
    )
    op.execute(
        nodes.update().where(nodes.c.drain_target != "").values(operation=nodes.c.drain_target)
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("drain_target")
        batch_op.drop_column("allocation_profile")
