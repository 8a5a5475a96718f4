"""Placement throughput: decisions/s, p50/p99 latency and state memory.

Fleets of 1k, 10k and 25k nodes (90 % of nodes in GB200 NVL72 racks of
18 four-GPU trays, the rest 8-GPU HGX H200/H100 boxes; ~110k GPUs at 25k),
eight racks or 32 boxes to a leaf, 16 leaves to a spine. The fleet is first
filled to ~85 % (``--fill``) with the request mix below, then a timed stream of mixed
requests (single nodes, small gangs, rack-sized gangs with spares, segmented
large gangs, whole racks, exclusive gangs) runs with releases that keep
utilisation near that level.

Timed per decision: ``place`` alone, and ``place`` plus booking the result
(``Usage.with_booking``). A naive first-fit baseline (scan nodes in order,
take the first free ones of the model, ignore topology) runs beside it.
Memory: tracemalloc of the Topology plus one Usage holding the bookings.

    python bench/placement_throughput.py [--quick] [--decisions N] [--seed S]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from dataclasses import dataclass

from controller.placement import (
    Booking,
    Level,
    NodeSpec,
    NoFit,
    Request,
    Topology,
    Usage,
    booking_for,
    place,
)

RACK_TRAYS = 18
RACKS_PER_LEAF = 8
BOXES_PER_LEAF = 32
LEAVES_PER_SPINE = 16


def make_fleet(nodes: int, rack_share: float = 0.9) -> list[NodeSpec]:
    """A mixed fleet of about ``nodes`` nodes."""
    racks = round(nodes * rack_share / RACK_TRAYS)
    boxes = max(0, nodes - racks * RACK_TRAYS)
    specs: list[NodeSpec] = []
    leaf_no = 0
    for r in range(racks):
        if r % RACKS_PER_LEAF == 0:
            leaf_no += 1
        leaf = f"leaf{leaf_no:04d}"
        spine = f"spine{(leaf_no - 1) // LEAVES_PER_SPINE:03d}"
        for t in range(1, RACK_TRAYS + 1):
            specs.append(
                NodeSpec(
                    f"gb200-r{r + 1:04d}-t{t:02d}",
                    "GB200",
                    4,
                    f"9b1c.{r + 1}",
                    f"r{r + 1:04d}",
                    leaf,
                    spine,
                )
            )
    for b in range(boxes):
        if b % BOXES_PER_LEAF == 0:
            leaf_no += 1
        model = "H200" if b % 2 == 0 else "H100"
        name = f"hgx-{b + 1:05d}"
        leaf = f"leaf{leaf_no:04d}"
        spine = f"spine{(leaf_no - 1) // LEAVES_PER_SPINE:03d}"
        specs.append(NodeSpec(name, model, 8, name, f"h{b // 4:04d}", leaf, spine))
    return specs


def make_request(rng: random.Random, key: str) -> Request:
    """One request of the mixed stream."""
    x = rng.random()
    if x < 0.45:
        model = rng.choice(["GB200", "H200", "H100", None])
        return Request(key, nodes=1, gpu_model=model)
    if x < 0.65:
        model = rng.choice(["GB200", "H200", "H100"])
        return Request(key, nodes=rng.randint(2, 8), gpu_model=model)
    if x < 0.75:
        return Request(
            key, nodes=rng.randint(9, 18), gpu_model="GB200", level=Level.NVLINK, required=False
        )
    if x < 0.83:
        return Request(key, nodes=16, gpu_model="GB200", spares_per_domain=2)
    if x < 0.90:
        seg = rng.choice([0, 16])
        n = rng.choice([32, 48, 64, 96, 144])
        return Request(key, nodes=n, gpu_model="GB200", segment=seg, level=Level.SPINE)
    if x < 0.95:
        return Request(key, racks=rng.randint(1, 4), gpu_model="GB200")
    return Request(key, nodes=rng.randint(4, 18), gpu_model="GB200", exclusive=True)


# -- naive first-fit baseline ---------------------------------------------------


class FirstFit:
    """Scan nodes in name order and take the first free ones of the model."""

    def __init__(self, specs: list[NodeSpec]) -> None:
        self.specs = sorted(specs, key=lambda s: s.name)
        self.owner: dict[str, str] = {}
        self.domains: dict[str, list[str]] = {}
        for s in self.specs:
            self.domains.setdefault(s.domain, []).append(s.name)
        self.model = {s.name: s.gpu_model for s in self.specs}
        self.dom_of = {s.name: s.domain for s in self.specs}

    def place(self, r: Request) -> tuple[str, ...] | None:
        if r.racks:
            got: list[str] = []
            count = 0
            for members in self.domains.values():
                if len(members) > 1 and all(m not in self.owner for m in members):
                    if r.gpu_model and self.model[members[0]] != r.gpu_model:
                        continue
                    got.extend(members)
                    count += 1
                    if count == r.racks:
                        return tuple(got)
            return None
        need = r.nodes + r.spares_per_domain
        by_model: dict[str, list[str]] = {}
        for s in self.specs:
            if s.name in self.owner or (r.gpu_model and s.gpu_model != r.gpu_model):
                continue
            lst = by_model.setdefault(s.gpu_model, [])
            lst.append(s.name)
            if len(lst) == need:
                return tuple(lst)
        return None

    def book(self, key: str, nodes: tuple[str, ...]) -> None:
        for n in nodes:
            self.owner[n] = key

    def release(self, key: str, nodes: tuple[str, ...]) -> None:
        for n in nodes:
            self.owner.pop(n, None)


# -- runs ----------------------------------------------------------------------------


@dataclass
class Result:
    decisions: int
    placed: int
    place_s: list[float]
    total_s: float
    domains: list[int]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_engine(
    topo: Topology, specs: list[NodeSpec], decisions: int, seed: int, fill: float = 0.75
) -> tuple[Result, Usage]:
    rng = random.Random(seed)
    usage = Usage(topo)
    active: list[Booking] = []
    total_nodes = len(specs)
    booked = 0
    i = 0

    def step(timed: bool, res: Result | None) -> None:
        nonlocal usage, booked, i
        i += 1
        req = make_request(rng, f"j{i}")
        t0 = time.perf_counter()
        got = place(topo, usage, req)
        t1 = time.perf_counter()
        if not isinstance(got, NoFit):
            b = booking_for(topo, req, got)
            usage = usage.with_booking(b)
            active.append(b)
            booked += len(b.all_nodes)
        t2 = time.perf_counter()
        while booked > fill * total_nodes and active:
            b = active.pop(rng.randrange(len(active)))
            usage = usage.without(b.key)
            booked -= len(b.all_nodes)
        t3 = time.perf_counter()
        if res is not None and timed:
            res.decisions += 1
            res.place_s.append(t1 - t0)
            res.total_s += t3 - t0
            if not isinstance(got, NoFit):
                res.placed += 1
                if got.nodes and req.nodes > 1:
                    res.domains.append(len(got.domains))
        del t2

    while booked < fill * total_nodes * 0.98:
        step(False, None)
    res = Result(0, 0, [], 0.0, [])
    gc.collect()
    for _ in range(decisions):
        step(True, res)
    return res, usage


def run_firstfit(specs: list[NodeSpec], decisions: int, seed: int, fill: float = 0.75) -> Result:
    rng = random.Random(seed)
    ff = FirstFit(specs)
    active: list[tuple[str, tuple[str, ...]]] = []
    booked = 0
    i = 0
    res = Result(0, 0, [], 0.0, [])

    def step(timed: bool) -> None:
        nonlocal booked, i
        i += 1
        req = make_request(rng, f"j{i}")
        t0 = time.perf_counter()
        got = ff.place(req)
        t1 = time.perf_counter()
        if got is not None:
            ff.book(req.key, got)
            active.append((req.key, got))
            booked += len(got)
        while booked > fill * len(specs) and active:
            key, nodes = active.pop(rng.randrange(len(active)))
            ff.release(key, nodes)
            booked -= len(nodes)
        t3 = time.perf_counter()
        if timed:
            res.decisions += 1
            res.place_s.append(t1 - t0)
            res.total_s += t3 - t0
            if got is not None:
                res.placed += 1
                if req.nodes > 1:
                    res.domains.append(len({ff.dom_of[n] for n in got}))

    while booked < fill * len(specs) * 0.98:
        step(False)
    for _ in range(decisions):
        step(True)
    return res


def measure_memory(nodes: int, bookings: tuple[Booking, ...]) -> float:
    """MiB held by one Topology (node specs included) plus one Usage with ``bookings``."""
    gc.collect()
    tracemalloc.start()
    topo = Topology.build(make_fleet(nodes))
    usage = Usage.from_bookings(topo, bookings)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del topo, usage
    return current / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    ap.add_argument("--decisions", type=int, default=0, help="timed decisions per fleet")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--fill", type=float, default=0.85, help="target node utilisation")
    args = ap.parse_args()
    sizes = [1_000, 10_000, 25_000]
    decisions = args.decisions or (500 if args.quick else 3000)
    ff_decisions = max(100, decisions // 5)
    summary = []
    for n in sizes:
        specs = make_fleet(n)
        gpus = sum(s.gpus for s in specs)
        t0 = time.perf_counter()
        topo = Topology.build(specs)
        build_ms = (time.perf_counter() - t0) * 1000
        res, usage = run_engine(topo, specs, decisions, args.seed, args.fill)
        bookings = usage.bookings()
        mem = measure_memory(n, bookings)
        ff = run_firstfit(specs, ff_decisions, args.seed, args.fill)
        rate_place = res.decisions / sum(res.place_s)
        rate_total = res.decisions / res.total_s
        ff_rate = ff.decisions / ff.total_s
        dom = statistics.fmean(res.domains) if res.domains else 0.0
        ff_dom = statistics.fmean(ff.domains) if ff.domains else 0.0
        print(
            f"fleet {len(specs):>6} nodes {gpus:>7} GPUs {len(topo.domains):>5} domains | "
            f"build {build_ms:6.0f} ms | engine: {rate_place:8.0f} place/s, "
            f"{rate_total:7.0f} decisions/s incl. book+release, "
            f"p50 {pct(res.place_s, 0.5) * 1e3:.3f} ms, p99 {pct(res.place_s, 0.99) * 1e3:.3f} ms, "
            f"max {max(res.place_s) * 1e3:.2f} ms, placed {res.placed}/{res.decisions}, "
            f"domains/multi-node job {dom:.2f} | state {mem:.1f} MiB | "
            f"first-fit: {ff_rate:7.0f} decisions/s, p99 {pct(ff.place_s, 0.99) * 1e3:.2f} ms, "
            f"domains/multi-node job {ff_dom:.2f} | speed-up x{rate_total / ff_rate:.1f}"
        )
        summary.append((len(specs), rate_total, pct(res.place_s, 0.99) * 1e3, mem, ff_rate))
    big = summary[-1]
    print(
        f"SUMMARY placement_throughput: {big[0]} nodes: {big[1]:.0f} decisions/s "
        f"(target >= 1000), p99 place {big[2]:.2f} ms (target <= 20), state {big[3]:.0f} MiB "
        f"(target <= 512); first-fit baseline {big[4]:.0f} decisions/s"
    )


if __name__ == "__main__":
    main()
