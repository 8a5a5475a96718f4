"""Placement quality against the optimum found by OR-Tools CP-SAT.

Small random instances: 4-12 GB200 rack domains of 4-18 trays over 1-3
leaves of one spine, partly used by earlier jobs, and one node request (some
with segments, some with hot spares). CP-SAT solves each exactly for the
engine's own lexicographic objective: fewest NVLink domains, then one leaf
rather than several, then fewest stranded GPUs (free GPUs left in the domains
used). Reported: the share of requests the engine places in the optimal
number of domains, stranded GPUs against the optimum, and the same for a
naive first-fit (fill free nodes in domain order) beside it.

    python bench/placement_quality.py [--quick] [--instances N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from controller.placement import Booking, NodeSpec, NoFit, Request, Topology, Usage, place

GPUS = 4


@dataclass
class Instance:
    topo: Topology
    usage: Usage
    request: Request
    free: dict[str, int]  # domain -> free nodes
    leaf: dict[str, str]


def make_instance(rng: random.Random, idx: int) -> Instance:
    leaves = rng.randint(1, 3)
    specs: list[NodeSpec] = []
    for r in range(rng.randint(4, 12)):
        size = rng.randint(4, 18)
        leaf = f"l{rng.randrange(leaves)}"
        for t in range(size):
            specs.append(
                NodeSpec(f"r{r:02d}-t{t:02d}", "GB200", GPUS, f"d{r:02d}", f"r{r}", leaf, "s0")
            )
    topo = Topology.build(specs, generation=idx)
    usage = Usage(topo)
    busy: list[str] = []
    for d in topo.domains:
        names = topo.domain_nodes(d)
        busy.extend(names[: rng.randint(0, len(names))] if rng.random() < 0.6 else [])
    if busy:
        doms = tuple(sorted({topo.node(n).domain for n in busy}))
        usage = usage.with_booking(
            Booking("earlier", tuple(busy), (), doms, False, "default", GPUS * len(busy))
        )
    free = {d: usage.free_count(d) for d in topo.domains}
    total = sum(free.values())
    seg = rng.choice([0, 0, 0, 2, 4])
    spares = rng.choice([0, 0, 0, 1, 2])
    hi = max(1, total if rng.random() < 0.2 else total // 2)
    n = rng.randint(1, hi)
    if seg:
        n = max(seg, n - n % seg)
    req = Request(f"q{idx}", nodes=n, gpu_model="GB200", segment=seg, spares_per_domain=spares)
    leaf = {d: topo.node(topo.domain_nodes(d)[0]).leaf for d in topo.domains}
    return Instance(topo, usage, req, free, leaf)


def solve_optimal(inst: Instance) -> tuple[int, int, int] | None:
    """(domains, multi-leaf 0/1, stranded GPUs) of the optimum, or None if infeasible."""
    r = inst.request
    seg = r.segment or 1
    s = r.spares_per_domain
    m = cp_model.CpModel()
    doms = list(inst.free)
    y = {d: m.NewIntVar(0, inst.free[d] // seg, f"y{d}") for d in doms}  # segments in d
    u = {d: m.NewBoolVar(f"u{d}") for d in doms}
    for d in doms:
        m.Add(y[d] * seg + s * u[d] <= inst.free[d])
        m.Add(y[d] >= 1).OnlyEnforceIf(u[d])
        m.Add(y[d] == 0).OnlyEnforceIf(u[d].Not())
    m.Add(sum(y[d] * seg for d in doms) == r.nodes)
    leaves = sorted(set(inst.leaf.values()))
    lv = {k: m.NewBoolVar(f"l{k}") for k in leaves}
    for d in doms:
        m.AddImplication(u[d], lv[inst.leaf[d]])
    multi = m.NewBoolVar("multi")
    m.Add(sum(lv.values()) <= 1 + len(leaves) * multi)
    stranded = sum(inst.free[d] * u[d] - y[d] * seg - s * u[d] for d in doms)
    big = 10 * sum(inst.free.values()) + 10
    m.Minimize(big * big * sum(u.values()) + big * multi + stranded)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 10
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    nd = sum(int(solver.Value(u[d])) for d in doms)
    return nd, int(solver.Value(multi)), int(solver.Value(stranded)) * GPUS


def first_fit(inst: Instance) -> tuple[int, int] | None:
    """(domains, stranded GPUs) of filling free nodes in domain order."""
    r = inst.request
    seg = r.segment or 1
    rem = r.nodes
    used = 0
    stranded = 0
    for d in sorted(inst.free):
        cap = inst.free[d] - r.spares_per_domain
        cap -= cap % seg
        if cap <= 0 or rem <= 0:
            continue
        take = min(cap, rem)
        rem -= take
        used += 1
        stranded += (inst.free[d] - take - r.spares_per_domain) * GPUS
    return (used, stranded) if rem <= 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--instances", type=int, default=0)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    n = args.instances or (100 if args.quick else 600)
    rng = random.Random(args.seed)
    solved = same_dom = same_leaf = same_stranded = ff_same_dom = 0
    agree_fit = 0
    eng_str: list[int] = []
    opt_str: list[int] = []
    ff_str: list[int] = []
    worse: list[str] = []
    t_engine = t_opt = 0.0
    for i in range(n):
        inst = make_instance(rng, i)
        t0 = time.perf_counter()
        got = place(inst.topo, inst.usage, inst.request)
        t1 = time.perf_counter()
        opt = solve_optimal(inst)
        t2 = time.perf_counter()
        t_engine += t1 - t0
        t_opt += t2 - t1
        if opt is None:
            agree_fit += isinstance(got, NoFit)
            continue
        if isinstance(got, NoFit):
            worse.append(f"#{i}: engine NoFit ({got.reason}) but optimum exists {opt}")
            solved += 1
            continue
        agree_fit += 1
        solved += 1
        leaves = {inst.leaf[d] for d in got.domains}
        nd = len(got.domains)
        same_dom += nd == opt[0]
        same_leaf += nd == opt[0] and (len(leaves) > 1) == bool(opt[1])
        if nd == opt[0] and (len(leaves) > 1) == bool(opt[1]):
            same_stranded += got.stranded_gpus == opt[2]
            eng_str.append(got.stranded_gpus)
            opt_str.append(opt[2])
        elif len(worse) < 5:
            worse.append(f"#{i}: engine {nd} domains/{len(leaves)} leaves, optimum {opt}")
        ff = first_fit(inst)
        if ff is not None:
            ff_same_dom += ff[0] == opt[0]
            ff_str.append(ff[1])
    for w in worse[:5]:
        print("differs:", w)
    share = same_dom / solved if solved else 0.0
    print(
        f"instances {n}, with a feasible optimum {solved}; feasibility agrees on "
        f"{agree_fit}/{n}\n"
        f"engine: optimal domain count on {same_dom}/{solved} ({share:.1%}), optimal "
        f"domains+leaf on {same_leaf}/{solved}, optimal stranded on {same_stranded}/{same_leaf}\n"
        f"stranded GPUs mean: engine {statistics.fmean(eng_str or [0]):.2f}, optimum "
        f"{statistics.fmean(opt_str or [0]):.2f}; first-fit {statistics.fmean(ff_str or [0]):.2f}"
        f" (optimal domain count on {ff_same_dom}/{solved}, {ff_same_dom / max(1, solved):.1%})\n"
        f"time: engine {t_engine / n * 1e3:.3f} ms/request, CP-SAT {t_opt / n * 1e3:.1f} ms/request"
    )
    print(
        f"SUMMARY placement_quality: optimal domains on {share:.1%} of {solved} requests "
        f"(target >= 99%), optimal stranded on {same_stranded}/{same_leaf}, stranded GPUs "
        f"engine {statistics.fmean(eng_str or [0]):.2f} vs optimum "
        f"{statistics.fmean(opt_str or [0]):.2f}; first-fit optimal domains "
        f"{ff_same_dom / max(1, solved):.1%}, stranded {statistics.fmean(ff_str or [0]):.2f}"
    )


if __name__ == "__main__":
    main()
