// examples/experiments/first_spike/plots.hpp: the benchmark's two pictures, drawn with dea/plot/svg.hpp.
//
//   <stem>_mse_per_seed.svg   left: each paired seed's test MSE, dot (baseline) and lap (idea), joined by a line;
//                             right: d = lap - dot per seed (green when lap wins), its mean and the paired bootstrap
//                             95% CI of the mean as a band;
//   <stem>_sigma_entropy.svg  the mechanism check (ii): mean row entropy of each block with q and k held fixed and
//                             sigma scaled x0.5, x1, x2 (it must rise), against the dot baseline's entropy on the same
//                             inputs and the uniform row's ln T.
#pragma once

#include <dea/plot/svg.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace lapbench {

inline void plot_paired_mse(const std::string& path, const std::string& task, const std::vector<std::uint64_t>& seeds,
                            const std::vector<double>& dot, const std::vector<double>& lap, double ci_lo, double ci_hi,
                            const std::string& verdict, double lr, double sigma0) {
  namespace svg = dea::svg;
  const std::size_t n = seeds.size();
  svg::Figure fig(1240, 470,
                  "First-Spike benchmark, task '" + task + "': paired seeds (lr " + svg::format_value(lr) + ", σ₀ " +
                      svg::format_value(sigma0) + ")");
  const auto boxes = svg::Figure::grid({0, 32, 1240, 438}, 1, 2, 12);
  std::vector<double> x;
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < n; ++i) {
    x.push_back(static_cast<double>(i));
    labels.push_back("seed " + std::to_string(seeds[i]));
  }
  svg::Axes& l = fig.axes(boxes[0]);
  for (std::size_t i = 0; i < n; ++i)
    l.line({x[i], x[i]}, {dot[i], lap[i]}, "#999999", 1.2).set_class("pair-link");
  double md = 0, ml = 0;
  for (std::size_t i = 0; i < n; ++i) {
    md += dot[i] / static_cast<double>(n);
    ml += lap[i] / static_cast<double>(n);
  }
  l.hline(md, svg::palette::blue, 1, "5 4", "dot mean " + svg::format_value(md, 4)).set_class("dot-mean");
  l.hline(ml, svg::palette::orange, 1, "5 4", "lap mean " + svg::format_value(ml, 4)).set_class("lap-mean");
  l.scatter(x, dot, svg::palette::blue, 5, "dot-product (baseline)").set_class("dot-points");
  l.scatter(x, lap, svg::palette::orange, 5, "Laplacian (idea)").set_class("lap-points");
  l.set_xticks(x, labels, n > 10 ? -40 : 0);
  l.set_xlim(-0.6, static_cast<double>(n) - 0.4);
  l.ylabel = "test MSE";
  l.title = "test MSE per seed (lower is better)";
  l.legend();

  svg::Axes& r = fig.axes(boxes[1]);
  std::vector<double> d, win, lose, xw, xl;
  double mean = 0;
  for (std::size_t i = 0; i < n; ++i) {
    d.push_back(lap[i] - dot[i]);
    mean += d.back() / static_cast<double>(n);
    (d.back() < 0 ? xw : xl).push_back(x[i]);
    (d.back() < 0 ? win : lose).push_back(d.back());
  }
  if (std::isfinite(ci_lo) && std::isfinite(ci_hi))
    r.hspan(ci_lo, ci_hi, svg::palette::gray, 0.18, "bootstrap 95% CI of mean(d)").set_class("ci-band");
  r.bars(xw, win, 0.6, svg::palette::green, "lap better (d < 0)").set_class("d-bars");
  r.bars(xl, lose, 0.6, svg::palette::red, "lap worse (d > 0)").set_class("d-bars");
  r.hline(0, "#333333", 1);
  r.hline(mean, svg::palette::purple, 1.5, "5 4", "mean(d) = " + svg::format_value(mean, 3)).set_class("mean-d");
  r.set_xticks(x, labels, n > 10 ? -40 : 0);
  r.set_xlim(-0.6, static_cast<double>(n) - 0.4);
  r.ylabel = "d = lap − dot";
  r.title = "paired difference: " + verdict;
  r.legend();
  fig.save(path);
}

/// scale_entropy[l] = mean row entropy of block l at sigma x0.5, x1, x2; dot_entropy[l] and lap_entropy[l] on the
/// same inputs; T the window (the uniform row's entropy is ln T).
inline void plot_sigma_entropy(const std::string& path, const std::string& task,
                               const std::vector<std::array<double, 3>>& scale_entropy,
                               const std::vector<double>& dot_entropy, long T) {
  namespace svg = dea::svg;
  svg::Figure fig(820, 480, "First-Spike mechanism check (ii), task '" + task + "'");
  svg::Axes& ax = fig.axes({0, 30, 820, 450});
  const std::vector<double> x = {0, 1, 2};
  if (T > 1) ax.hline(std::log(static_cast<double>(T)), svg::palette::gray, 1, "2 3", "uniform row: ln T").set_class("uniform");
  for (std::size_t l = 0; l < scale_entropy.size(); ++l) {
    const char* col = svg::palette::cycle(static_cast<int>(l) == 1 ? 3 : static_cast<int>(l) * 2);
    const std::vector<double> y = {scale_entropy[l][0], scale_entropy[l][1], scale_entropy[l][2]};
    ax.line(x, y, col, 2.2, {}, "Laplacian block " + std::to_string(l)).set_class("lap-entropy").radius = 5;
    if (l < dot_entropy.size())
      ax.hline(dot_entropy[l], col, 1.2, "6 4", "dot baseline block " + std::to_string(l) + " (same inputs)")
          .set_class("dot-entropy");
  }
  ax.set_xticks(x, {"σ × 0.5", "σ × 1 (learned)", "σ × 2"});
  ax.set_xlim(-0.3, 2.3);
  ax.ylabel = "mean row entropy (nats)";
  ax.xlabel = "bandwidth σ, q and k held fixed";
  ax.title = "larger σ gives less selective attention: entropy must rise left to right";
  ax.legend();
  fig.save(path);
}

}  // namespace lapbench
