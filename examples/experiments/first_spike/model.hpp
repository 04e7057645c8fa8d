// examples/experiments/first_spike/model.hpp: the experiment's TinyTransformer and its training loop (the seed's
// train_model, re-created), templated on the attention class.
//
// TinyTransformer(win = 32, out_dim = 1, depth = 2), float32 (as the seed's experiment script defines it):
//   h0[b, t] = inp(x[b, t]) + pos[t]                    inp = Linear(1, 64), pos [1, win, 64] ~ N(0, 0.02^2)
//   block (pre-LN, d = 64, 2 heads of 32):  h1 = h + attn(n1(h));  h2 = h1 + ff2(relu(ff0(n2(h1))))
//                                           attn = q, k, v, o Linear(64, 64) + the dot or Laplacian core
//   out = head(flatten(h_L))                head = Linear(win * 64, 1)
// Parameter names are the PyTorch module's (inp.weight, pos, blocks.0.q.weight, blocks.0.n1.weight,
// blocks.0.ff.0.weight, blocks.0.theta, head.weight, ...). Initialisation: PyTorch's defaults drawn from one
// dea::Rng in the module's construction order (inp, pos, then per block q, k, v, o, ff.0, ff.2, then head);
// theta is a constant fill, so both arms get identical shared weights for a seed.
#pragma once

#include "tasks.hpp"

#include <dea/attention/inputs.hpp>
#include <dea/attention/dot_product.hpp>
#include <dea/attention/laplacian.hpp>
#include <dea/core/param.hpp>
#include <dea/core/rng.hpp>
#include <dea/io/safetensors.hpp>
#include <dea/nn/layer_norm.hpp>
#include <dea/nn/linear.hpp>
#include <dea/ops/activations.hpp>
#include <dea/ops/mse.hpp>
#include <dea/optim/adamw.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace lapbench {

using S = float;
using DotAttn = dea::DotProductAttention<S, 2, 32>;
using LapAttn = dea::LaplacianAttention<S, 2, 32>;

template <class Attn>
struct ArmName;
template <>
struct ArmName<DotAttn> {
  static constexpr const char* value = "dot";
};
template <>
struct ArmName<LapAttn> {
  static constexpr const char* value = "lap";
};

template <class Attn>
typename Attn::Options attention_options(double sigma0) {
  typename Attn::Options o;
  o.bias = true;
  o.dropout = 0;
  if constexpr (std::is_same<Attn, LapAttn>::value) o.sigma0 = static_cast<S>(sigma0);
  (void)sigma0;
  return o;
}

template <class Attn>
class TinyTransformer {
public:
  static constexpr Index D = 64, H = 2, FF = 128;

  struct Block {
    dea::nn::LayerNorm<S> n1, n2;
    Attn attn;
    dea::nn::Linear<S> ff0, ff2;

    struct Cache {
      dea::nn::LayerNorm<S>::Cache ln1, ln2;
      typename Attn::Cache attn;    ///< the attention's own cache; attn.x is z1 = n1(h) [N, D]
      MatF h1;                      ///< h + attn(z1)   [N, D]
      MatF z2;                      ///< n2(h1)         [N, D]
      MatF r;                       ///< relu(f0)       [N, FF]
    };

    Block(dea::Rng& rng, double sigma0)
        : n1(D), n2(D), attn(D, H, scratch_rng(), attention_options<Attn>(sigma0)) {
      // q, k, v, o: nn.Linear(64, 64) defaults, weight then bias, module by module
      auto params = attn.parameters();
      const double b = 1.0 / std::sqrt(double(D));
      for (const char* m : {"q", "k", "v", "o"}) {
        dea::Param<S>& w = find(params, m, "weight");
        dea::Param<S>& bias = find(params, m, "bias");
        dea::init::uniform(w.mat(), rng, -b, b);
        dea::init::uniform(bias.value, rng, -b, b);
        w.name = std::string(m) + ".weight";
        bias.name = std::string(m) + ".bias";
      }
      ff0 = dea::nn::Linear<S>(D, FF, rng);
      ff2 = dea::nn::Linear<S>(FF, D, rng);
    }

    /// h [N, D] -> out [N, D]
    void forward(const MatF& h, const dea::AttnInputs<S>& in, Cache& c, MatF& out) {
      n1.forward(h, c.attn.x, c.ln1);                      // z1 = n1(h), written where the attention keeps its input
      const MatF a = attn.forward(c.attn.x, in, c.attn);  // a = attn(z1) (o included)
      c.h1 = h + a;                                        // h1 = h + a
      n2.forward(c.h1, c.z2, c.ln2);                       // z2 = n2(h1)
      linear_forward(ff0, c.z2, c.r);                      // f0 = ff0(z2)
      dea::ops::relu_forward<S>(c.r, c.r);                 // r = relu(f0), in place (f0 is not kept)
      linear_forward(ff2, c.r, out);                       // f = ff2(r)
      out += c.h1;                                         // out = h1 + f
    }

    /// dout [N, D] -> dh [N, D]; h is the forward input. Adds into every parameter's gradient.
    void backward(const MatF& dout, const MatF& h, Cache& c, MatF& dh) {
      MatF dr, dz2, dh1;
      linear_backward(ff2, dout, c.r, dr);                 // f = ff2(r)       ->  dr, dW2, db2
      dea::ops::relu_backward<S>(dr, c.r, dr);             // r = relu(f0)     ->  df0 = dr .* [f0 > 0] = dr .* [r > 0]
      linear_backward(ff0, dr, c.z2, dz2);                 // f0 = ff0(z2)     ->  dz2, dW0, db0
      n2.backward(dz2, c.h1, c.ln2, dh1);                  // z2 = n2(h1)      ->  dh1 (LN part)
      dh1 += dout;                                         // out = h1 + f     ->  dh1 += dout
      const MatF dz1 = attn.backward(dh1, c.attn);         // a = attn(z1)     ->  dz1
      n1.backward(dz1, h, c.ln1, dh);                      // z1 = n1(h)       ->  dh (LN part)
      dh += dh1;                                           // h1 = h + a       ->  dh += dh1
    }

    void append_params(dea::ParamList<S>& list, const std::string& prefix) {
      auto add = [&](dea::ParamList<S> ps, const std::string& sub) {
        for (auto* p : ps) {
          if (p->name.rfind(prefix, 0) != 0) p->name = prefix + sub + p->name;
          list.push_back(p);
        }
      };
      add(attn.parameters(), "");  // q.*, k.*, v.*, o.*, theta
      add(n1.parameters(), "n1.");
      add(n2.parameters(), "n2.");
      add(ff0.parameters(), "ff.0.");
      add(ff2.parameters(), "ff.2.");
    }

  private:
    /// y = lin(x) as nn::Linear::forward, with the bias written before the product is added (same bits, one
    /// pass over y fewer: dea::detail::mha::linear_forward_bias_first).
    static void linear_forward(const dea::nn::Linear<S>& lin, const MatF& x, MatF& y) {
      dea::check(x.cols() == lin.in_features(), "TinyTransformer: Linear input: expected ", lin.in_features(),
                 " columns, got ", x.cols());
      dea::detail::mha::linear_forward_bias_first<S>(x, lin.weight.mat(),
                                                     lin.has_bias() ? lin.bias.value.data() : nullptr, y);
    }
    /// lin.backward(dy, x, &dx) of nn::Linear, the weight gradient as one Eigen call where that gives the same
    /// bits (dea::detail::mha::linear_backward_packed_once).
    static void linear_backward(dea::nn::Linear<S>& lin, const MatF& dy, const MatF& x, MatF& dx) {
      dea::check_matrix(dy, x.rows(), lin.out_features(), "TinyTransformer: Linear backward: dy");
      dea::detail::mha::linear_backward_packed_once<S>(dy, x, lin.weight.mat(), lin.weight.grad_mat(),
                                                       lin.has_bias() ? lin.bias.grad.data() : nullptr, &dx);
    }
    static dea::Rng& scratch_rng() {
      thread_local dea::Rng r(0);
      return r;
    }
    static dea::Param<S>& find(const dea::ParamList<S>& ps, const std::string& m, const std::string& kind) {
      for (auto* p : ps)
        if (p->name == m + "." + kind || p->name == "W_" + m + "." + kind) return *p;
      dea::detail::raise("TinyTransformer: attention has no parameter " + m + "." + kind);
    }
  };

  TinyTransformer(Index win, dea::Rng& rng, double sigma0, Index depth = 2) : win_(win) {
    inp_ = dea::nn::Linear<S>(1, D, rng);
    pos_ = dea::Param<S>("pos", "main", {1, win, D});
    dea::init::normal(pos_.value, rng, 0.0, 0.02);
    for (Index l = 0; l < depth; ++l) blocks_.push_back(std::make_unique<Block>(rng, sigma0));
    head_ = dea::nn::Linear<S>(win * D, 1, rng);
    for (auto* p : inp_.parameters()) {
      p->name = "inp." + p->name;
      params_.push_back(p);
    }
    params_.push_back(&pos_);
    for (Index l = 0; l < depth; ++l) blocks_[l]->append_params(params_, "blocks." + std::to_string(l) + ".");
    for (auto* p : head_.parameters()) {
      p->name = "head." + p->name;
      params_.push_back(p);
    }
    caches_.resize(blocks_.size());
    acts_.resize(blocks_.size() + 1);
  }
  TinyTransformer(const TinyTransformer&) = delete;
  TinyTransformer& operator=(const TinyTransformer&) = delete;

  const dea::ParamList<S>& parameters() const { return params_; }
  void zero_grad() { dea::zero_grad(params_); }
  Index win() const { return win_; }
  Index depth() const { return Index(blocks_.size()); }
  Block& block(Index l) { return *blocks_[l]; }
  /// The caches of the last forward call (per block), e.g. the attention probabilities.
  const typename Block::Cache& cache(Index l) const { return caches_[l]; }

  /// Frees the activations and caches of the last forward (a kept model then holds only its parameters).
  void release_caches() {
    for (auto& c : caches_) c = typename Block::Cache{};
    for (auto& a : acts_) a.resize(0, 0);
    x_.resize(0, 0);
  }

  /// x [B, win] -> out [B, 1]; training: dropout active (the attention inputs of the call are built here).
  MatF forward(const MatF& x, bool training = false) {
    dea::check(x.cols() == win_, "TinyTransformer: x: expected ", win_, " columns, got ", x.cols());
    const Index B = x.rows(), N = B * win_;
    x_ = x;
    dea::AttnInputs<S> in(B, win_);
    in.set_training(training);
    MatF& h0 = acts_[0];
    h0.resize(N, D);
    const dea::ConstMatMap<S> P(pos_.value.data(), win_, D);
    const Eigen::Map<const dea::RowVec<S>> w(inp_.weight.value.data(), D), b(inp_.bias.value.data(), D);
    for (Index n = 0; n < N; ++n) h0.row(n) = x(n / win_, n % win_) * w + b + P.row(n % win_);  // inp(x) + pos
    for (std::size_t l = 0; l < blocks_.size(); ++l) blocks_[l]->forward(acts_[l], in, caches_[l], acts_[l + 1]);
    const dea::ConstMatMap<S> flat(acts_.back().data(), B, win_ * D);  // flatten: [B*T, D] -> [B, T*D]
    MatF out;
    head_.forward(flat, out);                                            // out = head(flat)
    return out;
  }

  /// dout [B, 1] -> adds every parameter's gradient (forward must have run on the same batch).
  void backward(const MatF& dout) {
    const Index B = dout.rows(), N = B * win_;
    const dea::ConstMatMap<S> flat(acts_.back().data(), B, win_ * D);
    MatF dflat;
    head_.backward(dout, flat, &dflat);  // out = head(flat)  ->  dflat, dW_head, db_head
    dflat.resize(N, D);  // same size: the [B, T*D] buffer read as [B*T, D] (no copy)
    MatF dh, dprev;
    dh.swap(dflat);
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      blocks_[l]->backward(dh, acts_[l], caches_[l], dprev);
      dh.swap(dprev);
    }
    // h0 = x * w_inp + b_inp + pos  ->  dw_inp = sum_n dh0 x, db_inp = sum_n dh0, dpos[t] = sum_b dh0[b, t]
    Eigen::Map<dea::RowVec<S>> gw(inp_.weight.grad.data(), D), gb(inp_.bias.grad.data(), D);
    dea::MatMap<S> gp(pos_.grad.data(), win_, D);
    for (Index n = 0; n < N; ++n) {
      gw += x_(n / win_, n % win_) * dh.row(n);
      gb += dh.row(n);
      gp.row(n % win_) += dh.row(n);
    }
  }

  /// Copies every parameter from a safetensors file (names prefix + PyTorch name). Parameters listed in
  /// `skip` keep their values.
  void load(const dea::io::SafeTensors& st, const std::string& prefix, const std::vector<std::string>& skip = {}) {
    for (auto* p : params_) {
      bool skipped = false;
      for (const auto& s : skip) skipped = skipped || p->name == s;
      if (skipped) continue;
      const std::string name = prefix + p->name;
      dea::check(st.has(name), "anchor file: missing tensor '", name, "'");
      dea::check(st.shape(name) == p->shape, "anchor file: ", name, ": expected shape ", dea::shape_str(p->shape),
                 ", got ", dea::shape_str(st.shape(name)));
      const dea::Tensor<S> t = st.get<S>(name);
      std::copy(t.ptr(), t.ptr() + t.numel(), p->value.data());
    }
  }

private:
  Index win_;
  dea::nn::Linear<S> inp_, head_;
  dea::Param<S> pos_;
  std::vector<std::unique_ptr<Block>> blocks_;
  dea::ParamList<S> params_;
  std::vector<typename Block::Cache> caches_;
  std::vector<MatF> acts_;  ///< block inputs/outputs: acts_[l] is the input of block l
  MatF x_;
};

// ---------------------------------------------------------------------------------------------------------------
// train_model (re-created: the seed's script calls it, its definition is not public)

struct TrainConfig {
  double lr = 0.0015;
  int epochs = 12;
  Index batch = 128;
  double sigma0 = 0.7;  ///< lap only
  /// Evaluate the test MSE after every epoch (hist, for plotting only) instead of after the last one alone.
  bool record_hist = true;
};

struct TrainResult {
  double metric = std::numeric_limits<double>::infinity();  ///< final-epoch test MSE (inf when diverged)
  bool diverged = false;
  std::vector<double> hist_train_loss, hist_test_mse;
  double seconds = 0;
  int steps = 0;
};

/// Optional exact inputs (the anchor file's seed-0 initial weights and shuffles).
struct AnchorInit {
  const dea::io::SafeTensors* st = nullptr;
  std::string prefix;                       ///< "init/dot/" or "init/lap/"
  std::vector<std::vector<Index>> perms;    ///< [epochs][n_train]
};

template <class Attn>
double evaluate_mse(TinyTransformer<Attn>& net, const MatF& x, const MatF& y) {
  const MatF out = net.forward(x);  // eval mode
  return dea::ops::mse_forward(out, y);
}

/// Trains a fresh model for `seed` on `data` and returns the metric; `keep` (if given) receives the trained model.
template <class Attn>
TrainResult train_model(const TaskData& data, std::uint64_t seed, const TrainConfig& cfg,
                        const AnchorInit* anchor = nullptr, std::unique_ptr<TinyTransformer<Attn>>* keep = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  dea::Rng rng(seed);  // seed_all(seed): initial weights, then the epoch shuffles
  auto net = std::make_unique<TinyTransformer<Attn>>(data.win(), rng, cfg.sigma0);
  if (anchor && anchor->st) {
    std::vector<std::string> skip;
    if (std::is_same<Attn, LapAttn>::value) skip = {"blocks.0.theta", "blocks.1.theta"};  // theta from sigma0
    net->load(*anchor->st, anchor->prefix, skip);
  }
  dea::optim::GroupConfig g;
  g.name = "main";
  g.lr = cfg.lr;
  g.weight_decay = 0.0;
  g.max_grad_norm = std::numeric_limits<double>::infinity();  // no clipping
  g.beta1 = 0.9;
  g.beta2 = 0.999;
  g.eps = 1e-8;
  dea::optim::AdamW<S> opt(net->parameters(), {g});
  const Index n = data.xtr.rows(), win = data.win();
  std::vector<Index> perm(static_cast<std::size_t>(n));
  MatF xb, yb, dout;
  TrainResult res;
  for (int ep = 0; ep < cfg.epochs && !res.diverged; ++ep) {
    if (anchor && anchor->st && !anchor->perms.empty()) {
      dea::check(ep < int(anchor->perms.size()) && Index(anchor->perms[ep].size()) == n,
                 "anchor file: no shuffle for epoch ", ep);
      perm = anchor->perms[static_cast<std::size_t>(ep)];
    } else {  // torch.randperm stand-in: Fisher-Yates from the run's generator
      std::iota(perm.begin(), perm.end(), Index(0));
      for (Index i = n - 1; i > 0; --i) std::swap(perm[i], perm[static_cast<std::size_t>(rng.below(std::uint64_t(i + 1)))]);
    }
    double loss_sum = 0;
    for (Index start = 0; start < n; start += cfg.batch) {  // keeps the last partial batch
      const Index nb = std::min(cfg.batch, n - start);
      xb.resize(nb, win);
      yb.resize(nb, 1);
      for (Index i = 0; i < nb; ++i) {
        xb.row(i) = data.xtr.row(perm[static_cast<std::size_t>(start + i)]);
        yb.row(i) = data.ytr.row(perm[static_cast<std::size_t>(start + i)]);
      }
      net->zero_grad();
      const MatF out = net->forward(xb, /*training*/ true);
      const double loss = dea::ops::mse_forward(out, yb);
      if (!std::isfinite(loss)) {
        res.diverged = true;
        break;
      }
      loss_sum += loss * double(nb);
      dea::ops::mse_backward<S>(out, yb, dout);
      net->backward(dout);
      opt.step();
      ++res.steps;
    }
    if (res.diverged) break;
    res.hist_train_loss.push_back(loss_sum / double(n));
    if (cfg.record_hist || ep + 1 == cfg.epochs) res.metric = evaluate_mse(*net, data.xte, data.yte);
    if (cfg.record_hist) res.hist_test_mse.push_back(res.metric);
  }
  if (res.diverged) res.metric = std::numeric_limits<double>::infinity();
  if (!std::isfinite(res.metric)) res.diverged = true;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (keep) {
    net->release_caches();
    *keep = res.diverged ? nullptr : std::move(net);
  }
  return res;
}

}  // namespace lapbench
