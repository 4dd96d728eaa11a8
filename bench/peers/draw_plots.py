"""Draw the bench PNGs from a plot spec (runs in the bench's matplotlib venv)."""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, path):
    """Lay out, write and close ``fig``; its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def soak(spec, out):
    """One panel per series of a soak, one line per app; the warm-up shaded."""
    doc = spec["soak"]
    panels = [
        ("rss_mb", "RSS (MB)"),
        ("working_state_mb", "working state on disk (MB)"),
        ("checkpoint_dir_mb", "checkpoint dir on disk (MB)"),
        ("events_per_s", "events/s"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for ax, (key, label) in zip(axes.flat, panels):
        for app in doc["apps"]:
            pts = app["series"][key]
            slope = app["slope_pct_per_10min"][key]
            tag = "n/a" if slope is None else f"{slope:+.2f} %/10 min"
            ax.plot([t for t, _ in pts], [v for _, v in pts], label=f"{app['app']} ({tag})")
            ax.axvspan(0, app["warmup_min"], color="grey", alpha=0.08)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    fig.suptitle(
        f"Soak: {doc['rate_per_app']:,.0f} events/s per app, {doc['keys']:,} keys, "
        "1 s checkpoints (slopes after the shaded warm-up)"
    )
    return [save(fig, out / "soak.png")]


def timeline(spec, out):
    """Throughput over time of the compare runs, checkpoints dotted."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for s in spec["timeline"]:
        pts = s["progress"]
        if len(pts) < 2:
            continue
        ts, rates = [], []
        step = max(1, len(pts) // 60)
        for (t0, v0), (t1, v1) in zip(pts[::step], pts[step::step]):
            if t1 > t0:
                ts.append((t0 + t1) / 2)
                rates.append((v1 - v0) / (t1 - t0))
        (line,) = ax.plot(ts, rates, label=s["system"])
        for t, _cid, _ms in s["checkpoints"]:
            ax.axvline(t, color=line.get_color(), alpha=0.25, linestyle=":")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("events/s (embedded: input read; kafka: output written)")
    ax.set_title("Throughput over time (dotted: checkpoint completed)")
    ax.legend()
    return save(fig, out / "throughput_timeline.png")


def workers_scaling(cases, out):
    """Per case, the ratios workers=2 / workers=1 beside the issue's target."""
    kinds = [("steady_ratio", "steady"), ("wall_ratio", "wall"), ("cpu_bound_ratio", "CPU-bound")]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(kinds)
    for k, (key, label) in enumerate(kinds):
        xs = [i + (k - 1) * width for i in range(len(cases))]
        values = [c[key] or 0.0 for c in cases]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, labels=[f"{v:.2f}" if v else "-" for v in values], fontsize=7)
    for i, c in enumerate(cases):
        if c["target"]:
            ax.hlines(c["target"], i - 0.45, i + 0.45, colors="black", linestyles="dashed")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(cases)), [c["case"] for c in cases])
    ax.set_ylabel("workers=2 / workers=1")
    ax.set_title("job.workers 2 vs 1 (dashed: target of the steady ratio)")
    ax.legend(fontsize=7)
    return save(fig, out / "workers_scaling.png")


def main(spec_path, out_dir):
    spec = json.loads(Path(spec_path).read_text())
    out = Path(out_dir)
    if "soak" in spec:
        print(" ".join(str(p) for p in soak(spec, out)))
        return
    written = []
    if any(len(s["progress"]) >= 2 for s in spec["timeline"]):
        written.append(timeline(spec, out))

    if spec["checkpoint_ms"]:
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, values in spec["checkpoint_ms"].items():
            ax.hist(values, bins=30, alpha=0.6, label=label)
        ax.set_xlabel("checkpoint duration (ms)")
        ax.set_ylabel("checkpoints")
        ax.set_title("Checkpoint duration")
        ax.legend(fontsize=7)
        written.append(save(fig, out / "checkpoint_duration_hist.png"))

    if spec["latency_ms"]:
        xs = sorted(spec["latency_ms"])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(xs, ys)
        ax.set_xlabel("end-to-end latency (ms): source emit -> committed output visible")
        ax.set_ylabel("fraction of events")
        ax.set_title("Latency CDF (aiostream-ckpt, paced input)")
        ax.grid(alpha=0.3)
        written.append(save(fig, out / "latency_cdf.png"))

    if spec["bars"]:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [b["label"] for b in spec["bars"]]
        values = [b["value"] for b in spec["bars"]]
        bars = ax.bar(labels, values)
        ax.bar_label(bars, labels=[f"{v / 1e3:,.0f}k" for v in values])
        ax.set_ylabel("events/s (steady window, median of repeats)")
        ax.set_title("pv_count, same input, same machine")
        written.append(save(fig, out / "throughput_bars.png"))

    if spec["scaling"]:
        fig, ax = plt.subplots(figsize=(9, 4))
        labels = [f"{s['experiment']}" for s in spec["scaling"]]
        bars = ax.bar(labels, [s["value"] for s in spec["scaling"]])
        ax.bar_label(bars, labels=[f"{s['value'] / 1e3:,.0f}k" for s in spec["scaling"]], fontsize=7)
        ax.set_ylabel("events/s")
        ax.set_title("aiostream-ckpt scaling")
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=7)
        written.append(save(fig, out / "scaling.png"))
    if spec.get("workers_scaling"):
        written.append(workers_scaling(spec["workers_scaling"], out))
    print(" ".join(str(p) for p in written))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
