// dea/plot/svg.hpp: plots written as self-contained SVG 1.1 files, with the standard library alone.
//
// Three layers:
//   * text and numbers: escape() makes any byte string safe as XML character data or an attribute value
//     (markup characters become entities; invalid UTF-8 and the code points XML 1.0 forbids become U+FFFD);
//     coordinates are written with at most two decimals and must be finite;
//   * Document: an element writer (rect, line, polyline, polygon, circle, text, groups, gradients, clip paths)
//     that keeps the tags balanced and produces one SVG 1.1 file with an XML declaration, the SVG namespace,
//     width / height / viewBox and a <title>. Nothing refers outside the file (no images, fonts or style sheets;
//     the only references are local url(#id)s of gradients and clip paths);
//   * Figure: a canvas with a title and panels placed by pixel boxes. A panel is either an Axes (line plots,
//     scatter, histograms as filled bars or step outlines, bar charts, shaded bands and fills, vertical and
//     horizontal lines, markers, text, legends, automatic limits and ticks) or a Heatmap (one cell per value,
//     row and column labels, a colour bar, an optional outlined cell).
//
// Every series is drawn inside <g class="series KIND [user class]">, every panel inside <g class="axes ...">
// or <g class="panel heatmap ...">, so a test (or a person with a text editor) can find what was drawn.
// Non-finite data points are skipped (lines break at them); limits come from the finite data.
//
//   svg::Figure fig(640, 400, "alpha-hat vs oracle");
//   svg::Axes& ax = fig.axes({0, 30, 640, 370});
//   ax.hist(values, 50, 0.0, 1.0, true, svg::palette::green, "oracle alpha");
//   ax.vline(0.95, svg::palette::red, 1.0, "4 3");
//   ax.legend();
//   fig.save("alpha_hist.svg");
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/utf8.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dea::svg {

// ------------------------------------------------------------------------------------------------------------
// Text and numbers
// ------------------------------------------------------------------------------------------------------------

/// XML-escapes `s` for character data and attribute values: & < > " ' become entities; invalid UTF-8 bytes and
/// code points not allowed in XML 1.0 (C0 controls other than tab, line feed and carriage return; U+FFFE, U+FFFF)
/// become U+FFFD. The result is valid UTF-8.
inline std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  std::size_t i = 0;
  while (i < s.size()) {
    char32_t cp = 0;
    const std::size_t n = utf8::decode(s, i, cp);
    i += n;
    switch (cp) {
      case '&': out += "&amp;"; continue;
      case '<': out += "&lt;"; continue;
      case '>': out += "&gt;"; continue;
      case '"': out += "&quot;"; continue;
      case '\'': out += "&apos;"; continue;
      default: break;
    }
    const bool allowed = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp != 0xFFFE && cp != 0xFFFF);
    utf8::append(out, allowed ? cp : utf8::kReplacement);
  }
  return out;
}

/// Number of code points of `s` (invalid bytes count one each).
inline std::size_t text_length(std::string_view s) {
  std::size_t n = 0, i = 0;
  while (i < s.size()) {
    char32_t cp = 0;
    i += utf8::decode(s, i, cp);
    // combining marks (U+0300..U+036F) take no advance of their own
    if (!(cp >= 0x300 && cp <= 0x36F)) ++n;
  }
  return n;
}

/// Estimated width in pixels of `s` at font size `size` in a sans-serif face (an average advance of 0.6 em; used
/// only for layout: legends, label margins).
inline double text_width(std::string_view s, double size) { return 0.6 * size * static_cast<double>(text_length(s)); }

/// A coordinate: at most two decimals, trailing zeros removed, never "-0". Throws dea::Error if not finite.
inline std::string num(double v) {
  check(std::isfinite(v), "svg: non-finite coordinate or size (", v, ")");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s(buf);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

/// A value for a label with `sig` significant digits (printf %g; "nan", "inf" for non-finite values).
inline std::string format_value(double v, int sig = 3) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", sig, v);
  std::string s(buf);
  if (s == "-0") s = "0";
  return s;
}

/// "Nice" tick positions (1, 2, 2.5 or 5 times a power of ten) inside [lo, hi], about `target` of them.
inline std::vector<double> nice_ticks(double lo, double hi, int target = 5) {
  std::vector<double> out;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return out;
  if (lo > hi) std::swap(lo, hi);
  if (hi == lo) {
    out.push_back(lo);
    return out;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (int k = 0; k < 1000; ++k) {
    double t = first + k * step;
    if (t > hi + step * 1e-9) break;
    if (std::abs(t) < step * 1e-9) t = 0;  // exact zero, never -0 or 1e-17
    out.push_back(t);
  }
  return out;
}

/// Tick label of `v` for ticks `step` apart: just enough decimals to tell neighbours apart.
inline std::string format_tick(double v, double step) {
  if (!std::isfinite(v)) return format_value(v);
  const double a = std::max(std::abs(v), std::abs(step));
  if (a >= 1e6 || (a > 0 && a < 1e-4)) return format_value(v, 3);
  int dec = 0;
  if (step > 0 && std::isfinite(step)) {
    dec = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
    // steps such as 0.25 or 2.5 need one more decimal than their power of ten
    const double scaled = step * std::pow(10.0, dec);
    if (std::abs(scaled - std::round(scaled)) > 1e-6) ++dec;
    dec = std::min(dec, 8);
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", dec, v);
  std::string s(buf);
  if (s.find_first_not_of("-0.") == std::string::npos) s = dec > 0 ? "0." + std::string(static_cast<std::size_t>(dec), '0') : "0";
  return s;
}

// ------------------------------------------------------------------------------------------------------------
// Colours
// ------------------------------------------------------------------------------------------------------------

struct Rgb {
  int r = 0, g = 0, b = 0;
};

/// "#rrggbb" (components clamped to [0, 255]).
inline std::string hex(Rgb c) {
  auto cl = [](int v) { return std::min(255, std::max(0, v)); };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", cl(c.r), cl(c.g), cl(c.b));
  return buf;
}

/// Parses "#rrggbb"; throws dea::Error otherwise.
inline Rgb parse_hex(std::string_view s) {
  check(s.size() == 7 && s[0] == '#', "svg::parse_hex: expected #rrggbb, got '", std::string(s), "'");
  auto nib = [&](char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    dea::detail::raise("svg::parse_hex: expected #rrggbb, got '" + std::string(s) + "'");
  };
  return Rgb{nib(s[1]) * 16 + nib(s[2]), nib(s[3]) * 16 + nib(s[4]), nib(s[5]) * 16 + nib(s[6])};
}

/// The ten categorical colours used by default (the familiar "tab10" hues).
namespace palette {
constexpr const char* blue = "#1f77b4";
constexpr const char* orange = "#ff7f0e";
constexpr const char* green = "#2ca02c";
constexpr const char* red = "#d62728";
constexpr const char* purple = "#9467bd";
constexpr const char* brown = "#8c564b";
constexpr const char* pink = "#e377c2";
constexpr const char* gray = "#7f7f7f";
constexpr const char* olive = "#bcbd22";
constexpr const char* cyan = "#17becf";
constexpr const char* black = "#000000";
/// The i-th colour of the cycle (i taken modulo 10).
inline const char* cycle(int i) {
  static constexpr const char* c[10] = {blue, orange, green, red, purple, brown, pink, gray, olive, cyan};
  return c[((i % 10) + 10) % 10];
}
}  // namespace palette

/// Sequential colour maps (t = 0 light or dark end, t = 1 the other), interpolated linearly between stops.
enum class Colormap { blues, greens, oranges, purples, magma, viridis, grays };

inline const char* to_string(Colormap m) {
  switch (m) {
    case Colormap::blues: return "blues";
    case Colormap::greens: return "greens";
    case Colormap::oranges: return "oranges";
    case Colormap::purples: return "purples";
    case Colormap::magma: return "magma";
    case Colormap::viridis: return "viridis";
    case Colormap::grays: return "grays";
  }
  return "?";
}

namespace detail {
inline const std::vector<const char*>& colormap_stops(Colormap m) {
  static const std::vector<const char*> blues = {"#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6",
                                                 "#4292c6", "#2171b5", "#08519c", "#08306b"};
  static const std::vector<const char*> greens = {"#f7fcf5", "#e5f5e0", "#c7e9c0", "#a1d99b", "#74c476",
                                                  "#41ab5d", "#238b45", "#006d2c", "#00441b"};
  static const std::vector<const char*> oranges = {"#fff5eb", "#fee6ce", "#fdd0a2", "#fdae6b", "#fd8d3c",
                                                   "#f16913", "#d94801", "#a63603", "#7f2704"};
  static const std::vector<const char*> purples = {"#fcfbfd", "#efedf5", "#dadaeb", "#bcbddc", "#9e9ac8",
                                                   "#807dba", "#6a51a3", "#54278f", "#3f007d"};
  static const std::vector<const char*> magma = {"#000004", "#1c1044", "#4f127b", "#812581", "#b5367a",
                                                 "#e55064", "#fb8761", "#fec287", "#fcfdbf"};
  static const std::vector<const char*> viridis = {"#440154", "#482878", "#3e4989", "#31688e", "#26828e",
                                                   "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"};
  static const std::vector<const char*> grays = {"#ffffff", "#000000"};
  switch (m) {
    case Colormap::blues: return blues;
    case Colormap::greens: return greens;
    case Colormap::oranges: return oranges;
    case Colormap::purples: return purples;
    case Colormap::magma: return magma;
    case Colormap::viridis: return viridis;
    case Colormap::grays: return grays;
  }
  return grays;
}
}  // namespace detail

/// Colour of t in [0, 1] (clamped; NaN gives t = 0) on colour map m.
inline Rgb colormap_rgb(Colormap m, double t) {
  const auto& st = detail::colormap_stops(m);
  if (!(t >= 0)) t = 0;
  if (t > 1) t = 1;
  const double pos = t * static_cast<double>(st.size() - 1);
  const std::size_t k = std::min(static_cast<std::size_t>(pos), st.size() - 2);
  const double f = pos - static_cast<double>(k);
  const Rgb a = parse_hex(st[k]), b = parse_hex(st[k + 1]);
  auto mix = [f](int x, int y) { return static_cast<int>(std::lround(x + (y - x) * f)); };
  return Rgb{mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}
inline std::string colormap_hex(Colormap m, double t) { return hex(colormap_rgb(m, t)); }

// ------------------------------------------------------------------------------------------------------------
// Document: the element writer
// ------------------------------------------------------------------------------------------------------------

/// Attribute list builder: values are escaped, numbers written with num() (finite only).
class Attrs {
public:
  Attrs() = default;
  Attrs& set(std::string_view name, std::string_view value) {
    s_ += ' ';
    s_.append(name);
    s_ += "=\"";
    s_ += escape(value);
    s_ += '"';
    return *this;
  }
  Attrs& set(std::string_view name, const char* value) { return set(name, std::string_view(value)); }
  Attrs& set(std::string_view name, const std::string& value) { return set(name, std::string_view(value)); }
  Attrs& set(std::string_view name, double value) { return set(name, std::string_view(num(value))); }
  Attrs& set(std::string_view name, int value) { return set(name, static_cast<double>(value)); }
  /// Adds the attribute only when `value` is not empty.
  Attrs& opt(std::string_view name, std::string_view value) { return value.empty() ? *this : set(name, value); }
  /// Appends the attributes of `o`.
  Attrs& append(const Attrs& o) {
    s_ += o.s_;
    return *this;
  }
  const std::string& str() const { return s_; }

private:
  std::string s_;
};

/// Style of a stroked or filled shape. Empty strings leave the SVG defaults out.
struct Style {
  std::string fill = "none";
  std::string stroke;        ///< empty: no stroke attribute
  double stroke_width = 1;
  std::string dash;          ///< stroke-dasharray, e.g. "4 3"
  double opacity = 1;        ///< applied to both fill and stroke (attribute "opacity") when < 1
  double fill_opacity = 1;   ///< when < 1
  std::string cls, id;       ///< class and id attributes (optional)

  void apply(Attrs& a) const {
    a.opt("id", id).opt("class", cls);
    a.set("fill", fill.empty() ? std::string("none") : fill);
    if (!stroke.empty()) {
      a.set("stroke", stroke);
      a.set("stroke-width", stroke_width);
      a.opt("stroke-dasharray", dash);
    }
    if (opacity < 1) a.set("opacity", std::max(0.0, opacity));
    if (fill_opacity < 1) a.set("fill-opacity", std::max(0.0, fill_opacity));
  }
};

inline Style fill_style(std::string color, double fill_opacity = 1) {
  Style s;
  s.fill = std::move(color);
  s.fill_opacity = fill_opacity;
  return s;
}
inline Style stroke_style(std::string color, double width = 1, std::string dash = {}) {
  Style s;
  s.stroke = std::move(color);
  s.stroke_width = width;
  s.dash = std::move(dash);
  return s;
}

/// Text placement and look.
struct TextStyle {
  double size = 11;
  std::string anchor = "start";  ///< start | middle | end
  std::string fill = "#222222";
  bool bold = false;
  bool italic = false;
  double rotate = 0;             ///< degrees, about the anchor point (negative = counter-clockwise)
  bool halo = false;             ///< draw a white outline under the text first (readable over lines and fills)
  std::string cls, id;
};

/// An SVG 1.1 document under construction. Elements are appended in drawing order; open()/close() nest groups.
class Document {
public:
  Document(double width, double height, std::string_view title = {}) : w_(width), h_(height) {
    check(std::isfinite(width) && width > 0 && std::isfinite(height) && height > 0,
          "svg::Document: width and height must be positive, got ", width, " x ", height);
    out_ = "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n";
    out_ += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\"";
    out_ += Attrs()
                .set("width", width)
                .set("height", height)
                .set("viewBox", "0 0 " + num(width) + " " + num(height))
                .set("font-family", "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif")
                .str();
    out_ += ">\n";
    if (!title.empty()) out_ += "<title>" + escape(title) + "</title>\n";
  }

  double width() const { return w_; }
  double height() const { return h_; }

  /// A document-unique id "<prefix><n>" (for gradients, clip paths, panels).
  std::string new_id(std::string_view prefix) { return std::string(prefix) + std::to_string(next_id_++); }

  /// <tag attrs/>
  void element(std::string_view tag, const Attrs& a) {
    indent();
    out_ += '<';
    out_.append(tag);
    out_ += a.str();
    out_ += "/>\n";
  }
  /// <tag attrs>escaped text</tag>
  void text_element(std::string_view tag, const Attrs& a, std::string_view text) {
    indent();
    out_ += '<';
    out_.append(tag);
    out_ += a.str();
    out_ += '>';
    out_ += escape(text);
    out_ += "</";
    out_.append(tag);
    out_ += ">\n";
  }
  void open(std::string_view tag, const Attrs& a = {}) {
    indent();
    out_ += '<';
    out_.append(tag);
    out_ += a.str();
    out_ += ">\n";
    stack_.emplace_back(tag);
  }
  void close() {
    check(!stack_.empty(), "svg::Document::close: no open element");
    const std::string tag = stack_.back();
    stack_.pop_back();
    indent();
    out_ += "</" + tag + ">\n";
  }
  /// Opens <g> with a class, an optional id and optional extra attributes.
  void group(std::string_view cls, std::string_view id = {}, const Attrs& extra = {}) {
    Attrs a;
    a.opt("id", id).opt("class", cls).append(extra);
    open("g", a);
  }

  void rect(double x, double y, double w, double h, const Style& s) {
    if (w < 0) {
      x += w;
      w = -w;
    }
    if (h < 0) {
      y += h;
      h = -h;
    }
    Attrs a;
    a.set("x", x).set("y", y).set("width", w).set("height", h);
    s.apply(a);
    element("rect", a);
  }
  void line(double x1, double y1, double x2, double y2, const Style& s) {
    Attrs a;
    a.set("x1", x1).set("y1", y1).set("x2", x2).set("y2", y2);
    s.apply(a);
    element("line", a);
  }
  void circle(double cx, double cy, double r, const Style& s) {
    Attrs a;
    a.set("cx", cx).set("cy", cy).set("r", r);
    s.apply(a);
    element("circle", a);
  }
  /// Points as (x, y) pairs; at least two.
  void polyline(const std::vector<std::pair<double, double>>& pts, const Style& s) {
    check(pts.size() >= 2, "svg::Document::polyline: needs at least 2 points, got ", pts.size());
    Attrs a;
    a.set("points", points(pts));
    s.apply(a);
    element("polyline", a);
  }
  void polygon(const std::vector<std::pair<double, double>>& pts, const Style& s) {
    check(pts.size() >= 3, "svg::Document::polygon: needs at least 3 points, got ", pts.size());
    Attrs a;
    a.set("points", points(pts));
    s.apply(a);
    element("polygon", a);
  }
  void text(double x, double y, std::string_view str, const TextStyle& t) {
    if (t.halo) {
      TextStyle h = t;
      h.halo = false;
      h.fill = "#ffffff";
      h.cls = "halo";
      h.id.clear();
      halo_ = true;
      text(x, y, str, h);
      halo_ = false;
    }
    Attrs a;
    a.opt("id", t.id).opt("class", t.cls);
    a.set("x", x).set("y", y).set("font-size", t.size).set("fill", t.fill);
    if (t.anchor != "start") a.set("text-anchor", t.anchor);
    if (t.bold) a.set("font-weight", "bold");
    if (t.italic) a.set("font-style", "italic");
    if (t.rotate != 0) a.set("transform", "rotate(" + num(t.rotate) + " " + num(x) + " " + num(y) + ")");
    if (halo_) a.set("stroke", "#ffffff").set("stroke-width", 3.0).set("stroke-linejoin", "round").set("opacity", 0.9);
    if (str.find('\n') == std::string_view::npos) {
      text_element("text", a, str);
      return;
    }
    // several lines: one <tspan> per line, each starting at x, 1.2 em below the previous one
    open("text", a);
    std::size_t start = 0;
    for (int k = 0; start <= str.size(); ++k) {
      std::size_t end = str.find('\n', start);
      if (end == std::string_view::npos) end = str.size();
      text_element("tspan", Attrs().set("x", x).set("dy", k == 0 ? 0.0 : 1.2 * t.size), str.substr(start, end - start));
      start = end + 1;
    }
    close();
  }
  /// A vertical (x1 = x2) or horizontal linear gradient over `stops` (offset in [0, 1], colour), in <defs>.
  /// Returns its id; fill with "url(#id)".
  std::string linear_gradient(const std::vector<std::pair<double, std::string>>& stops, bool vertical_up) {
    const std::string id = new_id("grad");
    open("defs");
    Attrs g;
    g.set("id", id).set("x1", 0.0).set("y1", vertical_up ? 1.0 : 0.0).set("x2", vertical_up ? 0.0 : 1.0).set("y2", 0.0);
    open("linearGradient", g);
    for (const auto& [off, col] : stops) {
      Attrs s;
      s.set("offset", std::min(1.0, std::max(0.0, off))).set("stop-color", col);
      element("stop", s);
    }
    close();
    close();
    return id;
  }
  /// A rectangular clip path in <defs>; returns its id (use clip-path="url(#id)" on a group).
  std::string clip_rect(double x, double y, double w, double h) {
    const std::string id = new_id("clip");
    open("defs");
    open("clipPath", Attrs().set("id", id));
    rect(x, y, w, h, Style{});
    close();
    close();
    return id;
  }

  /// The finished document (every open element must have been closed).
  std::string str() const {
    check(stack_.empty(), "svg::Document: element <", stack_.empty() ? std::string() : stack_.back(),
          "> is still open");
    return out_ + "</svg>\n";
  }
  /// Writes the document to `path` atomically (temporary file, then rename).
  void save(const std::string& path) const { dea::write_file_atomic(path, str()); }

private:
  static std::string points(const std::vector<std::pair<double, double>>& pts) {
    std::string s;
    s.reserve(pts.size() * 14);
    for (const auto& [x, y] : pts) {
      if (!s.empty()) s += ' ';
      s += num(x);
      s += ',';
      s += num(y);
    }
    return s;
  }
  void indent() { out_.append(2 * (stack_.size() + 1), ' '); }

  double w_, h_;
  std::string out_;
  std::vector<std::string> stack_;
  int next_id_ = 0;
  bool halo_ = false;
};

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

/// A matrix drawn as coloured cells with row and column labels, a colour bar and an optional outlined cell.
/// Row r is drawn top to bottom, column c left to right; cell (r, c) has id "<panel id>-r<r>-c<c>".
class Heatmap : public Panel {
public:
  explicit Heatmap(Box b) : Panel(b) {}

  /// values: rows * cols, row-major.
  Heatmap& set_data(int rows, int cols, std::vector<double> values) {
    check(rows > 0 && cols > 0, "svg::Heatmap::set_data: rows and cols must be positive, got ", rows, " x ", cols);
    check(values.size() == static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols),
          "svg::Heatmap::set_data: expected ", rows, " x ", cols, " = ", rows * cols, " values, got ", values.size());
    rows_ = rows;
    cols_ = cols;
    values_ = std::move(values);
    return *this;
  }
  int rows() const { return rows_; }
  int cols() const { return cols_; }

  std::vector<std::string> row_labels, col_labels;
  Colormap cmap = Colormap::viridis;
  double vmin = std::numeric_limits<double>::quiet_NaN();  ///< NaN: the finite minimum of the data
  double vmax = std::numeric_limits<double>::quiet_NaN();  ///< NaN: the finite maximum
  std::string title, xlabel, ylabel;
  int outline_row = -1, outline_col = -1;                  ///< cell to outline (-1: none)
  std::string outline_color = palette::red;
  bool colorbar = true;
  double label_size = 9;

  /// The colour range used (vmin, vmax, or the data's finite range; a constant matrix gets +-0.5).
  std::pair<double, double> range() const {
    double lo = vmin, hi = vmax;
    if (std::isnan(lo) || std::isnan(hi)) {
      double dlo = std::numeric_limits<double>::infinity(), dhi = -dlo;
      for (double v : values_)
        if (std::isfinite(v)) {
          dlo = std::min(dlo, v);
          dhi = std::max(dhi, v);
        }
      if (!(dlo <= dhi)) dlo = 0, dhi = 1;
      if (std::isnan(lo)) lo = dlo;
      if (std::isnan(hi)) hi = dhi;
    }
    if (!(hi > lo)) {
      lo -= 0.5;
      hi += 0.5;
    }
    return {lo, hi};
  }

  void draw(Document& doc) const override {
    check(rows_ > 0, "svg::Heatmap::draw: no data (call set_data)");
    check(row_labels.empty() || row_labels.size() == static_cast<std::size_t>(rows_), "svg::Heatmap: ", rows_,
          " rows but ", row_labels.size(), " row labels");
    check(col_labels.empty() || col_labels.size() == static_cast<std::size_t>(cols_), "svg::Heatmap: ", cols_,
          " columns but ", col_labels.size(), " column labels");
    const std::string pid = id.empty() ? doc.new_id("heatmap") : id;
    const auto [lo, hi] = range();
    double rlw = 0, clw = 0;
    for (const auto& s : row_labels) rlw = std::max(rlw, text_width(s, label_size));
    for (const auto& s : col_labels) clw = std::max(clw, text_width(s, label_size));
    const std::vector<double> cticks = nice_ticks(lo, hi, 5);
    const double cstep = cticks.size() > 1 ? cticks[1] - cticks[0] : hi - lo;
    double ctw = 0;
    for (double t : cticks) ctw = std::max(ctw, text_width(format_tick(t, cstep), 9));
    const double top = title.empty() ? 6 : 22;
    const double left = 4 + (ylabel.empty() ? 0 : 16) + rlw + 5;
    const double bottom = 5 + clw + (xlabel.empty() ? 0 : 16) + 4;
    const double cbw = colorbar ? 8 + 11 + 5 + ctw + 4 : 4;
    const double cell = std::max(1.0, std::min((box.w - left - cbw) / cols_, (box.h - top - bottom) / rows_));
    const double gw = cell * cols_, gh = cell * rows_;
    // centre the grid horizontally in what is left of the box
    const double x0 = box.x + left + std::max(0.0, (box.w - left - cbw - gw) / 2), y0 = box.y + top;

    doc.group("panel heatmap" + (cls.empty() ? std::string() : " " + cls), pid);
    doc.group("cells");
    for (int r = 0; r < rows_; ++r)
      for (int c = 0; c < cols_; ++c) {
        const double v = values_[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols_) + static_cast<std::size_t>(c)];
        Style st = fill_style(std::isfinite(v) ? colormap_hex(cmap, (v - lo) / (hi - lo)) : std::string("#d9d9d9"));
        st.id = pid + "-r" + std::to_string(r) + "-c" + std::to_string(c);
        st.cls = "cell";
        doc.rect(x0 + c * cell, y0 + r * cell, cell, cell, st);
      }
    doc.close();
    {
      Style frame = stroke_style("#333333", 0.8);
      frame.cls = "frame";
      doc.rect(x0, y0, gw, gh, frame);
    }
    if (outline_row >= 0 && outline_col >= 0 && outline_row < rows_ && outline_col < cols_) {
      // the outline in its colour, with a thin white line inside so that it shows on dark cells too
      const double ox = x0 + outline_col * cell, oy = y0 + outline_row * cell, in = std::min(1.25, cell / 4);
      Style o = stroke_style(outline_color, 2.5);
      o.cls = "outline";
      doc.rect(ox + in, oy + in, cell - 2 * in, cell - 2 * in, o);
      if (cell > 10) {
        Style halo = stroke_style("#ffffff", 0.8);
        halo.cls = "outline-halo";
        doc.rect(ox + in + 1.7, oy + in + 1.7, cell - 2 * in - 3.4, cell - 2 * in - 3.4, halo);
      }
    }
    TextStyle lab;
    lab.size = label_size;
    lab.fill = "#222222";
    if (!row_labels.empty()) {
      doc.group("row-labels");
      lab.anchor = "end";
      lab.cls = "row-label";
      for (int r = 0; r < rows_; ++r)
        doc.text(x0 - 4, y0 + (r + 0.5) * cell + 0.35 * label_size, row_labels[static_cast<std::size_t>(r)], lab);
      doc.close();
    }
    if (!col_labels.empty()) {
      doc.group("col-labels");
      lab.anchor = "end";
      lab.rotate = -90;
      lab.cls = "col-label";
      for (int c = 0; c < cols_; ++c)
        doc.text(x0 + (c + 0.5) * cell + 0.35 * label_size, y0 + gh + 4, col_labels[static_cast<std::size_t>(c)], lab);
      doc.close();
    }
    if (!xlabel.empty()) {
      TextStyle t;
      t.size = 10;
      t.anchor = "middle";
      t.cls = "xlabel";
      doc.text(x0 + gw / 2, y0 + gh + 5 + clw + 14, xlabel, t);
    }
    if (!ylabel.empty()) {
      TextStyle t;
      t.size = 10;
      t.anchor = "middle";
      t.rotate = -90;
      t.cls = "ylabel";
      doc.text(x0 - 5 - rlw - 8, y0 + gh / 2, ylabel, t);
    }
    if (!title.empty()) {
      TextStyle t;
      t.size = 11;
      t.anchor = "middle";
      t.bold = true;
      t.cls = "title";
      doc.text(x0 + gw / 2, box.y + 15, title, t);
    }
    if (colorbar) {
      const double cx = x0 + gw + 8, cw = 11;
      std::vector<std::pair<double, std::string>> stops;
      for (int k = 0; k <= 16; ++k) stops.emplace_back(k / 16.0, colormap_hex(cmap, k / 16.0));
      const std::string gid = doc.linear_gradient(stops, true);
      doc.group("colorbar");
      Style st = fill_style("url(#" + gid + ")");
      st.stroke = "#333333";
      st.stroke_width = 0.6;
      doc.rect(cx, y0, cw, gh, st);
      TextStyle t;
      t.size = 9;
      t.cls = "tick-label";
      for (double v : cticks) {
        const double y = y0 + gh - (v - lo) / (hi - lo) * gh;
        doc.line(cx + cw, y, cx + cw + 3, y, stroke_style("#333333", 0.8));
        doc.text(cx + cw + 5, y + 3, format_tick(v, cstep), t);
      }
      doc.close();
    }
    doc.close();
  }

private:
  int rows_ = 0, cols_ = 0;
  std::vector<double> values_;
};

/// A canvas: a white background, an optional title at the top and panels at pixel boxes.
class Figure {
public:
  Figure(double width, double height, std::string title = {}) : title(std::move(title)), w_(width), h_(height) {
    check(std::isfinite(width) && width > 0 && std::isfinite(height) && height > 0,
          "svg::Figure: width and height must be positive, got ", width, " x ", height);
  }

  std::string title;  ///< drawn centred at the top and stored as the document's <title>

  double width() const { return w_; }
  double height() const { return h_; }
  /// Height taken by the title at the top (0 without one).
  double title_height() const { return title.empty() ? 0.0 : 30.0; }

  Axes& axes(Box b) {
    panels_.push_back(std::make_unique<Axes>(b));
    return static_cast<Axes&>(*panels_.back());
  }
  Heatmap& heatmap(Box b) {
    panels_.push_back(std::make_unique<Heatmap>(b));
    return static_cast<Heatmap&>(*panels_.back());
  }
  std::size_t n_panels() const { return panels_.size(); }

  /// Boxes of a rows x cols grid filling `area`, row-major, with gaps between cells.
  static std::vector<Box> grid(Box area, int rows, int cols, double hgap = 0, double vgap = 0) {
    check(rows > 0 && cols > 0, "svg::Figure::grid: rows and cols must be positive, got ", rows, " x ", cols);
    const double w = (area.w - hgap * (cols - 1)) / cols, h = (area.h - vgap * (rows - 1)) / rows;
    std::vector<Box> out;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) out.push_back(Box{area.x + c * (w + hgap), area.y + r * (h + vgap), w, h});
    return out;
  }

  std::string svg() const {
    Document doc(w_, h_, title);
    doc.rect(0, 0, w_, h_, [] {
      Style s = fill_style("#ffffff");
      s.cls = "background";
      return s;
    }());
    if (!title.empty()) {
      TextStyle t;
      t.size = 15;
      const double wt = text_width(title, t.size);
      if (wt > w_ - 20) t.size = std::max(9.0, t.size * (w_ - 20) / wt);
      t.anchor = "middle";
      t.bold = true;
      t.cls = "suptitle";
      doc.text(w_ / 2, 21, title, t);
    }
    for (const auto& p : panels_) p->draw(doc);
    return doc.str();
  }
  /// Writes the figure atomically (temporary file, then rename).
  void save(const std::string& path) const { dea::write_file_atomic(path, svg()); }

private:
  double w_, h_;
  std::vector<std::unique_ptr<Panel>> panels_;
};

}  // namespace dea::svg
