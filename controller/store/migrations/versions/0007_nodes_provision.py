"""the OS image a node is being provisioned with, as its own column

Provisioning (``kiln nodes provision``) inserts a catalogue image through the
BMC's virtual media, power-cycles the node and waits for its agent. A
controller that restarts meanwhile must resume it, so the operation (image,
URL, pinned sha256, phase, when the node was cycled) is stored with the node
as JSON: ``""`` when the node is not being provisioned.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("provision_json", sa.String(), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("provision_json")
