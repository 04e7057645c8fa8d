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

/// The photo-finish beta of keys [p0, p0 + m) against the target t: vk[k] = 1 and bc[k] = beta where the pair is
/// valid (a real key other than t, |den| >= beta_eps, beta in [0, 1]), else 0 and 0. Returns the valid count.
/// Every operand is loaded unconditionally, the tests are combined with & and the outputs do not alias the inputs,
/// so the compiler vectorises the loop. Masks are of S and the count an int, so every lane is as wide as S: a byte
/// mask made the compiler pick 64 keys per vector step, and a row of fewer keys ran one key at a time.
template <bool WithKm, class S>
Index beta_chunk(Index m, Index p0, Index t, const S* e0p, const S* e1p, const S* km, S e0t, S dt, S beps,
                 S* __restrict vk, S* __restrict bc) {
  int nv = 0;
  for (Index k = 0; k < m; ++k) {
    const S num = e0p[k] - e0t;
    const S den = dt - (e1p[k] - e0p[k]);
    const S beta = num / (den + (den >= 0 ? beps : -beps));
    bool real = true;
    if constexpr (WithKm) real = km[p0 + k] != S(0);
    // a NaN fails every comparison; beta in [0, 1] also excludes +-inf
    const bool ok = (p0 + k != t) & real & (std::abs(den) >= beps) & (beta >= 0) & (beta <= 1);
    vk[k] = ok ? S(1) : S(0);
    bc[k] = ok ? beta : S(0);
    nv += ok ? 1 : 0;
  }
  return nv;
}

/// Gate loss of one query row.
///   e0, e1 [Tk]      normalised experts (treated as constants)
///   ahat [Tk]        alpha-hat of the row
///   a [Tk]           clamped oracle, 0 where unlabelled; has [Tk] 1 at labelled (and real) keys, else 0
///   km [Tk]          1 at real keys, else 0 (nullptr = all real)
///   target           the given target key (-1 = none) or, when `winner` is true, ignored (oracle winner)
/// Outputs: the row's sums; g_reg [Tk] += 2 (ahat - a) on labelled cells (to be divided by n_has);
///   g_spot [Tk] += d(sum of l_pair)/d ahat (only at t; to be divided by n_valid); beta, w, d_b [Tk] (NaN where
///   the pair is not valid; may be null). Returns the target index used (or -1 if the row is inactive).
template <class S>
Index gate_loss_row(Index tk, const S* e0, const S* e1, const S* ahat, const S* a, const S* has, const S* km,
                    bool winner, std::int64_t target, const GateLossParams<S>& gp,
                    GateLossSums<S>& sums, S* g_reg, S* g_spot, S* beta_out, S* w_out, S* db_out) {
  using C = DeaConstants;
  const S nan = std::numeric_limits<S>::quiet_NaN();
  if (beta_out)  // NaN where the pair is not valid (also for an inactive row)
    for (Index j = 0; j < tk; ++j) beta_out[j] = w_out[j] = db_out[j] = nan;

  // 1. dense regression over every labelled cell, in chunks of kChunk keys: branch-free loops (the compiler
  //    vectorises them) with d = 0 at unlabelled keys, and Eigen's vectorised sum
  constexpr Index kChunk = 128;
  using Arr = Eigen::Array<S, Eigen::Dynamic, 1, Eigen::ColMajor, kChunk, 1>;
  Arr dd;
  Index row_has = 0;
  for (Index p0 = 0; p0 < tk; p0 += kChunk) {
    const Index m = tk - p0 < kChunk ? tk - p0 : kChunk;
    dd.resize(m);
    S* ddp = dd.data();
    int n_has = 0;
    for (Index k = 0; k < m; ++k) {
      const Index j = p0 + k;
      const S diff = ahat[j] - a[j];  // loaded unconditionally, so that the loop vectorises
      const bool hj = has[j] != S(0);
      const S d = hj ? diff : S(0);
      ddp[k] = d;
      g_reg[j] += 2 * d;
      n_has += hj ? 1 : 0;
    }
    sums.reg += dd.square().sum();
    sums.n_has += n_has;
    row_has += n_has;
  }
  if (row_has == 0) return -1;  // no labelled key: the row is inactive (no target, no pairs)

  // 2. target t and whether the row is active
  Index t = 0;
  bool active = false, nan_seen = false;
  if (!winner) {
    t = target > 0 ? static_cast<Index>(target) : 0;
    active = target >= 0 && has[t] != S(0);
  } else {
    // the first labelled key of the largest S*_j = (1 - a_j) e0_j + a_j e1_j (the oracle winner). The scores are
    // formed branch-free in chunks (-inf at unlabelled keys) and searched for their maximum; if a labelled score
    // is NaN, the scalar loop below decides (it keeps the reference's rule for that case).
    S top = -std::numeric_limits<S>::infinity();
    Index first = -1;
    int n_nan = 0;
    for (Index p0 = 0; p0 < tk && n_nan == 0; p0 += kChunk) {
      const Index m = tk - p0 < kChunk ? tk - p0 : kChunk;
      dd.resize(m);
      S* sc = dd.data();
      for (Index k = 0; k < m; ++k) {
        const Index j = p0 + k;
        const S s = (1 - a[j]) * e0[j] + a[j] * e1[j];
        const bool hj = has[j] != S(0);
        sc[k] = hj ? s : -std::numeric_limits<S>::infinity();
        n_nan += (hj && !(s == s)) ? 1 : 0;
      }
      if (n_nan > 0) break;
      const S cmax = dd.maxCoeff();
      if (first < 0 || cmax > top) {
        for (Index k = 0; k < m; ++k)
          if (has[p0 + k] != S(0) && sc[k] == cmax) {
            top = cmax;
            first = p0 + k;
            break;
          }
      }
    }
    if (first >= 0 && n_nan == 0) {
      t = first;
      active = true;
    }
    nan_seen = n_nan > 0;
  }
  if (winner && !active && nan_seen) {
    S best = -std::numeric_limits<S>::infinity();
    for (Index j = 0; j < tk; ++j) {
      if (has[j] == S(0)) continue;
      const S s = (1 - a[j]) * e0[j] + a[j] * e1[j];  // S*_j at the oracle's alpha
      if (!active || s > best) {
        best = s;
        t = j;
      }
      active = true;
    }
  }
  if (!active) return -1;

  // 3.-4. photo-finish beta against every real key p != t, then the pair terms, over chunks of kChunk keys (on
  // the stack: no allocation). Every key of a chunk is evaluated; a key whose pair is not valid gets beta = 0
  // (so that every intermediate stays finite) and a 0 in the mask vk, which removes it from every sum. The
  // element-wise steps are plain loops without branches or Eigen array expressions (sqrt, exp, tanh, log), both
  // vectorised; the sums are Eigen's (vectorised), chunk by chunk in key order.
  const S e0t = e0[t], e1t = e1[t], a_t = a[t], ah_t = ahat[t];
  const S beps = S(C::beta_eps);
  const S dt = e1t - e0t, dr = ah_t - a_t;
  Arr vk, bc, ldec, sig;
  for (Index p0 = 0; p0 < tk; p0 += kChunk) {
    const Index m = tk - p0 < kChunk ? tk - p0 : kChunk;
    vk.resize(m);
    bc.resize(m);
    ldec.resize(m);
    sig.resize(m);
    const S* e0p = e0 + p0;
    const S* e1p = e1 + p0;
    S* vkp = vk.data();
    S* bcp = bc.data();
    const Index n_valid = km ? beta_chunk<true>(m, p0, t, e0p, e1p, km, e0t, dt, beps, vkp, bcp)
                             : beta_chunk<false>(m, p0, t, e0p, e1p, km, e0t, dt, beps, vkp, bcp);
    if (n_valid == 0) continue;
    const Arr diff = a_t - bc;
    const Arr d_b = (diff.square() + S(C::db_eps)).sqrt();                 // d_b = sqrt((a_t - beta)^2 + 1e-4)
    const Arr w = S(1) + gp.lambda_s * (-d_b / gp.tau_s).exp();            // w = 1 + lambda_s exp(-d_b / tau_s)
    const Arr s_beta = (diff / S(C::s_beta_temp)).tanh();                  // s_beta = tanh((a_t - beta) / 0.05)
    const Arr z = -s_beta * (ah_t - bc) / gp.tau_d;                        // L_dec = softplus(z)
    // softplus(z) as PyTorch computes it (linear above the threshold 20); its derivative is sigmoid(z), or 1.
    // log1p(ez) as log(u) ez / (u - 1), u = 1 + ez (exact to a few ulps; Eigen has no vectorised log1p)
    const Arr ez = z.min(S(20)).exp();
    const Arr lu = (S(1) + ez).log();
    const S *ezp = ez.data(), *lup = lu.data(), *zp = z.data(), *dfp = diff.data();
    S* ldp = ldec.data();
    S* sgp = sig.data();
    int n_side = 0;
    for (Index k = 0; k < m; ++k) {  // every division runs unconditionally (by nonzero values): vectorised
      const S u = S(1) + ezp[k], um1 = u - S(1);
      const S q = ezp[k] / (um1 == S(0) ? S(1) : um1);
      const S soft = um1 == S(0) ? ezp[k] : lup[k] * q;
      const bool big = zp[k] > S(20);
      ldp[k] = vkp[k] * (big ? zp[k] : soft);
      sgp[k] = vkp[k] * (big ? S(1) : ezp[k] / u);
      n_side += (vkp[k] * ((ah_t - bcp[k]) * dfp[k]) > S(0)) ? 1 : 0;
    }
    // l_pair = w (ah_t - a_t)^2 + lambda_d softplus(z),  z = -s_beta (ah_t - beta) / tau_d
    sums.spot += (vk * w * (dr * dr) + gp.lambda_d * ldec).sum();
    sums.decision += ldec.sum();
    sums.n_valid += n_valid;
    sums.n_side += n_side;
    g_spot[t] += (vk * (S(2) * w * dr) + gp.lambda_d * sig * (-s_beta / gp.tau_d)).sum();
    if (beta_out)
      for (Index k = 0; k < m; ++k) {
        const bool ok = vk[k] != S(0);
        beta_out[p0 + k] = ok ? bc[k] : nan;
        w_out[p0 + k] = ok ? w[k] : nan;
        db_out[p0 + k] = ok ? d_b[k] : nan;
      }
  }
  return t;
}

}  // namespace detail
}  // namespace dea
