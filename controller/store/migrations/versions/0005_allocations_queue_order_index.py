"""an index on allocations (submitted, id)

Allocations are kept after release, so the table grows with every job. A new
allocation takes the next queue position (the highest ``submitted`` so far)
and ``ListAllocations`` pages in (submitted, id) order; without this index
both scan every allocation ever made.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.create_index("ix_allocations_submitted_id", ["submitted", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_index("ix_allocations_submitted_id")
