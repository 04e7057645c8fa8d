// dea/lm/tr_moe.hpp: the TR-MoE MLP (`mlp_type = "tr_hash_engine"`) of the decoder-only language model.
//
// A re-implementation, with a hand-derived backward pass, of `TRHashEngineMLP` / `TRHashEngine` of the public
// complexity-framework (commit 17371ce5, complexity/core/mlp/tr_hash_engine.py, complexity/tr_hash/), stated in
// docs/lm.md (TR-MoE MLP). For a token with input x [D] and id t:
//
//   t^ = clamp(t, 0, V-1)                                  ids outside the vocabulary are clamped, not rejected
//   e_j = R(t^, j), j = 0..k-1                             fixed per-layer route table (route_table.hpp)
//   a = (1) for k = 1; else a_0 = p, a_j = (1-p)/(k-1)     p = 1/k unless top_k_primary_weight is set
//   f_e(x) = (silu(x G_e) .* (x U_e)) Dn_e                 expert e: G_e, U_e [D, w], Dn_e [w, D], w = I / E
//   f_s(x) = (silu(x W_g^T) .* (x W_u^T)) W_d^T            shared SwiGLU: W_g, W_u [W_s, D], W_d [D, W_s]
//   y = s_s f_s(x) + s_r sum_j a_j f_{e_j}(x)              s_s, s_r: fixed output scales
//
// There is no learned router, no gate, no capacity limit and no auxiliary loss: the route choice is integer and
// carries no gradient; gradients flow to x and to every expert and shared weight. A slot of weight 0 (p = 1 with
// k > 1) contributes nothing and is not evaluated, so its expert gets no gradient from it.
//
// Slot weights are computed in double from the exact decimal values and then cast to S. The reference holds them
// in a float32 buffer, so in double its 0.7 acts as 0.699999988 (a difference <= 2.3e-8 relative); in float
// the two agree.
//
// Speed: every expert runs only on its own tokens. forward groups the (token, slot) pairs by expert (expert order,
// then token order, then slot order), gathers their rows into one [P, D] block, runs per expert one GEMM each for
// the gate and up maps, SwiGLU and one GEMM for the down map, and then sums each token's slots in slot order.
// The products are ops/gemm.hpp's (threaded over row blocks, results independent of the thread count) and the
// gathers and sums are parallel over rows with disjoint writes, so every output and every gradient is bitwise
// the same for any number of threads.
#pragma once

#include "../core/init.hpp"
#include "../core/param.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/gemm.hpp"
#include "../ops/linear.hpp"
#include "../ops/swiglu.hpp"
#include "bf16_weights.hpp"
#include "route_table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dea {
namespace lm {

/// Construction options, named after the reference's MLPConfig fields, with its defaults where it has them.
struct TrMoeOptions {
  Index num_experts = 1;                 ///< E in {1, 2, 4, 8, 16}
  Index top_k = 1;                       ///< k in {1, 2, 4}, k <= E
  Index intermediate_size = 0;           ///< I: total routed width, > 0 and divisible by E (expert width w = I / E)
  bool shared_expert = true;             ///< a shared SwiGLU branch on every token
  Index shared_intermediate_size = 0;    ///< W_s when shared_expert; 0 = I (the reference's None)
  double top_k_primary_weight = -1;      ///< p: negative = None (uniform 1/k); otherwise clamped to [0, 1]
  double shared_output_scale = 1.0;      ///< s_s (fixed, not a parameter)
  double routed_output_scale = 1.0;      ///< s_r (fixed, not a parameter)
  std::string routing_strategy = "modulo_cyclic";  ///< token_id_balanced_hash, modulo_cyclic or modulo
  Index layer_idx = 0;                   ///< l: selects the layer's route table
  Index vocab_size = 32000;              ///< V of the route table
};

/// Telemetry of the last forward call (the reference's training_telemetry(), plus the per-expert load).
struct TrMoeTelemetry {
  double topk_w = 0;                     ///< a_0, the primary slot weight (the exact value, in double)
  Index active_num_experts = 0;          ///< E (dea has no runtime shrinking: always all experts)
  Index active_expert_width = 0;         ///< w
  std::vector<Index> expert_slot_counts;  ///< (token, slot) pairs routed to each expert
  std::vector<double> expert_share;      ///< expert_slot_counts / (N k)

  /// (key, value) pairs: the reference's telemetry names, then expert_share_{e}.
  std::vector<std::pair<std::string, double>> items() const {
    std::vector<std::pair<std::string, double>> out = {
        {"topk_w", topk_w},
        {"active_num_experts", static_cast<double>(active_num_experts)},
        {"active_expert_width", static_cast<double>(active_expert_width)}};
    for (std::size_t e = 0; e < expert_share.size(); ++e)
      out.emplace_back("expert_share_" + std::to_string(e), expert_share[e]);
    return out;
  }
};

namespace detail {

/// C += A B^T, C [M, N], A [M, K], B [N, K]: the packed product when it applies, otherwise Eigen on the fixed row
/// blocks (as ops::gemm_add_into does for A B); the result does not depend on the thread count.
template <class DA, class DB, class DC>
void tr_moe_gemm_nt_add(const Eigen::MatrixBase<DA>& A, const Eigen::MatrixBase<DB>& B, Eigen::MatrixBase<DC>& C) {
  check_matrix(C, A.rows(), B.rows(), "tr_moe_gemm_nt_add: C");
  if (ops::gemm_impl::try_packed<false, true>(A, B, C, true, nullptr)) return;
  ops::for_row_blocks(A.rows(),
                      [&](Index r0, Index nr) { C.middleRows(r0, nr).noalias() += A.middleRows(r0, nr) * B.transpose(); });
}

}  // namespace detail

/// The TR-MoE MLP of one decoder layer. Parameter names are relative to the MLP module (`layers.{l}.mlp.`).
template <class S>
class TrMoeMlp {
public:
  using Scalar = S;
  using Options = TrMoeOptions;
  using Telemetry = TrMoeTelemetry;
  using RouteIdx = Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// What forward keeps for backward (and exposes for tests). N rows, P = evaluated (token, slot) pairs.
  struct Cache {
    Mat<S> x;                        ///< [N, D] input
    RouteIdx routes;                 ///< [N, k] e_j of every token (clamped ids), slot order
    Mat<S> gs, us;                   ///< [N, W_s] shared gate / up pre-activations x W_g^T, x W_u^T
    std::vector<Index> offset;       ///< [E + 1] rows of expert e in the pair order: offset[e] .. offset[e+1]-1
    std::vector<Index> pair_token;   ///< [P] token of each pair, pairs ordered by (expert, token, slot)
    std::vector<Index> pair_slot;    ///< [P] slot of each pair
    std::vector<Index> pair_of;      ///< [N k] pair row of (token n, slot j) at n k + j; -1: weight 0, not evaluated
    Mat<S> g, u;                     ///< [P, w] expert gate / up pre-activations x G_e, x U_e
    bool empty() const { return x.rows() == 0; }
  };

  /// Builds the MLP and draws its parameters: expert_gate, expert_up, shared gate and up N(0, init_std^2);
  /// expert_down and shared_down N(0, down_std^2) (the host model passes 0.02 / sqrt(2 L) for the down maps).
  /// Builds the route table of layer opt.layer_idx. Throws dea::Error naming a bad option.
  TrMoeMlp(Index d_model, TrMoeOptions opt, Rng& rng, double init_std = 0.02, double down_std = 0.02)
      : opt_(std::move(opt)), D_(d_model) {
    check(d_model > 0, "TrMoeMlp: d_model must be positive, got ", d_model);
    strategy_ = parse_routing_strategy(opt_.routing_strategy);
    check_route_sizes(opt_.vocab_size, opt_.num_experts, opt_.top_k, opt_.layer_idx, "TrMoeMlp");
    check(opt_.intermediate_size > 0, "TrMoeMlp: intermediate_size must be positive, got ", opt_.intermediate_size);
    check(opt_.intermediate_size % opt_.num_experts == 0, "TrMoeMlp: intermediate_size (", opt_.intermediate_size,
          ") must be divisible by num_experts (", opt_.num_experts, ")");
    check(opt_.shared_intermediate_size >= 0, "TrMoeMlp: shared_intermediate_size must be >= 0 (0 = intermediate_size), got ",
          opt_.shared_intermediate_size);
    check(!std::isnan(opt_.top_k_primary_weight), "TrMoeMlp: top_k_primary_weight must not be NaN");
    check(std::isfinite(opt_.shared_output_scale), "TrMoeMlp: shared_output_scale must be finite, got ",
          opt_.shared_output_scale);
    check(std::isfinite(opt_.routed_output_scale), "TrMoeMlp: routed_output_scale must be finite, got ",
          opt_.routed_output_scale);
    check(init_std >= 0 && std::isfinite(init_std), "TrMoeMlp: init_std must be finite and >= 0, got ", init_std);
    check(down_std >= 0 && std::isfinite(down_std), "TrMoeMlp: down_std must be finite and >= 0, got ", down_std);
    E_ = opt_.num_experts;
    k_ = opt_.top_k;
    w_ = opt_.intermediate_size / E_;
    Ws_ = opt_.shared_expert ? (opt_.shared_intermediate_size > 0 ? opt_.shared_intermediate_size : opt_.intermediate_size)
                             : 0;
    const Index D = D_;
    expert_gate_ = Param<S>("engine.expert_gate", "main", {E_, D, w_});
    expert_up_ = Param<S>("engine.expert_up", "main", {E_, D, w_});
    expert_down_ = Param<S>("engine.expert_down", "main", {E_, w_, D});
    init::normal(expert_gate_.value, rng, 0.0, init_std);
    init::normal(expert_up_.value, rng, 0.0, init_std);
    init::normal(expert_down_.value, rng, 0.0, down_std);
    if (Ws_ > 0) {
      shared_gate_ = Param<S>("engine.shared_gate.weight", "main", {Ws_, D});
      shared_up_ = Param<S>("engine.shared_up.weight", "main", {Ws_, D});
      shared_down_ = Param<S>("engine.shared_down.weight", "main", {D, Ws_});
      init::normal(shared_gate_.mat(), rng, 0.0, init_std);
      init::normal(shared_up_.mat(), rng, 0.0, init_std);
      init::normal(shared_down_.mat(), rng, 0.0, down_std);
    }
    set_top_k_primary_weight(opt_.top_k_primary_weight);
    table_ = generated_route_table();
  }

  // ---------------------------------------------------------------------------------------------------------
  // Introspection

  const Options& options() const { return opt_; }
  Index d_model() const { return D_; }
  Index num_experts() const { return E_; }
  Index top_k() const { return k_; }
  Index expert_width() const { return w_; }
  /// W_s: 0 without a shared expert.
  Index shared_width() const { return Ws_; }
  Index vocab_size() const { return opt_.vocab_size; }
  RoutingStrategy routing_strategy() const { return strategy_; }

  /// The slot weights a [k] in double (the exact decimal values).
  const std::vector<double>& route_weights() const { return a_; }

  /// Sets p = top_k_primary_weight (negative = None -> 1/k, else clamped to [0, 1]) and recomputes a;
  /// for curricula. Ignored for k = 1 (a = 1).
  void set_top_k_primary_weight(double p) {
    check(!std::isnan(p), "TrMoeMlp::set_top_k_primary_weight: p must not be NaN");
    opt_.top_k_primary_weight = p;
    a_.assign(static_cast<std::size_t>(k_), 1.0 / static_cast<double>(k_));
    if (k_ > 1 && p >= 0) {
      const double pc = std::min(1.0, p);
      a_[0] = pc;
      for (Index j = 1; j < k_; ++j) a_[static_cast<std::size_t>(j)] = (1.0 - pc) / static_cast<double>(k_ - 1);
    }
  }

  /// Telemetry of the last forward call.
  const Telemetry& telemetry() const { return telemetry_; }

  // ---------------------------------------------------------------------------------------------------------
  // Route table

  /// The table in use, per-token rows [V, k].
  const RouteTable& route_table() const { return table_; }

  /// The table route_table.hpp builds for this layer's options (what a fresh reference module holds).
  RouteTable generated_route_table() const {
    return build_route_table(strategy_, opt_.vocab_size, E_, k_, opt_.layer_idx);
  }

  /// True when the table in use equals generated_route_table() (a checkpoint's table may differ).
  bool route_table_is_generated() const { return table_ == generated_route_table(); }

  /// Installs a table [V, k] after validate_route_table (shape, 0 <= e < E, no repeated expert in a row).
  void set_route_table(const RouteTable& R) {
    validate_route_table(R, opt_.vocab_size, E_, k_, "TrMoeMlp::set_route_table: table");
    table_ = R;
  }

  /// Installs a checkpoint's buffer `engine.route_table` [k, V] (slot-major int64), validated as set_route_table.
  void load_route_table(const std::int64_t* data, const Shape& shape) {
    table_ = route_table_from_buffer(data, shape, opt_.vocab_size, E_, k_, "TrMoeMlp::load_route_table: engine.route_table");
  }
  void load_route_table(const Tensor<std::int64_t>& buffer) { load_route_table(buffer.ptr(), buffer.shape); }

  /// The table in use in the framework's buffer layout [k, V] (int64), for a checkpoint's `engine.route_table`.
  std::vector<std::int64_t> route_table_buffer() const { return ::dea::lm::route_table_buffer(table_); }

  /// Rebuilds the table from the options (undoes load_route_table / set_route_table).
  void reset_route_table() { table_ = generated_route_table(); }

  // ---------------------------------------------------------------------------------------------------------
  // Parameters

  /// engine.expert_gate [E, D, w], engine.expert_up [E, D, w], engine.expert_down [E, w, D] (input-major, flat
  /// row-major: expert e's [D, w] block starts at e D w) and, with a shared expert, engine.shared_gate.weight,
  /// engine.shared_up.weight [W_s, D] and engine.shared_down.weight [D, W_s] (nn.Linear layout). Group "main".
  ParamList<S> parameters() {
    ParamList<S> l = {&expert_gate_, &expert_up_, &expert_down_};
    if (Ws_ > 0) {
      l.push_back(&shared_gate_);
      l.push_back(&shared_up_);
      l.push_back(&shared_down_);
    }
    return l;
  }

  void zero_grad() { dea::zero_grad(parameters()); }

  /// Stores the experts' and the shared expert's weights as bf16 (lm/bf16_weights.hpp) and frees their float values
  /// and gradients: forward then runs bf16 products and backward throws. float models only. Returns the bytes of the
  /// bf16 weights.
  std::size_t store_bf16_weights() {
    if constexpr (std::is_same<S, float>::value) {
      if (!w16_) {
        auto w = std::make_shared<W16>();
        for (Index e = 0; e < E_; ++e) {
          w->gate.push_back(pack_rhs_bf16(gate_(e).data(), D_, w_));
          w->up.push_back(pack_rhs_bf16(up_(e).data(), D_, w_));
          w->down.push_back(pack_rhs_bf16(down_(e).data(), w_, D_));
        }
        release_float(expert_gate_);
        release_float(expert_up_);
        release_float(expert_down_);
        if (Ws_ > 0) {
          w->shared_gate = pack_linear_bf16(shared_gate_.value.data(), Ws_, D_);
          w->shared_up = pack_linear_bf16(shared_up_.value.data(), Ws_, D_);
          w->shared_down = pack_linear_bf16(shared_down_.value.data(), D_, Ws_);
          release_float(shared_gate_);
          release_float(shared_up_);
          release_float(shared_down_);
        }
        w16_ = std::move(w);
      }
      return w16_->bytes();
    } else {
      check(false, "TrMoeMlp::store_bf16_weights: float models only");
      return 0;
    }
  }
  bool has_bf16_weights() const { return w16_ != nullptr; }
  /// Bytes of the weights kept: float values and bf16 copies (the route table not counted).
  std::size_t weight_bytes() const {
    std::size_t n = 0;
    for (const Param<S>* p : {&expert_gate_, &expert_up_, &expert_down_, &shared_gate_, &shared_up_, &shared_down_})
      n += value_bytes(*p);
    return n + (w16_ ? w16_->bytes() : 0);
  }

  // ---------------------------------------------------------------------------------------------------------
  // Forward / backward

  /// y [N, D] from x [N, D] and the N routing ids (any int64: clamped to [0, V-1]). Fills `c` for backward and
  /// updates telemetry().
  Mat<S> forward(const Mat<S>& x, const std::int64_t* token_ids, Cache& c);

  /// Backward of forward: dy [N, D]. ADDS into every parameter gradient, returns dx [N, D].
  Mat<S> backward(const Mat<S>& dy, const Cache& c);

private:
  ConstMatMap<S> gate_(Index e) const { return {expert_gate_.value.data() + e * D_ * w_, D_, w_}; }
  ConstMatMap<S> up_(Index e) const { return {expert_up_.value.data() + e * D_ * w_, D_, w_}; }
  ConstMatMap<S> down_(Index e) const { return {expert_down_.value.data() + e * w_ * D_, w_, D_}; }

  /// h = swiglu(g, u) for rows [r0, r0 + m) of the [P, w] pair buffers, over fixed row blocks.
  static void swiglu_rows_(const Mat<S>& g, const Mat<S>& u, Mat<S>& h, Index r0, Index m) {
    ops::for_row_blocks(m, [&](Index b0, Index nb) {
      ops::swiglu_forward(g.middleRows(r0 + b0, nb), u.middleRows(r0 + b0, nb), h.middleRows(r0 + b0, nb));
    });
  }

  Options opt_;
  RoutingStrategy strategy_ = RoutingStrategy::modulo_cyclic;
  Index D_ = 0, E_ = 1, k_ = 1, w_ = 0, Ws_ = 0;
  std::vector<double> a_;
  RouteTable table_;
  Param<S> expert_gate_, expert_up_, expert_down_, shared_gate_, shared_up_, shared_down_;
  Telemetry telemetry_;
  /// The weights as bf16 (store_bf16_weights), shared by copies: per expert G_e, U_e [D, w], Dn_e [w, D] as right-hand
  /// sides; the shared expert's three Linears.
  struct W16 {
    std::vector<ops::packed::Bf16Matrix> gate, up, down;
    ops::packed::Bf16Matrix shared_gate, shared_up, shared_down;
    std::size_t bytes() const {
      std::size_t n = shared_gate.bytes() + shared_up.bytes() + shared_down.bytes();
      for (const auto* v : {&gate, &up, &down})
        for (const auto& m : *v) n += m.bytes();
      return n;
    }
  };
  std::shared_ptr<const W16> w16_;

  /// C [m, cols] = A B_e for the expert's weight (float, or its bf16 copy), A and C with contiguous rows.
  template <class DA, class DC>
  void expert_product_(const Eigen::MatrixBase<DA>& A, ConstMatMap<S> (TrMoeMlp::*weight)(Index) const,
                       const std::vector<ops::packed::Bf16Matrix> W16::*packed, Index e,
                       Eigen::MatrixBase<DC>& C) const {
    if constexpr (std::is_same<S, float>::value) {
      if (w16_) {
        const auto& a = A.derived();
        auto& c = C.derived();
        ops::packed::gemm_bf16(a.rows(), ops::packed::View<float>{a.data(), Index(a.outerStride()), 1},
                               ((*w16_).*packed)[static_cast<std::size_t>(e)], c.data(), Index(c.outerStride()), false);
        return;
      }
    }
    ops::gemm_into(A, (this->*weight)(e), C);
  }
  /// y = x W^T for a shared-expert Linear (float, or its bf16 copy).
  void shared_product_(const Mat<S>& x, const Param<S>& W, const ops::packed::Bf16Matrix W16::*packed,
                       Mat<S>& y) const {
    if constexpr (std::is_same<S, float>::value) {
      if (w16_) return linear_bf16(x, (*w16_).*packed, y);
    }
    ops::linear_forward<S>(x, W.mat(), nullptr, y);
  }
};

// ---- forward and backward, defined outside the class ----

template <class S>
Mat<S> TrMoeMlp<S>::forward(const Mat<S>& x, const std::int64_t* token_ids, Cache& c) {
  check(x.rows() > 0, "TrMoeMlp::forward: x must have at least one row, got ", x.rows());
  check(x.cols() == D_, "TrMoeMlp::forward: x expected ", D_, " columns (d_model), got shape [", x.rows(), ", ",
        x.cols(), "]");
  check(token_ids != nullptr, "TrMoeMlp::forward: token_ids must not be null");
  check_finite(x, "TrMoeMlp::forward x");
  const Index N = x.rows(), D = D_, E = E_, k = k_, w = w_;
  const std::int64_t V = static_cast<std::int64_t>(opt_.vocab_size);
  c.x = x;

  // Routes: e_j = R(clamp(t, 0, V-1), j)
  c.routes.resize(N, k);
  for (Index n = 0; n < N; ++n) {
    const std::int64_t t = std::min<std::int64_t>(std::max<std::int64_t>(token_ids[n], 0), V - 1);
    for (Index j = 0; j < k; ++j) c.routes(n, j) = table_(static_cast<Index>(t), j);
  }

  // Pairs grouped by expert (counting sort: expert, then token, then slot); slots of weight 0 are skipped.
  std::vector<Index> count(static_cast<std::size_t>(E), 0), active(static_cast<std::size_t>(E), 0);
  for (Index n = 0; n < N; ++n)
    for (Index j = 0; j < k; ++j) {
      ++count[static_cast<std::size_t>(c.routes(n, j))];
      if (a_[static_cast<std::size_t>(j)] != 0.0) ++active[static_cast<std::size_t>(c.routes(n, j))];
    }
  c.offset.assign(static_cast<std::size_t>(E + 1), 0);
  for (Index e = 0; e < E; ++e) c.offset[static_cast<std::size_t>(e + 1)] = c.offset[static_cast<std::size_t>(e)] + active[static_cast<std::size_t>(e)];
  const Index P = c.offset[static_cast<std::size_t>(E)];
  c.pair_token.assign(static_cast<std::size_t>(P), 0);
  c.pair_slot.assign(static_cast<std::size_t>(P), 0);
  c.pair_of.assign(static_cast<std::size_t>(N * k), -1);
  {
    std::vector<Index> cursor(c.offset.begin(), c.offset.end() - 1);
    for (Index n = 0; n < N; ++n)
      for (Index j = 0; j < k; ++j) {
        if (a_[static_cast<std::size_t>(j)] == 0.0) continue;
        const Index p = cursor[static_cast<std::size_t>(c.routes(n, j))]++;
        c.pair_token[static_cast<std::size_t>(p)] = n;
        c.pair_slot[static_cast<std::size_t>(p)] = j;
        c.pair_of[static_cast<std::size_t>(n * k + j)] = p;
      }
  }

  // Routed experts on their own rows: Xs [P, D] -> g, u [P, w] -> h [P, w] -> Ys [P, D]
  Mat<S> Xs(P, D);
  parallel_for(P, [&](Index p) { Xs.row(p) = x.row(c.pair_token[static_cast<std::size_t>(p)]); },
               static_cast<double>(P * D) >= kParallelMinFlops);  // gather the pairs' rows
  c.g.resize(P, w);
  c.u.resize(P, w);
  Mat<S> h(P, w), Ys(P, D);
  for (Index e = 0; e < E; ++e) {
    const Index o = c.offset[static_cast<std::size_t>(e)], m = c.offset[static_cast<std::size_t>(e + 1)] - o;
    if (m == 0) continue;
    const auto Xe = Xs.middleRows(o, m);
    auto ge = c.g.middleRows(o, m);
    auto ue = c.u.middleRows(o, m);
    auto he = h.middleRows(o, m);
    auto ye = Ys.middleRows(o, m);
    expert_product_(Xe, &TrMoeMlp::gate_, &W16::gate, e, ge);         // g = x G_e        [m, w]
    expert_product_(Xe, &TrMoeMlp::up_, &W16::up, e, ue);             // u = x U_e        [m, w]
    swiglu_rows_(c.g, c.u, h, o, m);                                  // h = silu(g) .* u [m, w]
    expert_product_(he, &TrMoeMlp::down_, &W16::down, e, ye);         // f_e = h Dn_e     [m, D]
  }

  // Shared SwiGLU: y = s_s (silu(x W_g^T) .* x W_u^T) W_d^T
  Mat<S> y;
  if (Ws_ > 0) {
    shared_product_(x, shared_gate_, &W16::shared_gate, c.gs);         // gs = x W_g^T     [N, W_s]
    shared_product_(x, shared_up_, &W16::shared_up, c.us);             // us = x W_u^T     [N, W_s]
    Mat<S> hs(N, Ws_);
    ops::for_row_blocks(N, [&](Index r0, Index nr) {                  // hs = silu(gs) .* us
      ops::swiglu_forward(c.gs.middleRows(r0, nr), c.us.middleRows(r0, nr), hs.middleRows(r0, nr));
    });
    shared_product_(hs, shared_down_, &W16::shared_down, y);           // f_s = hs W_d^T   [N, D]
    const S ss = static_cast<S>(opt_.shared_output_scale);
    if (ss != S(1)) y *= ss;                                          // y = s_s f_s
  } else {
    c.gs.resize(0, 0);
    c.us.resize(0, 0);
    y = Mat<S>::Zero(N, D);
  }

  // y += s_r sum_j a_j f_{e_j}, each token's slots summed in slot order
  const S sr = static_cast<S>(opt_.routed_output_scale);
  parallel_for(N, [&](Index n) {
    RowVec<S> r = RowVec<S>::Zero(D);
    for (Index j = 0; j < k; ++j) {
      const Index p = c.pair_of[static_cast<std::size_t>(n * k + j)];
      if (p >= 0) r.noalias() += static_cast<S>(a_[static_cast<std::size_t>(j)]) * Ys.row(p);
    }
    y.row(n).noalias() += sr * r;
  }, static_cast<double>(N * k * D) >= kParallelMinFlops);

  telemetry_.topk_w = a_[0];
  telemetry_.active_num_experts = E;
  telemetry_.active_expert_width = w;
  telemetry_.expert_slot_counts = count;
  telemetry_.expert_share.assign(static_cast<std::size_t>(E), 0.0);
  for (Index e = 0; e < E; ++e)
    telemetry_.expert_share[static_cast<std::size_t>(e)] =
        static_cast<double>(count[static_cast<std::size_t>(e)]) / static_cast<double>(N * k);
  return y;
}

template <class S>
Mat<S> TrMoeMlp<S>::backward(const Mat<S>& dy, const Cache& c) {
  check(!w16_, "TrMoeMlp::backward: the weights are stored as bf16 for inference");
  check(!c.empty(), "TrMoeMlp::backward: the cache is empty (run forward first)");
  const Index N = c.x.rows(), D = D_, E = E_, k = k_, w = w_;
  check(c.routes.rows() == N && c.routes.cols() == k && static_cast<Index>(c.offset.size()) == E + 1,
        "TrMoeMlp::backward: the cache does not belong to this MLP (num_experts ", E, ", top_k ", k, ")");
  check_matrix(dy, N, D, "TrMoeMlp::backward dy");
  check_finite(dy, "TrMoeMlp::backward dy");
  const Index P = c.offset[static_cast<std::size_t>(E)];
  const S sr = static_cast<S>(opt_.routed_output_scale);

  // Shared branch
  Mat<S> dx;
  if (Ws_ > 0) {
    Mat<S> hs(N, Ws_);
    ops::for_row_blocks(N, [&](Index r0, Index nr) {                  // recompute hs = silu(gs) .* us
      ops::swiglu_forward(c.gs.middleRows(r0, nr), c.us.middleRows(r0, nr), hs.middleRows(r0, nr));
    });
    const S ss = static_cast<S>(opt_.shared_output_scale);
    Mat<S> dys;
    if (ss != S(1)) dys = ss * dy;                                    // y = s_s f_s -> df_s = s_s dy
    const Mat<S>& dfs = ss != S(1) ? dys : dy;
    Mat<S> dhs;
    ops::linear_backward<S>(dfs, hs, shared_down_.mat(), shared_down_.grad_mat(), nullptr, &dhs);  // f_s = hs W_d^T
    Mat<S> dgs(N, Ws_), dus(N, Ws_);
    ops::for_row_blocks(N, [&](Index r0, Index nr) {                  // hs = silu(gs) .* us
      ops::swiglu_backward(dhs.middleRows(r0, nr), c.gs.middleRows(r0, nr), c.us.middleRows(r0, nr),
                           dgs.middleRows(r0, nr), dus.middleRows(r0, nr));
    });
    ops::linear_backward<S>(dgs, c.x, shared_gate_.mat(), shared_gate_.grad_mat(), nullptr, &dx);  // gs = x W_g^T
    ops::linear_backward<S>(dus, c.x, shared_up_.mat(), shared_up_.grad_mat(), nullptr, &dx, true);  // us = x W_u^T
  } else {
    dx = Mat<S>::Zero(N, D);
  }
  if (P == 0) return dx;

  // Routed experts: dYs [P, D] = s_r a_j dy[n] of each pair (y += s_r a_j f_e), Xs regathered
  Mat<S> Xs(P, D), dYs(P, D);
  parallel_for(P, [&](Index p) {
    const Index n = c.pair_token[static_cast<std::size_t>(p)], j = c.pair_slot[static_cast<std::size_t>(p)];
    Xs.row(p) = c.x.row(n);
    dYs.row(p) = (sr * static_cast<S>(a_[static_cast<std::size_t>(j)])) * dy.row(n);
  }, static_cast<double>(2 * P * D) >= kParallelMinFlops);
  Mat<S> h(P, w), dg(P, w), du(P, w), dXs(P, D);
  for (Index e = 0; e < E; ++e) {
    const Index o = c.offset[static_cast<std::size_t>(e)], m = c.offset[static_cast<std::size_t>(e + 1)] - o;
    if (m == 0) continue;
    const auto Xe = Xs.middleRows(o, m);
    const auto dYe = dYs.middleRows(o, m);
    auto he = h.middleRows(o, m);
    auto dge = dg.middleRows(o, m);
    auto due = du.middleRows(o, m);
    auto dXe = dXs.middleRows(o, m);
    MatMap<S> dG(expert_gate_.grad.data() + e * D * w, D, w);
    MatMap<S> dU(expert_up_.grad.data() + e * D * w, D, w);
    MatMap<S> dDn(expert_down_.grad.data() + e * w * D, w, D);
    swiglu_rows_(c.g, c.u, h, o, m);                                  // recompute h = silu(g) .* u
    ops::gemm_tn_add<S>(he, dYe, dDn);                                // f_e = h Dn_e -> dDn_e += h^T df
    ops::linear_forward_into<S>(dYe, down_(e), nullptr, dge);         //              -> dh = df Dn_e^T (in dg)
    ops::for_row_blocks(m, [&](Index b0, Index nb) {                  // h = silu(g) .* u -> dg, du
      ops::swiglu_backward(dg.middleRows(o + b0, nb), c.g.middleRows(o + b0, nb), c.u.middleRows(o + b0, nb),
                           dg.middleRows(o + b0, nb), du.middleRows(o + b0, nb));
    });
    ops::gemm_tn_add<S>(Xe, dge, dG);                                 // g = x G_e -> dG_e += x^T dg
    ops::gemm_tn_add<S>(Xe, due, dU);                                 // u = x U_e -> dU_e += x^T du
    ops::linear_forward_into<S>(dge, gate_(e), nullptr, dXe);         //           -> dx_pair = dg G_e^T
    detail::tr_moe_gemm_nt_add(due, up_(e), dXe);                     //                    += du U_e^T
  }
  // dx[n] += sum_j dx_pair(n, j), in slot order
  parallel_for(N, [&](Index n) {
    for (Index j = 0; j < k; ++j) {
      const Index p = c.pair_of[static_cast<std::size_t>(n * k + j)];
      if (p >= 0) dx.row(n) += dXs.row(p);
    }
  }, static_cast<double>(N * k * D) >= kParallelMinFlops);
  return dx;
}

}  // namespace lm
}  // namespace dea
