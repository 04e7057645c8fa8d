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
//
// The parts: svg_document.hpp (text, numbers, colours, Document), svg_axes.hpp (series, Axes), and here
// Heatmap and Figure.
#pragma once

#include "svg_axes.hpp"

namespace dea::svg {

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

