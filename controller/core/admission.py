"""Whether a request could ever be admitted: the checks that refuse at once
what no state of the fleet could run, instead of letting it wait forever.

Nodes whose GPUs are not known yet (enrolled, not inspected) could be
anything, so they keep a request hoping — unless they are drained or out of
service, when nothing will inspect them until an operator brings them back.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from controller.core.errors import FailedPrecondition, InvalidArgument, KilnError
from controller.core.model import AllocationSpec
from controller.core.records import NodeRecord
from controller.core.states import OUT_OF_SERVICE, NodeState
from controller.placement import QueueConfig


def awaiting_inspection(node: NodeRecord) -> bool:
    """Its GPUs are not known yet and it is on its way to being inspected.

    A drained or out-of-service node (quarantined, powered off, maintenance)
    is inspected only once an operator brings it back, so it cannot keep a
    request waiting.
    """
    return (
        node.gpu_count == 0
        and not node.drained
        and node.state not in OUT_OF_SERVICE
        and node.state != NodeState.DRAINING
    )


def _could_serve(spec: AllocationSpec, nodes: Sequence[NodeRecord]) -> list[NodeRecord]:
    """Nodes that might one day serve ``spec``: inspected nodes of its GPU
    model (any model when it names none), and nodes awaiting inspection."""
    return [
        n
        for n in nodes
        if awaiting_inspection(n)
        or (n.gpu_count > 0 and (not spec.gpu_model or n.gpu_model == spec.gpu_model))
    ]


def might_fit_once_inspected(spec: AllocationSpec, nodes: Sequence[NodeRecord]) -> bool:
    """Whether nodes awaiting inspection could still make ``spec`` fit.

    Their GPUs could be anything, but their number and racks are known: a
    request for more nodes (or racks) than could ever serve it never fits,
    and drained or out-of-service nodes give no hope (``awaiting_inspection``).
    """
    if not any(awaiting_inspection(n) for n in nodes):
        return False
    candidates = _could_serve(spec, nodes)
    if spec.nodes + (spec.spares_per_domain if spec.nodes else 0) > len(candidates):
        return False
    return spec.racks <= len({n.rack or n.name for n in candidates})


def fewest_gpus(spec: AllocationSpec, nodes: Sequence[NodeRecord]) -> int | None:
    """A lower bound of the GPUs any admission of ``spec`` books on this fleet
    (job nodes and spares, as queue quotas count them): the smallest nodes (or
    rack domains) that could serve it, a node awaiting inspection counting as
    one GPU. None when too few could serve it (it never fits anyway)."""
    candidates = _could_serve(spec, nodes)
    hopeful = [1 for n in candidates if awaiting_inspection(n)]
    if spec.racks:
        domains: dict[str, int] = defaultdict(int)
        members: dict[str, int] = defaultdict(int)
        for n in candidates:
            if n.gpu_count > 0 and n.nvlink_domain:
                domains[n.nvlink_domain] += n.gpu_count
                members[n.nvlink_domain] += 1
        sizes = [g for d, g in domains.items() if members[d] > 1] + hopeful
        need = spec.racks
    else:
        sizes = [n.gpu_count for n in candidates if n.gpu_count > 0] + hopeful
        need = spec.nodes + spec.spares_per_domain
    return sum(sorted(sizes)[:need]) if len(sizes) >= need else None


def never_admitted(
    spec: AllocationSpec, nodes: Sequence[NodeRecord], queues: Sequence[QueueConfig]
) -> KilnError | None:
    """Why ``spec``'s queue could never admit it, whatever the fleet does
    (None: it might). Queues only limit anything when some are configured.

    InvalidArgument: the queue is not configured. FailedPrecondition: even the
    fewest GPUs it could book are more than the queue's quota plus its
    borrowing limit.
    """
    if not queues:
        return None
    name = spec.queue or "default"
    queue = next((q for q in queues if q.name == name), None)
    if queue is None:
        known = ", ".join(sorted(q.name for q in queues))
        return InvalidArgument(f"unknown queue {name!r}; the configured queues are {known}")
    if queue.gpu_quota is None:
        return None
    most = queue.gpu_quota + queue.borrowing_limit
    least = fewest_gpus(spec, nodes)
    if least is not None and least > most:
        return FailedPrecondition(
            f"this request can never be admitted: it needs at least {least} GPUs, more than "
            f"queue {name!r} may ever hold (quota {queue.gpu_quota} + borrowing limit "
            f"{queue.borrowing_limit})"
        )
    return None
