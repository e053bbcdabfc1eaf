"""Stacked bars of phase shares as inline SVG, drawn on the server.

Why: the Verdict page is the landing page. A Vega-Lite chart there makes the browser fetch and compile Vega
before it draws a bar, whatever the number of ranks: on a first visit the same chart was on screen 0.4 s
sooner as SVG (``benchmarks/chart_render.py --cold`` at commit e9426fd). A few dozen stacked bars need none of
that; each segment carries a ``<title>`` (the browser's own tooltip) and its figures as ``data-`` attributes.
"""

from __future__ import annotations

from html import escape

_WIDTH, _LEFT, _RIGHT, _LINE = 420, 40, 6, 16
_FONT = "font-family='sans-serif' font-size='12' fill='#555'"
_SMALL = "font-family='sans-serif' font-size='10' fill='#555'"
_CHAR, _SMALL_CHAR = 7.2, 6.0  # a character's width at those sizes, at most


def stacked_bars(
    bars: list[tuple[str, dict[str, float | None]]],
    phases: list[str],
    colors: dict[str, str],
    x_title: str,
    height: int = 360,
) -> str:
    """An SVG of one bar per ``(label, {phase: share})``, its phases stacked in the order of ``phases``
    (shares of 1 at most; None or absent is not drawn); a legend of the phases any bar has."""
    present = [p for p in phases if any(shares.get(p) for _, shares in bars)]
    legend, x, y = [], _LEFT, 4
    for p in present:  # the legend above the plot, on as many lines as it needs
        width = 24 + _CHAR * len(p)
        if x > _LEFT and x + width > _WIDTH - _RIGHT:
            x, y = _LEFT, y + _LINE
        legend.append(f"<rect x='{x:.1f}' y='{y}' width='10' height='10' fill='{colors[p]}'/>")
        legend.append(f"<text x='{x + 14:.1f}' y='{y + 10}' {_FONT}>{escape(p)}</text>")
        x += width
    top = y + _LINE + 8
    rotate = len(bars) > 12
    label_room = 14 + _SMALL_CHAR * max((len(label) for label, _ in bars), default=1) if rotate else 18
    plot_h = height - top - label_room - 20
    plot_w = _WIDTH - _LEFT - _RIGHT
    step = plot_w / max(1, len(bars))
    every = max(1, -(-11 // max(1, int(step)))) if rotate else 1  # a label where it fits (each bar has its tooltip)
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {_WIDTH} {height}' width='100%'"
        f" role='img' aria-label='{escape(x_title, quote=True)}' data-chart='stacked-shares'>",
        *legend,
    ]
    for tick in (0, 25, 50, 75, 100):
        y = top + plot_h * (1 - tick / 100)
        out.append(f"<line x1='{_LEFT}' x2='{_WIDTH - _RIGHT}' y1='{y:.1f}' y2='{y:.1f}' stroke='#ddd'/>")
        out.append(f"<text x='{_LEFT - 4}' y='{y + 4:.1f}' text-anchor='end' {_FONT}>{tick}%</text>")
    for i, (label, shares) in enumerate(bars):
        bar_w = min(step * 0.8, 56.0)
        x0 = _LEFT + i * step + (step - bar_w) / 2
        base = top + plot_h
        for p in present:
            share = shares.get(p)
            if not share:
                continue
            h = plot_h * min(1.0, max(0.0, share))
            base -= h
            out.append(
                f"<rect x='{x0:.1f}' y='{base:.1f}' width='{bar_w:.1f}' height='{h:.1f}' fill='{colors[p]}'"
                f" data-bar='{escape(label, quote=True)}' data-phase='{escape(p, quote=True)}'"
                f" data-share='{share:.6f}'><title>{escape(label)} · {escape(p)} {share:.1%}</title></rect>"
            )
        cx, ly = x0 + bar_w / 2, top + plot_h + 14
        if rotate:
            if i % every == 0 or i == len(bars) - 1:
                out.append(
                    f"<text transform='translate({cx + 3:.1f},{ly - 8}) rotate(-90)' text-anchor='end'"
                    f" {_SMALL}>{escape(label)}</text>"
                )
        else:
            out.append(f"<text x='{cx:.1f}' y='{ly}' text-anchor='middle' {_FONT}>{escape(label)}</text>")
    out.append(
        f"<text x='{_LEFT + plot_w / 2:.1f}' y='{height - 4}' text-anchor='middle' {_FONT}>{escape(x_title)}</text>"
    )
    out.append("</svg>")
    return "".join(out)
