"""a node's power block (a coolant leak) as its own column

A Critical leak detector on a tray powers it off and blocks it from power-on
until an operator clears the leak (``kiln nodes clear-leak``). The block must
outlive the controller, so it is stored with the node: ``""`` when nothing
blocks it, else why it may not be powered on.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("power_block", sa.String(), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("power_block")
