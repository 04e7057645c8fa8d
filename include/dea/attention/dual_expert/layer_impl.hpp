// dea/attention/dual_expert/layer_impl.hpp: the member functions of DualExpertAttention (dual_expert.hpp).
//
// Defined outside the class (not inline), so that an `extern template` declaration keeps other translation units
// from instantiating them. The work is in kernel.hpp / row_block.hpp, on the scalar type and the compile-time DHead
// (Dynamic: the run-time head width); these functions validate, run the projections and hand the core to the kernel.
#pragma once

#include "../dual_expert.hpp"  // (the class; this file is included at its end)

#include "../../core/parallel.hpp"
#include "../../ops/linear.hpp"

#include <cmath>
#include <string>

namespace dea {

template <class S, int Heads, int DHead>
DualExpertAttention<S, Heads, DHead>::DualExpertAttention(Index d_model, Index n_heads, Rng& rng, Options opt)
    : D_(d_model), H_(n_heads), opt_(opt) {
  check(d_model > 0, "DualExpertAttention: d_model must be positive, got ", d_model);
  check(n_heads > 0, "DualExpertAttention: n_heads must be positive, got ", n_heads);
  check(d_model % n_heads == 0, "DualExpertAttention: d_model (", d_model, ") must be divisible by n_heads (",
        n_heads, ")");
  Dh_ = d_model / n_heads;
  check(Heads == Dynamic || Heads == n_heads, "DualExpertAttention: n_heads: expected the compile-time ", Heads,
        ", got ", n_heads);
  check(DHead == Dynamic || DHead == Dh_, "DualExpertAttention: d_model / n_heads: expected the compile-time ",
        DHead, ", got ", Dh_);
  check(opt.dropout >= 0 && opt.dropout < 1, "DualExpertAttention: dropout must be in [0, 1), got ", opt.dropout);
  check(opt.rope_theta >= 0 && std::isfinite(opt.rope_theta),
        "DualExpertAttention: rope_theta must be finite and >= 0 (0: no RoPE), got ", opt.rope_theta);
  check(opt.rope_theta == 0 || Dh_ % 2 == 0, "DualExpertAttention: rope_theta ", opt.rope_theta,
        " (RoPE) needs an even head width d_model / n_heads (rotate-half pairs), got ", Dh_);
  const char* names[4] = {"W_q", "W_k", "W_v", "W_o"};
  // without out_proj W_o holds nothing (at bert-base size it would be 12 unused 768 x 768 matrices and their
  // gradients); reset_parameters still draws its initial values, so the other parameters get the same ones
  for (int p = 0; p < 4; ++p) {
    const Index n = (p < 3 || opt_.out_proj) ? D_ : 0;
    weight_[p] = Param<S>(std::string(names[p]) + ".weight", "main", {n, n});
    bias_[p] = Param<S>(std::string(names[p]) + ".bias", "main", {n});
  }
  W_rel_ = Param<S>("W_rel", "main", {H_, Dh_, Dh_});
  W_gate_ = Param<S>("W_gate", "gate", {H_, 2 * Dh_ + 2});
  c_gate_ = Param<S>("c_gate", "gate", {H_});
  reset_parameters(rng);
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::reset_parameters(Rng& rng) {
  for (int p = 0; p < 4; ++p) {
    if (weight_[p].value.size() > 0) {
      init::xavier_uniform(weight_[p].mat(), rng, D_, D_);
    } else {  // W_o without out_proj: the draws of the layer that has it, discarded
      Mat<S> discard(D_, D_);
      init::xavier_uniform(discard, rng, D_, D_);
    }
    bias_[p].value.setZero();
  }
  for (Index h = 0; h < H_; ++h)
    Eigen::Map<Mat<S>>(W_rel_.value.data() + h * Dh_ * Dh_, Dh_, Dh_) = init::orthogonal<S>(Dh_, rng);
  for (Index h = 0; h < H_; ++h) init::xavier_uniform(W_gate_.mat().row(h), rng, 2 * Dh_ + 2, 1);
  c_gate_.value.setConstant(S(DeaConstants::c_gate_init));
}

template <class S, int Heads, int DHead>
ParamList<S> DualExpertAttention<S, Heads, DHead>::parameters() {
  ParamList<S> out;
  const int nproj = opt_.out_proj ? 4 : 3;
  for (int p = 0; p < nproj; ++p) {
    out.push_back(&weight_[p]);
    if (opt_.bias) out.push_back(&bias_[p]);
  }
  out.push_back(&W_rel_);
  out.push_back(&W_gate_);
  out.push_back(&c_gate_);
  return out;
}

template <class S, int Heads, int DHead>
detail::dex::LayerView<S> DualExpertAttention<S, Heads, DHead>::view() const {
  detail::dex::LayerView<S> L;
  L.D = D_;
  L.H = H_;
  L.Dh = Dh_;
  L.block_q = opt_.block_q;
  L.W_rel = W_rel_.value.data();
  L.W_gate = W_gate_.value.data();
  L.c_gate = c_gate_.value.data();
  L.gate = opt_.gate;
  L.dropout = static_cast<double>(opt_.dropout);
  L.rope_theta = opt_.rope_theta;
  return L;
}

// ---- forward

template <class S, int Heads, int DHead>
Mat<S> DualExpertAttention<S, Heads, DHead>::forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache) {
  Mat<S> y;
  forward(x, in, cache, y);
  return y;
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache, Mat<S>& y) {
  check(in.batch() > 0 && x.rows() == in.batch() * in.q_len(), "DualExpertAttention::forward: x: expected ",
        in.batch() * in.q_len(), " rows (B*T of the attention inputs), got ", x.rows());
  check(in.q_len() == in.k_len(), "DualExpertAttention::forward: self-attention needs inputs with q_len == k_len, got ",
        in.q_len(), " and ", in.k_len());
  forward_impl(x, x, x, in, cache, true, y);
}

template <class S, int Heads, int DHead>
Mat<S> DualExpertAttention<S, Heads, DHead>::forward(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in,
                                                    const AttnInputs<S>& in, Cache& cache) {
  Mat<S> y;
  forward(q_in, k_in, v_in, in, cache, y);
  return y;
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::forward(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in,
                                                  const AttnInputs<S>& in, Cache& cache, Mat<S>& y) {
  check(in.batch() > 0 && q_in.rows() == in.batch() * in.q_len() && k_in.rows() == in.batch() * in.k_len(),
        "DualExpertAttention::forward: q_in/k_in: expected ", in.batch() * in.q_len(), " and ", in.batch() * in.k_len(),
        " rows (B*Tq and B*Tk of the attention inputs), got ", q_in.rows(), " and ", k_in.rows());
  check(v_in.rows() == k_in.rows(), "DualExpertAttention::forward: v_in: expected ", k_in.rows(), " rows, got ",
        v_in.rows());
  forward_impl(q_in, k_in, v_in, in, cache, false, y);
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::forward_impl(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in,
                                                       const AttnInputs<S>& in, Cache& c, bool self, Mat<S>& y) {
  // ---- validation at the boundary (nothing below may throw inside a parallel region)
  const Index B = in.batch(), Tq = in.q_len(), Tk = in.k_len();
  in.require(kSupport, H_, B, Tq, Tk, "DualExpertAttention");
  check(q_in.cols() == D_, "DualExpertAttention::forward: x: expected ", D_, " columns (d_model), got ", q_in.cols());
  if (!self) {
    check(k_in.cols() == D_ && v_in.cols() == D_, "DualExpertAttention::forward: k_in/v_in: expected ", D_,
          " columns, got ", k_in.cols(), " and ", v_in.cols());
    check_finite(k_in, "DualExpertAttention::forward: k_in");
    check_finite(v_in, "DualExpertAttention::forward: v_in");
  }
  check_finite(q_in, self ? "DualExpertAttention::forward: x" : "DualExpertAttention::forward: q_in");
  check(opt_.rope_theta == 0 || Tq == Tk, "DualExpertAttention::forward: rope_theta ", opt_.rope_theta,
        " (RoPE) needs Tq == Tk (query row i and key row i are position i), got Tq = ", Tq, " and Tk = ", Tk);
  const bool dropout_on = in.training() && opt_.dropout > 0;
  check(!dropout_on || in.rng() != nullptr, "DualExpertAttention::forward: training with dropout ", opt_.dropout,
        " needs an Rng (AttnInputs::set_training)");

  // ---- cache set-up: buffers keep their storage from the previous call
  c.loss_gate = 0;
  c.stats = GateStats();
  c.B = B;
  c.Tq = Tq;
  c.Tk = Tk;
  c.self = self;
  c.has_oracle = in.has_oracle();
  c.dropout_on = dropout_on;
  c.gamma_mix = in.gamma_mix();
  c.in = in;
  c.kernel = in.keep_maps() ? DeaKernel::reference : opt_.kernel;
  c.drop_seed = dropout_on ? in.rng()->next_u64() : 0;
  c.q_in = q_in;
  if (!self) {
    c.k_in = k_in;
    c.v_in = v_in;
  }
  // Q = q_in W_q^T + b_q, K = k_in W_k^T + b_k, V = v_in W_v^T + b_v. Q and K are the gate's inputs, and the gate
  // stays fp32: their products are fp32 whatever the product precision (V follows it).
  {
    const ScopedPrecision gate_inputs(Precision::fp32);
    ops::linear_forward<S>(q_in, weight_[0].mat(), opt_.bias ? bias_[0].value.data() : nullptr, c.Q);
    ops::linear_forward<S>(self ? q_in : k_in, weight_[1].mat(), opt_.bias ? bias_[1].value.data() : nullptr, c.K);
  }
  ops::linear_forward<S>(self ? q_in : v_in, weight_[2].mat(), opt_.bias ? bias_[2].value.data() : nullptr, c.V);
  detail::dex::forward_core<S, DHead>(view(), c);
  // y = ctx W_o^T + b_o, or the concatenated heads themselves without an output projection
  if (opt_.out_proj)
    ops::linear_forward<S>(c.ctx, weight_[3].mat(), opt_.bias ? bias_[3].value.data() : nullptr, y);
  else
    y = c.ctx;
}

// ---- incremental decoding

template <class S, int Heads, int DHead>
Mat<S> DualExpertAttention<S, Heads, DHead>::forward_decode(const Mat<S>& x_new, DecodeCache& dc) const {
  namespace dex = detail::dex;
  const Index B = dc.B, D = D_, H = H_, Dh = Dh_;
  check(x_new.cols() == D, "DualExpertAttention::forward_decode: x_new: expected ", D, " columns (d_model), got ",
        x_new.cols());
  check(x_new.rows() > 0 && x_new.rows() % B == 0, "DualExpertAttention::forward_decode: x_new: expected a positive "
        "multiple of the cache's batch ", B, " rows (B*Tn), got ", x_new.rows());
  check(dc.len == 0 || (dc.K.cols() == D && dc.K.rows() == B * dc.cap),
        "DualExpertAttention::forward_decode: cache: expected keys of ", D, " columns for ", B,
        " sequences (a cache of another layer shape?), got ", dc.K.rows(), " x ", dc.K.cols());
  const bool rope = opt_.rope_theta > 0;
  check(dc.len == 0 || dc.rope_theta == opt_.rope_theta, "DualExpertAttention::forward_decode: cache: filled by a "
        "layer with rope_theta ", dc.rope_theta, ", this layer has rope_theta ", opt_.rope_theta);
  check(dc.len == 0 || !rope || dc.Kw.size() == static_cast<std::size_t>(B * H * dc.cap),
        "DualExpertAttention::forward_decode: cache: expected the gate's key terms of ", H, " heads (a cache of "
        "another layer shape?)");
  check_finite(x_new, "DualExpertAttention::forward_decode: x_new");
  const Index Tn = x_new.rows() / B, P0 = dc.len, Tk = P0 + Tn;
  // Q = x W_q^T + b_q, K = x W_k^T + b_k, V = x W_v^T + b_v of the new positions [B*Tn, D]
  {
    const ScopedPrecision gate_inputs(Precision::fp32);  // as in forward: the gate's inputs stay fp32
    ops::linear_forward<S>(x_new, weight_[0].mat(), opt_.bias ? bias_[0].value.data() : nullptr, dc.Q);
    ops::linear_forward<S>(x_new, weight_[1].mat(), opt_.bias ? bias_[1].value.data() : nullptr, dc.Kn);
  }
  ops::linear_forward<S>(x_new, weight_[2].mat(), opt_.bias ? bias_[2].value.data() : nullptr, dc.Vn);
  dc.rope_theta = opt_.rope_theta;
  // append them: sequence b's rows [P0, Tk) of K, V (storage of cap rows per sequence, grown by doubling)
  if (Tk > dc.cap) {
    Index cap = dc.cap * 2;
    if (cap < Tk) cap = Tk;
    if (cap < 16) cap = 16;
    Mat<S> K(B * cap, D), V(B * cap, D);
    for (Index b = 0; b < B && P0 > 0; ++b) {
      K.middleRows(b * cap, P0) = dc.K.middleRows(b * dc.cap, P0);
      V.middleRows(b * cap, P0) = dc.V.middleRows(b * dc.cap, P0);
    }
    dc.K.swap(K);
    dc.V.swap(V);
    if (rope) {
      AlignedVec<S> Kw(static_cast<std::size_t>(B * H * cap));
      for (Index bh = 0; bh < B * H && P0 > 0; ++bh)
        std::copy(dc.Kw.data() + bh * dc.cap, dc.Kw.data() + bh * dc.cap + P0, Kw.data() + bh * cap);
      dc.Kw.swap(Kw);
    }
    dc.cap = cap;
  }
  if (rope && dc.Kw.size() != static_cast<std::size_t>(B * H * dc.cap))  // (only when empty: checked above)
    dc.Kw.resize(static_cast<std::size_t>(B * H * dc.cap));
  if (rope) {
    // the new keys: their gate terms K_j.w_k (unrotated), then rho_j K_j at positions P0 .. Tk - 1 (the cache
    // holds the experts' rotated keys); the queries are rotated by the kernel (q_offset = P0)
    if (dc.rope.head_dim() != Dh || dc.rope.theta() != opt_.rope_theta)
      dc.rope = ops::RopeTable<S>(Dh, opt_.rope_theta);
    dc.rope.reserve(Tk);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h) {
        S* kn = dc.Kn.data() + b * Tn * D + h * Dh;
        const S* wk = W_gate_.value.data() + h * (2 * Dh + 2) + Dh;
        S* kw = dc.Kw.data() + (b * H + h) * dc.cap + P0;
        for (Index r = 0; r < Tn; ++r) kw[r] = dex::dot(kn + r * D, wk, Dh);
        dex::rope_rows(dc.rope, P0, kn, Tn, D, S(1));
      }
  }
  for (Index b = 0; b < B; ++b) {
    dc.K.middleRows(b * dc.cap + P0, Tn) = dc.Kn.middleRows(b * Tn, Tn);
    dc.V.middleRows(b * dc.cap + P0, Tn) = dc.Vn.middleRows(b * Tn, Tn);
  }
  dc.R.resize(B * Tn, D);
  dc.ctx.resize(B * Tn, D);
  // the core: each (b, h) pair runs the row-block kernel on its Tn new rows against its Tk keys, causal with
  // q_offset = P0 (row r sees keys [0, P0 + r]), every key real, no oracle, no dropout
  const detail::dex::LayerView<S> L = view();
  const Index bq = dex::block_rows<S>(L.block_q, Tn, Tk);
  const int nt = num_threads() < 1 ? 1 : num_threads();
  const Index per = dex::Scratch<S>::size(bq, Tk, Dh);
  if (dc.scratch.size() < static_cast<std::size_t>(nt * per)) dc.scratch.resize(static_cast<std::size_t>(nt * per));
  const bool par = double(B * H) * double(Tn) * double(Tk) * double(4 * Dh + 20) > kParallelMinFlops;
  const dex::PairRows<S> rows{dc.Q.data(), dc.K.data(), dc.V.data(), dc.R.data(), D, Tn, dc.cap};
  parallel_for(B * H, [&](Index bh) {
    const dex::HeadParams<S> hp = L.head(bh % H);
    // every key real (no key mask)
    dex::Pair<S, DHead> p = dex::make_pair<S, DHead>(bh, H, Tn, Tk, hp, rows, dex::PairKeys<S>::from_bytes(nullptr),
                                                    dc.scratch.data() + dex::thread_index() * per, bq);
    p.causal = true;
    p.q_offset = P0;
    if (rope) {  // the cached keys are rotated already; the gate's key terms come from the cache
      p.rope = &dc.rope;
      p.keys_rotated = true;
      p.key_gate = dc.Kw.data() + bh * dc.cap;
    }
    p.setup(false);
    const dex::RowStats<S> rs;    // nothing kept (forward only)
    const dex::BlockMaps<S> mp;   // every [n, Tk] buffer in the scratch
    S* ctx = dc.ctx.data() + p.b * Tn * D + p.h * Dh;
    for (Index i0 = 0; i0 < Tn; i0 += bq) p.forward_block(i0, std::min(bq, Tn - i0), mp, rs, nullptr, ctx);
  }, par);
  dc.len = Tk;
  // y = ctx W_o^T + b_o, or the concatenated heads without an output projection
  Mat<S> y;
  if (opt_.out_proj)
    ops::linear_forward<S>(dc.ctx, weight_[3].mat(), opt_.bias ? bias_[3].value.data() : nullptr, y);
  else
    y = dc.ctx;
  return y;
}

// ---- backward

template <class S, int Heads, int DHead>
Mat<S> DualExpertAttention<S, Heads, DHead>::backward(const Mat<S>& dy, Cache& cache) {
  check(cache.B > 0, "DualExpertAttention::backward: the cache holds no forward pass");
  check(cache.self, "DualExpertAttention::backward: the forward was cross-attention; use backward_inputs");
  Mat<S> dx;
  backward_impl(dy, cache, nullptr, &dx);
  return dx;
}

template <class S, int Heads, int DHead>
auto DualExpertAttention<S, Heads, DHead>::backward_inputs(const Mat<S>& dy, Cache& cache) -> InputGrads {
  InputGrads g;
  backward_impl(dy, cache, &g, nullptr);
  return g;
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::backward_impl(const Mat<S>& dy, Cache& c, InputGrads* g, Mat<S>* dx) {
  check(c.B > 0, "DualExpertAttention::backward: the cache holds no forward pass");
  check_matrix(dy, c.B * c.Tq, D_, "DualExpertAttention::backward: dy");
  const Index B = c.B, Tq = c.Tq, Tk = c.Tk, H = H_, Dh = Dh_;
  // output projection: y = ctx W_o^T + b_o
  Mat<S> dctx;
  if (opt_.out_proj)
    ops::linear_backward<S>(dy, c.ctx, weight_[3].mat(), weight_[3].grad_mat(), opt_.bias ? bias_[3].grad.data() : nullptr,
                            &dctx);
  else
    dctx = dy;
  Mat<S> dQ(B * Tq, D_), dK(B * Tk, D_), dV(B * Tk, D_);
  Vec<S> dwrel_part(B * H * Dh * Dh);  // every element written by the kernel
  detail::dex::backward_core<S, DHead>(view(), c, dctx, dQ, dK, dV, dwrel_part.data());
  // W_rel gradient: per-pair partials summed in the fixed order b = 0..B-1
  parallel_for(H, [&](Index h) {
    Eigen::Map<Vec<S>> gw(W_rel_.grad.data() + h * Dh * Dh, Dh * Dh);
    for (Index b = 0; b < B; ++b) gw += Eigen::Map<const Vec<S>>(dwrel_part.data() + (b * H + h) * Dh * Dh, Dh * Dh);
  }, double(B * H) * double(Dh * Dh) > kParallelMinFlops);
  // projections: Q = q_in W_q^T + b_q, etc. Self-attention (dx): dx = dQ W_q, then dx += dK W_k and dx += dV W_v
  // in place, which is (dQ W_q + dK W_k) + dV W_v without two [B*T, D] temporaries and their passes.
  const Mat<S>& kin = c.self ? c.q_in : c.k_in;
  const Mat<S>& vin = c.self ? c.q_in : c.v_in;
  ops::linear_backward<S>(dQ, c.q_in, weight_[0].mat(), weight_[0].grad_mat(), opt_.bias ? bias_[0].grad.data() : nullptr,
                          dx ? dx : &g->dq);
  ops::linear_backward<S>(dK, kin, weight_[1].mat(), weight_[1].grad_mat(), opt_.bias ? bias_[1].grad.data() : nullptr,
                          dx ? dx : &g->dk, dx != nullptr);
  ops::linear_backward<S>(dV, vin, weight_[2].mat(), weight_[2].grad_mat(), opt_.bias ? bias_[2].grad.data() : nullptr,
                          dx ? dx : &g->dv, dx != nullptr);
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::backward_gate(Cache& c, S scale) {
  if (!c.has_oracle) return;
  detail::dex::gate_grads<S>(view(), c, scale, W_gate_.grad.data(), c_gate_.grad.data());
}

template <class S, int Heads, int DHead>
auto DualExpertAttention<S, Heads, DHead>::verify_gradient_isolation(const Mat<S>& x, const AttnInputs<S>& in)
    -> IsolationReport {
  IsolationReport r;
  Cache cache;
  zero_grad();
  const Mat<S> y = forward(x, in, cache);
  backward(S(2) / S(y.size()) * y, cache);  // d mean(y^2) / dy
  for (Param<S>* p : parameters()) {
    const double s = static_cast<double>(p->grad.cwiseAbs().sum());
    if (p->group == "gate") r.task_gate_grad += s;
    if (p == &W_rel_) r.task_rel_grad += s;
  }
  zero_grad();
  backward_gate(cache);
  for (Param<S>* p : parameters()) {
    const double s = static_cast<double>(p->grad.cwiseAbs().sum());
    (p->group == "gate" ? r.gate_gate_grad : r.gate_main_grad) += s;
  }
  zero_grad();
  r.ok = r.task_gate_grad == 0 && r.task_rel_grad > 0 && r.gate_main_grad == 0 && r.gate_gate_grad > 0;
  return r;
}

}  // namespace dea
