"""The sweep chart: median time and TFLOP/s against sequence length, one line per variant and reference.

Only rows that were measured (status OK) are drawn; a variant that failed or was skipped at a point has a
gap there. Variants are solid lines, references dashed. matplotlib is an optional dependency (the `plot`
extra) and is imported only here.
"""

from __future__ import annotations

from pathlib import Path

from flashcore_cli.measure.series import series


def plot_sweep(record: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    env = record.get("environment", {})
    shape = f"B={record['batch']}, H={record['heads']}, D={record['head_dim']}{', causal' if record['causal'] else ''}"
    fig, (ax_time, ax_tflops) = plt.subplots(1, 2, figsize=(13, 5.2))
    for name, points in series(record).items():
        measured = sorted((s, row) for s, row in points.items() if row.get("median_us"))
        if not measured:
            continue
        xs = [s for s, _ in measured]
        is_reference = measured[0][1].get("kind") == "reference"
        style = {"linestyle": "--" if is_reference else "-", "marker": "o", "markersize": 4, "label": name}
        ax_time.plot(xs, [row["median_us"] for _, row in measured], **style)
        ax_tflops.plot(xs, [row["tflops"] for _, row in measured], **style)
    for ax in (ax_time, ax_tflops):
        ax.set_xscale("log", base=2)
        ax.set_xticks(record["seq_lens"], [str(s) for s in record["seq_lens"]])
        ax.set_xlabel("sequence length S")
        ax.grid(True, which="both", alpha=0.3)
    ax_time.set_yscale("log")
    ax_time.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax_time.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_time.yaxis.set_minor_formatter(NullFormatter())
    ax_time.set_ylabel("median time per call (us, L2 flushed)")
    ax_tflops.set_ylabel("TFLOP/s (4·B·H·S²·D, halved if causal)")
    ax_tflops.legend(fontsize=8, loc="best")
    fig.suptitle(f"flashcore sweep: {shape} on {env.get('gpu', 'GPU ?')} (torch {env.get('torch', '?')})")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
