// dea/plot/svg_document.hpp: the first two layers of dea/plot/svg.hpp (read its comment): text and numbers
// (escaping, coordinates, ticks), colours and colour maps, and Document, the SVG 1.1 element writer.
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


}  // namespace dea::svg
