// dea/plot/figures.hpp: the training and evaluation pictures of the reference (eval.py plot_alpha_histogram, and the
// curves a reader of train_log.jsonl wants), drawn with svg.hpp.
//
//   alpha_histogram(alpha_hat, alpha_oracle, title)   alpha-hat against the oracle alpha on labelled cells: the
//       mock oracle's three density bands shaded, the oracle as a filled histogram, alpha-hat as a step outline
//       (50 bins on [0, 1], densities), the 0.95 cap as a dashed red line;
//   training_curves(jsonl, title)                      from train's log: task and gate loss, gamma_mix, accuracy
//       and decision side accuracy, alpha-hat mean and alpha MAE, against the step (validation as markers).
// Each returns an svg::Figure; save() writes it atomically.
#pragma once

#include "../core/error.hpp"
#include "svg.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dea::plots {

/// The mock oracle's density bands as the reference shades them: [0, 0.05] "pure sim 45%",
/// [0.15, 0.30] "weak ~0.2 25%", [0.75, 0.95] "strong ~0.9 30%", and the 0.95 cap as a dashed red line.
inline void alpha_bands(svg::Axes& ax) {
  ax.vspan(0.0, 0.05, "#d0e6f7", 0.6, "pure sim 45%").set_class("band");
  ax.vspan(0.15, 0.30, "#fde2b8", 0.6, "weak ~0.2 25%").set_class("band");
  ax.vspan(0.75, 0.95, "#d4f0d0", 0.6, "strong ~0.9 30%").set_class("band");
  ax.vline(0.95, svg::palette::red, 1, "4 3").set_class("cap-line");
}

/// alpha-hat (step outline) against the oracle alpha (filled) on [0, 1], 50 bins, as densities.
inline svg::Figure alpha_histogram(const std::vector<double>& alpha_hat, const std::vector<double>& alpha_oracle,
                                   const std::string& title = "alpha_hat vs oracle alpha") {
  svg::Figure fig(820, 460);
  svg::Axes& ax = fig.axes({0, 4, 820, 456});
  alpha_bands(ax);
  if (!alpha_oracle.empty())
    ax.hist(alpha_oracle, 50, 0.0, 1.0, true, svg::palette::green, "oracle α (n=" + std::to_string(alpha_oracle.size()) + ")",
            true, 0.55)
        .set_class("oracle-hist");
  if (!alpha_hat.empty())
    ax.hist(alpha_hat, 50, 0.0, 1.0, true, svg::palette::orange, "α̂ (n=" + std::to_string(alpha_hat.size()) + ")", false)
        .set_class("alpha-hat-hist");
  if (alpha_hat.empty() && alpha_oracle.empty()) {
    svg::TextStyle t;
    t.size = 12;
    t.anchor = "middle";
    t.cls = "no-data";
    ax.text_axes(0.5, 0.5, "no labelled cells", t);
    ax.set_ylim(0, 1);
  }
  ax.set_xlim(0, 1);
  svg::TextStyle cap;
  cap.size = 9;
  cap.fill = svg::palette::red;
  cap.anchor = "end";
  cap.halo = true;
  cap.cls = "cap-label";
  ax.text(0.95, ax.ylim().second, "cap 0.95\n(never 1.0)", cap, -3, 14);
  ax.xlabel = "α";
  ax.ylabel = "density";
  ax.title = title;
  ax.legend(svg::Loc::upper_center);
  return fig;
}

namespace detail {

inline double field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::numeric_limits<double>::quiet_NaN();
  return it->get<double>();
}

struct Curve {
  std::vector<double> x, y;
};

inline Curve curve(const std::map<long long, nlohmann::json>& recs, const char* key) {
  Curve c;
  for (const auto& [step, j] : recs) {
    c.x.push_back(static_cast<double>(step));
    c.y.push_back(field(j, key));
  }
  return c;
}

inline bool any_finite(const Curve& c) {
  for (double v : c.y)
    if (std::isfinite(v)) return true;
  return false;
}

}  // namespace detail

/// Curves from the text of train_log.jsonl. Step records (with "gamma") and evaluation records ("event": "eval")
/// are kept per step (the last record of a step wins, so a resumed run that repeats steps draws each once);
/// lines that are not JSON objects with a "step" are skipped (a crash can cut the last line).
inline svg::Figure training_curves(std::string_view jsonl, const std::string& title = "training") {
  std::map<long long, nlohmann::json> train, val;
  std::size_t start = 0, bad = 0;
  while (start < jsonl.size()) {
    std::size_t end = jsonl.find('\n', start);
    if (end == std::string_view::npos) end = jsonl.size();
    const std::string_view line = jsonl.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      ++bad;
      continue;
    }
    const long long step = j["step"].get<long long>();
    const auto ev = j.find("event");
    if (ev != j.end() && ev->is_string() && ev->get<std::string>() == "eval") val[step] = std::move(j);
    else train[step] = std::move(j);
  }
  svg::Figure fig(1200, 760, title + (bad ? " (" + std::to_string(bad) + " unreadable log lines skipped)" : ""));
  const auto boxes = svg::Figure::grid({0, 32, 1200, 728}, 2, 2, 12, 6);
  using detail::curve;

  svg::Axes& loss = fig.axes(boxes[0]);
  const detail::Curve task = curve(train, "task_loss"), gate = curve(train, "loss_gate"), vloss = curve(val, "task_loss");
  loss.line(task.x, task.y, svg::palette::blue, 1.6, {}, "task loss (train)").set_class("task-loss");
  loss.line(gate.x, gate.y, svg::palette::orange, 1.6, {}, "gate loss L_v2.8 (train)").set_class("gate-loss");
  if (!val.empty())
    loss.line(vloss.x, vloss.y, svg::palette::purple, 1.2, "4 3", "task loss (validation)").set_class("val-loss").radius = 4;
  loss.title = "losses";
  loss.xlabel = "step";
  loss.legend();

  svg::Axes& gam = fig.axes(boxes[1]);
  const detail::Curve g = curve(train, "gamma");
  gam.line(g.x, g.y, svg::palette::green, 1.8, {}, "γ_mix (oracle weight in the scores)").set_class("gamma");
  gam.set_ylim(-0.05, 1.05);
  gam.title = "γ_mix schedule";
  gam.xlabel = "step";
  gam.legend();

  svg::Axes& acc = fig.axes(boxes[2]);
  const detail::Curve va = curve(val, "accuracy"), vs = curve(val, "decision_side_acc"),
                      ts = curve(train, "decision_side_acc");
  if (detail::any_finite(ts))
    acc.line(ts.x, ts.y, svg::palette::gray, 1.0, {}, "decision side accuracy (train)").set_class("train-side-acc");
  if (!val.empty()) {
    acc.line(va.x, va.y, svg::palette::blue, 1.6, {}, "accuracy (validation)").set_class("val-accuracy").radius = 4;
    acc.line(vs.x, vs.y, svg::palette::red, 1.2, "4 3", "decision side accuracy (validation)").set_class("val-side-acc").radius =
        3.5;
  }
  acc.hline(0.5, svg::palette::gray, 0.8, "2 3");
  acc.set_ylim(0, 1.02);
  acc.title = "accuracy";
  acc.xlabel = "step";
  acc.legend();

  svg::Axes& al = fig.axes(boxes[3]);
  const detail::Curve am = curve(train, "alpha_hat_mean"), mae = curve(train, "alpha_mae"), vmae = curve(val, "alpha_mae"),
                      vp = curve(val, "alpha_pearson");
  al.line(am.x, am.y, svg::palette::orange, 1.4, {}, "α̂ mean, labelled cells (train)").set_class("alpha-hat-mean");
  al.line(mae.x, mae.y, svg::palette::brown, 1.4, {}, "|α̂ − α| MAE (train)").set_class("alpha-mae");
  if (!val.empty()) {
    al.line(vmae.x, vmae.y, svg::palette::purple, 1.2, "4 3", "|α̂ − α| MAE (validation)").set_class("val-alpha-mae").radius = 4;
    if (detail::any_finite(vp))
      al.line(vp.x, vp.y, svg::palette::cyan, 1.2, "4 3", "Pearson r (validation)").set_class("val-pearson").radius = 3.5;
  }
  al.title = "the gate's α̂ against the oracle";
  al.xlabel = "step";
  al.legend();
  return fig;
}

}  // namespace dea::plots
