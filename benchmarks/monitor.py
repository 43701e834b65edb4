"""What the rank panel costs: a k-means iteration and a Keras train step with the ranks' publishing on and off.

    python benchmarks/monitor.py              # 2 ranks, 15 pairs (~3 min)
    python benchmarks/monitor.py --quick      # a smoke run
    python benchmarks/monitor.py --ranks 4

A real ``MPICluster``: "on" is what every cluster does from its start (``mpinb._progress.start``: the
collective layer's step observer, the fits' step marks, and a thread publishing each rank's state
through ipyparallel twice a second while a cell runs, once where ranks outnumber cores); "off" is
``mpinb._progress.stop()``. The two alternate pair by pair (on/off, then off/on), so drift in the
host hits both alike. Timed on the engines: ``KMeans.fit`` from fixed centres on uniform data (so
Lloyd runs every one of its ``max_iter`` iterations), per iteration; ``mpinb.keras.fit`` of an MLP
for one epoch after a warm-up, per train step; on and off in pairs inside one cell, the order
alternating. Reported: each pair's times, the medians, the overhead on/off - 1 and the median of
the pairs' ratios, a control (off against off: the method's own spread); and, since
a shared machine's noise is larger than the effect, the hooks timed alone (per step: one
collective's three observer calls and one step mark; per message: building the snapshot) as a
share of the median step. JSON to ``benchmarks/results/monitor.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _machine import write_report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETUP = """
import time
import numpy as np
import mpinb
from mpinb import _progress

rank = mpinb.world().rank
rng = np.random.default_rng(rank)
X = rng.random((ROWS, 16))
centres = np.random.default_rng(0).random((16, 16))

def kmeans_iteration():
    t0 = time.perf_counter()
    km = mpinb.KMeans(16, init=centres, n_init=1, max_iter=ITERS, tol=0.0).fit(X)
    return (time.perf_counter() - t0) / km.n_iter_

kmeans_iteration()  # compile the kernels before any timed round

import keras
import mpinb.keras
keras.utils.set_random_seed(0)
XK = rng.random((STEPS * 64 // mpinb.world().size, 64)).astype("float32")
YK = rng.integers(0, 10, len(XK))
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer=mpinb.keras.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
mpinb.keras.fit(model, XK, YK, batch_size=64, epochs=1, verbose=0)  # build and trace

def keras_step():
    t0 = time.perf_counter()
    history = mpinb.keras.fit(model, XK, YK, batch_size=64, epochs=1, verbose=0, shuffle=False)
    return (time.perf_counter() - t0) / history["steps"][0]

def hook_costs(n=20_000):
    # What the panel adds to one step, alone: three observer calls (one collective's enter, arrived,
    # finish) and one step mark; and what one message costs the publishing thread.
    from mpinb._collective import protocol as _p

    class Op:
        name, index, phase, gen = "allreduce", 1, _p.ARRIVING, None
    op, enter, arrived, finish = Op(), _p.IDLE.rules["enter"], _p.ARRIVING.rules["arrived"], _p.MOVING.rules["finish"]
    observe, mark = _progress._observe, _progress._mark
    t0 = time.perf_counter()
    for i in range(n):
        observe(op, _p.IDLE, "enter", enter)
        observe(op, _p.ARRIVING, "arrived", arrived)
        observe(op, _p.MOVING, "finish", finish)
        mark("bench", i, None)
    per_step = (time.perf_counter() - t0) / n
    _progress._state.history.clear()
    t0 = time.perf_counter()
    for _ in range(200):
        _progress.snapshot()
    return per_step, (time.perf_counter() - t0) / 200
"""

# Each round: on, off and a control (off again, the A/A comparison that shows the method's own
# spread), in an order that rotates from round to round.
PAIRS = """
modes = ("on", "off", "control")
paired = tuple({mode: [] for mode in modes} for _ in range(2))
for i in range(ROUNDS):
    for mode in modes[i % 3:] + modes[:i % 3]:
        _progress.start() if mode == "on" else _progress.stop()
        paired[0][mode].append(kmeans_iteration())
        paired[1][mode].append(keras_step())
_progress.start()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "monitor.json"))
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    config = {"ranks": args.ranks, "rows_per_rank": 20_000 if args.quick else 200_000, "features": 16, "clusters": 16,
              "iterations": 10 if args.quick else 40, "keras_steps": 40 if args.quick else 150, "global_batch": 64,
              "rounds": rounds}

    import mpinb

    times: dict[str, dict[str, list[float]]] = {}
    with mpinb.MPICluster(n=args.ranks) as cluster:
        cluster.view.execute(SETUP.replace("ROWS", str(config["rows_per_rank"])).replace("ITERS", str(
            config["iterations"])).replace("STEPS", str(config["keras_steps"])))
        # Pairs inside one cell, the order alternating: drift on a shared host hits both modes of a pair alike.
        cluster.view.execute(PAIRS.replace("ROUNDS", str(rounds)))
        # The slowest rank's time: a step is done when every rank is.
        by_rank = cluster.pull("paired")  # each rank's ({"on": [...], "off": [...]} of k-means, ... of Keras)
        for which, name in enumerate(("kmeans_iteration", "keras_step")):
            ranks = [r[which] for r in by_rank]
            times[name] = {mode: [max(r[mode][i] for r in ranks) for i in range(rounds)]
                           for mode in ("on", "off", "control")}
            for i in range(rounds):
                print(f"pair {i + 1}: {name} on {times[name]['on'][i] * 1e3:.2f} ms, "
                      f"off {times[name]['off'][i] * 1e3:.2f} ms", flush=True)
        # What the panel shows after a Keras fit with publishing on (a fit longer than a message's interval).
        cluster.view.execute("_progress.start(); hooks = hook_costs(); keras_step(); crowded = _progress._crowded()")
        hooks = cluster.pull("hooks")
        per_second = 1 if any(cluster.pull("crowded")) else 2  # a host with more ranks than cores sends one
        time.sleep(1.0)
        published = cluster.monitor().rows
    per_step, per_message = max(h[0] for h in hooks), max(h[1] for h in hooks)
    report: dict = {"config": config, "seconds": times, "median_ms": {}, "overhead": {},
                    "hooks": {"per_step_us": per_step * 1e6, "per_message_us": per_message * 1e6,
                              "messages_per_second": per_second,
                              "publisher_share_of_a_core": per_message * per_second},
                    "panel_after": [{k: r[k] for k in ("rank", "state", "progress", "split")} for r in published],
                    "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name, modes in times.items():
        on, off = statistics.median(modes["on"]), statistics.median(modes["off"])
        paired = statistics.median(a / b for a, b in zip(modes["on"], modes["off"], strict=True)) - 1.0
        report["median_ms"][name] = {"on": on * 1e3, "off": off * 1e3}
        report["overhead"][name] = on / off - 1.0
        report["overhead"][name + "_paired"] = paired
        print(f"{name}: median on {on * 1e3:.3f} ms, off {off * 1e3:.3f} ms, overhead {on / off - 1:+.2%} "
              f"(median of the pairs' ratios {paired:+.2%}); "
              f"the hooks alone: {per_step / off:.3%} of a step")
        report["overhead"][name + "_hooks_alone"] = per_step / off
        control = statistics.median(modes["control"])
        report["median_ms"][name]["control"] = control * 1e3
        report["overhead"][name + "_control"] = control / off - 1.0
        print(f"{name}: control (off against off) {control / off - 1:+.2%}: the method's own spread")
    print(f"hooks: {per_step * 1e6:.1f} us a step (a collective and a mark), {per_message * 1e6:.0f} us a message "
          f"({per_second} a second: {per_message * per_second:.3%} of a core)")
    write_report(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
