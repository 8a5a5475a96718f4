"""a node's kind and its rack's bring-up hold, as their own columns

An NVL72 rack has members Kiln powers but never allocates (NVLink switch trays,
power shelves): ``kind`` says which a node is (``compute`` for every node
enrolled before). ``rack_hold`` is why a rack's bring-up keeps a compute tray
from new work (``kiln racks bring-up``; ``""``: nothing holds it), kept across
restarts so a rack never goes out partly brought up.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("kind", sa.String(), nullable=False, server_default="compute")
        )
        batch_op.add_column(sa.Column("rack_hold", sa.String(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("rack_hold")
        batch_op.drop_column("kind")
