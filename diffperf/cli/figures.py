"""Figures (matplotlib, Agg backend): the only module of diffperf that draws.

Each `*_figure` function takes data (a StudyResult, a Result as a dict, numpy arrays) and
returns a matplotlib Figure; `save` writes it. Axes carry units; nothing opens a window.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from diffperf.errors import SpecError

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
# Breakdown parts by group, in stacking order (colors follow _PART_COLORS).
_PART_GROUPS = (("compute", ("compute_s",)), ("recompute", ("recompute_s",)),
                ("TP comm", ("tp_exposed_s",)), ("CP comm", ("cp_exposed_s",)),
                ("EP comm", ("ep_exposed_s",)), ("AxoNN comm", ("axonn_exposed_s",)),
                ("PP comm", ("pp_exposed_s",)), ("DP comm", ("dp_exposed_s",)),
                ("bubble", ("bubble_s",)), ("optimizer", ("optimizer_s",)),
                ("overheads", ("overhead_s", "overlap_slowdown_s")))
_PART_COLORS = ("#4c72b0", "#8fa8d8", "#dd8452", "#c44e52", "#da8bc3", "#8c613c",
                "#937860", "#e6b422", "#9a9a9a", "#55a868", "#cccccc")


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, paths, force: bool) -> list:
    """Write the figure to each path (format from the suffix) through a temporary file and a
    rename; refuse to replace an existing file without force. Returns the paths written."""
    from diffperf.cli.output import atomic_path, check_writable

    paths = [Path(p) for p in paths]
    for path in paths:
        if path.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise SpecError(f"{path}: figure format must be .png, .svg or .pdf")
        check_writable(path, force)
    for path in paths:
        with atomic_path(path, suffix=path.suffix) as tmp:
            fig.savefig(tmp, dpi=150, bbox_inches="tight", format=path.suffix[1:].lower())
    pyplot().close(fig)
    return paths


def _footer(fig, notes) -> None:
    if notes:
        fig.text(0.01, -0.02, "\n".join(notes), ha="left", va="top", fontsize=7.5,
                 color="#444444", wrap=True)


def _part_groups(breakdown: dict) -> list:
    """[(label, seconds)] of the exposed parts, grouped, in stacking order."""
    return [(label, sum(float(breakdown.get(k, 0.0)) for k in keys))
            for label, keys in _PART_GROUPS]


# ------------------------------------------------------------------------------------------
# Studies
# ------------------------------------------------------------------------------------------

def comm_scaling_figure(study):
    """Two views (rows): the re-searched best layout and the fixed Megatron layout. Columns:
    exposed communication, exposed communication + pipeline bubble, hidden communication (% of
    step time) vs model size, one line per system."""
    from diffperf.studies.comm_scaling import VIEWS

    plt = pyplot()
    t = study.table
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.6), sharex=True, sharey="col")
    what = {VIEWS[0]: "layout re-searched on each system",
            VIEWS[1]: "Megatron's Table 1 layout (t 8, its p, full recompute) kept"}
    for r, view in enumerate(VIEWS):
        for k, system in enumerate(dict.fromkeys(t["system"])):
            sel = (t["system"] == system) & (t["view"] == view)
            if not sel.any():
                continue
            projected = bool(t["projected"][sel][0])
            style = dict(color=_COLORS[k], marker="o", ls="--" if projected else "-",
                         label=f"{system} (PROJECTION)" if projected else system)
            x = t["params_B"][sel]
            axes[r, 0].plot(x, 100 * t["comm_exposed_frac"][sel], **style)
            axes[r, 1].plot(x, 100 * (t["comm_exposed_frac"][sel] + t["bubble_frac"][sel]),
                            **style)
            axes[r, 2].plot(x, 100 * t["comm_hidden_frac"][sel], **style)
        axes[r, 0].set_ylabel(f"{view}:\nexposed communication, % of step")
        axes[r, 1].set_ylabel("exposed communication + bubble, %")
        axes[r, 2].set_ylabel("hidden communication, %")
        for c, title in enumerate(("exposed communication (critical path)",
                                   "parallel overhead (comm + bubble)",
                                   "hidden (overlapped with compute)")):
            axes[r, c].set_title(f"{title}\n{what[view]}", fontsize=9)
    first = (t["system"] == t["system"][0]) & (t["view"] == VIEWS[0])
    ticks = [f"{p:.0f}B\n{g} GPUs" for p, g in zip(t["params_B"][first], t["gpus"][first])]
    for ax in axes.flat:
        ax.set_xscale("log")
        # 310B and 530B sit close on a log axis: slanted labels keep them apart
        ax.set_xticks(t["params_B"][first], ticks, fontsize=7, rotation=35, ha="right")
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[1, 1].set_xlabel("model parameters (Megatron-LM Table 1 GPT family, its GPUs and "
                          "batch)")
    axes[0, 1].legend(fontsize=7, loc="lower right")
    fig.suptitle(study.title + ":\nshare of the step time, re-searched layout (top) and "
                 "fixed Megatron layout (bottom)")
    fig.tight_layout()
    _footer(fig, study.notes)
    return fig


def diminishing_returns_figure(study):
    """One row per model: throughput, tokens/s per GPU and exposed communication vs GPUs, one
    line per disjoint layout family; a star marks the fastest family at each count."""
    from diffperf.studies.diminishing_returns import LABELS, SERIES, crossover

    plt = pyplot()
    t = study.table
    models = list(dict.fromkeys(t["model"]))
    fig, axes = plt.subplots(len(models), 3, figsize=(15, 4.3 * len(models)), squeeze=False)
    styles = dict(fsdp=dict(color=_COLORS[3], marker="s", ls="--"),
                  tp_pp=dict(color=_COLORS[0], marker="^", ls="-"),
                  other=dict(color=_COLORS[2], marker="o", ls=":"))
    for r, m in enumerate(models):
        a, b, d = axes[r]
        for s in SERIES:
            sel = (t["model"] == m) & (t["series"] == s)
            if not sel.any():
                continue
            g = t["gpus"][sel]
            kw = styles[s] | dict(label=LABELS[s])
            a.plot(g, t["tokens_per_s"][sel] / 1e6, **kw)
            b.plot(g, t["tokens_per_s_per_gpu"][sel], **kw)
            d.plot(g, 100 * t["comm_exposed_frac"][sel], **kw)
        best = (t["model"] == m) & (t["best"] == 1)
        g = t["gpus"][best]
        b.plot(g, t["tokens_per_s_per_gpu"][best], ls="none", marker="*", ms=16, mfc="none",
               mec="k", label="fastest family at that count")
        a.plot(g, t["tokens_per_s"][best][0] * g / g[0] / 1e6, color="#999999", lw=1,
               ls="-.", label="linear scaling")
        c = crossover(t, m)
        b.set_title(f"{m}: " + ("no FSDP -> TP/PP cross-over" if c is None else
                                f"TP/PP overtakes FSDP between {c[0]} and {c[1]} GPUs"),
                    fontsize=10)
        a.set_title(f"{m}: total throughput", fontsize=10)
        d.set_title(f"{m}: exposed communication", fontsize=10)
        a.set_yscale("log")
        a.set_ylabel("throughput, million tokens/s")
        b.set_ylabel("tokens/s per GPU")
        sec = b.secondary_yaxis("right", functions=(lambda x: x * 3.6e-3,
                                                    lambda y: y / 3.6e-3))
        sec.set_ylabel("thousand tokens per GPU-hour")
        d.set_ylabel("exposed communication, % of step time")
        for ax in (a, b, d):
            ax.set_xscale("log", base=2)
            ax.set_xticks(g, [str(int(x)) for x in g])
            ax.minorticks_off()
            ax.set_xlabel("GPUs (H100 SXM); same model, batch and sequence")
            ax.grid(alpha=0.3, which="both")
        b.legend(fontsize=7)
        a.legend(fontsize=7)
    fig.suptitle(study.title)
    fig.tight_layout()
    _footer(fig, study.notes)
    return fig


def llm_vs_longseq_figure(study):
    """Elasticities (at the best layout; re-searched) and throughput per system, both models."""
    from diffperf.studies.llm_vs_longseq import BASE, LABELS, MODELS, elasticity

    plt = pyplot()
    t = study.table
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    params = list(LABELS)
    y = np.arange(len(params))
    h = 0.38
    for k, (method, title) in enumerate((("grad", "at the best layout (jax.grad)"),
                                         ("research", "layout searched again (x2; domain 8->72)"))):
        ax = axes[k]
        for j, m in enumerate(MODELS):
            v = np.array([elasticity(t, m, p, method) for p in params])
            ax.barh(y + (j - 0.5) * h, np.nan_to_num(v), height=h, color=_COLORS[j], label=m)
            for yi, vi in zip(y + (j - 0.5) * h, v):
                ax.text(0, yi, " not re-searched" if np.isnan(vi) else f" {vi:+.3f}", va="center",
                        fontsize=7, ha="left")
        small = [abs(elasticity(t, m, p, method)) for m in MODELS for p in params
                 if p != "flops"]
        lim = 1.35 * max([v for v in small if np.isfinite(v)] + [0.05])
        ax.set_xlim(-lim, 0.3 * lim)  # FLOP/s (about -1) is clipped: its value is printed
        ax.set_yticks(y, [LABELS[p] + (" (bar clipped)" if p == "flops" else "")
                          for p in params])
        ax.axvline(0, color="k", lw=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("elasticity d ln T / d ln theta (dimensionless; < 0: faster)")
        ax.set_title(f"sensitivity on {BASE}, {title}", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    axes[0].legend(fontsize=8, loc="lower left")
    ax = axes[2]
    lay = t["kind"] == "best_layout"
    systems = list(dict.fromkeys(t["system"][lay]))
    x = np.arange(len(systems))
    for j, m in enumerate(MODELS):
        sel = lay & (t["model"] == m)
        base = sel & (t["system"] == BASE)
        if not base.any():
            continue
        ref = t["tokens_per_s_per_gpu"][base][0]
        vals, text = [], []
        for s in systems:
            i = np.flatnonzero(sel & (t["system"] == s))
            vals.append(t["tokens_per_s_per_gpu"][i[0]] / ref if len(i) else np.nan)
            text.append("" if not len(i) else
                        f"tp{t['tp'][i[0]]:.0f} pp{t['pp'][i[0]]:.0f} cp{t['cp'][i[0]]:.0f}")
        bars = ax.bar(x + (j - 0.5) * h, np.nan_to_num(vals), width=h, color=_COLORS[j],
                      label=m)
        for bar, s in zip(bars, text):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), s, rotation=90,
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [s.replace("-sxm-", "\n").replace("-nvl72", "\nNVL72")
                      .replace(" (counterfactual)", "\n(counterfactual)") for s in systems],
                  fontsize=8)
    ax.set_ylabel(f"tokens/s per GPU, relative to {BASE}")
    ax.set_title("best layout on each system (label: its tp, pp, cp)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.set_ylim(0, max(1.0, np.nanmax(ax.get_ylim())) * 1.15)
    fig.suptitle(study.title)
    fig.tight_layout()
    _footer(fig, study.notes)
    return fig


_AXONN_NAMES = dict(axonn_4d="AxoNN 4D\n(best grid)",
                    megatron_paper="Megatron-LM\n(Table 1 t, p;\nASSUMED)",
                    megatron_tp_node="Megatron-LM\n(TP in node)",
                    megatron_3d="Megatron 3D\n(diffperf best)")


def axonn_figure(study):
    """80B: TFLOP/s per GPU as the paper counts them, per series, with the published AxoNN
    and implied Megatron-LM figures; 20B: the overlap gain; the 80B breakdowns."""
    from diffperf.studies.axonn import EIGHTY, SERIES, find

    plt = pyplot()
    t = study.table
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.4),
                             gridspec_kw=dict(width_ratios=(1.2, 0.8, 1.1)))
    rows = [(s, find(t, EIGHTY, s)) for s in SERIES]
    rows = [(s, i) for s, i in rows if i is not None]
    _axonn_tflops_panel(axes[0], t, rows)
    _axonn_overlap_panel(axes[1], t)
    _axonn_breakdown_panel(axes[2], t, rows)
    fig.suptitle(study.title)
    fig.tight_layout()
    _footer(fig, study.notes)
    return fig


def _axonn_tflops_panel(ax, t, rows) -> None:
    """Bars of the 80B series in the paper's TFLOP/s, the published figures as lines."""
    from diffperf.studies.axonn import EIGHTY

    x = np.arange(len(rows))
    bars = ax.bar(x, [t["paper_tflops_per_gpu"][i] for _, i in rows],
                  color=[_COLORS[k] for k in range(len(rows))])
    for bar, (_, i) in zip(bars, rows):
        ax.text(bar.get_x() + bar.get_width() / 2, 5, _layout_label(t, i)
                + f" rc{t['recompute'][i]:.0f}", rotation=90, ha="center", va="bottom",
                fontsize=7, color="white")
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                f"{bar.get_height():.0f}", ha="center", va="bottom", fontsize=8)
    if rows:
        i0 = rows[0][1]
        for value, label, ls in ((t["axonn_published_tflops"][i0], "AxoNN measured", "-"),
                                 (t["megatron_implied_tflops"][i0], "Megatron-LM (implied)",
                                  "--")):
            ax.axhline(value, color="k", lw=1.5, ls=ls)
            ax.text(len(rows) - 0.5, value, label, fontsize=7, va="bottom", ha="right")
    peak = float(t["peak_tflops"][0])
    ax.axhline(peak, color="#999999", lw=1, ls=":")
    ax.text(-0.4, peak, "peak bf16", fontsize=7, va="bottom", color="#666666")
    ax.set_xticks(x, [_AXONN_NAMES[s] for s, _ in rows], fontsize=8)
    ax.set_ylabel("TFLOP/s per GPU as the paper counts (Narayanan eq. 3)")
    ax.set_ylim(0, 1.15 * peak)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(f"GPT-80B on 1024 Perlmutter A100s (batch "
                 f"{int(t['global_batch'][t['model'] == EIGHTY][0])})", fontsize=10)


def _axonn_overlap_panel(ax, t) -> None:
    """Step time of the best 20B grids with AxoNN's overlaps on and off."""
    from diffperf.studies.axonn import AXONN_OVERLAP_GAIN_20B, EIGHTY

    twenty = [i for i in np.flatnonzero(t["series"] == "axonn_4d") if t["model"][i] != EIGHTY]
    xs = np.arange(len(twenty))
    on = [t["step_time_s"][i] for i in twenty]
    off = [t["overlap_off_step_time_s"][i] for i in twenty]
    ax.bar(xs - 0.2, on, width=0.4, color=_COLORS[0], label="overlaps on")
    ax.bar(xs + 0.2, off, width=0.4, color=_COLORS[3], label="overlaps off (same grid)")
    for k, i in enumerate(twenty):
        ax.text(k, max(on[k], off[k]) * 1.02, f"+{100 * t['overlap_gain'][i]:.0f}%",
                ha="center", fontsize=9)
    ax.set_xticks(xs, [f"{t['model'][i]}\n{t['gpus'][i]} GPUs, batch {t['global_batch'][i]}\n"
                       + _layout_label(t, i) for i in twenty], fontsize=7)
    ax.set_ylabel("step time, s")
    ax.set_ylim(0, 1.2 * max(off + [1e-9]))
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(f"AxoNN overlap gain on 20B (paper: ~{100 * AXONN_OVERLAP_GAIN_20B:.0f}%)",
                 fontsize=10)


def _axonn_breakdown_panel(ax, t, rows) -> None:
    """Stacked exposed parts of the 80B series."""
    x = np.arange(len(rows))
    bottoms = np.zeros(len(rows))
    for (label, keys), color in zip(_PART_GROUPS, _PART_COLORS):
        frac = np.array([sum(float(t[k[:-2] + "_frac"][i]) for k in keys
                             if k[:-2] + "_frac" in t) for _, i in rows])
        if not np.any(frac > 0):
            continue
        ax.bar(x, 100 * frac, bottom=100 * bottoms, color=color, label=label)
        bottoms += frac
    ax.set_xticks(x, [_AXONN_NAMES[s] for s, _ in rows], fontsize=8)
    ax.set_ylabel("% of step time (exposed parts)")
    ax.set_title("GPT-80B: where the step time goes", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_ylim(0, 100)


def _layout_label(t, i) -> str:
    """'tp4 pp4 dp64 mb1' or, for an AxoNN row, 'gx2 gy2 gz4 dp64 mb7'."""
    keys = ("gx", "gy", "gz") if t["series"][i] == "axonn_4d" else ("tp", "pp", "cp")
    parts = [f"{k}{t[k][i]:.0f}" for k in keys if k in t]
    return " ".join(parts + [f"dp{t['dp'][i]:.0f}", f"mb{t['micro_batch'][i]:.0f}"])


STUDY_FIGURES = {"comm-scaling": comm_scaling_figure,
                 "diminishing-returns": diminishing_returns_figure,
                 "llm-vs-longseq": llm_vs_longseq_figure, "axonn": axonn_figure}


# ------------------------------------------------------------------------------------------
# diffperf plot
# ------------------------------------------------------------------------------------------

def prediction_figure(result: dict, title: str):
    """Stacked breakdown of the step time (exposed parts, hidden communication beside) and
    memory per device against the usable capacity. `result` is `predict_cmd.result_dict`."""
    from diffperf.result import HIDDEN_PARTS, MEMORY_PARTS

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw=dict(width_ratios=(3, 1)))
    parts = _part_groups(result["breakdown"])
    left = 0.0
    for (label, sec), color in zip(parts, _PART_COLORS):
        if sec <= 0:
            continue
        a.barh(1, sec, left=left, color=color, label=f"{label} {sec:.3g} s")
        left += sec
    hidden = [(k.replace("_hidden_s", "").upper(), float(result["breakdown"].get(k, 0.0)))
              for k in HIDDEN_PARTS]
    left = 0.0
    for k, (label, sec) in enumerate(hidden):
        if sec <= 0:
            continue
        a.barh(0, sec, left=left, color=_COLORS[k], hatch="//", alpha=0.5,
               label=f"{label} comm hidden {sec:.3g} s")
        left += sec
    a.set_yticks([0, 1], ["hidden\n(overlapped)", "step time\n(exposed parts)"])
    a.set_xlabel("seconds per step")
    a.set_title(f"step time {result['step_time_s']:.4g} s, MFU {100 * result['mfu']:.1f}%")
    a.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    a.grid(alpha=0.3, axis="x")
    mem = result["memory"]
    bottom = 0.0
    for k, key in enumerate(MEMORY_PARTS):
        gib = float(mem[key]) / 2**30
        b.bar(0, gib, bottom=bottom, color=_COLORS[k], label=f"{key[:-6]} {gib:.3g} GiB")
        bottom += gib
    cap = float(mem["capacity_bytes"]) / 2**30
    b.axhline(cap, color="r", ls="--", lw=1.5, label=f"usable capacity {cap:.3g} GiB")
    b.set_xticks([])
    b.set_ylabel("memory per device, GiB")
    b.set_title("fits in memory" if result["fits"] else "does NOT fit in memory",
                color="k" if result["fits"] else "r", fontsize=10)
    b.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def search_figure(step_s, mem_gib, front, best, capacity_gib, title: str):
    """Step time vs memory per device of every layout that fits, with the Pareto front and
    the fastest layout marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.scatter(mem_gib, step_s, s=3, color="#9ab", alpha=0.35, lw=0, rasterized=True,
               label=f"{len(step_s):,} layouts that fit")
    order = np.argsort(mem_gib[front])
    ax.plot(mem_gib[front][order], step_s[front][order], "o-", color=_COLORS[3], ms=4,
            drawstyle="steps-post", label=f"Pareto front ({len(front)} layouts)")
    ax.plot(mem_gib[best], step_s[best], "*", color="k", ms=14, label="fastest")
    ax.axvline(capacity_gib, color="r", ls="--", lw=1, label=f"usable capacity "
               f"{capacity_gib:.3g} GiB")
    ax.set_yscale("log")
    ax.set_xlabel("memory per device, GiB")
    ax.set_ylabel("step time, s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def validation_figure(measured_s, predicted_s, sources, title: str):
    """Predicted vs measured step time (log-log, one color per source) and the absolute
    percentage error per source."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw=dict(width_ratios=(1.2, 1)))
    names = list(dict.fromkeys(sources))
    err = 100 * np.abs(predicted_s / measured_s - 1)
    for k, s in enumerate(names):
        sel = sources == s
        a.scatter(measured_s[sel], predicted_s[sel], s=12, alpha=0.7, color=_COLORS[k % 10],
                  label=f"{s} (n={sel.sum()}, MAPE {np.mean(err[sel]):.1f}%)")
    lo = min(measured_s.min(), predicted_s.min()) / 1.3
    hi = max(measured_s.max(), predicted_s.max()) * 1.3
    line = np.array([lo, hi])
    a.plot(line, line, color="k", lw=1, label="predicted = measured")
    a.plot(line, 1.2 * line, color="k", lw=0.8, ls=":", label="\u00b120%")
    a.plot(line, line / 1.2, color="k", lw=0.8, ls=":")
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlim(lo, hi)
    a.set_ylim(lo, hi)
    a.set_xlabel("measured step time, s")
    a.set_ylabel("predicted step time, s")
    a.grid(alpha=0.3, which="both")
    a.legend(fontsize=8)
    b.boxplot([err[sources == s] for s in names], showfliers=True)
    b.set_xticks(np.arange(1, len(names) + 1), names, rotation=20, fontsize=8)
    for k, s in enumerate(names, 1):
        b.plot(k, np.mean(err[sources == s]), "D", color=_COLORS[3], ms=5)
    b.plot([], [], "D", color=_COLORS[3], ms=5, label="mean (MAPE)")
    b.plot([], [], color="#ff7f0e", label="median")
    b.set_ylabel("absolute error of step time, % (box: quartiles)")
    b.set_ylim(bottom=0)
    b.grid(alpha=0.3, axis="y")
    b.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
