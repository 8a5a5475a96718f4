"""the leak watcher's reads that found no detectors, kept across restarts

A node whose BMC showed no leak detectors is asked again after a wait that
doubles with each such read in a row (10 minutes up to an hour). Kept here
(when, how many in a row, through which BMC URL) so a restarted controller
goes on with those waits instead of asking every BMC of the fleet at once,
and again 5-10 minutes later.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leak_looks",
        sa.Column("node", sa.String(), sa.ForeignKey("nodes.name"), nullable=False),
        sa.Column("bmc_url", sa.String(), nullable=False),
        sa.Column("none_at", sa.Float(), nullable=False),
        sa.Column("none_streak", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("node"),
    )


def downgrade() -> None:
    op.drop_table("leak_looks")
