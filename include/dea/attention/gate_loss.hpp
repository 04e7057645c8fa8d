// dea/attention/gate_loss.hpp: the constants of Dual-Expert Attention and the per-row kernel of its gate loss
// L_v2.8 (spotlight + decision around the photo-finish point beta).
//
// For one (b, h, i) query row the kernel chooses the target t, computes beta_p for every key p against t,
// decides which pairs are valid, and returns the row's share of the loss sums and of dL/d(alpha_hat).
// The layer adds the rows up in a fixed order and divides by the batch counts (see dual_expert.hpp).
#pragma once

#include "../core/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

namespace dea {

/// Constants of the reference (dual_expert_attention.py v2.8.3).
struct DeaConstants {
  static constexpr double alpha_max = 0.95;   ///< upper clamp of alpha (oracle) and alpha-hat
  static constexpr double logit_clip = 10.0;  ///< gate logit clamped to [-10, 10] before the sigmoid
  static constexpr double norm_eps = 1e-5;    ///< added to sigma in the per-query normalisation
  static constexpr double var_floor = 1e-12;  ///< sigma = sqrt(max(var, var_floor))
  static constexpr double beta_eps = 1e-6;    ///< photo-finish epsilon
  static constexpr double db_eps = 1e-4;      ///< inside the sqrt of d_b
  static constexpr double lambda_s = 2.0;     ///< spotlight height
  static constexpr double tau_s = 0.1;        ///< spotlight width
  static constexpr double s_beta_temp = 0.05; ///< tanh temperature of s_beta
  static constexpr double tau_d = 0.1;        ///< decision softplus temperature
  static constexpr double lambda_d = 0.5;     ///< weight of L_decision
  static constexpr double c_gate_init = -0.5; ///< initial c_gate of every head
};

/// Hyper-parameters of the gate loss (the reference's constructor overrides).
template <class S>
struct GateLossParams {
  S lambda_s = S(DeaConstants::lambda_s);
  S tau_s = S(DeaConstants::tau_s);
  S tau_d = S(DeaConstants::tau_d);
  S lambda_d = S(DeaConstants::lambda_d);
};

/// Sums of one query row's (or a whole batch's) gate-loss terms.
template <class S>
struct GateLossSums {
  S reg = 0;          ///< sum over labelled cells of (alpha_hat - a)^2
  S spot = 0;         ///< sum over valid pairs of l_pair
  S decision = 0;     ///< sum over valid pairs of L_dec
  Index n_has = 0;    ///< labelled cells
  Index n_valid = 0;  ///< valid (t, p) pairs
  Index n_side = 0;   ///< valid pairs on the oracle's side of beta (strict)

  void add(const GateLossSums& o) {
    reg += o.reg;
    spot += o.spot;
    decision += o.decision;
    n_has += o.n_has;
    n_valid += o.n_valid;
    n_side += o.n_side;
  }
};

namespace detail {

/// Gate loss of one query row.
///   e0, e1 [Tk]      normalised experts (treated as constants)
///   ahat [Tk]        alpha-hat of the row
///   a [Tk]           clamped oracle, 0 where unlabelled; has [Tk] labelled (and real) keys
///   km [Tk]          real keys (nullptr = all real)
///   target           the given target key (-1 = none) or, when `winner` is true, ignored (oracle winner)
/// Outputs: the row's sums; g_reg [Tk] += 2 (ahat - a) on labelled cells (to be divided by n_has);
///   g_spot [Tk] += d(sum of l_pair)/d ahat (only at t; to be divided by n_valid); beta, w, d_b [Tk] (NaN where
///   the pair is not valid; may be null). Returns the target index used (or -1 if the row is inactive).
template <class S>
Index gate_loss_row(Index tk, const S* e0, const S* e1, const S* ahat, const S* a, const std::uint8_t* has,
                    const std::uint8_t* km, bool winner, std::int64_t target, const GateLossParams<S>& gp,
                    GateLossSums<S>& sums, S* g_reg, S* g_spot, S* beta_out, S* w_out, S* db_out) {
  using C = DeaConstants;
  const S nan = std::numeric_limits<S>::quiet_NaN();
  if (beta_out)
    for (Index j = 0; j < tk; ++j) beta_out[j] = w_out[j] = db_out[j] = nan;

  // 1. dense regression over every labelled cell
  for (Index j = 0; j < tk; ++j)
    if (has[j]) {
      const S d = ahat[j] - a[j];
      sums.reg += d * d;
      sums.n_has += 1;
      g_reg[j] += 2 * d;
    }

  // 2. target t and whether the row is active
  Index t = 0;
  bool active = false;
  if (!winner) {
    t = target > 0 ? static_cast<Index>(target) : 0;
    active = target >= 0 && has[t];
  } else {
    S best = -std::numeric_limits<S>::infinity();
    for (Index j = 0; j < tk; ++j) {
      if (!has[j]) continue;
      const S s = (1 - a[j]) * e0[j] + a[j] * e1[j];  // S*_j at the oracle's alpha
      if (!active || s > best) {
        best = s;
        t = j;
      }
      active = true;
    }
  }
  if (!active) return -1;

  // 3.-4. photo-finish beta against every real key p != t, then the pair terms. The valid pairs are gathered in
  // chunks of up to kChunk (on the stack: no allocation) and their terms are evaluated as arrays, which Eigen
  // vectorises (sqrt, exp, tanh, log), then summed chunk by chunk in key order.
  const S e0t = e0[t], e1t = e1[t], a_t = a[t], ah_t = ahat[t];
  const S beps = S(C::beta_eps);
  constexpr Index kChunk = 128;
  using Arr = Eigen::Array<S, Eigen::Dynamic, 1, Eigen::ColMajor, kChunk, 1>;
  S cbeta[kChunk];
  Index cp[kChunk];
  Index m = 0;
  const S dr = ah_t - a_t;
  auto flush = [&]() {
    if (m == 0) return;
    const Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>> beta(cbeta, m);
    const Arr diff = a_t - beta;
    const Arr d_b = (diff.square() + S(C::db_eps)).sqrt();                 // d_b = sqrt((a_t - beta)^2 + 1e-4)
    const Arr w = S(1) + gp.lambda_s * (-d_b / gp.tau_s).exp();            // w = 1 + lambda_s exp(-d_b / tau_s)
    const Arr s_beta = (diff / S(C::s_beta_temp)).tanh();                  // s_beta = tanh((a_t - beta) / 0.05)
    const Arr z = -s_beta * (ah_t - beta) / gp.tau_d;                      // L_dec = softplus(z)
    // softplus(z) as PyTorch computes it (linear above the threshold 20); its derivative is sigmoid(z), or 1
    const Arr ez = z.min(S(20)).exp();
    // log1p(ez) as log(u) ez / (u - 1), u = 1 + ez (exact to a few ulps; Eigen has no vectorised log1p)
    const Arr u = S(1) + ez;
    const Arr l_dec = (z > S(20)).select(z, (u == S(1)).select(ez, u.log() * (ez / (u - S(1)))));
    const Arr sig_z = (z > S(20)).select(S(1), ez / (S(1) + ez));
    sums.spot += (w * (dr * dr) + gp.lambda_d * l_dec).sum();
    sums.decision += l_dec.sum();
    sums.n_valid += m;
    sums.n_side += ((ah_t - beta) * diff > S(0)).count();
    // l_pair = w (ah_t - a_t)^2 + lambda_d softplus(z),  z = -s_beta (ah_t - beta) / tau_d
    g_spot[t] += (S(2) * w * dr + gp.lambda_d * sig_z * (-s_beta / gp.tau_d)).sum();
    if (beta_out)
      for (Index k = 0; k < m; ++k) {
        beta_out[cp[k]] = cbeta[k];
        w_out[cp[k]] = w[k];
        db_out[cp[k]] = d_b[k];
      }
    m = 0;
  };
  for (Index p = 0; p < tk; ++p) {
    if (p == t || (km && !km[p])) continue;
    const S num = e0[p] - e0t;
    const S den = (e1t - e0t) - (e1[p] - e0[p]);
    const S beta = num / (den + beps * (den >= 0 ? S(1) : S(-1)));
    if (!(std::abs(den) >= beps) || !(beta >= 0) || !(beta <= 1) || !std::isfinite(beta)) continue;
    cbeta[m] = beta;
    cp[m] = p;
    if (++m == kChunk) flush();
  }
  flush();
  return t;
}

}  // namespace detail
}  // namespace dea
