// paris_demo: the Dual-Expert Attention module demo on this library.
//
// Tokens [CLS] paris is capital of france [SEP] with seeded random hidden states (D = 512, H = 8); an oracle
// alpha(paris -> france) = 0.90 and alpha(paris -> is) = alpha(paris -> of) = 0.02, target "france" on the
// "paris" row. Only the gate (W_gate, c_gate) is fitted, with Adam on the gate loss alone at gamma = 1; then
// the gate's alpha-hat, the photo-finish points and the attention row are printed, and the gradient-isolation
// check runs, before the fit and after it. The check needs gradients to look at: when every gate cell sits at
// the 0.95 cap after the fit (a large --lr), the gate loss passes no gradient to W_gate, c_gate, and that run
// can show no violation but cannot confirm the gate moves either; it is reported as inconclusive, and the check
// before the fit decides. Exit status: 0 done (the fit's targets are reported, not required); 1 when gradient
// isolation is violated (a task gradient reaches the gate or a gate gradient reaches another parameter) or on an
// error; 2 bad command line.
//
//   paris_demo [--steps 300 (0..10000000)] [--lr 0.01 (> 0, <= 1000)] [--seed 1 (>= 0)] [--threads N (1..4096)]
#include <dea/attention/dual_expert.hpp>
#include <dea/cli/flags.hpp>
#include <dea/optim/adamw.hpp>

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <vector>

using namespace dea;
using Layer = DualExpertAttention<double>;

namespace {

constexpr const char* kUsage =
    "usage: paris_demo [--steps N (300, 0..10000000)] [--lr X (0.01, > 0 and <= 1000)] [--seed N (1)] "
    "[--threads N (1..4096)]\n";

using Iso = Layer::IsolationReport;

/// A violation: a task gradient in the gate, or a gate-loss gradient outside it (each must be exactly 0).
bool violated(const Iso& r) { return r.task_gate_grad != 0 || r.gate_main_grad != 0; }
/// The check could see both directions: the task reached W_rel and the gate loss reached the gate.
bool conclusive(const Iso& r) { return r.task_rel_grad > 0 && r.gate_gate_grad > 0; }

void print_iso(const char* when, const Iso& r) {
  fmt::print("isolation {}: task -> |grad W_gate, c_gate| = {:g}, |grad W_rel| = {:.3e}; gate -> |grad main| = {:g}, "
             "|grad W_gate, c_gate| = {:.3e}{}\n",
             when, r.task_gate_grad, r.task_rel_grad, r.gate_main_grad, r.gate_gate_grad,
             violated(r) ? "  VIOLATED" : conclusive(r) ? "" : "  (inconclusive: a gradient vanished)");
}

}  // namespace

int main(int argc, char** argv) try {
  long steps = 300;
  std::int64_t seed = 1;
  int threads = 0;
  double lr = 1e-2;
  try {
    dea::cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("-h") || args.is("--help")) {
        fmt::print("paris_demo: prints the DEA module demo\n{}", kUsage);
        return 0;
      }
      if (args.is("--steps")) steps = static_cast<long>(args.int_value(0, 10000000));
      else if (args.is("--seed")) seed = args.int_value(0, std::numeric_limits<std::int64_t>::max());
      else if (args.is("--threads")) threads = args.threads_value();
      else if (args.is("--lr")) lr = args.double_value(dea::cli::Range::open_closed(0, 1e3));  // AdamW: no inf, NaN
      else args.unknown();
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "paris_demo: {}\n{}", dea::without_error_prefix(e.what()), kUsage);
    return 2;
  }
  if (threads > 0) set_num_threads(threads);
  const auto t0 = std::chrono::steady_clock::now();

  const std::vector<std::string> tokens = {"[CLS]", "paris", "is", "capital", "of", "france", "[SEP]"};
  const Index T = 7, D = 512, H = 8, qi = 1, ki = 5;
  Rng rng(static_cast<std::uint64_t>(seed));
  Layer layer(D, H, rng);
  Mat<double> x(T, D);
  init::normal(x, rng, 0, 1);  // random hidden states, not embeddings

  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor<double> oracle({1, T, T}, nan);
  oracle[qi * T + ki] = 0.90;  // paris -> france
  oracle[qi * T + 2] = 0.02;   // paris -> is
  oracle[qi * T + 4] = 0.02;   // paris -> of
  Tensor<std::int64_t> target({1, T}, -1);
  target[qi] = ki;

  AttnInputs<double> in(1, T);
  in.set_oracle(oracle).set_targets(target);
  Layer::Cache cache;
  auto alpha = [&](Index h, Index j) { return cache.alpha_hat[static_cast<std::size_t>(cache.cell(0, h, qi, j, H))]; };
  auto head_mean = [&](Index j) {
    double s = 0;
    for (Index h = 0; h < H; ++h) s += alpha(h, j);
    return s / double(H);
  };

  fmt::print("Dual-Expert Attention demo: D={} H={} tokens:", D, H);
  for (const auto& t : tokens) fmt::print(" {}", t);
  fmt::print("\n");
  in.set_gamma_mix(1.0);
  layer.forward(x, in, cache);
  fmt::print("alpha_hat(paris->france) at init, per head:");
  for (Index h = 0; h < H; ++h) fmt::print(" {:.3f}", alpha(h, ki));
  fmt::print("  mean {:.4f} (sigmoid(c_gate) = {:.4f} plus input terms)\n", head_mean(ki), 1 / (1 + std::exp(0.5)));
  fmt::print("alpha_hat(paris->is) at init, per head:");
  for (Index h = 0; h < H; ++h) fmt::print(" {:.3f}", alpha(h, 2));
  fmt::print("\n");

  // isolation before the fit, where no gate cell sits at the 0.95 cap yet and both gradients are non-zero
  in.set_gamma_mix(0.5);
  const Iso iso_init = layer.verify_gradient_isolation(x, in);
  in.set_gamma_mix(1.0);

  // fit only the gate: Adam on [W_gate, c_gate], gamma = 1, the gate loss alone
  ParamList<double> gate = {&layer.W_gate(), &layer.c_gate()};
  auto adam = optim::make_adam(gate, lr);
  for (long s = 1; s <= steps; ++s) {
    layer.forward(x, in, cache);
    layer.zero_grad();
    layer.backward_gate(cache);
    adam.step();
    if (s % 100 == 0 || s == steps) fmt::print("  step {:4d}  L_v2.8 = {:.5f}\n", s, cache.loss_gate);
  }

  in.set_gamma_mix(0.0);
  layer.forward(x, in, cache);
  fmt::print("\nafter {} gate steps (forward at gamma = 0):\n", steps);
  fmt::print("alpha_hat(paris->france) per head:");
  for (Index h = 0; h < H; ++h) fmt::print(" {:.3f}", alpha(h, ki));
  const double mean_france = head_mean(ki), mean_is = head_mean(2);
  fmt::print("\n  mean {:.4f}   (oracle 0.90)\n", mean_france);
  fmt::print("alpha_hat(paris->is) per head:");
  for (Index h = 0; h < H; ++h) fmt::print(" {:.3f}", alpha(h, 2));
  fmt::print("\n  mean {:.4f}   (oracle 0.02)\n", mean_is);
  fmt::print("alpha_hat(paris->of) per head:");
  for (Index h = 0; h < H; ++h) fmt::print(" {:.3f}", alpha(h, 4));
  fmt::print("\n");
  fmt::print("head 0 photo-finish beta against 'france':\n");
  for (Index j = 0; j < T; ++j) {
    if (j == ki) continue;
    const double b = cache.beta[static_cast<std::size_t>(cache.cell(0, 0, qi, j, H))];
    if (std::isnan(b)) fmt::print("  {:>8}: no crossing in [0,1]\n", tokens[j]);
    else fmt::print("  {:>8}: beta = {:.4f}\n", tokens[j], b);
  }
  const GateStats& st = cache.stats;
  fmt::print("gate stats: loss_reg={:.5f} loss_spot={:.5f} loss_decision={:.5f} decision_side_acc={:.4f} "
             "n_decision_pairs={}\n",
             st.loss_reg, st.loss_spot, st.loss_decision, st.decision_side_acc, st.n_decision_pairs);
  fmt::print("head 0 S~ row for 'paris':     ");
  for (Index j = 0; j < T; ++j) {
    const auto k = static_cast<std::size_t>(cache.cell(0, 0, qi, j, H));
    fmt::print(" {:+.3f}", (1 - cache.alpha_hat[k]) * cache.e0n[k] + cache.alpha_hat[k] * cache.e1n[k]);
  }
  fmt::print("\nhead 0 attention row for 'paris':");
  for (Index j = 0; j < T; ++j) fmt::print(" {:.3f}", cache.attn[static_cast<std::size_t>(cache.cell(0, 0, qi, j, H))]);
  fmt::print("\n");

  // isolation: task stand-in mean(output^2) reaches W_rel and never W_gate; the gate loss the reverse (checked
  // before the fit above and here after it)
  in.set_gamma_mix(0.5);
  const Iso iso = layer.verify_gradient_isolation(x, in);
  fmt::print("\n");
  print_iso("before the fit", iso_init);
  print_iso("after the fit ", iso);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool iso_violated = violated(iso_init) || violated(iso);
  if (iso_violated) {
    fmt::print("gradient isolation: FAILED\n");
  } else if (conclusive(iso) && conclusive(iso_init)) {
    fmt::print("gradient isolation: OK\n");
  } else if (conclusive(iso_init) || conclusive(iso)) {
    // e.g. after a fit whose gate cells all sit at the 0.95 cap: the gate loss passes no gradient, nothing to see
    const bool init_ok = conclusive(iso_init);
    const Iso& blind = init_ok ? iso : iso_init;
    fmt::print("gradient isolation: OK {} (the check {} is inconclusive: {})\n", init_ok ? "before the fit" : "after it",
               init_ok ? "after the fit" : "before it",
               blind.gate_gate_grad == 0 ? "the gate gradient vanished; gate cells held at the 0.95 cap pass none"
                                         : "the task gradient of W_rel vanished");
  } else {
    fmt::print("gradient isolation: inconclusive (no violation, but the gate or W_rel gradient vanished in both "
               "checks)\n");
  }
  const bool reached = mean_france >= 0.85 && mean_is <= 0.10;
  fmt::print("fit: mean alpha_hat(paris->france) {:.4f} (target >= 0.85), alpha_hat(paris->is) {:.4f} (target <= 0.10): {}\n",
             mean_france, mean_is, reached ? "reached" : "NOT reached");
  if (!reached) {
    // The 0.95 cap passes no gradient once sigmoid(logit) > 0.95, as in the reference: a cell that saturates
    // during the fit stays there.
    fmt::print("  heads whose alpha_hat(paris->is) is held at the 0.95 cap (no gate gradient there):");
    for (Index h = 0; h < H; ++h)
      if (alpha(h, 2) >= 0.95) fmt::print(" {}", h);
    fmt::print("\n");
  }
  fmt::print("done in {:.2f} s\n", secs);
  return iso_violated ? 1 : 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "paris_demo: {}\n", dea::without_error_prefix(e.what()));
  return 1;
}
