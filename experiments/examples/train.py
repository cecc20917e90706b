"""A small real training run for experiments: linear regression by minibatch SGD with momentum, plain Python.

    python train.py --lr 0.05 --batch 16 --momentum 0.9 --steps 60

Each step prints `TRAINYARD_METRIC {"step": n, "loss": ...}` (the validation loss on held-out rows), which is
the metric path every job reports through (docs/monitoring.md). With `TRAINYARD_CHECKPOINT_DIR` set it saves
`step-<n>.json` every `--checkpoint-every` steps, and starts from `TRAINYARD_RESUME_FROM` when the platform
restored one. On emulated cards it states a GPU memory use that grows with the batch size (right-sizing).
"""

import argparse
import json
import math
import os
import random
import time

FEATURES = 16
ROWS = 512
HELD_OUT = 128


def data(seed: int = 11):
    rng = random.Random(seed)
    truth = [rng.gauss(0, 1) for _ in range(FEATURES)]
    rows = []
    for _ in range(ROWS + HELD_OUT):
        x = [rng.gauss(0, 1) for _ in range(FEATURES)]
        rows.append((x, sum(a * b for a, b in zip(truth, x, strict=True)) + rng.gauss(0, 0.3)))
    return rows[:ROWS], rows[ROWS:]


def loss(w, rows):
    total = sum((sum(a * b for a, b in zip(w, x, strict=True)) - y) ** 2 for x, y in rows) / len(rows)
    return total if math.isfinite(total) else 1e12


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (to watch it live)")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = parser.parse_args()
    train, held_out = data()
    rng = random.Random(int(args.lr * 1e6) + args.batch)
    w, v, start = [0.0] * FEATURES, [0.0] * FEATURES, 0
    resume = os.environ.get("TRAINYARD_RESUME_FROM")
    if resume and os.path.isfile(resume):
        with open(resume) as f:
            state = json.load(f)
        w, v, start = state["w"], state["v"], state["step"]
        print(f"resumed from step {start}", flush=True)
    print("TRAINYARD_EMULATED_GPU " + json.dumps({"memory_mib": 900 + 40 * args.batch, "util_pct": 70}), flush=True)
    ckpt_dir = os.environ.get("TRAINYARD_CHECKPOINT_DIR")
    for step in range(start + 1, args.steps + 1):
        batch = rng.sample(train, args.batch)
        grad = [0.0] * FEATURES
        for x, y in batch:
            err = sum(a * b for a, b in zip(w, x, strict=True)) - y
            for i in range(FEATURES):
                grad[i] += 2 * err * x[i] / args.batch
        for i in range(FEATURES):
            v[i] = args.momentum * v[i] - args.lr * grad[i]
            w[i] = max(-1e6, min(1e6, w[i] + v[i]))
        value = loss(w, held_out)
        print(
            "TRAINYARD_METRIC " + json.dumps({"step": step, "loss": round(min(value, 1e12), 6), "ts": time.time()}),
            flush=True,
        )
        if ckpt_dir and step % args.checkpoint_every == 0:
            with open(os.path.join(ckpt_dir, f"step-{step}.json"), "w") as f:
                json.dump({"w": w, "v": v, "step": step}, f)
        if args.step_seconds:
            time.sleep(args.step_seconds)


if __name__ == "__main__":
    main()
