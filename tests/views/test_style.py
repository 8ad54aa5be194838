"""The views' shared style: one meaning per colour, whole-number ticks, cell borders, empty
states, the panel's PNG grid."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import numpy as np
from matplotlib import image
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure

from workbench.bench import figures as bench_figures
from workbench.views import style

VIEWS = Path(style.__file__).parent
HEX = "#"


def test_no_colour_of_the_palette_has_two_meanings():
    colours = [c.lower() for c in style.PALETTE.values()]
    assert len(colours) == len(set(colours)), style.PALETTE


def hex_literals(path: Path) -> set[str]:
    return {
        n.value.lower()
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and len(n.value) == 7
        and n.value.startswith(HEX)
    }


def test_the_views_write_no_colour_of_their_own_outside_the_palette():
    allowed = {c.lower() for c in style.PALETTE.values()} | {style.BORDER, style.EDGE}
    strays = {p.name: sorted(hex_literals(p) - allowed) for p in VIEWS.glob("*.py") if p.name != "style.py"}
    strays = {k: v for k, v in strays.items() if v}
    # what is left: line colours of reference curves (tolerances, the paged cache), no cell meaning
    assert set(strays) <= {"divergence.py", "paged.py"}, strays


def test_the_benchmark_figures_agree_with_the_palette_and_orange_means_no_engine():
    assert bench_figures.WORKBENCH_COLOUR == style.ATTENDED and bench_figures.PREFILL_COLOUR == style.PREFILL
    engines = {name: c for name, c in bench_figures.ENGINE_COLOURS.items() if name != "workbench"}
    cache_meanings = {
        style.PADDING,
        style.PREFILL,
        style.ATTENDED,
        style.FED,
        style.NEW_KEY,
        style.STATE,
        style.EXPIRED,
        style.QUEUED,
        style.WAITING,
        style.GOOD,
        style.BAD,
    }
    assert not set(engines.values()) & cache_meanings, engines


def lightness(colour: str) -> float:
    """CIE L* (0 black .. 100 white) of an sRGB colour."""
    rgb = np.array(to_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    y = float(linear @ [0.2126, 0.7152, 0.0722])
    return 116 * y ** (1 / 3) - 16 if y > 0.008856 else 903.3 * y


def lab(colour: str) -> np.ndarray:
    """CIE L*a*b* (D65) of an sRGB colour."""
    rgb = np.array(to_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    f = np.cbrt(xyz / [0.95047, 1.0, 1.08883])
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_the_verdict_pair_reads_without_hue_and_is_not_red_against_green():
    # red/green (the old #2ca02c/#d62728) differ by 11 L*: a deuteranope sees two browns
    assert abs(lightness(style.GOOD) - lightness(style.BAD)) >= 20
    assert style.BAD_HATCH and style.BAD_MARKER


def test_prefill_and_the_fed_token_are_clearly_different_colours():
    # the old amber #f2a541 was 37 CIE76 units from the fed orange: two oranges side by side
    assert np.linalg.norm(lab(style.PREFILL) - lab(style.FED)) >= 45


def test_brown_means_mlx_lm_only():
    assert bench_figures.ENGINE_COLOURS["mlx-lm"] == style.MLX_LM and style.MLX_LM not in style.SERIES


def test_integer_ticks_label_whole_positions_only():
    fig = Figure()
    ax = fig.subplots()
    ax.imshow(np.zeros((1, 3)), extent=(-2.5, 0.5, 0.5, -0.5))
    style.integer_ticks(ax.xaxis, -2, 0)
    assert list(ax.get_xticks()) == [-2, -1, 0]
    style.integer_ticks(ax.xaxis, 0, 99, max_labels=8)
    ticks = list(ax.get_xticks())
    assert len(ticks) <= 8 and all(float(t).is_integer() for t in ticks) and ticks[0] == 0


def test_cell_borders_draw_every_line_of_a_three_cell_row():
    fig = Figure()
    ax = fig.subplots()
    ax.imshow(np.zeros((1, 3)))
    style.cell_borders(ax, 3, 1)
    vertical, horizontal = ax.collections[-2:]
    assert len(vertical.get_segments()) == 4 and len(horizontal.get_segments()) == 2  # 3 cells, not 2


def test_an_empty_axes_shows_its_message_and_no_frame():
    fig = Figure()
    ax = fig.subplots()
    style.empty(ax, "no rows in the batch")
    FigureCanvasAgg(fig).draw()
    assert not ax.axison and ax.texts[0].get_text() == "no rows in the batch"


def test_png_grid_lays_images_out_in_rows_top_aligned():
    def png(h, w, value):
        buf = io.BytesIO()
        image.imsave(buf, np.full((h, w, 3), value), format="png")
        return buf.getvalue()

    grid = image.imread(
        io.BytesIO(style.png_grid([[png(10, 20, 0.0), png(6, 30, 0.5)], [png(4, 8, 0.0)]], gap_px=2))
    )
    assert grid.shape[:2] == (10 + 2 + 4, 20 + 2 + 30)
    assert (
        to_hex(grid[0, 0, :3]) == "#000000" and to_hex(grid[8, 30, :3]) == "#ffffff"
    )  # under the short image: white


def test_scientific_writes_tiny_and_huge_magnitudes_without_e_notation():
    assert style.scientific(3.8e-6) == "3.8×10⁻⁶" and style.scientific(-1.25e-7, 3) == "-1.25×10⁻⁷"
    assert style.scientific(1.5e12) == "1.5×10¹²" and style.scientific(0.0) == "0"


def test_the_step_cost_figure_draws_the_kv_cache_in_the_views_live_kv_blue():
    from workbench.bench import step_cost

    # it was magenta (#c44e9b) in 00 while every render_kv draws live KV blue
    assert step_cost.KV_COLOUR == style.ATTENDED
