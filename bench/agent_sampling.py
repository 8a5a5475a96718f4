"""CPU cost of one agent health-sampling round on a simulated 8-GPU H200 node.

Measures process CPU time (time.process_time) per ``HealthSampler.sample()``
over N rounds against the *fake* NVML backend, and what that costs at one
round per second. The fake is pure Python; real NVML calls go to the driver
instead, so this bounds the agent's own overhead, not the driver's.

    python bench/agent_sampling.py [--rounds N] [--part h200]
"""

from __future__ import annotations

import argparse
import statistics
import time

from agent.health import HealthSampler
from agent.nvml import open_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--part", default="h200", choices=["h100", "h200", "gb200"])
    args = parser.parse_args()

    nvml = open_backend(f"fake:{args.part}", node_name="bench")
    nvml.nvmlInit()
    sampler = HealthSampler(nvml)
    sampler.sample()  # warm-up: event set, link counts
    gpus = nvml.nvmlDeviceGetCount()

    per_round: list[float] = []
    for i in range(args.rounds):
        if i % 10 == 0:
            nvml.faults.xid(i % gpus, 13)  # type: ignore[attr-defined]
        t0 = time.process_time()
        sampler.sample()
        per_round.append((time.process_time() - t0) * 1000)

    mean = statistics.fmean(per_round)
    p50 = statistics.median(per_round)
    p99 = sorted(per_round)[int(len(per_round) * 0.99) - 1]
    core_pct = mean / 1000 * 100  # one round per second
    print("measures the FAKE NVML backend (pure Python), not a real driver")
    print(f"node: fake {args.part}, {gpus} GPUs, {args.rounds} rounds")
    print(f"CPU per round: mean {mean:.2f} ms, p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    print(f"CPU per GPU per round: {mean / gpus:.3f} ms")
    print(f"at 1 round/s: {core_pct:.2f}% of one core")
    print(
        f"summary: {mean:.2f} ms CPU/round for {gpus} fake {args.part} GPUs = "
        f"{core_pct:.2f}% of one core at 1 Hz"
    )


if __name__ == "__main__":
    main()
