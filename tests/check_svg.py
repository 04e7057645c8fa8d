#!/usr/bin/env python3
"""Checks the SVG files dea's programs write, as a reader would: with a real XML parser (xml.etree.ElementTree).

Every file must be well-formed XML and a self-contained SVG 1.1 document: the SVG namespace, version 1.1, a
positive width / height and the matching viewBox, only the SVG 1.1 elements and attributes the plots use, finite
numbers in every coordinate, colours that are #rrggbb / none / a url(#id) of an element in the same file, unique
ids, no external references, and every text anchor and panel frame on the canvas.

Then each program's pictures are read like a person reads them: the axes' tick labels give the data-to-pixel map,
and what is drawn is compared with what it should show (the outlined heatmap cell is the (query, key) cell, the
beta marker sits where the two photo-finish lines cross, the histograms integrate to 1, ...).

    check_svg.py files FILE...                      generic checks only
    check_svg.py visualize DIR --heads H [--demo]   the visualize output folder
    check_svg.py train DIR                          train's plots (alpha_hist_*_step*.svg, training_curves.svg)
    check_svg.py alpha_hist FILE...                 eval's alpha_hist_<split>.svg
    check_svg.py laplacian REPORT.json              laplacian_bench's two plots beside its report
    check_svg.py trmha DIR                          tr_mha_demo's route_shares.svg and route_weights.svg
    check_svg.py selftest                           the checker rejects broken files

Exit status 0 when every check passes; 1 with a message naming the file and the check otherwise.
"""
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
ELEMENTS = {"svg", "g", "title", "desc", "defs", "rect", "line", "polyline", "polygon", "circle", "text", "tspan",
            "linearGradient", "stop", "clipPath"}
ATTRS = {"id", "class", "x", "y", "width", "height", "x1", "y1", "x2", "y2", "cx", "cy", "r", "points", "fill",
         "stroke", "stroke-width", "stroke-dasharray", "stroke-linejoin", "opacity", "fill-opacity", "transform",
         "font-size", "font-family", "font-weight", "font-style", "text-anchor", "dy", "offset", "stop-color",
         "clip-path", "viewBox", "version"}
NUMERIC = {"x", "y", "width", "height", "x1", "y1", "x2", "y2", "cx", "cy", "r", "stroke-width", "opacity",
           "fill-opacity", "font-size", "dy", "offset"}
NONNEG = {"width", "height", "r", "stroke-width", "opacity", "fill-opacity", "font-size"}
COLOUR = re.compile(r"^(none|#[0-9a-f]{6}|url\(#([A-Za-z_][\w.-]*)\))$")


class Fail(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Fail(msg)


def local(tag):
    return tag[len(NS):] if tag.startswith(NS) else tag


def classes(el):
    return el.get("class", "").split()


def has_class(el, c):
    return c in classes(el)


def find_all(root, cls, tag=None):
    return [e for e in root.iter() if has_class(e, cls) and (tag is None or local(e.tag) == tag)]


def text_of(el):
    return "".join(el.itertext())


def number(v, what):
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise Fail(f"{what}: not a number: {v!r}")
    need(math.isfinite(x), f"{what}: not finite: {v!r}")
    return x


def points(el):
    raw = el.get("points", "").split()
    pts = []
    for p in raw:
        xy = p.split(",")
        need(len(xy) == 2, f"bad point {p!r}")
        pts.append((number(xy[0], "point x"), number(xy[1], "point y")))
    return pts


# ------------------------------------------------------------------------------------------------------------
# Generic validation
# ------------------------------------------------------------------------------------------------------------

DTD = os.environ.get("DEA_SVG_DTD")          # the SVG 1.1 DTD (Debian: w3c-sgml-lib), when the build found it
XMLLINT = os.environ.get("DEA_XMLLINT", "xmllint")


def validate(path):
    """Parses `path` and checks the SVG 1.1 structure (and, with DEA_SVG_DTD set, validity against the SVG 1.1
    DTD with xmllint). Returns the root element."""
    if DTD:
        r = subprocess.run([XMLLINT, "--noout", "--nonet", "--dtdvalid", DTD, path], capture_output=True, text=True)
        need(r.returncode == 0, f"{path}: not valid against the SVG 1.1 DTD: " + " / ".join(r.stderr.splitlines()[:3]))
    with open(path, "rb") as f:
        head = f.read(64)
    need(head.startswith(b"<?xml version=\"1.0\""), f"{path}: no XML declaration")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise Fail(f"{path}: not well-formed XML: {e}")
    need(root.tag == NS + "svg", f"{path}: root element is {root.tag}, expected svg in the SVG namespace")
    need(root.get("version") == "1.1", f"{path}: version {root.get('version')!r}, expected 1.1")
    W, H = number(root.get("width"), "width"), number(root.get("height"), "height")
    need(W > 0 and H > 0, f"{path}: non-positive size")
    vb = [number(v, "viewBox") for v in root.get("viewBox", "").split()]
    need(vb == [0, 0, W, H], f"{path}: viewBox {vb} does not match the size {W} x {H}")
    ids = {}
    for el in root.iter():
        need(el.tag.startswith(NS), f"{path}: element {el.tag} outside the SVG namespace")
        name = local(el.tag)
        need(name in ELEMENTS, f"{path}: unexpected element <{name}>")
        for a, v in el.attrib.items():
            need(a in ATTRS, f"{path}: <{name}> has an unexpected attribute {a!r}")
            if a in NUMERIC:
                x = number(v, f"{path}: <{name} {a}>")
                need(a not in NONNEG or x >= 0, f"{path}: <{name} {a}={v}> is negative")
            if a == "id":
                need(v not in ids, f"{path}: duplicate id {v!r}")
                ids[v] = el
        if name in ("polyline", "polygon"):
            need(len(points(el)) >= (2 if name == "polyline" else 3), f"{path}: <{name}> with too few points")
        if "transform" in el.attrib:
            m = re.fullmatch(r"rotate\((-?[\d.]+) (-?[\d.]+) (-?[\d.]+)\)", el.get("transform"))
            need(m is not None, f"{path}: unexpected transform {el.get('transform')!r}")
        if name in ("text", "tspan") and name == "text":
            need(text_of(el).strip() != "", f"{path}: empty <text>")
    refs = []
    for el in root.iter():
        for a in ("fill", "stroke", "stop-color"):
            v = el.get(a)
            if v is not None:
                m = COLOUR.match(v)
                need(m is not None, f"{path}: {a}={v!r} is not none, #rrggbb or url(#id)")
                if m.group(2):
                    refs.append(m.group(2))
        if el.get("clip-path") is not None:
            m = re.fullmatch(r"url\(#([\w.-]+)\)", el.get("clip-path"))
            need(m is not None, f"{path}: bad clip-path {el.get('clip-path')!r}")
            refs.append(m.group(1))
    for r in refs:
        need(r in ids, f"{path}: reference to a missing id #{r}")
    # on the canvas: text anchors and frames
    for el in root.iter(NS + "text"):
        x, y = number(el.get("x"), "text x"), number(el.get("y"), "text y")
        need(-1 <= x <= W + 1 and -1 <= y <= H + 1, f"{path}: text {text_of(el)!r} anchored off the canvas at ({x}, {y})")
    for el in find_all(root, "frame", "rect"):
        x, y, w, h = (number(el.get(k), k) for k in ("x", "y", "width", "height"))
        need(x >= -0.5 and y >= -0.5 and x + w <= W + 0.5 and y + h <= H + 0.5, f"{path}: a panel frame leaves the canvas")
    need(root.find(NS + "title") is not None or find_all(root, "suptitle") or find_all(root, "title"),
         f"{path}: no title")
    return root


# ------------------------------------------------------------------------------------------------------------
# Reading axes
# ------------------------------------------------------------------------------------------------------------

class AxisMap:
    """value = a * pixel + b, from an axes' tick marks and their numeric labels."""

    def __init__(self, g, which, path):
        grp = [c for c in g if has_class(c, which)]
        need(len(grp) == 1, f"{path}: axes without a {which} group")
        kids = list(grp[0])
        lines = [c for c in kids if local(c.tag) == "line"]
        texts = [c for c in kids if local(c.tag) == "text"]
        need(len(lines) == len(texts), f"{path}: {which}: {len(lines)} tick marks but {len(texts)} labels")
        pairs = []
        for ln, tx in zip(lines, texts):
            try:
                v = float(text_of(tx).replace("−", "-"))
            except ValueError:
                continue
            p = number(ln.get("x1" if which == "xticks" else "y1"), "tick")
            pairs.append((p, v))
        need(len(pairs) >= 2, f"{path}: {which}: fewer than two numeric tick labels")
        self.labels = [text_of(t) for t in texts]
        self.tick_px = [number(l.get("x1" if which == "xticks" else "y1"), "tick") for l in lines]
        n = len(pairs)
        mp = sum(p for p, _ in pairs) / n
        mv = sum(v for _, v in pairs) / n
        spp = sum((p - mp) ** 2 for p, _ in pairs)
        need(spp > 0, f"{path}: {which}: all ticks at one pixel")
        self.a = sum((p - mp) * (v - mv) for p, v in pairs) / spp
        self.b = mv - self.a * mp
        # the labels must agree with one linear map (ticks evenly placed)
        for p, v in pairs:
            need(abs(self.a * p + self.b - v) <= 1e-3 * max(1.0, abs(v)) + abs(self.a) * 0.6,
                 f"{path}: {which}: tick label {v} is not where a linear axis puts it")
        need((self.a > 0) == (which == "xticks"), f"{path}: {which}: values run the wrong way")

    def value(self, px):
        return self.a * px + self.b

    def pixel(self, v):
        return (v - self.b) / self.a


def axes_list(root):
    return [g for g in root.iter(NS + "g") if has_class(g, "axes")]


def maps(ax, path):
    return AxisMap(ax, "xticks", path), AxisMap(ax, "yticks", path)


def series(ax, cls):
    return [g for g in ax.iter(NS + "g") if has_class(g, "series") and has_class(g, cls)]


def one(items, what, path):
    need(len(items) == 1, f"{path}: expected one {what}, found {len(items)}")
    return items[0]


def legend_labels(ax):
    return [text_of(t) for g in ax.iter(NS + "g") if has_class(g, "legend") for t in g.iter(NS + "text")]


def y_at(pts, x):
    """Linear interpolation of a polyline (pixel space) at pixel x."""
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if min(x0, x1) - 1e-9 <= x <= max(x0, x1) + 1e-9:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise Fail(f"x = {x} outside the polyline")


def bar_rects(g):
    return [tuple(number(r.get(k), k) for k in ("x", "y", "width", "height")) for r in g.iter(NS + "rect")]


def density_integral_bars(g, xm, ym):
    total = 0.0
    for x, y, w, h in bar_rects(g):
        total += abs(xm.value(x + w) - xm.value(x)) * abs(ym.value(y) - ym.value(y + h))
    return total


def density_integral_step(pl, xm, ym):
    pts = points(pl)
    total = 0.0
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if abs(y0 - y1) < 1e-9 and x1 > x0:
            total += (xm.value(x1) - xm.value(x0)) * ym.value(y0)
    return total


def check_alpha_hist(path):
    root = validate(path)
    ax = one(axes_list(root), "axes", path)
    xm, ym = maps(ax, path)
    need(abs(xm.value(number(find_all(ax, "plot-area", "rect")[0].get("x"), "x"))) < 0.01, f"{path}: x axis does not start at 0")
    need(len(series(ax, "band")) == 3, f"{path}: expected the three density bands")
    cap = one(series(ax, "cap-line"), "cap line", path)
    need(abs(xm.value(number(cap.find(NS + "line").get("x1"), "x")) - 0.95) < 0.003, f"{path}: the cap line is not at 0.95")
    orc, hat = series(ax, "oracle-hist"), series(ax, "alpha-hat-hist")
    need(orc or hat or find_all(ax, "no-data"), f"{path}: no histogram and no 'no labelled cells' note")
    if orc:
        integral = density_integral_bars(orc[0], xm, ym)
        need(abs(integral - 1) < 0.03, f"{path}: the oracle density integrates to {integral:.3f}, not 1")
    if hat:
        pl = one(list(hat[0].iter(NS + "polyline")), "alpha-hat outline", path)
        integral = density_integral_step(pl, xm, ym)
        need(abs(integral - 1) < 0.03, f"{path}: the alpha-hat density integrates to {integral:.3f}, not 1")
        xs = [xm.value(x) for x, _ in points(pl)]
        need(min(xs) > -0.005 and max(xs) < 1.005, f"{path}: the alpha-hat outline leaves [0, 1]")
    return root


# ------------------------------------------------------------------------------------------------------------
# visualize
# ------------------------------------------------------------------------------------------------------------

DEMO = [("Paris is capital of France", "paris", "france", 0.90), ("car→wheel", "car", "wheel", 0.90),
        ("king→queen", "king", "queen", 0.90), ("5+3=8", "5+3", "8", 0.90), ("dog→dogs", "dog", "dogs", 0.02)]


def slug(s):
    """The file-name stem visualize gives a sentence: the reference's slug, and one longer than 60 bytes cut to
    its start (at most 51 bytes, at a character boundary, no trailing '_') plus '_' and the FNV-1a hash of the
    whole slug in 8 hex digits."""
    full = re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")
    b = full.encode()
    if len(b) <= 60:
        return full
    h = 2166136261
    for c in b:
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    n = 51
    while n > 0 and (b[n] & 0xC0) == 0x80:
        n -= 1
    return b[:n].decode().rstrip("_") + f"_{h:08x}"


def check_heatmap(path, entry, heads):
    root = validate(path)
    toks = entry["tokens"]
    L, qi, ki = len(toks), entry["query_index"], entry["key_index"]
    panels = [g for g in root.iter(NS + "g") if has_class(g, "heatmap")]
    need(len(panels) == heads, f"{path}: {len(panels)} panels, expected one per head ({heads})")
    for p in panels:
        pid = p.get("id")
        cells = find_all(p, "cell", "rect")
        need(len(cells) == L * L, f"{path}: panel {pid}: {len(cells)} cells, expected {L}x{L} real tokens")
        need(len({c.get("fill") for c in cells}) > 1, f"{path}: panel {pid}: every cell has one colour")
        rows = [text_of(t) for t in find_all(p, "row-label", "text")]
        cols = [text_of(t) for t in find_all(p, "col-label", "text")]
        need(rows == toks and cols == toks, f"{path}: panel {pid}: labels {rows} / {cols}, expected {toks}")
        outline = one(find_all(p, "outline", "rect"), "outlined cell", path)
        ox = number(outline.get("x"), "x") + number(outline.get("width"), "w") / 2
        oy = number(outline.get("y"), "y") + number(outline.get("height"), "h") / 2
        need(outline.get("stroke") == "#d62728", f"{path}: panel {pid}: the outline is not red")
        hit = [c.get("id") for c in cells
               if number(c.get("x"), "x") <= ox <= number(c.get("x"), "x") + number(c.get("width"), "w")
               and number(c.get("y"), "y") <= oy <= number(c.get("y"), "y") + number(c.get("height"), "h")]
        need(hit == [f"{pid}-r{qi}-c{ki}"], f"{path}: panel {pid}: the outline covers {hit}, expected the cell of "
                                             f"query {toks[qi]!r} (row {qi}) and key {toks[ki]!r} (column {ki})")
        # the (row, column) ids sit on a grid: row r above row r+1, column c left of c+1
        by_id = {c.get("id"): c for c in cells}
        need(number(by_id[f"{pid}-r0-c0"].get("y"), "y") < number(by_id[f"{pid}-r{L-1}-c0"].get("y"), "y") and
             number(by_id[f"{pid}-r0-c0"].get("x"), "x") < number(by_id[f"{pid}-r0-c{L-1}"].get("x"), "x"),
             f"{path}: panel {pid}: cells are not laid out row by row")
        cb = one([g for g in p.iter(NS + "g") if has_class(g, "colorbar")], "colour bar", path)
        ticks = [(float(text_of(t).replace("−", "-")), number(t.get("y"), "y")) for t in cb.iter(NS + "text")]
        need(len(ticks) >= 2, f"{path}: panel {pid}: colour bar with fewer than 2 ticks")
        need(all(a[0] < b[0] and a[1] > b[1] for a, b in zip(ticks, ticks[1:])),
             f"{path}: panel {pid}: colour bar values do not rise upwards")


def check_photo_finish(path, entry, oracle, alpha_hat):
    root = validate(path)
    ax = one(axes_list(root), "axes", path)
    xm, ym = maps(ax, path)
    t = one(list(one(series(ax, "target-line"), "target line", path).iter(NS + "polyline")), "target polyline", path)
    p = one(list(one(series(ax, "distractor-line"), "distractor line", path).iter(NS + "polyline")), "distractor polyline",
            path)
    pt, pp = points(t), points(p)
    need(len(pt) == 201 and len(pp) == 201, f"{path}: the lines have {len(pt)} and {len(pp)} points, expected 201")
    need(abs(xm.value(pt[0][0])) < 0.002 and abs(xm.value(pt[-1][0]) - 1) < 0.002, f"{path}: lines do not span α' in [0, 1]")
    for pts in (pt, pp):  # straight lines in α'
        mid = pts[100]
        need(abs((pts[0][1] + pts[-1][1]) / 2 - mid[1]) < 0.6, f"{path}: S*(α') is not linear in α'")
    def vline_value(cls):
        g = one(series(ax, cls), cls, path)
        ln = one(list(g.iter(NS + "line")), cls, path)
        need(ln.get("x1") == ln.get("x2"), f"{path}: {cls} is not vertical")
        return xm.value(number(ln.get("x1"), "x"))
    need(abs(vline_value("oracle-line") - oracle) < 0.003, f"{path}: the oracle line is not at α = {oracle}")
    need(abs(vline_value("alpha-hat-line") - alpha_hat) < 0.003, f"{path}: the α̂ line is not at {alpha_hat}")
    never = one(series(ax, "never-region"), "never region", path)
    x, _, w, _ = bar_rects(never)[0]
    need(abs(xm.value(x) - 0.95) < 0.003 and abs(xm.value(x + w) - 1) < 0.003, f"{path}: the never region is not α > 0.95")
    diffs = [a[1] - b[1] for a, b in zip(pt, pp)]
    crosses = any((d1 > 0) != (d2 > 0) for d1, d2 in zip(diffs, diffs[1:])) or any(abs(d) < 1e-9 for d in diffs)
    labels = " | ".join(legend_labels(ax))
    toks = entry["tokens"]
    need(f"target '{toks[entry['key_index']]}'" in labels, f"{path}: the legend does not name the target")
    need(f"distractor '{entry['distractor']}'" in labels, f"{path}: the legend does not name the distractor")
    beta = entry["beta"]
    markers = series(ax, "beta-marker")
    if beta is None:
        need(not markers, f"{path}: a β marker although there is no crossing")
        need(find_all(ax, "no-crossing", "text"), f"{path}: no 'no crossing' note")
        need(not crosses, f"{path}: the lines cross, but the plot says no crossing")
    else:
        c = one(list(one(markers, "β marker", path).iter(NS + "circle")), "β marker circle", path)
        cx, cy = number(c.get("cx"), "cx"), number(c.get("cy"), "cy")
        need(abs(xm.value(cx) - beta) < 0.003, f"{path}: the β marker is at α' = {xm.value(cx):.4f}, expected {beta}")
        need(abs(y_at(pt, cx) - cy) < 1.5 and abs(y_at(pp, cx) - cy) < 1.5,
             f"{path}: the β marker is not where the two lines cross")
        need(crosses, f"{path}: a β marker but the lines do not cross")
        need(abs(vline_value("beta-line") - beta) < 0.003, f"{path}: the dotted β line is not at β")
        need(not find_all(ax, "no-crossing"), f"{path}: 'no crossing' note with a crossing")


def check_visualize(d, heads, demo):
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    need(isinstance(summary, list) and summary, f"{d}/summary.json: expected a non-empty list")
    if demo:
        need([(e["text"], e["pair"], e["oracle_alpha"]) for e in summary] ==
             [(t, f"{q}→{k}", a) for t, q, k, a in DEMO], f"{d}/summary.json: not the reference's five demo pairs")
    expected = {"alpha_histogram.svg", "spotlight_w_vs_db.svg", "alpha_hat_vs_oracle.svg"}
    for e in summary:
        for key in ("text", "pair", "oracle_alpha", "alpha_hat_mean", "alpha_hat_per_head", "distractor", "beta"):
            need(key in e, f"{d}/summary.json: entry without {key!r}")
        s = e.get("slug", slug(e["text"]))
        # the reference's slug; a second sentence with the same slug gets "_2", "_3", ...
        need(s == slug(e["text"]) or re.fullmatch(re.escape(slug(e["text"])) + r"_\d+", s) is not None,
             f"{d}/summary.json: slug {s!r} for {e['text']!r}")
        expected |= {f"heatmap_E0tilde_{s}.svg", f"heatmap_E1tilde_{s}.svg", f"heatmap_S_tilde_{s}.svg",
                     f"photo_finish_{s}.svg"}
        ah = e["alpha_hat_per_head"]
        need(len(ah) == heads, f"{d}/summary.json: {len(ah)} heads, expected {heads}")
        need(all(0 <= a <= 0.95 for a in ah), f"{d}/summary.json: α̂ outside [0, 0.95]")
        need(abs(sum(ah) / len(ah) - e["alpha_hat_mean"]) < 2e-4, f"{d}/summary.json: α̂ mean is not the mean over heads")
        need(e["beta"] is None or 0 <= e["beta"] <= 1, f"{d}/summary.json: β outside [0, 1]")
        toks, qi, ki = e["tokens"], e["query_index"], e["key_index"]
        q, k = e["pair"].split("→")
        need(q.lower().endswith(toks[qi]) and k.lower().startswith(toks[ki]) and qi < ki,
             f"{d}/summary.json: query / key positions {qi}, {ki} do not hold {q!r}, {k!r} in {toks}")
        need(toks[e["distractor_index"]] == e["distractor"] and e["distractor_index"] != ki,
             f"{d}/summary.json: bad distractor")
    present = {os.path.basename(p) for p in glob.glob(os.path.join(d, "*.svg"))}
    need(present == expected, f"{d}: SVG files {sorted(present ^ expected)} differ from the expected set")
    if demo:
        need(len(present) == 23, f"{d}: {len(present)} SVGs, the reference writes 23")
    for e in summary:
        s = e.get("slug", slug(e["text"]))
        for kind in ("E0tilde", "E1tilde", "S_tilde"):
            check_heatmap(os.path.join(d, f"heatmap_{kind}_{s}.svg"), e, heads)
        check_photo_finish(os.path.join(d, f"photo_finish_{s}.svg"), e, e["oracle_alpha"],
                           e["alpha_hat_per_head"][e["head"]])
    # alpha histogram: mock density left, alpha-hat right with a line per pair at its head-mean
    path = os.path.join(d, "alpha_histogram.svg")
    root = validate(path)
    axs = axes_list(root)
    need(len(axs) == 2, f"{path}: expected two panels")
    xl, yl = maps(axs[0], path)
    dens = one(series(axs[0], "oracle-density"), "mock density", path)
    integral = density_integral_bars(dens, xl, yl)
    need(abs(integral - 1) < 0.03, f"{path}: the mock density integrates to {integral:.3f}")
    # the reference density: 45% below 0.05, 25% in [0.15, 0.30], 30% in [0.75, 0.95]
    mass = [0.0, 0.0, 0.0]
    for x, y, w, h in bar_rects(dens):
        c = xl.value(x + w / 2)
        m = abs(xl.value(x + w) - xl.value(x)) * abs(yl.value(y) - yl.value(y + h))
        mass[0 if c < 0.1 else (1 if c < 0.5 else 2)] += m
    need(all(abs(a - b) < 0.02 for a, b in zip(mass, (0.45, 0.25, 0.30))), f"{path}: mock masses {mass}")
    xr, yr = maps(axs[1], path)
    need(abs(density_integral_bars(one(series(axs[1], "alpha-hat-hist"), "α̂ histogram", path), xr, yr) - 1) < 0.03,
         f"{path}: the α̂ density does not integrate to 1")
    lines = series(axs[1], "pair-line")
    need(len(lines) == len(summary), f"{path}: {len(lines)} pair lines, expected {len(summary)}")
    got = sorted(xr.value(number(g.find(NS + "line").get("x1"), "x")) for g in lines)
    want = sorted(e["alpha_hat_mean"] for e in summary)
    need(all(abs(a - b) < 0.003 for a, b in zip(got, want)), f"{path}: pair lines at {got}, expected {want}")
    need(len(find_all(axs[1], "pair-label", "text")) == len(summary), f"{path}: pair labels missing")
    # spotlight: the real (d_b, w) lie on w = 1 + 2 exp(-d_b / 0.1); L_dec(α̂ = β) = λ_d ln 2
    path = os.path.join(d, "spotlight_w_vs_db.svg")
    root = validate(path)
    axs = axes_list(root)
    need(len(axs) == 2, f"{path}: expected two panels")
    xl, yl = maps(axs[0], path)
    curve = one(list(one(series(axs[0], "w-curve"), "w curve", path).iter(NS + "polyline")), "w curve", path)
    need(len(points(curve)) == 300, f"{path}: the w curve does not have 300 points")
    pts = list(one(series(axs[0], "pair-points"), "pair points", path).iter(NS + "circle"))
    need(pts, f"{path}: no (d_b, w) points of valid pairs")
    for c in pts:
        db, w = xl.value(number(c.get("cx"), "cx")), yl.value(number(c.get("cy"), "cy"))
        need(0.01 - 0.005 <= db and abs(w - (1 + 2 * math.exp(-db / 0.1))) < 0.02,
             f"{path}: point (d_b {db:.3f}, w {w:.3f}) is off the spotlight curve")
    xr, yr = maps(axs[1], path)
    curves = series(axs[1], "decision-curve")
    need(len(curves) == 3, f"{path}: expected three decision-loss curves")
    for g, beta in zip(curves, (0.6, 0.5, 0.6)):
        pl = points(one(list(g.iter(NS + "polyline")), "curve", path))
        need(len(pl) == 300, f"{path}: a decision curve does not have 300 points")
        v = yr.value(y_at(pl, xr.pixel(beta)))
        need(abs(v - 0.5 * math.log(2)) < 0.01, f"{path}: λ_d L_decision at α̂ = β is {v:.4f}, expected λ_d ln 2")
    # bars: oracle and head-mean bars, a dot per head
    path = os.path.join(d, "alpha_hat_vs_oracle.svg")
    root = validate(path)
    ax = one(axes_list(root), "axes", path)
    ym = AxisMap(ax, "yticks", path)
    orc = bar_rects(one(series(ax, "oracle-bars"), "oracle bars", path))
    hat = bar_rects(one(series(ax, "alpha-hat-bars"), "α̂ bars", path))
    need([round(ym.value(y), 3) for _, y, _, _ in orc] == [round(e["oracle_alpha"], 3) for e in summary if e["oracle_alpha"] > 0],
         f"{path}: oracle bars do not show the oracle α")
    need(all(abs(ym.value(y) - e["alpha_hat_mean"]) < 0.003 for (_, y, _, _), e in
             zip(hat, [e for e in summary if e["alpha_hat_mean"] > 0])), f"{path}: α̂ bars do not show the head means")
    dots = list(one(series(ax, "head-dots"), "head dots", path).iter(NS + "circle"))
    need(len(dots) == heads * len(summary), f"{path}: {len(dots)} head dots, expected {heads * len(summary)}")
    xt = [g for g in ax if has_class(g, "xticks")][0]
    need([text_of(t) for t in xt.iter(NS + "text")] == [e["pair"] for e in summary], f"{path}: x labels are not the pairs")
    return len(present)


# ------------------------------------------------------------------------------------------------------------
# train, laplacian_bench, tr_mha_demo
# ------------------------------------------------------------------------------------------------------------

def check_train(d):
    log = os.path.join(d, "train_log.jsonl")
    recs = [json.loads(l) for l in open(log, encoding="utf-8") if l.strip()]
    train_steps = sorted({r["step"] for r in recs if r.get("event") != "eval"})
    eval_steps = sorted({r["step"] for r in recs if r.get("event") == "eval"})
    need(eval_steps, f"{log}: no evaluation records")
    for s in eval_steps:
        for kind in ("train", "val"):
            check_alpha_hist(os.path.join(d, f"alpha_hist_{kind}_step{s}.svg"))
    path = os.path.join(d, "training_curves.svg")
    root = validate(path)
    axs = axes_list(root)
    need(len(axs) == 4, f"{path}: expected four panels")
    task = one(list(one(series(axs[0], "task-loss"), "task loss", path).iter(NS + "polyline")), "task loss", path)
    need(len(points(task)) == len(train_steps), f"{path}: {len(points(task))} task-loss points, {len(train_steps)} logged")
    xm, ym = maps(axs[0], path)
    by_step = {r["step"]: r for r in recs if r.get("event") != "eval"}
    for (px, py), s in zip(points(task), train_steps):
        need(abs(xm.value(px) - s) < 0.01 * max(1, train_steps[-1]) and
             abs(ym.value(py) - by_step[s]["task_loss"]) < 0.01 * max(1.0, abs(by_step[s]["task_loss"])),
             f"{path}: task-loss point at step {s} does not match the log")
    val = one(series(axs[2], "val-accuracy"), "validation accuracy", path)
    need(len(list(val.iter(NS + "circle"))) == len(eval_steps), f"{path}: validation markers do not match the log")
    g = points(one(list(one(series(axs[1], "gamma"), "gamma", path).iter(NS + "polyline")), "gamma", path))
    _, gy = maps(axs[1], path)
    need(abs(gy.value(g[0][1]) - by_step[train_steps[0]]["gamma"]) < 0.01, f"{path}: γ curve does not start at the log's γ")


def check_laplacian(report_path):
    rep = json.load(open(report_path, encoding="utf-8"))
    stem = os.path.splitext(report_path)[0]
    path = stem + "_mse_per_seed.svg"
    root = validate(path)
    axs = axes_list(root)
    need(len(axs) == 2, f"{path}: expected two panels")
    dot, lap = rep["baseline"]["per_seed"], rep["idea"]["per_seed"]
    ym = AxisMap(axs[0], "yticks", path)
    for cls, vals in (("dot-points", dot), ("lap-points", lap)):
        circ = list(one(series(axs[0], cls), cls, path).iter(NS + "circle"))
        need(len(circ) == len(vals), f"{path}: {len(circ)} {cls}, expected one per seed ({len(vals)})")
        span = max(dot + lap) - min(dot + lap) + 1e-12
        for c, v in zip(circ, vals):
            need(abs(ym.value(number(c.get("cy"), "cy")) - v) < 0.01 * span, f"{path}: {cls} do not show the report's MSE")
    bars = sum(len(bar_rects(g)) for g in series(axs[1], "d-bars"))
    need(bars == sum(1 for a, b in zip(lap, dot) if a != b), f"{path}: {bars} difference bars")
    need(rep["verdict"] in " ".join(text_of(t) for t in find_all(axs[1], "title")), f"{path}: the verdict is not shown")
    if rep.get("mechanism_signature"):
        path = stem + "_sigma_entropy.svg"
        root = validate(path)
        ax = one(axes_list(root), "axes", path)
        lines = series(ax, "lap-entropy")
        per_block = rep["mechanism_signature"]["check_ii_entropy_rises_with_sigma"]["per_block"]
        need(len(lines) == len(per_block), f"{path}: {len(lines)} entropy lines, expected one per block")
        ym = AxisMap(ax, "yticks", path)
        for g, b in zip(lines, per_block):
            pl = points(one(list(g.iter(NS + "polyline")), "entropy line", path))
            want = [b["mean_entropy_sigma_x0.5"], b["mean_entropy_sigma_x1"], b["mean_entropy_sigma_x2"]]
            need(len(pl) == 3 and all(abs(ym.value(y) - w) < 0.01 * max(1, abs(w)) for (_, y), w in zip(pl, want)),
                 f"{path}: the entropy line does not show the report's values")
        need(len(series(ax, "dot-entropy")) == len(per_block), f"{path}: dot baseline lines missing")


def check_trmha(d):
    path = os.path.join(d, "route_shares.svg")
    root = validate(path)
    ax = one(axes_list(root), "axes", path)
    ym = AxisMap(ax, "yticks", path)
    groups = series(ax, "share-bars")
    need(len(groups) == 3, f"{path}: expected 3 bar groups (v1 init, v2 init, v2 trained), found {len(groups)}")
    for g in groups:
        total = sum(abs(ym.value(y) - ym.value(y + h)) for _, y, _, h in bar_rects(g))
        need(abs(total - 1) < 0.02, f"{path}: route shares of one layer sum to {total:.3f}, not 1")
    path = os.path.join(d, "route_weights.svg")
    root = validate(path)
    ax = one(axes_list(root), "axes", path)
    xm, ym = maps(ax, path)
    hists = series(ax, "weight-hist")
    need(len(hists) == 3, f"{path}: expected 3 route-weight histograms")
    for g in hists:
        integral = density_integral_step(one(list(g.iter(NS + "polyline")), "outline", path), xm, ym)
        need(abs(integral - 1) < 0.03, f"{path}: a route-weight density integrates to {integral:.3f}")


def selftest():
    """The generic checks must reject broken files (so a passing run means something)."""
    good = ('<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" version="1.1" '
            'width="10" height="10" viewBox="0 0 10 10"><title>t</title>{}</svg>\n')
    bad = {
        "unclosed tag": good.format("<g>"),
        "raw ampersand": good.format("<text x=\"1\" y=\"1\">a & b</text>"),
        "NaN coordinate": good.format("<rect x=\"nan\" y=\"0\" width=\"1\" height=\"1\"/>"),
        "external reference": good.format("<rect x=\"0\" y=\"0\" width=\"1\" height=\"1\" fill=\"url(#nope)\"/>"),
        "foreign element": good.format("<image x=\"0\" y=\"0\" width=\"1\" height=\"1\"/>"),
        "duplicate id": good.format("<g id=\"a\"/><g id=\"a\"/>"),
        "text off canvas": good.format("<text x=\"50\" y=\"1\">x</text>"),
        "attribute outside SVG 1.1": good.format("<rect x=\"0\" y=\"0\" width=\"1\" height=\"1\" data-v=\"1\"/>"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "ok.svg")
        open(p, "w").write(good.format("<text x=\"1\" y=\"5\">a &amp; b</text>"))
        validate(p)
        for what, text in bad.items():
            p = os.path.join(tmp, "bad.svg")
            open(p, "w").write(text)
            try:
                validate(p)
            except Fail:
                continue
            raise Fail(f"selftest: a file with {what} was accepted")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    mode, args = argv[1], argv[2:]
    n = 0
    try:
        if mode == "files":
            need(args, "no files given")
            for p in args:
                validate(p)
            n = len(args)
        elif mode == "visualize":
            heads = int(args[args.index("--heads") + 1])
            n = check_visualize(args[0], heads, "--demo" in args)
        elif mode == "train":
            check_train(args[0])
            n = len(glob.glob(os.path.join(args[0], "*.svg")))
        elif mode == "alpha_hist":
            need(args, "no files given")
            for p in args:
                check_alpha_hist(p)
            n = len(args)
        elif mode == "laplacian":
            check_laplacian(args[0])
            n = 2
        elif mode == "trmha":
            check_trmha(args[0])
            n = 2
        elif mode == "selftest":
            selftest()
        else:
            print(__doc__)
            return 2
    except Fail as e:
        print(f"check_svg {mode}: FAILED: {e}")
        return 1
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"check_svg {mode}: FAILED: {type(e).__name__}: {e}")
        return 1
    print(f"check_svg {mode}: OK ({n} SVG files checked{', valid against the SVG 1.1 DTD' if DTD else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
