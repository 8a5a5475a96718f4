"""Trace-shaped replay: an event-driven cluster simulation using ``schedule``.

The workload is synthetic but shaped like public GPU-cluster traces (Helios,
Philly): most jobs take one node, a heavy tail takes 2-128 nodes; durations
are log-normal (median ~40 min, long tail, capped at two days); arrivals are
Poisson at a rate that offers ~100 % of the fleet's node-hours. Gangs larger
than one HGX box ask for GB200 trays. A few jobs ask for whole racks or
keep 2 hot spares.

Each arrival and each completion runs one scheduling cycle over the pending
jobs (priority, FIFO, a hold for the head job). Reported: GPU utilisation
over the arrival window, mean and p95 queue wait, the worst wait of large
gangs (>= 32 nodes, where starvation shows), and NVLink domains spanned per
multi-node job. The baseline on the same workload: first-fit node choice
(ignores topology) and greedy admission of any job that fits (no holds).

    python bench/placement_replay.py [--quick] [--jobs N] [--nodes N] [--seed S]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import time
from dataclasses import dataclass

from placement_throughput import FirstFit, make_fleet

from controller.placement import Level, Request, Topology, Usage, schedule


@dataclass
class Job:
    key: str
    arrive: float
    duration: float
    request: Request


def make_jobs(rng: random.Random, n: int, fleet_nodes: int, load: float) -> list[Job]:
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    weights = [0.70, 0.08, 0.07, 0.05, 0.05, 0.03, 0.015, 0.005]
    mu, sigma = math.log(40 * 60), 1.4  # median 40 min
    mean_dur = math.exp(mu + sigma * sigma / 2)
    mean_size = sum(s * w for s, w in zip(sizes, weights, strict=True))
    rate = load * fleet_nodes / (mean_size * mean_dur)  # arrivals per second
    t = 0.0
    jobs = []
    for i in range(n):
        t += rng.expovariate(rate)
        dur = min(rng.lognormvariate(mu, sigma), 48 * 3600)
        x = rng.random()
        key = f"job{i:05d}"
        if x < 0.01:
            req = Request(key, racks=1, gpu_model="GB200", submitted=i)
        else:
            size = rng.choices(sizes, weights)[0]
            if size <= 8:
                model = rng.choices(["GB200", None, "H200", "H100"], [0.75, 0.15, 0.05, 0.05])[0]
                req = Request(key, nodes=size, gpu_model=model, submitted=i)
            elif size == 16 and rng.random() < 0.3:
                req = Request(key, nodes=16, gpu_model="GB200", spares_per_domain=2, submitted=i)
            else:
                level = Level.NVLINK if size <= 18 else Level.LEAF
                req = Request(
                    key, nodes=size, gpu_model="GB200", level=level, required=False, submitted=i
                )
        jobs.append(Job(key, t, dur, req))
    return jobs


@dataclass
class Stats:
    waits: list[float]
    big_waits: list[float]
    domains: list[int]
    busy_gpu_s: float
    horizon: float
    total_gpus: int
    cycles: int
    cycle_s: float
    unfinished: int

    def line(self, name: str) -> str:
        util = self.busy_gpu_s / (self.total_gpus * self.horizon)
        p95 = sorted(self.waits)[int(0.95 * (len(self.waits) - 1))] if self.waits else 0.0
        return (
            f"{name:<9} utilisation {util:6.1%} | wait mean "
            f"{statistics.fmean(self.waits) / 60:7.1f} min, p95 {p95 / 60:7.1f} min | "
            "large gangs: max wait "
            f"{max(self.big_waits or [0]) / 3600:6.1f} h | domains/multi-node job "
            f"{statistics.fmean(self.domains or [0]):.2f} | started {len(self.waits)}, "
            f"never started {self.unfinished} | {self.cycles} cycles, "
            f"{self.cycle_s / max(1, self.cycles) * 1e3:.2f} ms/cycle"
        )


def _gpu_count(topo_gpus: dict[str, int], nodes: tuple[str, ...]) -> int:
    return sum(topo_gpus[n] for n in nodes)


def simulate_engine(topo: Topology, jobs: list[Job], gpus_of: dict[str, int]) -> Stats:
    by_key = {j.key: j for j in jobs}
    events: list[tuple[float, int, str, str]] = [(j.arrive, 1, "arrive", j.key) for j in jobs]
    heapq.heapify(events)
    horizon = jobs[-1].arrive
    usage = Usage(topo)
    pending: dict[str, Request] = {}
    st = Stats([], [], [], 0.0, horizon, sum(gpus_of.values()), 0, 0.0, 0)
    while events:
        now, _, kind, key = heapq.heappop(events)
        if kind == "arrive":
            pending[key] = by_key[key].request
        else:
            usage = usage.without(key)
        t0 = time.perf_counter()
        res = schedule(topo, usage, list(pending.values()))
        st.cycle_s += time.perf_counter() - t0
        st.cycles += 1
        assert res.usage is not None
        usage = res.usage
        for k in res.rejected:
            pending.pop(k, None)
        for k, p in res.admitted.items():
            job = by_key[k]
            pending.pop(k, None)
            wait = now - job.arrive
            st.waits.append(wait)
            if job.request.nodes >= 32 or job.request.racks:
                st.big_waits.append(wait)
            if len(p.nodes) > 1:
                st.domains.append(len(p.domains))
            end = now + job.duration
            gpus = _gpu_count(gpus_of, p.nodes + p.spares)
            st.busy_gpu_s += gpus * max(0.0, min(end, horizon) - min(now, horizon))
            heapq.heappush(events, (end, 0, "end", k))
    st.unfinished = len(pending)
    return st


def simulate_firstfit(specs: list, jobs: list[Job], gpus_of: dict[str, int]) -> Stats:
    by_key = {j.key: j for j in jobs}
    events: list[tuple[float, int, str, str]] = [(j.arrive, 1, "arrive", j.key) for j in jobs]
    heapq.heapify(events)
    horizon = jobs[-1].arrive
    ff = FirstFit(specs)
    running: dict[str, tuple[str, ...]] = {}
    pending: dict[str, Request] = {}
    st = Stats([], [], [], 0.0, horizon, sum(gpus_of.values()), 0, 0.0, 0)
    while events:
        now, _, kind, key = heapq.heappop(events)
        if kind == "arrive":
            pending[key] = by_key[key].request
        else:
            ff.release(key, running.pop(key))
        t0 = time.perf_counter()
        for k, req in sorted(pending.items(), key=lambda kv: kv[1].submitted):
            got = ff.place(req)
            if got is None:
                continue
            ff.book(k, got)
            running[k] = got
            del pending[k]
            job = by_key[k]
            wait = now - job.arrive
            st.waits.append(wait)
            if req.nodes >= 32 or req.racks:
                st.big_waits.append(wait)
            if len(got) > 1:
                st.domains.append(len({ff.dom_of[n] for n in got}))
            end = now + job.duration
            st.busy_gpu_s += _gpu_count(gpus_of, got) * max(0.0, min(end, horizon) - now)
            heapq.heappush(events, (end, 0, "end", k))
        st.cycle_s += time.perf_counter() - t0
        st.cycles += 1
    st.unfinished = len(pending)
    return st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=0)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    nodes = args.nodes or (500 if args.quick else 2000)
    n_jobs = args.jobs or (1500 if args.quick else 8000)
    specs = make_fleet(nodes)
    topo = Topology.build(specs)
    gpus_of = {s.name: s.gpus for s in specs}
    jobs = make_jobs(random.Random(args.seed), n_jobs, len(specs), args.load)
    print(
        f"fleet {len(specs)} nodes, {sum(gpus_of.values())} GPUs, {len(topo.domains)} NVLink "
        f"domains; {n_jobs} jobs over {jobs[-1].arrive / 3600:.1f} h, offered load {args.load:.0%}"
    )
    eng = simulate_engine(topo, jobs, gpus_of)
    print(eng.line("kiln"))
    ff = simulate_firstfit(specs, jobs, gpus_of)
    print(ff.line("first-fit"))
    u_e = eng.busy_gpu_s / (eng.total_gpus * eng.horizon)
    u_f = ff.busy_gpu_s / (ff.total_gpus * ff.horizon)
    print(
        f"SUMMARY placement_replay: utilisation {u_e:.1%} vs first-fit {u_f:.1%}; mean wait "
        f"{statistics.fmean(eng.waits) / 60:.1f} vs {statistics.fmean(ff.waits) / 60:.1f} min; "
        f"large-gang max wait {max(eng.big_waits or [0]) / 3600:.1f} vs "
        f"{max(ff.big_waits or [0]) / 3600:.1f} h; domains/multi-node job "
        f"{statistics.fmean(eng.domains or [0]):.2f} vs {statistics.fmean(ff.domains or [0]):.2f}"
    )


if __name__ == "__main__":
    main()
