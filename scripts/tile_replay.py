"""Replays the order v12's backward runs its tiles in, on a model: a tile costs its step count (every step one unit,
masked or not), and a CTA takes the next tile of a list when its own tile ends (or, with --lead L, L units before
it ends, as v12's producer claims while the consumers finish). Prints each list's makespan over the ideal (total work
/ CTAs) for causal shapes, the figures docs/ladder.md "Persistent tiles" quotes. No GPU, no torch.

usage: python3 scripts/tile_replay.py [--ctas 132]"""

import argparse
import heapq


def claimed(costs, ctas, lead=0.0, ahead=False):
    """Makespan when each CTA claims its next tile `lead` units before its current one ends (ahead: as it starts)."""
    end = [0.0] * ctas
    events, nxt = [], min(ctas, len(costs))
    for c in range(nxt):
        end[c] = costs[c]
        heapq.heappush(events, (0.0 if ahead else max(0.0, end[c] - lead), c))
    while events and nxt < len(costs):
        _, c = heapq.heappop(events)
        start = end[c]
        end[c] = start + costs[nxt]
        nxt += 1
        heapq.heappush(events, (start if ahead else max(start, end[c] - lead), c))
    return max(end)


def snake(costs, ctas):
    """Makespan when round r deals tiles r*ctas.. to the CTAs, alternating direction (sm90/tile_scheduler_sm90.cuh)."""
    load = [0.0] * ctas
    for i, w in enumerate(costs):
        r, c = divmod(i, ctas)
        load[ctas - 1 - c if r & 1 else c] += w
    return max(load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctas", type=int, default=132)
    g = parser.parse_args().ctas
    # (label, key blocks of 128, batch * heads, steps of key block n): bottom-right causal, S = S_kv
    rows = [("2,16,4096,128", 32, 32, lambda n: 64 - 2 * n), ("2,16,4096,64", 32, 32, lambda n: 32 - n),
            ("1,16,16384,128", 128, 16, lambda n: 256 - 2 * n), ("1,8,8192,128", 64, 8, lambda n: 128 - 2 * n),
            ("4,32,2048,64", 16, 128, lambda n: 16 - n), ("2,16,1024,128", 8, 32, lambda n: 16 - 2 * n)]
    print(f"causal, {g} CTAs: makespan / ideal")
    heads_row = ("head order", "heavy, all", "groups", "groups,lead2", "groups,ahead", "groups,snake")
    widths = (11, 11, 7, 13, 13, 13)
    print(f"{'shape':22} " + " ".join(f"{h:>{w}}" for h, w in zip(heads_row, widths)))
    for label, nb, heads, steps in rows:
        by_head = [steps(n) for _ in range(heads) for n in range(nb)]
        heavy_all = [steps(n) for n in range(nb) for _ in range(heads)]
        group = max(1, g // nb)
        grouped = [steps(n) for g0 in range(0, heads, group) for n in range(nb) for _ in range(min(group, heads - g0))]
        ideal = sum(by_head) / g
        cols = [claimed(by_head, g), claimed(heavy_all, g), claimed(grouped, g), claimed(grouped, g, lead=2.0),
                claimed(grouped, g, ahead=True), snake(grouped, g)]
        print(f"{label + ' causal':22} " + " ".join(f"{c / ideal:>{w}.3f}" for c, w in zip(cols, widths)))


if __name__ == "__main__":
    main()
