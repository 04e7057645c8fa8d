// dea/plot/svg_axes.hpp: the plotting layer of dea/plot/svg.hpp (read its comment), part one: histograms,
// series, the Panel base and Axes (line plots, scatter, histograms, bars, bands, lines, markers, legends).
#pragma once

#include "svg_document.hpp"

namespace dea::svg {

// ------------------------------------------------------------------------------------------------------------
// Plotting: histograms, axes, heatmaps, figures
// ------------------------------------------------------------------------------------------------------------

/// A histogram: bins [edges[k], edges[k+1]) (the last bin includes its right edge), heights = counts, or
/// counts / (n_in * bin width) with density. Non-finite values and values outside [lo, hi] are not counted.
struct Hist {
  std::vector<double> edges, heights;
  std::size_t n_in = 0, n_out = 0;
};

inline Hist histogram(const std::vector<double>& values, int bins, double lo, double hi, bool density) {
  check(bins > 0, "svg::histogram: bins must be positive, got ", bins);
  check(std::isfinite(lo) && std::isfinite(hi) && hi > lo, "svg::histogram: expected finite lo < hi, got [", lo, ", ",
        hi, "]");
  Hist h;
  h.edges.resize(static_cast<std::size_t>(bins) + 1);
  for (int k = 0; k <= bins; ++k) h.edges[static_cast<std::size_t>(k)] = lo + (hi - lo) * k / bins;
  h.heights.assign(static_cast<std::size_t>(bins), 0.0);
  const double width = (hi - lo) / bins;
  for (double v : values) {
    if (!std::isfinite(v) || v < lo || v > hi) {
      ++h.n_out;
      continue;
    }
    std::size_t k = static_cast<std::size_t>((v - lo) / width);
    if (k >= static_cast<std::size_t>(bins)) k = static_cast<std::size_t>(bins) - 1;  // v == hi
    h.heights[k] += 1;
    ++h.n_in;
  }
  if (density && h.n_in > 0)
    for (double& c : h.heights) c /= static_cast<double>(h.n_in) * width;
  return h;
}

/// A rectangle in pixels (x, y = top-left corner).
struct Box {
  double x = 0, y = 0, w = 0, h = 0;
};

/// Where a legend goes; `best` picks the corner that covers the fewest data points.
enum class Loc {
  none,
  best,
  upper_right,
  upper_left,
  lower_left,
  lower_right,
  center_right,
  center_left,
  upper_center,
  lower_center,
  center
};

/// One thing drawn in an Axes. The Axes methods fill it; the public fields may be adjusted afterwards.
struct Series {
  enum class Kind { line, scatter, bars, step, fill, vspan, hspan, vline, hline, text, text_axes };
  Kind kind = Kind::line;
  std::vector<double> x, y, y2;  ///< y2: lower curve of a fill, bottoms of bars
  std::string color;
  double width = 1.5;            ///< stroke width; for bars, the bar width in data units
  std::string dash;              ///< stroke-dasharray
  double opacity = 1;            ///< fill opacity of areas and bars, opacity of lines and markers
  double radius = 0;             ///< marker radius (scatter; 0 on a line = no markers)
  std::string edge;              ///< bars and spans: outline colour (empty = none)
  std::string label;             ///< legend entry (empty = not in the legend)
  std::string cls;               ///< extra class of the series group
  std::string str;               ///< text
  TextStyle text;                ///< text look
  double dx = 0, dy = 0;         ///< text offset in pixels

  Series& set_class(std::string c) {
    cls = std::move(c);
    return *this;
  }
  Series& set_label(std::string l) {
    label = std::move(l);
    return *this;
  }
};

inline const char* kind_name(Series::Kind k) {
  switch (k) {
    case Series::Kind::line: return "line";
    case Series::Kind::scatter: return "scatter";
    case Series::Kind::bars: return "bars";
    case Series::Kind::step: return "step";
    case Series::Kind::fill: return "fill";
    case Series::Kind::vspan: return "vspan";
    case Series::Kind::hspan: return "hspan";
    case Series::Kind::vline: return "vline";
    case Series::Kind::hline: return "hline";
    case Series::Kind::text: return "text";
    case Series::Kind::text_axes: return "text";
  }
  return "?";
}

/// Something a Figure draws into its box.
class Panel {
public:
  explicit Panel(Box b) : box(b) {}
  virtual ~Panel() = default;
  virtual void draw(Document& doc) const = 0;
  Box box;          ///< outer box in pixels (labels and titles included)
  std::string cls;  ///< extra class of the panel group
  std::string id;   ///< id of the panel group (optional)
};

/// A 2-D plot with linear axes.
class Axes : public Panel {
public:
  explicit Axes(Box b) : Panel(b) {}

  std::string title, xlabel, ylabel;
  bool grid = true;
  Loc legend_loc = Loc::none;
  double margin = 0.05;  ///< fraction of the data range added on each side of automatic limits

  Axes& set_xlim(double lo, double hi) {
    check(std::isfinite(lo) && std::isfinite(hi) && hi > lo, "svg::Axes::set_xlim: expected finite lo < hi, got [", lo,
          ", ", hi, "]");
    xlim_ = {lo, hi};
    has_xlim_ = true;
    return *this;
  }
  Axes& set_ylim(double lo, double hi) {
    check(std::isfinite(lo) && std::isfinite(hi) && hi > lo, "svg::Axes::set_ylim: expected finite lo < hi, got [", lo,
          ", ", hi, "]");
    ylim_ = {lo, hi};
    has_ylim_ = true;
    return *this;
  }
  /// Fixed ticks (labels default to the formatted positions); `rotate` in degrees (e.g. -30).
  Axes& set_xticks(std::vector<double> pos, std::vector<std::string> labels = {}, double rotate = 0) {
    check(labels.empty() || labels.size() == pos.size(), "svg::Axes::set_xticks: ", pos.size(), " positions but ",
          labels.size(), " labels");
    xticks_ = std::move(pos);
    xtick_labels_ = std::move(labels);
    xtick_rotate_ = rotate;
    has_xticks_ = true;
    return *this;
  }
  Axes& set_yticks(std::vector<double> pos, std::vector<std::string> labels = {}) {
    check(labels.empty() || labels.size() == pos.size(), "svg::Axes::set_yticks: ", pos.size(), " positions but ",
          labels.size(), " labels");
    yticks_ = std::move(pos);
    ytick_labels_ = std::move(labels);
    has_yticks_ = true;
    return *this;
  }
  Axes& legend(Loc loc = Loc::best) {
    legend_loc = loc;
    return *this;
  }

  /// A polyline through (x[k], y[k]); it breaks at non-finite points.
  Series& line(std::vector<double> x, std::vector<double> y, std::string color = {}, double width = 1.5,
               std::string dash = {}, std::string label = {}) {
    check_sizes(x, y, "line");
    Series& s = add(Series::Kind::line, std::move(color));
    s.x = std::move(x);
    s.y = std::move(y);
    s.width = width;
    s.dash = std::move(dash);
    s.label = std::move(label);
    return s;
  }
  Series& scatter(std::vector<double> x, std::vector<double> y, std::string color = {}, double radius = 3,
                  std::string label = {}, double opacity = 1) {
    check_sizes(x, y, "scatter");
    Series& s = add(Series::Kind::scatter, std::move(color));
    s.x = std::move(x);
    s.y = std::move(y);
    s.radius = radius;
    s.label = std::move(label);
    s.opacity = opacity;
    return s;
  }
  /// One point drawn as a filled circle with a dark edge.
  Series& marker(double x, double y, std::string color = palette::black, double radius = 5, std::string label = {}) {
    Series& s = scatter({x}, {y}, std::move(color), radius, std::move(label));
    s.edge = "#000000";
    return s;
  }
  /// Bars centred at x with heights h and a common width (data units), from `bottom` (default 0).
  Series& bars(std::vector<double> x, std::vector<double> h, double width, std::string color = {},
               std::string label = {}, std::vector<double> bottom = {}, double opacity = 1) {
    check_sizes(x, h, "bars");
    check(bottom.empty() || bottom.size() == x.size(), "svg::Axes::bars: ", x.size(), " bars but ", bottom.size(),
          " bottoms");
    check(std::isfinite(width) && width > 0, "svg::Axes::bars: width must be positive, got ", width);
    Series& s = add(Series::Kind::bars, std::move(color));
    s.x = std::move(x);
    s.y = std::move(h);
    s.y2 = bottom.empty() ? std::vector<double>(s.x.size(), 0.0) : std::move(bottom);
    s.width = width;
    s.label = std::move(label);
    s.opacity = opacity;
    return s;
  }
  /// The outline of a histogram: edges (n + 1) and heights (n).
  Series& step(std::vector<double> edges, std::vector<double> heights, std::string color = {}, double width = 2,
               std::string label = {}) {
    check(edges.size() == heights.size() + 1, "svg::Axes::step: expected edges = heights + 1, got ", edges.size(),
          " and ", heights.size());
    Series& s = add(Series::Kind::step, std::move(color));
    s.x = std::move(edges);
    s.y = std::move(heights);
    s.width = width;
    s.label = std::move(label);
    return s;
  }
  /// A histogram of `values` over [lo, hi] in `bins` bins: filled bars, or a step outline when !filled.
  Series& hist(const std::vector<double>& values, int bins, double lo, double hi, bool density, std::string color = {},
               std::string label = {}, bool filled = true, double opacity = 0.7) {
    const Hist h = histogram(values, bins, lo, hi, density);
    if (!filled) return step(h.edges, h.heights, std::move(color), 2, std::move(label));
    std::vector<double> centres(h.heights.size());
    for (std::size_t k = 0; k < centres.size(); ++k) centres[k] = 0.5 * (h.edges[k] + h.edges[k + 1]);
    return bars(std::move(centres), h.heights, (hi - lo) / bins, std::move(color), std::move(label), {}, opacity);
  }
  /// The area between lo(x) and hi(x).
  Series& fill_between(std::vector<double> x, std::vector<double> lo, std::vector<double> hi, std::string color = {},
                       double opacity = 0.25, std::string label = {}) {
    check_sizes(x, lo, "fill_between");
    check_sizes(x, hi, "fill_between");
    Series& s = add(Series::Kind::fill, std::move(color));
    s.x = std::move(x);
    s.y = std::move(hi);
    s.y2 = std::move(lo);
    s.opacity = opacity;
    s.label = std::move(label);
    return s;
  }
  /// A shaded vertical band x0 <= x <= x1 over the whole height.
  Series& vspan(double x0, double x1, std::string color, double opacity = 0.2, std::string label = {}) {
    Series& s = add(Series::Kind::vspan, std::move(color));
    s.x = {x0, x1};
    s.opacity = opacity;
    s.label = std::move(label);
    return s;
  }
  Series& hspan(double y0, double y1, std::string color, double opacity = 0.2, std::string label = {}) {
    Series& s = add(Series::Kind::hspan, std::move(color));
    s.y = {y0, y1};
    s.opacity = opacity;
    s.label = std::move(label);
    return s;
  }
  Series& vline(double x, std::string color = palette::black, double width = 1, std::string dash = {},
                std::string label = {}) {
    Series& s = add(Series::Kind::vline, std::move(color));
    s.x = {x};
    s.width = width;
    s.dash = std::move(dash);
    s.label = std::move(label);
    return s;
  }
  Series& hline(double y, std::string color = palette::black, double width = 1, std::string dash = {},
                std::string label = {}) {
    Series& s = add(Series::Kind::hline, std::move(color));
    s.y = {y};
    s.width = width;
    s.dash = std::move(dash);
    s.label = std::move(label);
    return s;
  }
  /// Text anchored at data point (x, y), moved by (dx, dy) pixels.
  Series& text(double x, double y, std::string str, TextStyle style = {}, double dx = 0, double dy = 0) {
    Series& s = add(Series::Kind::text, style.fill);
    s.x = {x};
    s.y = {y};
    s.str = std::move(str);
    s.text = std::move(style);
    s.dx = dx;
    s.dy = dy;
    return s;
  }
  /// Text at a fraction of the plot area: (0, 0) lower left, (1, 1) upper right.
  Series& text_axes(double fx, double fy, std::string str, TextStyle style = {}) {
    Series& s = add(Series::Kind::text_axes, style.fill);
    s.x = {fx};
    s.y = {fy};
    s.str = std::move(str);
    s.text = std::move(style);
    return s;
  }

  const std::vector<Series>& series() const { return series_; }

  /// The plot area (inside the tick labels and titles) in pixels.
  Box plot_area() const {
    const Layout L = layout();
    return L.plot;
  }
  /// The x and y limits the plot uses (given, or from the data).
  std::pair<double, double> xlim() const { return has_xlim_ ? xlim_ : auto_limits(true); }
  std::pair<double, double> ylim() const { return has_ylim_ ? ylim_ : auto_limits(false); }
  /// Pixel position of a data point.
  double px(double x) const {
    const Box p = plot_area();
    const auto [lo, hi] = xlim();
    return clamp_px(p.x + (x - lo) / (hi - lo) * p.w);
  }
  double py(double y) const {
    const Box p = plot_area();
    const auto [lo, hi] = ylim();
    return clamp_px(p.y + p.h - (y - lo) / (hi - lo) * p.h);
  }

  void draw(Document& doc) const override {
    const Layout L = layout();
    const Box p = L.plot;
    // (plain copies: C++17 lambdas cannot capture structured bindings, and clang refuses it)
    const double x0 = L.xlim.first, x1 = L.xlim.second;
    const double y0 = L.ylim.first, y1 = L.ylim.second;
    auto X = [&](double x) { return clamp_px(p.x + (x - x0) / (x1 - x0) * p.w); };
    auto Y = [&](double y) { return clamp_px(p.y + p.h - (y - y0) / (y1 - y0) * p.h); };

    doc.group("axes" + (cls.empty() ? std::string() : " " + cls), id);
    doc.rect(p.x, p.y, p.w, p.h, [] {
      Style s = fill_style("#ffffff");
      s.cls = "plot-area";
      return s;
    }());
    // grid
    if (grid) {
      doc.group("grid");
      for (double t : L.xticks) doc.line(X(t), p.y, X(t), p.y + p.h, stroke_style("#e6e6e6", 0.8));
      for (double t : L.yticks) doc.line(p.x, Y(t), p.x + p.w, Y(t), stroke_style("#e6e6e6", 0.8));
      doc.close();
    }
    // series, clipped to the plot area
    const std::string clip = doc.clip_rect(p.x, p.y, p.w, p.h);
    doc.group("data", {}, Attrs().set("clip-path", "url(#" + clip + ")"));
    for (const Series& s : series_)
      if (s.kind != Series::Kind::text && s.kind != Series::Kind::text_axes) draw_series(doc, s, p, X, Y);
    doc.close();
    // text is not clipped (a label next to a line may reach past the frame)
    for (const Series& s : series_)
      if (s.kind == Series::Kind::text || s.kind == Series::Kind::text_axes) draw_series(doc, s, p, X, Y);
    // frame and ticks
    doc.rect(p.x, p.y, p.w, p.h, [] {
      Style s = stroke_style("#333333", 1);
      s.cls = "frame";
      return s;
    }());
    TextStyle tick;
    tick.size = 10;
    tick.fill = "#333333";
    tick.cls = "tick-label";
    doc.group("xticks");
    for (std::size_t k = 0; k < L.xticks.size(); ++k) {
      const double x = X(L.xticks[k]);
      doc.line(x, p.y + p.h, x, p.y + p.h + 4, stroke_style("#333333", 1));
      TextStyle t = tick;
      if (xtick_rotate_ != 0) {
        t.anchor = "end";
        t.rotate = xtick_rotate_;
        doc.text(x + 3, p.y + p.h + 10, L.xtick_labels[k], t);
      } else {
        t.anchor = "middle";
        doc.text(x, p.y + p.h + 16, L.xtick_labels[k], t);
      }
    }
    doc.close();
    doc.group("yticks");
    for (std::size_t k = 0; k < L.yticks.size(); ++k) {
      const double y = Y(L.yticks[k]);
      doc.line(p.x - 4, y, p.x, y, stroke_style("#333333", 1));
      TextStyle t = tick;
      t.anchor = "end";
      doc.text(p.x - 6, y + 3.5, L.ytick_labels[k], t);
    }
    doc.close();
    // labels and title
    if (!xlabel.empty()) {
      TextStyle t;
      t.size = 11.5;
      t.anchor = "middle";
      t.cls = "xlabel";
      doc.text(p.x + p.w / 2, box.y + box.h - 6, xlabel, t);
    }
    if (!ylabel.empty()) {
      TextStyle t;
      t.size = 11.5;
      t.anchor = "middle";
      t.rotate = -90;
      t.cls = "ylabel";
      doc.text(box.x + 13, p.y + p.h / 2, ylabel, t);
    }
    if (!title.empty()) {
      TextStyle t;
      t.size = fit_size(title, 12.5, p.w + 40);
      t.anchor = "middle";
      t.bold = true;
      t.cls = "title";
      doc.text(p.x + p.w / 2, box.y + 16, title, t);
    }
    draw_legend(doc, p, X, Y);
    doc.close();
  }

private:
  struct Layout {
    Box plot;
    std::pair<double, double> xlim, ylim;
    std::vector<double> xticks, yticks;
    std::vector<std::string> xtick_labels, ytick_labels;
  };

  static double clamp_px(double v) { return std::min(1e6, std::max(-1e6, v)); }

  static double fit_size(const std::string& s, double size, double avail) {
    const double w = text_width(s, size);
    if (w <= avail || w <= 0) return size;
    return std::max(8.0, size * avail / w);
  }

  static void check_sizes(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
    check(a.size() == b.size(), "svg::Axes::", what, ": x has ", a.size(), " values but y has ", b.size());
  }

  Series& add(Series::Kind k, std::string color) {
    Series s;
    s.kind = k;
    if (color.empty()) color = palette::cycle(n_auto_colour_++);
    s.color = std::move(color);
    series_.push_back(std::move(s));
    return series_.back();
  }

  /// Limits from the finite data of every series (with `margin` on each side; a bar or histogram baseline at 0
  /// stays on the axis).
  std::pair<double, double> auto_limits(bool is_x) const {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    bool zero_base = false;
    auto take = [&](double v) {
      if (std::isfinite(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    };
    for (const Series& s : series_) {
      using K = Series::Kind;
      switch (s.kind) {
        case K::line:
        case K::scatter:
        case K::fill:
          // only points that are drawn: x and y (and a fill's lower curve) finite
          for (std::size_t k = 0; k < s.x.size(); ++k) {
            if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k]) || (s.kind == K::fill && !std::isfinite(s.y2[k])))
              continue;
            take(is_x ? s.x[k] : s.y[k]);
            if (!is_x && s.kind == K::fill) take(s.y2[k]);
          }
          break;
        case K::bars:
          for (std::size_t k = 0; k < s.x.size(); ++k) {
            if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k]) || !std::isfinite(s.y2[k])) continue;
            if (is_x) {
              take(s.x[k] - s.width / 2);
              take(s.x[k] + s.width / 2);
            } else {
              take(s.y2[k]);
              take(s.y2[k] + s.y[k]);
              if (s.y2[k] == 0) zero_base = true;
            }
          }
          break;
        case K::step:
          for (double v : (is_x ? s.x : s.y)) take(v);
          if (!is_x) {
            take(0);
            zero_base = true;
          }
          break;
        case K::vspan:
        case K::vline:
          if (is_x)
            for (double v : s.x) take(v);
          break;
        case K::hspan:
        case K::hline:
          if (!is_x)
            for (double v : s.y) take(v);
          break;
        case K::text:
        case K::text_axes: break;
      }
    }
    if (!(lo <= hi)) return {0.0, 1.0};
    if (hi == lo) {
      const double d = lo == 0 ? 0.5 : std::abs(lo) * 0.1;
      return {lo - d, hi + d};
    }
    const double pad = (hi - lo) * margin;
    return {(zero_base && lo == 0) ? 0.0 : lo - pad, hi + pad};
  }

  Layout layout() const {
    Layout L;
    L.xlim = xlim();
    L.ylim = ylim();
    // ticks first (their labels set the margins)
    auto ticks = [](bool given, const std::vector<double>& pos, const std::vector<std::string>& labels,
                    std::pair<double, double> lim, int target, std::vector<double>& out,
                    std::vector<std::string>& out_labels) {
      const double lo = lim.first, hi = lim.second, eps = (hi - lo) * 1e-9;
      if (given) {
        for (std::size_t k = 0; k < pos.size(); ++k)
          if (std::isfinite(pos[k]) && pos[k] >= lo - eps && pos[k] <= hi + eps) {
            out.push_back(pos[k]);
            out_labels.push_back(labels.empty() ? format_value(pos[k], 4) : labels[k]);
          }
        return;
      }
      out = nice_ticks(lo, hi, target);
      const double step = out.size() > 1 ? out[1] - out[0] : std::abs(hi - lo);
      for (double t : out) out_labels.push_back(format_tick(t, step));
    };
    const double w_guess = box.w - 70, h_guess = box.h - 60;
    ticks(has_xticks_, xticks_, xtick_labels_, L.xlim, std::max(2, static_cast<int>(w_guess / 90)), L.xticks,
          L.xtick_labels);
    ticks(has_yticks_, yticks_, ytick_labels_, L.ylim, std::max(2, static_cast<int>(h_guess / 55)), L.yticks,
          L.ytick_labels);
    double ytw = 0, xtw = 0;
    for (const auto& s : L.ytick_labels) ytw = std::max(ytw, text_width(s, 10));
    for (const auto& s : L.xtick_labels) xtw = std::max(xtw, text_width(s, 10));
    const double ml = 8 + ytw + 8 + (ylabel.empty() ? 0 : 18);
    const double rad = std::abs(xtick_rotate_) * 3.14159265358979 / 180;
    const double xth = xtick_rotate_ != 0 ? xtw * std::sin(rad) + 10 * std::cos(rad) + 10 : 18;
    const double mb = 4 + xth + (xlabel.empty() ? 0 : 18) + 2;
    const double mt = title.empty() ? 8 : 26;
    const double mr = 14;
    L.plot = Box{box.x + ml, box.y + mt, std::max(10.0, box.w - ml - mr), std::max(10.0, box.h - mt - mb)};
    return L;
  }

  template <class FX, class FY>
  void draw_series(Document& doc, const Series& s, const Box& p, FX X, FY Y) const {
    using K = Series::Kind;
    doc.group(std::string("series ") + kind_name(s.kind) + (s.cls.empty() ? "" : " " + s.cls));
    switch (s.kind) {
      case K::line: {
        Style st = stroke_style(s.color, s.width, s.dash);
        st.opacity = s.opacity;
        std::vector<std::pair<double, double>> seg;
        auto flush = [&] {
          if (seg.size() >= 2) doc.polyline(seg, st);
          else if (seg.size() == 1 && s.radius <= 0)  // an isolated point still shows (markers draw it otherwise)
            doc.circle(seg[0].first, seg[0].second, std::max(1.5, s.width), fill_style(s.color));
          seg.clear();
        };
        for (std::size_t k = 0; k < s.x.size(); ++k) {
          if (std::isfinite(s.x[k]) && std::isfinite(s.y[k])) seg.emplace_back(X(s.x[k]), Y(s.y[k]));
          else flush();
        }
        flush();
        if (s.radius > 0)
          for (std::size_t k = 0; k < s.x.size(); ++k)
            if (std::isfinite(s.x[k]) && std::isfinite(s.y[k])) doc.circle(X(s.x[k]), Y(s.y[k]), s.radius, fill_style(s.color));
        break;
      }
      case K::scatter: {
        Style st = fill_style(s.color);
        st.opacity = s.opacity;
        if (!s.edge.empty()) {
          st.stroke = s.edge;
          st.stroke_width = 1;
        }
        for (std::size_t k = 0; k < s.x.size(); ++k)
          if (std::isfinite(s.x[k]) && std::isfinite(s.y[k])) doc.circle(X(s.x[k]), Y(s.y[k]), s.radius, st);
        break;
      }
      case K::bars: {
        Style st = fill_style(s.color, s.opacity);
        if (!s.edge.empty()) {
          st.stroke = s.edge;
          st.stroke_width = 0.8;
        }
        for (std::size_t k = 0; k < s.x.size(); ++k) {
          const double top = s.y2[k] + s.y[k];
          if (!std::isfinite(s.x[k]) || !std::isfinite(top) || !std::isfinite(s.y2[k]) || s.y[k] == 0) continue;
          const double xa = X(s.x[k] - s.width / 2), xb = X(s.x[k] + s.width / 2);
          const double ya = Y(top), yb = Y(s.y2[k]);
          doc.rect(std::min(xa, xb), std::min(ya, yb), std::abs(xb - xa), std::abs(yb - ya), st);
        }
        break;
      }
      case K::step: {
        std::vector<std::pair<double, double>> pts;
        const std::size_t n = s.y.size();
        if (n > 0 && std::isfinite(s.x[0])) pts.emplace_back(X(s.x[0]), Y(0));
        for (std::size_t k = 0; k < n; ++k) {
          const double h = std::isfinite(s.y[k]) ? s.y[k] : 0.0;
          if (!std::isfinite(s.x[k]) || !std::isfinite(s.x[k + 1])) continue;
          pts.emplace_back(X(s.x[k]), Y(h));
          pts.emplace_back(X(s.x[k + 1]), Y(h));
        }
        if (n > 0 && std::isfinite(s.x[n])) pts.emplace_back(X(s.x[n]), Y(0));
        if (pts.size() >= 2) doc.polyline(pts, stroke_style(s.color, s.width, s.dash));
        break;
      }
      case K::fill: {
        Style st = fill_style(s.color, s.opacity);
        std::vector<std::size_t> run;
        auto flush = [&] {
          if (run.size() >= 2) {
            std::vector<std::pair<double, double>> pts;
            for (std::size_t k : run) pts.emplace_back(X(s.x[k]), Y(s.y[k]));
            for (auto it = run.rbegin(); it != run.rend(); ++it) pts.emplace_back(X(s.x[*it]), Y(s.y2[*it]));
            doc.polygon(pts, st);
          }
          run.clear();
        };
        for (std::size_t k = 0; k < s.x.size(); ++k) {
          if (std::isfinite(s.x[k]) && std::isfinite(s.y[k]) && std::isfinite(s.y2[k])) run.push_back(k);
          else flush();
        }
        flush();
        break;
      }
      case K::vspan:
      case K::hspan: {
        Style st = fill_style(s.color, s.opacity);
        if (!s.edge.empty()) {
          st.stroke = s.edge;
          st.stroke_width = 0.8;
        }
        if (s.kind == K::vspan && std::isfinite(s.x[0]) && std::isfinite(s.x[1])) {
          const double a = X(s.x[0]), b = X(s.x[1]);
          doc.rect(std::min(a, b), p.y, std::abs(b - a), p.h, st);
        } else if (s.kind == K::hspan && std::isfinite(s.y[0]) && std::isfinite(s.y[1])) {
          const double a = Y(s.y[0]), b = Y(s.y[1]);
          doc.rect(p.x, std::min(a, b), p.w, std::abs(b - a), st);
        }
        break;
      }
      case K::vline:
        if (std::isfinite(s.x[0])) {
          Style st = stroke_style(s.color, s.width, s.dash);
          st.opacity = s.opacity;
          doc.line(X(s.x[0]), p.y, X(s.x[0]), p.y + p.h, st);
        }
        break;
      case K::hline:
        if (std::isfinite(s.y[0])) {
          Style st = stroke_style(s.color, s.width, s.dash);
          st.opacity = s.opacity;
          doc.line(p.x, Y(s.y[0]), p.x + p.w, Y(s.y[0]), st);
        }
        break;
      case K::text:
        if (std::isfinite(s.x[0]) && std::isfinite(s.y[0])) doc.text(X(s.x[0]) + s.dx, Y(s.y[0]) + s.dy, s.str, s.text);
        break;
      case K::text_axes:
        if (std::isfinite(s.x[0]) && std::isfinite(s.y[0]))
          doc.text(p.x + s.x[0] * p.w, p.y + (1 - s.y[0]) * p.h, s.str, s.text);
        break;
    }
    doc.close();
  }

  template <class FX, class FY>
  void draw_legend(Document& doc, const Box& p, FX X, FY Y) const {
    if (legend_loc == Loc::none) return;
    std::vector<const Series*> items;
    for (const Series& s : series_)
      if (!s.label.empty()) items.push_back(&s);
    if (items.empty()) return;
    const double fs = 10, row = 16, sw = 24;
    double tw = 0;
    for (const Series* s : items) tw = std::max(tw, text_width(s->label, fs));
    const double w = std::min(p.w - 8, sw + 8 + tw + 12), h = row * static_cast<double>(items.size()) + 8;
    // candidate corners, in order of preference
    const double xl = p.x + 6, xc = p.x + (p.w - w) / 2, xr = p.x + p.w - w - 6;
    const double yu = p.y + 6, yc = p.y + (p.h - h) / 2, yd = p.y + p.h - h - 6;
    const std::array<std::pair<Loc, std::pair<double, double>>, 9> corners = {{
        {Loc::upper_right, {xr, yu}},
        {Loc::upper_left, {xl, yu}},
        {Loc::lower_left, {xl, yd}},
        {Loc::lower_right, {xr, yd}},
        {Loc::center_right, {xr, yc}},
        {Loc::center_left, {xl, yc}},
        {Loc::upper_center, {xc, yu}},
        {Loc::lower_center, {xc, yd}},
        {Loc::center, {xc, yc}},
    }};
    std::pair<double, double> at = corners[0].second;
    if (legend_loc == Loc::best) {
      std::size_t best = 0;
      long best_n = -1;
      for (std::size_t c = 0; c < corners.size(); ++c) {
        const long n = covered(corners[c].second.first, corners[c].second.second, w, h, X, Y);
        if (best_n < 0 || n < best_n) {
          best_n = n;
          best = c;
        }
      }
      at = corners[best].second;
    } else {
      for (const auto& c : corners)
        if (c.first == legend_loc) at = c.second;
    }
    doc.group("legend");
    Style bg = fill_style("#ffffff", 0.85);
    bg.stroke = "#bbbbbb";
    bg.stroke_width = 0.8;
    doc.rect(at.first, at.second, w, h, bg);
    for (std::size_t k = 0; k < items.size(); ++k) {
      const Series& s = *items[k];
      const double cy = at.second + 4 + row * (static_cast<double>(k) + 0.5);
      const double sx = at.first + 6;
      using K = Series::Kind;
      switch (s.kind) {
        case K::line:
        case K::step:
        case K::vline:
        case K::hline: {
          Style st = stroke_style(s.color, std::min(3.0, std::max(1.0, s.width)), s.dash);
          doc.line(sx, cy, sx + sw, cy, st);
          if (s.kind == K::line && s.radius > 0) doc.circle(sx + sw / 2, cy, s.radius, fill_style(s.color));
          break;
        }
        case K::scatter: {
          Style st = fill_style(s.color);
          st.opacity = s.opacity;
          if (!s.edge.empty()) {
            st.stroke = s.edge;
            st.stroke_width = 1;
          }
          doc.circle(sx + sw / 2, cy, std::min(5.0, std::max(2.5, s.radius)), st);
          break;
        }
        default: {
          Style st = fill_style(s.color, std::max(0.3, s.opacity));
          st.stroke = "#888888";
          st.stroke_width = 0.5;
          doc.rect(sx + 2, cy - 5, sw - 4, 10, st);
        }
      }
      TextStyle t;
      t.size = fs;
      t.cls = "legend-label";
      doc.text(sx + sw + 6, cy + 3.5, s.label, t);
    }
    doc.close();
  }

  /// Estimated pixel box (x, y, w, h) of a text series whose anchor is at (ax, ay).
  static Box text_box(const Series& s, double ax, double ay) {
    double w = 0;
    int lines = 1;
    std::size_t start = 0;
    while (true) {
      const std::size_t e = s.str.find('\n', start);
      w = std::max(w, text_width(std::string_view(s.str).substr(start, e == std::string::npos ? std::string::npos : e - start),
                                 s.text.size));
      if (e == std::string::npos) break;
      ++lines;
      start = e + 1;
    }
    const double h = 1.2 * s.text.size * lines;
    double x0 = s.text.anchor == "middle" ? -w / 2 : (s.text.anchor == "end" ? -w : 0.0);
    Box b{ax + x0, ay - s.text.size, w, h};
    if (std::abs(std::abs(s.text.rotate) - 90) < 1) {
      // reading upwards (-90) or downwards (+90): the run of text becomes vertical
      const double up = s.text.rotate < 0 ? -1 : 1;
      const double a = x0 * up, bnd = (x0 + w) * up;
      b = Box{ax - s.text.size, ay + std::min(a, bnd), h, w};
    }
    return b;
  }

  /// How much of the data a legend at the pixel rectangle (x, y, w, h) would hide: line vertices and markers
  /// count 1, bars 3, vertical / horizontal lines 3, text 1000.
  template <class FX, class FY>
  long covered(double x, double y, double w, double h, FX X, FY Y) const {
    long n = 0;
    auto in = [&](double px, double py) { return px >= x && px <= x + w && py >= y && py <= y + h; };
    auto overlaps = [&](const Box& b) { return b.x < x + w && b.x + b.w > x && b.y < y + h && b.y + b.h > y; };
    const Box p = plot_area();
    for (const Series& s : series_) {
      using K = Series::Kind;
      if (s.kind == K::line || s.kind == K::scatter || s.kind == K::fill) {
        for (std::size_t k = 0; k < s.x.size(); ++k)
          if (std::isfinite(s.x[k]) && std::isfinite(s.y[k]) && in(X(s.x[k]), Y(s.y[k]))) ++n;
      } else if (s.kind == K::text || s.kind == K::text_axes) {
        if (!std::isfinite(s.x[0]) || !std::isfinite(s.y[0])) continue;
        const double ax = s.kind == K::text ? X(s.x[0]) + s.dx : p.x + s.x[0] * p.w;
        const double ay = s.kind == K::text ? Y(s.y[0]) + s.dy : p.y + (1 - s.y[0]) * p.h;
        if (overlaps(text_box(s, ax, ay))) n += 1000;  // text is never hidden when a free corner exists
      } else if (s.kind == K::bars) {
        for (std::size_t k = 0; k < s.x.size(); ++k) {
          const double top = s.y2[k] + s.y[k];
          if (!std::isfinite(s.x[k]) || !std::isfinite(top) || !std::isfinite(s.y2[k])) continue;
          const double xa = X(s.x[k] - s.width / 2), xb = X(s.x[k] + s.width / 2), ya = Y(top), yb = Y(s.y2[k]);
          if (overlaps(Box{std::min(xa, xb), std::min(ya, yb), std::abs(xb - xa), std::abs(yb - ya)})) n += 3;
        }
      } else if (s.kind == K::step) {
        for (std::size_t k = 0; k < s.y.size(); ++k) {
          if (!std::isfinite(s.y[k]) || !std::isfinite(s.x[k]) || !std::isfinite(s.x[k + 1])) continue;
          const double xa = X(s.x[k]), xb = X(s.x[k + 1]), ya = Y(std::max(0.0, s.y[k])), yb = Y(std::min(0.0, s.y[k]));
          if (overlaps(Box{std::min(xa, xb), ya, std::abs(xb - xa), yb - ya})) n += 2;
        }
      } else if (s.kind == K::vline && std::isfinite(s.x[0])) {
        if (X(s.x[0]) >= x && X(s.x[0]) <= x + w) n += 3;
      } else if (s.kind == K::hline && std::isfinite(s.y[0])) {
        if (Y(s.y[0]) >= y && Y(s.y[0]) <= y + h) n += 3;
      }
    }
    return n;
  }

  std::vector<Series> series_;
  int n_auto_colour_ = 0;
  bool has_xlim_ = false, has_ylim_ = false;
  std::pair<double, double> xlim_{0, 1}, ylim_{0, 1};
  bool has_xticks_ = false, has_yticks_ = false;
  std::vector<double> xticks_, yticks_;
  std::vector<std::string> xtick_labels_, ytick_labels_;
  double xtick_rotate_ = 0;
};


}  // namespace dea::svg
