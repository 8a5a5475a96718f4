"""an index on nodes.bmc_url

Enrolment refuses a second node with a BMC URL another node already has; the
index keeps that look-up cheap on a large fleet. It is not unique: a database
from before the check may already hold two nodes on one BMC, and upgrading
must not fail on it (``kiln nodes list`` shows both; drain the one that is
not that BMC's machine).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_bmc_url"), ["bmc_url"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_bmc_url"))
