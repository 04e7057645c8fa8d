// tr_mha_demo: the token-routed MHA adapters (tr_mha = v1, tr_mha_v2 = v2) at a glance.
//
//   tr_mha_demo [--seed N (0; 0..2^63-1)] [--threads N (2; 1..4096)] [--steps N (30; 0..100000)]
//               [--case file.safetensors ...] [--plot_dir tr_mha_plots] [--no-plots]
//
// 1. Builds v1 and v2 layers with the reference's defaults (D = 64, H = 4, E = 4; v1 r = 8, v2 r = 4, targets qv)
//    and prints their telemetry on a batch of RMSNorm-like inputs.
// 2. Shows v2's exact neutrality at init: its output is bitwise the plain-MHA output of the same weights, and among
//    the routed parameters only the up map receives a gradient.
// 3. Trains v2 for a few SGD steps on a toy regression and prints how the routed branch wakes up.
// 4. With --case, runs golden `kind = tr_mha_layer` files through dea::interop::run_tr_mha_case and prints the
//    comparison (exit code 1 if any case fails).
// 5. Writes two SVG plots into --plot_dir (default tr_mha_plots/; --no-plots skips them): route_shares.svg (each
//    expert's share of the route weight, v1 and v2 at init and v2 after training) and route_weights.svg (the
//    distribution of the per-token route weights w of the selected experts).
// Exit status: 0 every check passed (the last line says "tr_mha_demo checks: all passed"), 1 a check failed (v2 not
// bit-identical to plain MHA at init, the v2 loss not falling, a golden case) or an error, 2 bad command line (a value that is not an integer in
// its range, an unknown flag, a missing value).
#include <dea/attention/token_routed.hpp>
#include <dea/cli/flags.hpp>
#include <dea/plot/svg.hpp>
#include <dea/interop/tr_mha_case.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <string>
#include <vector>

using namespace dea;
using Layer = TokenRoutedAttention<double>;

namespace {

void print_telemetry(const char* what, const TokenRoutedTelemetry& t) {
  std::printf("  %-40s", what);
  for (const auto& [k, v] : t.items()) std::printf(" %s=%.4f", k.c_str() + 7, v);  // drop the "tr_mha_" prefix
  std::printf("\n");
}

double max_abs(const Mat<double>& m) { return m.size() ? m.cwiseAbs().maxCoeff() : 0.0; }

/// Rows shaped like the output of a block's input RMSNorm (rms 1 per row).
Mat<double> rmsnorm_like(Index rows, Index cols, Rng& rng) {
  Mat<double> x(rows, cols);
  init::normal(x, rng, 0.0, 1.0);
  for (Index i = 0; i < rows; ++i) x.row(i) /= std::sqrt(x.row(i).squaredNorm() / static_cast<double>(cols));
  return x;
}

/// One layer's routing for the plots: telemetry route shares and every selected route weight.
struct RouteSnapshot {
  std::string name;
  std::vector<double> shares;
  std::vector<double> weights;
};

RouteSnapshot snapshot(std::string name, const TokenRoutedTelemetry& t, const Mat<double>& route_weights) {
  RouteSnapshot r;
  r.name = std::move(name);
  r.shares = t.route_share;
  r.weights.assign(route_weights.data(), route_weights.data() + route_weights.size());
  return r;
}

void write_plots(const std::string& dir, const std::vector<RouteSnapshot>& snaps) {
  namespace svg = dea::svg;
  std::filesystem::create_directories(dir);
  const char* colours[3] = {svg::palette::blue, svg::palette::orange, svg::palette::green};
  {
    svg::Figure fig(820, 460, "token-routed MHA: each expert's share of the route weight");
    svg::Axes& ax = fig.axes({0, 30, 820, 430});
    std::size_t E = 0;
    for (const auto& s : snaps) E = std::max(E, s.shares.size());
    const double w = 0.8 / static_cast<double>(snaps.size());
    std::vector<double> pos;
    std::vector<std::string> labels;
    for (std::size_t e = 0; e < E; ++e) {
      pos.push_back(static_cast<double>(e));
      labels.push_back("expert " + std::to_string(e));
    }
    for (std::size_t k = 0; k < snaps.size(); ++k) {
      std::vector<double> x;
      for (std::size_t e = 0; e < snaps[k].shares.size(); ++e)
        x.push_back(static_cast<double>(e) - 0.4 + w * (static_cast<double>(k) + 0.5));
      ax.bars(x, snaps[k].shares, w * 0.92, colours[k % 3], snaps[k].name).set_class("share-bars");
    }
    ax.set_xticks(pos, labels);
    ax.set_xlim(-0.6, static_cast<double>(E) - 0.4);
    ax.ylabel = "mean route weight per token (tr_mha_route_e)";
    ax.title = "route shares (a token's selected experts share weight 1)";
    ax.legend();
    fig.save((std::filesystem::path(dir) / "route_shares.svg").string());
  }
  {
    svg::Figure fig(820, 460, "token-routed MHA: distribution of the route weights w");
    svg::Axes& ax = fig.axes({0, 30, 820, 430});
    for (std::size_t k = 0; k < snaps.size(); ++k) {
      // outlines from wide to thin, so that identical distributions stay visible on top of each other
      svg::Series& h = ax.hist(snaps[k].weights, 40, 0.0, 1.0, true, colours[k % 3],
                               snaps[k].name + " (n=" + std::to_string(snaps[k].weights.size()) + ")", false)
                           .set_class("weight-hist");
      h.width = k == 0 ? 4.5 : (k == 1 ? 2.5 : 1.2);
      if (k == 1) h.dash = "6 3";
    }
    ax.vline(0.5, svg::palette::gray, 1, "2 3");
    ax.set_xlim(0, 1);
    ax.xlabel = "route weight w of a selected expert (softmax over the token's selected experts)";
    ax.ylabel = "density";
    ax.title = "route weights: 0.5 = an even split between the two selected experts";
    ax.legend();
    fig.save((std::filesystem::path(dir) / "route_weights.svg").string());
  }
}

constexpr std::int64_t kMaxSeed = std::numeric_limits<std::int64_t>::max();
constexpr const char* kUsage =
    "usage: tr_mha_demo [--seed N (0)] [--threads N (2, 1..4096)] [--steps N (30, 0..100000)]\n"
    "                   [--case file.safetensors ...] [--plot_dir tr_mha_plots] [--no-plots]\n";

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 0;
  int threads = 2, steps = 30;
  std::vector<std::string> cases;
  std::string plot_dir = "tr_mha_plots";
  bool plots = true;
  try {
    dea::cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("-h") || args.is("--help")) {
        std::printf("%s", kUsage);
        return 0;
      }
      if (args.is("--seed")) seed = static_cast<std::uint64_t>(args.int_value(0, kMaxSeed));
      else if (args.is("--threads")) threads = args.threads_value();
      else if (args.is("--steps")) steps = static_cast<int>(args.int_value(0, 100000));  // 30 take well under a second
      else if (args.is("--case")) cases.push_back(args.value());
      else if (args.is("--plot_dir")) plot_dir = args.value();
      else if (args.is("--no-plots")) plots = false;
      else args.unknown();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tr_mha_demo: %s\n%s", dea::without_error_prefix(e.what()).c_str(), kUsage);
    return 2;
  }
  set_num_threads(threads);

  try {
    const Index B = 2, T = 16, D = 64, H = 4, vocab = 1000;
    Rng rng(seed);
    const Mat<double> x = rmsnorm_like(B * T, D, rng);
    Tensor<std::int64_t> ids({B, T});
    for (Index i = 0; i < ids.numel(); ++i) ids[i] = static_cast<std::int64_t>(rng.below(vocab));
    const AttnInputs<double> in(B, T);

    std::printf("token-routed MHA adapters: B=%ld T=%ld D=%ld H=%ld, E=4, k=2, priors (2, 1, -2), tau=1\n\n",
                static_cast<long>(B), static_cast<long>(T), static_cast<long>(D), static_cast<long>(H));

    // ---- v1 at construction ----
    Layer::Options o1;  // defaults: v1, E = 4, r = 8, k = 2, alpha = 0.1, verifier 0.1
    Layer v1(D, H, rng, o1);
    Layer::Cache c1, c1p;
    const Mat<double> y1 = v1.forward(x, ids, in, c1);
    const Mat<double> y1p = v1.forward_plain(x, in, c1p);
    std::printf("v1 (tr_mha), at init: %ld parameters\n", static_cast<long>(count_parameters(v1.parameters())));
    print_telemetry("telemetry:", v1.telemetry());
    std::printf("  routed branch effect max|y - y_plain| / max|y| = %.3e (v1 is not neutral at init)\n\n",
                max_abs(y1 - y1p) / max_abs(y1));
    std::vector<RouteSnapshot> snaps = {snapshot("v1 at init", c1.telemetry, c1.route_weights)};

    // ---- v2 at construction: exact neutrality ----
    Layer::Options o2;
    o2.variant = TrVariant::v2;
    o2.adapter_rank = 4;
    o2.targets = TrTargets::qv;
    Layer v2(D, H, rng, o2);
    Layer::Cache c2, c2p;
    const Mat<double> y2 = v2.forward(x, ids, in, c2);
    const Mat<double> y2p = v2.forward_plain(x, in, c2p);
    const bool same_bits = std::memcmp(y2.data(), y2p.data(), sizeof(double) * static_cast<std::size_t>(y2.size())) == 0;
    std::printf("v2 (tr_mha_v2, targets qv), at init: %ld parameters\n",
                static_cast<long>(count_parameters(v2.parameters())));
    print_telemetry("telemetry:", v2.telemetry());
    snaps.push_back(snapshot("v2 at init", c2.telemetry, c2.route_weights));
    std::printf("  output vs plain MHA of the same weights: max|diff| = %.1e, identical bits: %s\n",
                max_abs(y2 - y2p), same_bits ? "yes" : "NO");
    std::vector<std::string> failed;  // the demo's own checks: any failure makes the exit status 1
    if (!same_bits) failed.push_back("v2 at init is not bit-identical to plain MHA");
    Mat<double> R(B * T, D);
    init::normal(R, rng, 0.0, 1.0);
    v2.zero_grad();
    v2.backward(R, c2);
    std::printf("  gradient of L = <y, R> at init (max |grad|):\n");
    for (Param<double>* p : v2.parameters())
      if (p->name.find("proj") == std::string::npos && p->name.find("norm") == std::string::npos)
        std::printf("    %-24s %.3e\n", p->name.c_str(), p->grad.cwiseAbs().maxCoeff());
    std::printf("\n");

    // ---- v2 learns: SGD on a toy regression y -> target, from the neutral start ----
    // alpha_0 = 1.0 as in the reference's v2 pilots; the target moves every token's output a little.
    Layer v2t(D, H, rng, [&] {
      Layer::Options o = o2;
      o.adapter_gate_init = 1.0;
      return o;
    }());
    Mat<double> target;
    {
      Layer::Cache c;
      target = v2t.forward_plain(x, in, c);
      Mat<double> noise(B * T, D);
      init::normal(noise, rng, 0.0, 0.05);
      target += noise;
    }
    const double lr = 0.2;
    double first_loss = 0, last_loss = 0;
    std::printf("v2 (alpha_0 = 1), %d SGD steps (lr %.2f) on L = mean over tokens of |y - target|^2:\n", steps, lr);
    for (int s = 0; s <= steps; ++s) {
      Layer::Cache c, cp;
      const Mat<double> y = v2t.forward(x, ids, in, c);
      const double loss = (y - target).squaredNorm() / static_cast<double>(y.rows());
      if (s == 0) first_loss = loss;
      last_loss = loss;
      if (s % 10 == 0 || s == steps) {
        const Mat<double> yp = v2t.forward_plain(x, in, cp);
        char label[96];
        std::snprintf(label, sizeof label, "step %3d loss %.5f effect %.1e", s, loss, max_abs(y - yp) / max_abs(y));
        print_telemetry(label, v2t.telemetry());
      }
      if (s == steps) {
        snaps.push_back(snapshot("v2 after " + std::to_string(steps) + " steps", c.telemetry, c.route_weights));
        break;
      }
      v2t.zero_grad();
      v2t.backward(2.0 * (y - target) / static_cast<double>(y.rows()), c);
      for (Param<double>* p : v2t.parameters()) p->value -= lr * p->grad;
    }
    std::printf("  (effect = max|y - y_plain| / max|y|: the routed branch's share of the output)\n");
    if (steps > 0 && !(std::isfinite(last_loss) && last_loss < first_loss))
      failed.push_back("the v2 loss did not fall (" + std::to_string(first_loss) + " -> " + std::to_string(last_loss) + ")");
    if (plots) try {
      write_plots(plot_dir, snaps);
      std::printf("plots: %s/route_shares.svg, %s/route_weights.svg\n", plot_dir.c_str(), plot_dir.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tr_mha_demo: warning: plots not written: %s\n",
                   dea::without_error_prefix(e.what()).c_str());
    }

    // ---- golden cases ----
    for (const std::string& path : cases) {
      const auto res = interop::run_tr_mha_case<double>(path);
      std::printf("\n%s", res.str().c_str());
      if (!res.ok) failed.push_back("golden case " + path);
    }
    if (failed.empty()) {
      std::printf("\ntr_mha_demo checks: all passed\n");
      return 0;
    }
    std::printf("\ntr_mha_demo checks: FAILED\n");
    for (const std::string& f : failed) std::printf("  failed: %s\n", f.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tr_mha_demo: %s\n", dea::without_error_prefix(e.what()).c_str());
    return 1;
  }
}
