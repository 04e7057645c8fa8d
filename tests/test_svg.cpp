// Tests of dea/plot/svg.hpp and dea/plot/figures.hpp: escaping (markup, invalid UTF-8, forbidden code points), number
// formatting and ticks, colour maps, histograms, balanced well-formed documents (checked by a small XML scanner
// written here), non-finite data, heatmap geometry (the outlined cell is the requested cell), legends that avoid
// the data, and atomic saving. The test also writes a gallery of figures into svg_test_out/ in the working
// directory, which the ctest entry svg_gallery_valid then parses with a real XML parser (tests/check_svg.py).
#include <catch2/catch.hpp>
#include <dea/plot/figures.hpp>
#include <dea/plot/svg.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_svg {

using namespace dea;

namespace {

/// A small XML well-formedness scanner: one root element, balanced and properly nested tags, quoted attribute
/// values without '<', and every '&' in text or attributes starting one of the five predefined entities or a
/// character reference. Returns "" when well-formed, else what is wrong.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> stack;
  int roots = 0;
  std::size_t i = 0;
  auto entity_ok = [&](std::size_t at) {
    static const char* ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"};
    for (const char* e : ents)
      if (s.compare(at, std::char_traits<char>::length(e), e) == 0) return true;
    return false;
  };
  while (i < s.size()) {
    if (s[i] != '<') {
      if (s[i] == '&' && !entity_ok(i)) return "bare '&' in text at " + std::to_string(i);
      if (s[i] == '>') return "bare '>' in text at " + std::to_string(i);
      if (stack.empty() && !std::isspace(static_cast<unsigned char>(s[i]))) return "text outside the root";
      ++i;
      continue;
    }
    if (s.compare(i, 5, "<?xml") == 0) {
      const std::size_t e = s.find("?>", i);
      if (e == std::string::npos || i != 0) return "bad XML declaration";
      i = e + 2;
      continue;
    }
    if (s.compare(i, 2, "</") == 0) {
      const std::size_t e = s.find('>', i);
      if (e == std::string::npos) return "unterminated end tag";
      const std::string name = s.substr(i + 2, e - i - 2);
      if (stack.empty() || stack.back() != name) return "end tag </" + name + "> does not match";
      stack.pop_back();
      i = e + 1;
      continue;
    }
    std::size_t j = i + 1;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '-' || s[j] == ':')) ++j;
    const std::string name = s.substr(i + 1, j - i - 1);
    if (name.empty()) return "empty tag name at " + std::to_string(i);
    bool self = false;
    while (true) {
      while (j < s.size() && s[j] == ' ') ++j;
      if (j >= s.size()) return "unterminated tag <" + name + ">";
      if (s[j] == '>') break;
      if (s.compare(j, 2, "/>") == 0) {
        self = true;
        ++j;
        break;
      }
      const std::size_t eq = s.find('=', j);
      if (eq == std::string::npos || s[eq + 1] != '"') return "attribute without a quoted value in <" + name + ">";
      const std::size_t close = s.find('"', eq + 2);
      if (close == std::string::npos) return "unterminated attribute value";
      for (std::size_t k = eq + 2; k < close; ++k) {
        if (s[k] == '<') return "'<' in an attribute value";
        if (s[k] == '&' && !entity_ok(k)) return "bare '&' in an attribute value";
      }
      j = close + 1;
    }
    if (stack.empty()) ++roots;
    if (!self) stack.push_back(name);
    i = j + 1;
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (roots != 1) return "expected one root element, found " + std::to_string(roots);
  return "";
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::size_t count(const std::string& s, const std::string& sub) {
  std::size_t n = 0;
  for (std::size_t i = s.find(sub); i != std::string::npos; i = s.find(sub, i + 1)) ++n;
  return n;
}

/// The numeric value of attribute `a` in the first element whose text contains `marker`.
double attr_of(const std::string& svg, const std::string& marker, const std::string& a) {
  const std::size_t at = svg.find(marker);
  REQUIRE(at != std::string::npos);
  const std::size_t start = svg.rfind('<', at);
  const std::size_t end = svg.find('>', at);
  const std::string el = svg.substr(start, end - start);
  const std::regex re(" " + a + "=\"([^\"]+)\"");
  std::smatch m;
  REQUIRE(std::regex_search(el, m, re));
  return std::stod(m[1].str());
}

const std::string kOut = "svg_test_out";

void gallery_save(const svg::Figure& f, const std::string& name) {
  std::filesystem::create_directories(kOut);
  f.save(kOut + "/" + name);
}

}  // namespace

TEST_CASE("escape: markup characters become entities, UTF-8 is kept", "[svg]") {
  REQUIRE(svg::escape("a<b & c>d \"q\" 'p'") == "a&lt;b &amp; c&gt;d &quot;q&quot; &apos;p&apos;");
  REQUIRE(svg::escape("α̂ → Ẽ0, S̃") == "α̂ → Ẽ0, S̃");
  REQUIRE(svg::escape("tab\tnl\ncr\r") == "tab\tnl\ncr\r");
  REQUIRE(svg::escape("") == "");
}

TEST_CASE("escape: invalid UTF-8 and forbidden code points become U+FFFD", "[svg]") {
  const std::string rep = "\xEF\xBF\xBD";
  REQUIRE(svg::escape("a\xFFz") == "a" + rep + "z");             // a byte that starts nothing
  REQUIRE(svg::escape("\xC3") == rep);                            // truncated 2-byte sequence
  REQUIRE(svg::escape("\xC0\xAF") == rep + rep);                  // overlong '/'
  REQUIRE(svg::escape("\xED\xA0\x80") == rep + rep + rep);        // a UTF-16 surrogate
  REQUIRE(svg::escape(std::string("x\x01y\x1Fz", 5)) == "x" + rep + "y" + rep + "z");
  REQUIRE(svg::escape(std::string("nul\0!", 5)) == "nul" + rep + "!");
  REQUIRE(svg::escape("\xEF\xBF\xBE") == rep);                    // U+FFFE is not an XML character
  // the result is always well-formed inside an element
  const std::string doc = "<t>" + svg::escape("<&>\xFF\x02\"") + "</t>";
  REQUIRE(xml_problem(doc).empty());
}

TEST_CASE("numbers: coordinates, labels and ticks", "[svg]") {
  REQUIRE(svg::num(3) == "3");
  REQUIRE(svg::num(2.5) == "2.5");
  REQUIRE(svg::num(-12.126) == "-12.13");  // 2 decimals
  REQUIRE(svg::num(-0.001) == "0");
  REQUIRE(svg::num(100.10) == "100.1");
  REQUIRE_THROWS_AS(svg::num(std::nan("")), Error);
  REQUIRE_THROWS_AS(svg::num(INFINITY), Error);
  REQUIRE(svg::format_value(std::nan("")) == "nan");
  REQUIRE(svg::format_value(0.123456, 3) == "0.123");

  const std::vector<double> t = svg::nice_ticks(0, 1, 5);
  REQUIRE(t.size() == 6);
  for (std::size_t k = 0; k < t.size(); ++k) REQUIRE(t[k] == Approx(0.2 * static_cast<double>(k)));
  const std::vector<double> u = svg::nice_ticks(-2.3, 1.8, 5);  // step 1: -2 .. 1, zero exactly
  REQUIRE(u == std::vector<double>{-2, -1, 0, 1});
  const std::vector<double> v = svg::nice_ticks(0.91, 0.95, 4);  // step 0.01
  REQUIRE(v.size() == 5);
  REQUIRE(v.front() == Approx(0.91));
  REQUIRE(svg::nice_ticks(3, 3).size() == 1);
  REQUIRE(svg::nice_ticks(NAN, 1).empty());
  REQUIRE(svg::format_tick(0.25, 0.25) == "0.25");
  REQUIRE(svg::format_tick(0.5, 0.25) == "0.50");
  REQUIRE(svg::format_tick(0.4, 0.2) == "0.4");
  REQUIRE(svg::format_tick(2000, 500) == "2000");
  REQUIRE(svg::format_tick(-1e-17, 0.5) == "0.0");
  REQUIRE(svg::format_tick(1e7, 5e6) == "1e+07");
}

TEST_CASE("colour maps: end points, clamping, monotone lightness", "[svg]") {
  REQUIRE(svg::colormap_hex(svg::Colormap::blues, 0) == "#f7fbff");
  REQUIRE(svg::colormap_hex(svg::Colormap::blues, 1) == "#08306b");
  REQUIRE(svg::colormap_hex(svg::Colormap::blues, -3) == "#f7fbff");
  REQUIRE(svg::colormap_hex(svg::Colormap::blues, 7) == "#08306b");
  REQUIRE(svg::colormap_hex(svg::Colormap::magma, std::nan("")) == "#000004");
  REQUIRE(svg::colormap_hex(svg::Colormap::grays, 0.5) == "#808080");
  // sequential maps: the sum of the channels falls (blues, greens) or rises (magma) along t
  auto lum = [](svg::Rgb c) { return c.r + c.g + c.b; };
  for (int k = 0; k < 20; ++k) {
    REQUIRE(lum(svg::colormap_rgb(svg::Colormap::blues, k / 20.0)) >= lum(svg::colormap_rgb(svg::Colormap::blues, (k + 1) / 20.0)));
    REQUIRE(lum(svg::colormap_rgb(svg::Colormap::magma, k / 20.0)) <= lum(svg::colormap_rgb(svg::Colormap::magma, (k + 1) / 20.0)));
  }
  REQUIRE(svg::parse_hex("#1f77b4").g == 0x77);
  REQUIRE_THROWS_AS(svg::parse_hex("1f77b4"), Error);
  REQUIRE_THROWS_AS(svg::parse_hex("#1f77bx"), Error);
}

TEST_CASE("histogram: bins, the right edge, density, values left out", "[svg]") {
  const svg::Hist h = svg::histogram({0.0, 0.1, 0.24, 0.25, 0.5, 1.0, NAN, -0.1, 1.5}, 4, 0, 1, false);
  REQUIRE(h.edges.size() == 5);
  REQUIRE(h.heights == std::vector<double>{3, 1, 1, 1});  // [0,.25) [.25,.5) [.5,.75) [.75,1]
  REQUIRE(h.n_in == 6);
  REQUIRE(h.n_out == 3);
  const svg::Hist d = svg::histogram({0.1, 0.2, 0.3, 0.9}, 10, 0, 1, true);
  double area = 0;
  for (double x : d.heights) area += x * 0.1;
  REQUIRE(area == Approx(1.0));
  REQUIRE_THROWS_AS(svg::histogram({1}, 0, 0, 1, false), Error);
  REQUIRE_THROWS_AS(svg::histogram({1}, 5, 1, 1, false), Error);
}

TEST_CASE("Document: balanced, escaped, SVG 1.1 header, errors on misuse", "[svg]") {
  svg::Document doc(200, 100, "a <title> & more");
  doc.group("layer one", "g1");
  doc.rect(10, 10, -5, 20, svg::fill_style("#ff0000"));  // negative width is flipped
  svg::TextStyle t;
  t.anchor = "middle";
  t.rotate = -90;
  doc.text(50, 50, "x < y & \"z\"\nsecond line", t);
  doc.close();
  const std::string s = doc.str();
  REQUIRE(xml_problem(s).empty());
  REQUIRE(s.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"", 0) == 0);
  REQUIRE(s.find("xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\"") != std::string::npos);
  REQUIRE(s.find("viewBox=\"0 0 200 100\"") != std::string::npos);
  REQUIRE(s.find("<title>a &lt;title&gt; &amp; more</title>") != std::string::npos);
  REQUIRE(s.find("x=\"5\" y=\"10\" width=\"5\"") != std::string::npos);
  REQUIRE(count(s, "<tspan") == 2);
  REQUIRE(s.find("transform=\"rotate(-90 50 50)\"") != std::string::npos);

  svg::Document open(10, 10);
  open.group("g");
  REQUIRE_THROWS_AS(open.str(), Error);  // <g> still open
  svg::Document bad(10, 10);
  REQUIRE_THROWS_AS(bad.close(), Error);
  REQUIRE_THROWS_AS(bad.rect(std::nan(""), 0, 1, 1, svg::Style{}), Error);
  REQUIRE_THROWS_AS(bad.polyline({{0, 0}}, svg::Style{}), Error);
  REQUIRE_THROWS_AS(svg::Document(0, 10), Error);
}

TEST_CASE("Axes: non-finite data break lines and never reach the file", "[svg]") {
  svg::Figure fig(500, 300, "lines with gaps");
  svg::Axes& ax = fig.axes({0, 30, 500, 270});
  std::vector<double> x, y;
  for (int k = 0; k < 20; ++k) {
    x.push_back(k);
    y.push_back(k == 7 ? NAN : (k == 12 ? INFINITY : std::sin(k)));
  }
  ax.line(x, y, svg::palette::blue, 1.5, {}, "sin").set_class("my-line");
  ax.scatter({1, NAN, 3}, {1, 2, NAN}, svg::palette::red, 3, "points");
  ax.vline(NAN);
  ax.bars({1, 2}, {NAN, 0.5}, 0.5);
  ax.legend();
  const std::string s = fig.svg();
  REQUIRE(xml_problem(s).empty());
  REQUIRE(s.find("nan") == std::string::npos);
  REQUIRE(s.find("inf") == std::string::npos);
  // three runs: 0..6, 8..11, 13..19
  const std::size_t at = s.find("class=\"series line my-line\"");
  REQUIRE(at != std::string::npos);
  const std::size_t end = s.find("</g>", at);
  REQUIRE(count(s.substr(at, end - at), "<polyline") == 3);
  REQUIRE(count(s, "class=\"legend-label\"") == 2);
  // limits come from the finite data only
  REQUIRE(ax.ylim().first > -1.2);
  REQUIRE(ax.ylim().second < 1.2);
  gallery_save(fig, "lines_with_gaps.svg");
  REQUIRE_THROWS_AS(ax.line({1, 2}, {1}), Error);
  REQUIRE_THROWS_AS(ax.set_xlim(1, 1), Error);
}

TEST_CASE("Axes: data-to-pixel map, fixed limits and ticks", "[svg]") {
  svg::Figure fig(400, 300);
  svg::Axes& ax = fig.axes({0, 0, 400, 300});
  ax.line({0, 1}, {0, 10});
  ax.set_xlim(0, 1).set_ylim(0, 10);
  const svg::Box p = ax.plot_area();
  REQUIRE(ax.px(0) == Approx(p.x));
  REQUIRE(ax.px(1) == Approx(p.x + p.w));
  REQUIRE(ax.py(0) == Approx(p.y + p.h));
  REQUIRE(ax.py(10) == Approx(p.y));
  // the tick labels drawn sit where the map puts them
  const std::string s = fig.svg();
  const std::regex re("<line x1=\"([0-9.]+)\" y1=\"[0-9.]+\" x2=\"[0-9.]+\" y2=\"[0-9.]+\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\"/>\\s*"
                      "<text class=\"tick-label\" x=\"[0-9.]+\" y=\"[0-9.]+\" font-size=\"10\" fill=\"#333333\" "
                      "text-anchor=\"middle\">([0-9.]+)</text>");
  int n = 0;
  for (std::sregex_iterator it(s.begin(), s.end(), re), e; it != e; ++it, ++n)
    REQUIRE(std::stod((*it)[1].str()) == Approx(ax.px(std::stod((*it)[2].str()))).margin(0.01));
  REQUIRE(n >= 3);
}

TEST_CASE("Heatmap: cells, labels, the outlined cell and the colour bar", "[svg]") {
  svg::Figure fig(420, 360, "E0~ of one head");
  svg::Heatmap& hm = fig.heatmap({0, 30, 420, 330});
  std::vector<double> v;
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 6; ++c) v.push_back(r - 0.5 * c);
  hm.set_data(5, 6, v);
  hm.row_labels = {"[CLS]", "paris", "is", "<b>", "[SEP]"};
  hm.col_labels = {"[CLS]", "paris", "is", "capital", "&", "[SEP]"};
  hm.outline_row = 1;
  hm.outline_col = 4;
  hm.id = "head0";
  hm.cmap = svg::Colormap::magma;
  const std::string s = fig.svg();
  REQUIRE(xml_problem(s).empty());
  REQUIRE(count(s, "class=\"cell\"") == 30);
  REQUIRE(count(s, "class=\"row-label\"") == 5);
  REQUIRE(count(s, "class=\"col-label\"") == 6);
  REQUIRE(s.find(">&lt;b&gt;</text>") != std::string::npos);
  REQUIRE(s.find(">&amp;</text>") != std::string::npos);
  REQUIRE(count(s, "class=\"outline\"") == 1);
  // the outline lies inside cell (1, 4) and inside no other cell
  const double ox = attr_of(s, "class=\"outline\"", "x") + attr_of(s, "class=\"outline\"", "width") / 2;
  const double oy = attr_of(s, "class=\"outline\"", "y") + attr_of(s, "class=\"outline\"", "height") / 2;
  const double cx = attr_of(s, "id=\"head0-r1-c4\"", "x"), cy = attr_of(s, "id=\"head0-r1-c4\"", "y");
  const double cw = attr_of(s, "id=\"head0-r1-c4\"", "width");
  REQUIRE(ox > cx);
  REQUIRE(ox < cx + cw);
  REQUIRE(oy > cy);
  REQUIRE(oy < cy + cw);
  // the smallest value (r 0, c 5: -2.5) gets the dark end of magma, the largest (r 4, c 0: 4) the light end
  REQUIRE(s.find("id=\"head0-r0-c5\" class=\"cell\" fill=\"#000004\"") != std::string::npos);
  REQUIRE(s.find("id=\"head0-r4-c0\" class=\"cell\" fill=\"#fcfdbf\"") != std::string::npos);
  REQUIRE(hm.range() == std::make_pair(-2.5, 4.0));
  REQUIRE(count(s, "<linearGradient") == 1);
  REQUIRE(s.find("class=\"colorbar\"") != std::string::npos);
  gallery_save(fig, "heatmap.svg");

  svg::Figure f2(100, 100);
  svg::Heatmap& bad = f2.heatmap({0, 0, 100, 100});
  REQUIRE_THROWS_AS(bad.set_data(2, 2, {1, 2, 3}), Error);
  bad.set_data(2, 2, {1, 2, 3, 4});
  bad.row_labels = {"a"};
  REQUIRE_THROWS_AS(f2.svg(), Error);
}

TEST_CASE("legend: the best corner avoids the data", "[svg]") {
  svg::Figure fig(400, 300);
  svg::Axes& ax = fig.axes({0, 0, 400, 300});
  // data crowd the upper right; the legend must go elsewhere
  std::vector<double> x, y;
  for (int k = 0; k <= 50; ++k) {
    x.push_back(0.6 + 0.4 * k / 50.0);
    y.push_back(0.6 + 0.4 * k / 50.0);
  }
  ax.scatter(x, y, {}, 3, "upper-right cloud");
  ax.scatter({0.0, 1.0}, {0.0, 0.0}, {}, 2);
  ax.set_xlim(0, 1).set_ylim(0, 1);
  ax.legend();
  const std::string s = fig.svg();
  const std::size_t at = s.find("class=\"legend\"");
  REQUIRE(at != std::string::npos);
  const double lx = attr_of(s.substr(at), "<rect", "x");
  const double ly = attr_of(s.substr(at), "<rect", "y");
  const svg::Box p = ax.plot_area();
  REQUIRE(lx < p.x + p.w / 2);  // left half: upper left is free
  REQUIRE(ly < p.y + p.h / 2);
}

TEST_CASE("plots: the alpha histogram and the training curves", "[svg][plots]") {
  std::vector<double> ah, ao;
  for (int k = 0; k < 1000; ++k) {
    ao.push_back(k % 2 ? 0.8 + 0.15 * (k % 7) / 7.0 : 0.04 * (k % 5) / 5.0);
    ah.push_back(0.3 + 0.4 * (k % 11) / 11.0);
  }
  const svg::Figure h = plots::alpha_histogram(ah, ao, "val step 4");
  const std::string s = h.svg();
  REQUIRE(xml_problem(s).empty());
  REQUIRE(count(s, "class=\"series vspan band\"") == 3);
  REQUIRE(s.find("class=\"series step alpha-hat-hist\"") != std::string::npos);
  REQUIRE(s.find("class=\"series bars oracle-hist\"") != std::string::npos);
  gallery_save(h, "alpha_hist.svg");
  const std::string empty = plots::alpha_histogram({}, {}, "nothing labelled").svg();
  REQUIRE(empty.find("no labelled cells") != std::string::npos);

  const std::string log =
      "{\"step\":1,\"gamma\":1.0,\"task_loss\":0.7,\"loss_gate\":1.2,\"alpha_hat_mean\":0.3,\"alpha_mae\":0.4}\n"
      "{\"step\":2,\"gamma\":0.5,\"task_loss\":0.6,\"loss_gate\":null,\"alpha_hat_mean\":0.35,\"alpha_mae\":0.3}\n"
      "{\"step\":2,\"event\":\"eval\",\"accuracy\":0.55,\"task_loss\":0.66,\"alpha_mae\":0.31,\"decision_side_acc\":0.6}\n"
      "{\"step\":3,\"gamma\":0.0,\"task_loss\":0.5,\"loss_gate\":0.9}\n"
      "{\"step\":4,\"gam";  // a line cut by a crash
  const svg::Figure c = plots::training_curves(log, "run <a&b>");
  const std::string t = c.svg();
  REQUIRE(xml_problem(t).empty());
  REQUIRE(t.find("1 unreadable log lines skipped") != std::string::npos);
  REQUIRE(t.find("run &lt;a&amp;b&gt;") != std::string::npos);
  REQUIRE(count(t, "class=\"axes\"") == 4);
  // loss_gate is null at step 2: its line breaks there (two pieces: step 1 alone as a dot, step 3 alone)
  const std::size_t at = t.find("class=\"series line gate-loss\"");
  REQUIRE(at != std::string::npos);
  REQUIRE(count(t.substr(at, t.find("</g>", at) - at), "<circle") == 2);
  gallery_save(c, "training_curves.svg");
}

TEST_CASE("save: atomic write, the file is the document", "[svg]") {
  svg::Figure fig(300, 200, "saved");
  fig.axes({0, 30, 300, 170}).line({0, 1, 2}, {1, 3, 2});
  std::filesystem::create_directories(kOut);
  const std::string path = kOut + "/saved.svg";
  fig.save(path);
  REQUIRE(read(path) == fig.svg());
  for (const auto& e : std::filesystem::directory_iterator(kOut))  // no temporary file left behind
    REQUIRE(e.path().filename().string().rfind("saved.svg.tmp", 0) != 0);
  REQUIRE_THROWS_AS(fig.save(kOut + "/no/such/dir/x.svg"), Error);
}

}  // namespace test_svg
