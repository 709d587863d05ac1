"""Where a traced train step's device time goes: a jax.profiler trace read without TensorBoard.

    python benchmarks/trace_report.py RUN/profile/...perfetto_trace.json.gz [--top 15]

Reads the Perfetto JSON trace that `jax.profiler` writes with `create_perfetto_trace=True`
(tpu_bench.py run --profile keeps one per build; `train.py --profile` writes the same trace
under RUN/profile), takes the TPU's "XLA Ops" events and prints, per step: the time in each HLO
category (convolution fusions are the MXU's matmuls; loop and input fusions the vector unit's
elementwise work), the FLOP rate XLA's own `model_flops` gives each, and the generated source
lines that took most time, with the line's text when the generated file is on this machine.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

PEAK = 197e12  # bf16 FLOP/s of one TPU v5e


def load(path: Path) -> tuple[list[dict], int, float]:
    """The device's op events, the number of steps traced, and the mean step time in seconds."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and "TPU" in e["args"]["name"]}

    def on(e: dict, thread: str) -> bool:
        return e.get("ph") == "X" and e["pid"] in devices and names.get((e["pid"], e.get("tid"))) == thread

    steps = [e for e in events if on(e, "XLA Modules")]
    ops = self_times([e for e in events if on(e, "XLA Ops")])
    step_s = sum(e["dur"] for e in steps) / max(len(steps), 1) / 1e6
    return ops, max(len(steps), 1), step_s


def self_times(ops: list[dict]) -> list[dict]:
    """The ops with "dur" made exclusive: a while or conditional op's span holds the ops of its
    body, which are events of their own, so its own time is its span less theirs."""
    ops = sorted(ops, key=lambda e: (e["pid"], e["ts"], -e["dur"]))
    out = [dict(e) for e in ops]
    stack: list[dict] = []
    for e in out:
        while stack and (stack[-1]["pid"] != e["pid"] or e["ts"] >= stack[-1]["ts"] + stack[-1]["span"]):
            stack.pop()
        e["span"] = e["dur"]
        if stack:
            stack[-1]["dur"] -= e["dur"]
        stack.append(e)
    return out


def source_text(source: str) -> str:
    """The text of `file:line` when the file is here."""
    file, _, line = source.rpartition(":")
    try:
        return Path(file).read_text().splitlines()[int(line) - 1].strip()[:90]
    except (OSError, ValueError, IndexError):
        return ""


def report(path: Path, top: int) -> None:
    ops, steps, step_s = load(path)
    busy = sum(e["dur"] for e in ops) / steps / 1e6
    print(f"{path.name}: {steps} steps, {step_s * 1e3:.1f} ms a step, ops busy {busy * 1e3:.1f} ms")
    by_cat: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    by_line: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in ops:
        a = e.get("args", {})
        seconds = e["dur"] / 1e6 / steps
        cat = by_cat[a.get("hlo_category", "?")]
        cat[0] += seconds
        cat[1] += float(a.get("model_flops", 0) or 0) / steps
        cat[2] += float(a.get("bytes_accessed", 0) or 0) / steps
        line = by_line[a.get("source") or "(no source)"]
        line[0] += seconds
        line[1] += float(a.get("model_flops", 0) or 0) / steps
    print(f"  {'category':28s} {'ms':>8s} {'share':>6s} {'TFLOP/s':>8s} {'of peak':>7s} {'GB/s':>7s}")
    for name, (s, flops, nbytes) in sorted(by_cat.items(), key=lambda kv: -kv[1][0]):
        if s < 1e-4:
            continue
        print(f"  {name:28s} {s * 1e3:8.1f} {s / step_s:6.1%} {flops / s / 1e12:8.1f} "
              f"{flops / s / PEAK:7.1%} {nbytes / s / 1e9:7.0f}")
    print(f"  top source lines ({top}):")
    for source, (s, flops) in sorted(by_line.items(), key=lambda kv: -kv[1][0])[:top]:
        short = "/".join(source.split("/")[-2:])
        print(f"  {s * 1e3:7.1f} ms {s / step_s:6.1%} {flops / s / PEAK:6.1%} peak  {short:24s} "
              f"{source_text(source)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    for path in args.traces:
        report(path, args.top)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
