// Tests of include/dea/nn and the ops it adds (layer_norm, gelu, cross_entropy): finite-difference checks of every
// parameter and input of every block (double, tiny sizes, objective <y, R> or the loss itself), the padding row
// of the embedding, the whole model for both heads with and without oracle (alpha-hat held fixed, as the task
// path treats it as a constant), the gate path against the averaged gate loss, gradient isolation, the
// accumulation contract, thread-count independence, parameter names and bad input.
#include <catch2/catch.hpp>
#include <dea/attention/dot_product.hpp>
#include <dea/attention/laplacian.hpp>
#include <dea/attention/token_routed.hpp>
#include <dea/data/collate.hpp>
#include <dea/nn/transformer.hpp>
#include <dea/ops/cross_entropy.hpp>
#include <dea/ops/gelu.hpp>
#include <dea/ops/layer_norm.hpp>
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <limits>
#include <set>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_nn {

using namespace dea;
using Model = nn::TransformerModel<double>;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

Mat<double> randn(Index r, Index c, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Mat<double> m(r, c);
  init::normal(m, rng, 0.0, scale);
  return m;
}

double dot(const Mat<double>& a, const Mat<double>& b) { return a.cwiseProduct(b).sum(); }

// ---------------------------------------------------------------- model fixtures

struct ModelCase {
  nn::Task task = nn::Task::cls;
  Index B = 2, T = 5, V = 11, D = 8, H = 2, L = 2, d_ff = 12;
  bool oracle = true, targets = false, mask = true, segments = true;
  double gamma = 0.6, dropout = 0.0;
  std::optional<std::vector<Index>> supervise;
  Index max_len = 16;
  std::uint64_t seed = 5;
  bool tiled = false;  // the Dual-Expert layers run the tiled kernel (Options::kernel)
};

nn::ModelConfig make_config(const ModelCase& mc) {
  nn::ModelConfig cfg;
  cfg.vocab_size = mc.V;
  cfg.d_model = mc.D;
  cfg.n_heads = mc.H;
  cfg.n_layers = mc.L;
  cfg.d_ff = mc.d_ff;
  cfg.max_len = mc.max_len;
  cfg.dropout = mc.dropout;
  cfg.n_classes = 3;
  cfg.pad_id = 0;
  cfg.task = mc.task;
  cfg.supervise_layers = mc.supervise;
  return cfg;
}

/// A model whose LayerNorm affines, biases and gate offsets are random, so every path carries signal.
template <class M>
M make_model(const ModelCase& mc) {
  Rng rng(mc.seed);
  typename M::AttentionOptionsFn opts;
  if constexpr (M::has_gate)
    if (mc.tiled)
      opts = [&](Index l) {
        auto o = nn::default_attention_options<typename M::Layer::AttentionType>(mc.dropout, l, mc.L);
        o.kernel = DeaKernel::tiled;
        return o;
      };
  M model(make_config(mc), rng, opts);
  for (Param<double>* p : model.parameters()) {
    const std::string& n = p->name;
    if (n.find("ln") != std::string::npos && n.find("weight") != std::string::npos)
      init::uniform(p->value, rng, 0.6, 1.4);
    else if (n.find("bias") != std::string::npos)
      init::uniform(p->value, rng, -0.3, 0.3);
    else if (n.find("c_gate") != std::string::npos)
      init::uniform(p->value, rng, -0.8, 0.3);
  }
  return model;
}

nn::ModelBatch<double> make_batch(const ModelCase& mc) {
  Rng rng(mc.seed + 1000);
  const Index B = mc.B, T = mc.T;
  nn::ModelBatch<double> b;
  b.input_ids = Tensor<std::int64_t>({B, T});
  for (Index k = 0; k < B * T; ++k) b.input_ids[k] = 1 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(mc.V - 1)));
  if (mc.mask) {
    b.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
    for (Index t = T - 2; t < T; ++t) {  // row 1: the last two tokens are padding
      b.input_ids[T + t] = 0;
      b.attention_mask[T + t] = 0;
    }
  }
  if (mc.segments) {
    b.token_type_ids = Tensor<std::int64_t>({B, T}, 0);
    for (Index k = 0; k < B * T; ++k) b.token_type_ids[k] = (k % T) >= T / 2 ? 1 : 0;
  }
  if (mc.oracle) {
    b.alpha_oracle = Tensor<double>({B, T, T});
    for (Index k = 0; k < b.alpha_oracle.numel(); ++k)
      b.alpha_oracle[k] = rng.uniform() < 0.4 ? kNaN : rng.uniform(-0.05, 1.0);
    if (mc.targets) {
      b.target_idx = Tensor<std::int64_t>({B, T});
      for (Index bb = 0; bb < B; ++bb)
        for (Index i = 0; i < T; ++i) {
          const Index k = bb * T + i;
          if (rng.uniform() < 0.3) {
            b.target_idx[k] = -1;
            continue;
          }
          const Index t = static_cast<Index>(rng.below(static_cast<std::uint64_t>(T - 2)));  // a real key
          b.target_idx[k] = t;
          b.alpha_oracle[(bb * T + i) * T + t] = 0.3 + 0.5 * rng.uniform();
        }
    }
  }
  if (mc.task == nn::Task::cls) {
    b.labels = Tensor<std::int64_t>({B});
    for (Index k = 0; k < B; ++k) b.labels[k] = static_cast<std::int64_t>(rng.below(3));
  } else {
    b.labels = Tensor<std::int64_t>({B, T}, -100);
    for (Index k = 0; k < B * T; ++k)
      if (b.input_ids[k] != 0 && rng.uniform() < 0.6) b.labels[k] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(mc.V)));
    b.labels[0] = 3;  // at least one target
  }
  return b;
}

/// Task path of the whole model: every main parameter against task_loss, alpha-hat held at its unperturbed values.
template <class M>
testing::GradCheckReport check_model_task(const ModelCase& mc, bool logits_objective = false,
                                          std::vector<std::string> skip = {}) {
  M model = make_model<M>(mc);
  const nn::ModelBatch<double> batch = make_batch(mc);
  Rng drop(77);
  const bool training = mc.dropout > 0;
  typename M::Cache c0;
  const auto out0 = model.forward(batch, mc.gamma, training, &drop, c0);
  model.freeze_alpha_hat(c0);
  const Mat<double> R = testing::random_projection(out0.logits.rows(), out0.logits.cols(), mc.seed + 3);
  auto objective = [&] {
    drop.reseed(77);
    typename M::Cache c;
    const auto out = model.forward(batch, mc.gamma, training, &drop, c);
    return logits_objective ? dot(out.logits, R) : out.task_loss;
  };
  auto analytic = [&] {
    drop.reseed(77);
    model.zero_grad();
    typename M::Cache c;
    model.forward(batch, mc.gamma, training, &drop, c);
    if (logits_objective)
      model.backward_logits(R, c);
    else
      model.backward_task(c);
  };
  testing::GradCheck gc;
  skip.push_back("W_gate");
  skip.push_back("c_gate");
  gc.add_except(model.parameters(), skip);
  auto rep = gc.run(objective, analytic);
  analytic();
  for (Param<double>* p : model.parameters())
    if (p->group == "gate") REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
  return rep;
}

/// Gate path of the whole model: W_gate / c_gate of every layer against loss_gate (alpha-hat fixed in the scores,
/// so a layer's gate reaches later layers only through its own gate loss, as in the reference's graph).
testing::GradCheckReport check_model_gate(const ModelCase& mc) {
  Model model = make_model<Model>(mc);
  const nn::ModelBatch<double> batch = make_batch(mc);
  Model::Cache c0;
  model.forward(batch, mc.gamma, false, nullptr, c0);
  model.freeze_alpha_hat(c0);
  auto objective = [&] {
    Model::Cache c;
    return model.forward(batch, mc.gamma, false, nullptr, c).loss_gate;
  };
  auto analytic = [&] {
    model.zero_grad();
    Model::Cache c;
    model.forward(batch, mc.gamma, false, nullptr, c);
    model.backward_gate(c);
    for (Param<double>* p : model.parameters())
      if (p->group == "main") REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
  };
  testing::GradCheck gc;
  for (Param<double>* p : model.parameters())
    if (p->group == "gate") gc.add(p->name, p->value.data(), p->grad.data(), p->numel());
  return gc.run(objective, analytic);
}

}  // namespace

// =============================================================================================== ops

TEST_CASE("layer_norm forward matches its definition and backward matches finite differences", "[nn][ops]") {
  const Index N = 6, D = 7;
  Mat<double> x = randn(N, D, 1, 2.0);
  x.row(2).array() += 5.0;  // a shifted row
  Vec<double> w(D), b(D), dw = Vec<double>::Zero(D), db = Vec<double>::Zero(D);
  Rng rng(2);
  init::uniform(w, rng, 0.5, 1.5);
  init::uniform(b, rng, -0.5, 0.5);
  Mat<double> y;
  Vec<double> mean, rstd;
  ops::layer_norm_forward<double>(x, w.data(), b.data(), 1e-5, y, mean, rstd);
  for (Index n = 0; n < N; ++n) {
    const double mu = x.row(n).mean();
    const double var = (x.row(n).array() - mu).square().mean();
    for (Index c = 0; c < D; ++c)
      REQUIRE(y(n, c) == Approx((x(n, c) - mu) / std::sqrt(var + 1e-5) * w[c] + b[c]).epsilon(1e-13));
  }
  const Mat<double> R = testing::random_projection(N, D, 3);
  Mat<double> dx = Mat<double>::Zero(N, D);
  auto objective = [&] {
    Mat<double> yy;
    Vec<double> m, r;
    ops::layer_norm_forward<double>(x, w.data(), b.data(), 1e-5, yy, m, r);
    return dot(yy, R);
  };
  auto analytic = [&] {
    dw.setZero();
    db.setZero();
    Mat<double> yy, g;
    Vec<double> m, r;
    ops::layer_norm_forward<double>(x, w.data(), b.data(), 1e-5, yy, m, r);
    ops::layer_norm_backward<double>(R, x, m, r, w.data(), dw.data(), db.data(), g);
    dx = g;
  };
  testing::GradCheck gc;
  gc.add("x", x.data(), dx.data(), x.size());
  gc.add("weight", w.data(), dw.data(), D);
  gc.add("bias", b.data(), db.data(), D);
  const auto rep = gc.run(objective, analytic);
  INFO(rep.str());
  REQUIRE(rep.ok);
  // accumulation: a second backward adds the same parameter gradients again
  const Vec<double> dw1 = dw;
  Mat<double> g;
  ops::layer_norm_backward<double>(R, x, mean, rstd, w.data(), dw.data(), db.data(), g);
  REQUIRE((dw - 2 * dw1).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("gelu is the exact erf form and its backward matches finite differences", "[nn][ops]") {
  REQUIRE(ops::gelu(0.0) == 0.0);
  REQUIRE(ops::gelu(1.0) == Approx(0.8413447460685429).epsilon(1e-15));    // Phi(1) = 0.8413447...
  REQUIRE(ops::gelu(-2.0) == Approx(-0.04550026389635842).epsilon(1e-14));  // -2 Phi(-2)
  REQUIRE(ops::gelu_grad(0.0) == 0.5);
  Mat<double> x = randn(5, 6, 4, 2.0);
  const Mat<double> R = testing::random_projection(5, 6, 5);
  Mat<double> dx = Mat<double>::Zero(5, 6);
  auto objective = [&] {
    Mat<double> y;
    ops::gelu_forward<double>(x, y);
    return dot(y, R);
  };
  auto analytic = [&] {
    Mat<double> g = R;
    ops::gelu_backward_inplace<double>(x, g);
    dx = g;
  };
  testing::GradCheck gc;
  gc.add("x", x.data(), dx.data(), x.size());
  const auto rep = gc.run(objective, analytic);
  INFO(rep.str());
  REQUIRE(rep.ok);
}

TEST_CASE("gelu in float (vectorised erf and exp) agrees with the double formula to float round-off", "[nn][ops]") {
  // x over [-9, 9] (both tails, where erf saturates) plus exact zeros; several row blocks
  const Index n = 257, m = 33;
  Mat<double> xd(n, m);
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < m; ++j) xd(i, j) = -9.0 + 18.0 * double(i * m + j) / double(n * m - 1);
  xd(0, 0) = 0.0;
  const Mat<float> xf = xd.cast<float>();
  const Mat<double> xr = xf.cast<double>();  // the float inputs, exactly, for the double reference
  Mat<float> yf, yin = xf;
  ops::gelu_forward<float>(xf, yf);
  ops::gelu_forward_into<float>(yin, yin);  // in place gives the same bits
  REQUIRE(yin == yf);
  Mat<float> gf = Mat<float>::Ones(n, m);
  ops::gelu_backward_inplace<float>(xf, gf);
  double err_y = 0, err_g = 0;
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < m; ++j) {
      const double x = xr(i, j);
      err_y = std::max(err_y, std::abs(double(yf(i, j)) - ops::gelu(x)) / std::max(1.0, std::abs(x)));
      err_g = std::max(err_g, std::abs(double(gf(i, j)) - ops::gelu_grad(x)));
    }
  INFO("max error: gelu " << err_y << ", gelu' " << err_g);
  REQUIRE(err_y < 1e-6);
  REQUIRE(err_g < 1e-6);
  REQUIRE(yf(0, 0) == 0.0f);
}

TEST_CASE("cross_entropy: mean over counted rows, ignore_index, gradient", "[nn][ops]") {
  Mat<double> z(3, 4);
  z << 1.0, 2.0, 0.5, -1.0,  //
      0.0, 0.0, 0.0, 0.0,    //
      3.0, -2.0, 1.0, 0.25;
  const std::int64_t labels[3] = {1, -100, 3};
  const auto r = ops::cross_entropy<double>(z, labels, 3);
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5) + std::exp(-1.0)) - 2.0;
  const double l2 = std::log(std::exp(3.0) + std::exp(-2.0) + std::exp(1.0) + std::exp(0.25)) - 0.25;
  REQUIRE(r.count == 2);
  REQUIRE(r.loss == Approx((l0 + l2) / 2).epsilon(1e-14));
  REQUIRE(r.dlogits.row(1).cwiseAbs().maxCoeff() == 0.0);  // ignored row
  REQUIRE(std::abs(r.dlogits.row(0).sum()) < 1e-15);       // softmax - onehot sums to 0

  Mat<double> zz = randn(5, 4, 6, 3.0), dz = Mat<double>::Zero(5, 4);
  const std::int64_t lab[5] = {0, 3, -100, 2, 2};
  testing::GradCheck gc;
  gc.add("logits", zz.data(), dz.data(), zz.size());
  const auto rep = gc.run([&] { return ops::cross_entropy<double>(zz, lab, 5).loss; },
                          [&] {
                            const Mat<double> g = ops::cross_entropy<double>(zz, lab, 5).dlogits;
                            dz = g;  // copy into the registered buffer (a temporary would move a new one in)
                          });
  INFO(rep.str());
  REQUIRE(rep.ok);

  // every row ignored: loss 0 (PyTorch gives NaN), count 0, zero gradient
  const std::int64_t none[3] = {-100, -100, -100};
  const auto e = ops::cross_entropy<double>(z, none, 3);
  REQUIRE(e.count == 0);
  REQUIRE(e.loss == 0.0);
  REQUIRE(e.dlogits.cwiseAbs().maxCoeff() == 0.0);
  // large logits stay finite
  Mat<double> big(1, 3);
  big << 1000.0, -1000.0, 999.0;
  const std::int64_t one[1] = {2};
  REQUIRE(std::isfinite(ops::cross_entropy<double>(big, one, 1).loss));
  // bad labels
  const std::int64_t bad[3] = {1, 4, 0};
  REQUIRE_THROWS_AS(ops::cross_entropy<double>(z, bad, 3), Error);
  const std::int64_t neg[3] = {1, -1, 0};
  REQUIRE_THROWS_AS(ops::cross_entropy<double>(z, neg, 3), Error);
  REQUIRE_THROWS_AS(ops::cross_entropy<double>(z, labels, 2), Error);
}

// =============================================================================================== blocks

TEST_CASE("Embedding: scaled lookup, gradient, the padding row gets none", "[nn][embedding]") {
  const Index V = 6, D = 5, pad = 2;
  nn::Embedding<double> emb(V, D, pad);
  Rng rng(8);
  emb.reset_parameters(rng, 1.0);
  REQUIRE(emb.weight.value.segment(pad * D, D).cwiseAbs().maxCoeff() > 0);  // the pad row is initialised too
  const std::vector<std::int64_t> ids{1, 2, 5, 2, 0, 1, 3};
  const Index N = static_cast<Index>(ids.size());
  const double scale = std::sqrt(5.0);
  Mat<double> y;
  emb.forward(ids.data(), N, scale, y);
  for (Index n = 0; n < N; ++n)
    REQUIRE((y.row(n) - scale * emb.weight.mat().row(ids[static_cast<std::size_t>(n)])).cwiseAbs().maxCoeff() < 1e-15);
  const Mat<double> R = testing::random_projection(N, D, 9);
  emb.zero_grad();
  emb.backward(R, ids.data(), N, scale);
  // rows other than the pad row: dW[v] = scale * sum_{n: id_n = v} R_n
  for (Index v = 0; v < V; ++v) {
    RowVec<double> expect = RowVec<double>::Zero(D);
    if (v != pad)
      for (Index n = 0; n < N; ++n)
        if (ids[static_cast<std::size_t>(n)] == v) expect += scale * R.row(n);
    REQUIRE((emb.weight.grad_mat().row(v) - expect).cwiseAbs().maxCoeff() < 1e-14);
  }
  REQUIRE(emb.weight.grad_mat().row(pad).cwiseAbs().maxCoeff() == 0.0);
  // finite differences of every non-pad row (the pad row's lookup has a value but, by design, no gradient)
  testing::GradCheck gc;
  for (Index v = 0; v < V; ++v)
    if (v != pad)
      gc.add("weight[" + std::to_string(v) + "]", emb.weight.value.data() + v * D, emb.weight.grad.data() + v * D, D);
  const auto rep = gc.run(
      [&] {
        Mat<double> yy;
        emb.forward(ids.data(), N, scale, yy);
        return dot(yy, R);
      },
      [&] {
        emb.zero_grad();
        emb.backward(R, ids.data(), N, scale);
      });
  INFO(rep.str());
  REQUIRE(rep.ok);
  // accumulate mode adds
  Mat<double> y2 = y;
  emb.forward(ids.data(), N, 1.0, y2, true);
  REQUIRE((y2 - y - y / scale).cwiseAbs().maxCoeff() < 1e-14);
  const std::vector<std::int64_t> bad{1, 6};
  REQUIRE_THROWS_AS(emb.forward(bad.data(), 2, 1.0, y), Error);
  const std::vector<std::int64_t> neg{-1};
  REQUIRE_THROWS_AS(emb.forward(neg.data(), 1, 1.0, y), Error);
}

TEST_CASE("sinusoidal positional table", "[nn][positional]") {
  const Index L = 40, D = 10;
  nn::SinusoidalPositionalEncoding<double> exact(L, D, nn::SinusoidalPositionalEncoding<double>::Precision::exact);
  nn::SinusoidalPositionalEncoding<double> f32(L, D);
  for (Index pos = 0; pos < L; ++pos)
    for (Index i = 0; 2 * i < D; ++i) {
      const double a = pos * std::exp(-2.0 * i * std::log(10000.0) / D);
      REQUIRE(exact.table()(pos, 2 * i) == Approx(std::sin(a)).margin(1e-15));
      REQUIRE(exact.table()(pos, 2 * i + 1) == Approx(std::cos(a)).margin(1e-15));
      // float32 table: the reference's buffer, float-rounded
      REQUIRE(std::abs(f32.table()(pos, 2 * i) - std::sin(a)) < 4e-6);
      REQUIRE(std::abs(f32.table()(pos, 2 * i + 1) - std::cos(a)) < 4e-6);
      REQUIRE(static_cast<double>(static_cast<float>(f32.table()(pos, 2 * i))) == f32.table()(pos, 2 * i));
    }
  REQUIRE(exact.table()(0, 0) == 0.0);
  REQUIRE(exact.table()(0, 1) == 1.0);
  Mat<double> x = Mat<double>::Zero(2 * 7, D);
  exact.add_to(x, 2);
  REQUIRE((x.middleRows(7, 7) - exact.table().topRows(7)).cwiseAbs().maxCoeff() == 0.0);
  Mat<double> too_long = Mat<double>::Zero(41, D);
  REQUIRE_THROWS_AS(exact.add_to(too_long, 1), Error);
}

TEST_CASE("FeedForward gradients match finite differences (with and without dropout)", "[nn][ffn][gradcheck]") {
  for (double p : {0.0, 0.3}) {
    SECTION("dropout " + std::to_string(p)) {
      Rng rng(11);
      nn::FeedForward<double> ff(6, 10, p, rng);
      for (Param<double>* q : ff.parameters())
        if (q->name.find("bias") != std::string::npos) init::uniform(q->value, rng, -0.3, 0.3);
      REQUIRE(ff.parameters().size() == 4);
      REQUIRE(ff.parameters()[0]->name == "0.weight");
      REQUIRE(ff.parameters()[3]->name == "3.bias");
      REQUIRE(ff.parameters()[0]->shape == Shape{10, 6});
      Mat<double> u = randn(7, 6, 12);
      const Mat<double> R = testing::random_projection(7, 6, 13);
      Mat<double> du = Mat<double>::Zero(7, 6);
      Rng drop(5);
      auto objective = [&] {
        drop.reseed(5);
        nn::FeedForward<double>::Cache c;
        return dot(ff.forward(u, true, &drop, c), R);
      };
      auto analytic = [&] {
        drop.reseed(5);
        ff.zero_grad();
        nn::FeedForward<double>::Cache c;
        ff.forward(u, true, &drop, c);
        const Mat<double> g = ff.backward(R, u, c);
        du = g;  // copy into the registered buffer
      };
      testing::GradCheck gc;
      gc.add(ff.parameters());
      gc.add("u", u.data(), du.data(), u.size());
      const auto rep = gc.run(objective, analytic);
      INFO(rep.str());
      REQUIRE(rep.ok);
      // eval mode: no dropout, no random draw
      nn::FeedForward<double>::Cache c1, c2;
      Rng r1(1), r2(1);
      const Mat<double> y1 = ff.forward(u, false, &r1, c1);
      const Mat<double> y2 = ff.forward(u, false, nullptr, c2);
      REQUIRE((y1 - y2).cwiseAbs().maxCoeff() == 0.0);
      REQUIRE(r1.next_u64() == r2.next_u64());
    }
  }
}

TEST_CASE("nn::Dropout: the mask is counter-based (the same bits for any thread count and any length)",
          "[nn][dropout][threads]") {
  nn::Dropout d(0.1);
  auto masked = [&](Index rows, int threads) {
    set_num_threads(threads);
    Mat<float> x = Mat<float>::Ones(rows, 1000);
    Rng rng(11);
    d.forward(x, true, &rng);
    set_num_threads(1);
    return x;
  };
  const Mat<float> a = masked(70, 1), b = masked(70, 2), c = masked(23, 2);
  REQUIRE((a - b).cwiseAbs().maxCoeff() == 0.0f);
  REQUIRE((a.topRows(23) - c).cwiseAbs().maxCoeff() == 0.0f);  // element k's draw depends on (seed, k) alone
  const double kept = static_cast<double>((a.array() != 0.0f).count()) / static_cast<double>(a.size());
  REQUIRE(kept == Approx(0.9).margin(0.005));
  Index runs = 0;  // no structure across chunk boundaries: runs of kept values as for independent draws
  for (Index k = 1; k < a.size(); ++k) runs += (a.data()[k] == 0.0f) != (a.data()[k - 1] == 0.0f);
  REQUIRE(static_cast<double>(runs) / static_cast<double>(a.size()) == Approx(2 * 0.9 * 0.1).margin(0.01));
}

TEST_CASE("nn::Dropout: inverted scaling, reproducible mask, identity in eval mode", "[nn][dropout]") {
  nn::Dropout d(0.25);
  Mat<double> x = Mat<double>::Ones(300, 100);
  Rng rng(3);
  const auto st = d.forward(x, true, &rng);
  REQUIRE(st.active);
  Index zeros = 0;
  for (Index k = 0; k < x.size(); ++k) {
    REQUIRE((x.data()[k] == 0.0 || x.data()[k] == Approx(1.0 / 0.75).epsilon(1e-15)));
    zeros += x.data()[k] == 0.0;
  }
  REQUIRE(static_cast<double>(zeros) / static_cast<double>(x.size()) == Approx(0.25).margin(0.01));
  Mat<double> g = Mat<double>::Ones(300, 100);
  nn::Dropout::backward(g, st);
  REQUIRE((g - x).cwiseAbs().maxCoeff() == 0.0);  // the same mask
  Mat<double> e = Mat<double>::Ones(3, 3);
  REQUIRE_FALSE(d.forward(e, false, nullptr).active);
  REQUIRE(e.sum() == 9.0);
  REQUIRE_THROWS_AS(d.forward(e, true, nullptr), Error);
  REQUIRE_THROWS_AS(nn::Dropout(1.0), Error);
}

TEST_CASE("nn::Dropout: forward keeps the mask as bits; backward from them equals the mask regenerated from the seed",
          "[nn][dropout]") {
  nn::Dropout d(0.3);
  Rng rng(5);
  nn::DropoutState st;
  for (const Index rows : {Index(37), Index(700), Index(3)}) {  // 700 x 30 spans several parallel chunks
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      Mat<float> x = Mat<float>::Ones(rows, 30);
      d.forward(x, true, &rng, st);  // the same state object every time: its storage is reused
      REQUIRE(st.active);
      REQUIRE(st.kept.size() == static_cast<std::size_t>((rows * 30 + 31) / 32));
      nn::DropoutState by_hand;  // the seed alone: backward regenerates the mask
      by_hand.active = true;
      by_hand.p = st.p;
      by_hand.seed = st.seed;
      Mat<float> g1 = Mat<float>::Constant(rows, 30, -2.5f), g2 = g1, x2 = Mat<float>::Ones(rows, 30);
      nn::Dropout::backward(g1, st);
      nn::Dropout::backward(g2, by_hand);
      nn::Dropout::apply(x2, st);
      set_num_threads(1);
      REQUIRE((g1 - g2).cwiseAbs().maxCoeff() == 0.0f);
      REQUIRE((x2 - x).cwiseAbs().maxCoeff() == 0.0f);
      REQUIRE(((g1.array() == 0.0f) == (x.array() == 0.0f)).all());
    }
  }
  Mat<float> e = Mat<float>::Ones(4, 4);
  d.forward(e, false, nullptr, st);  // evaluation mode resets the state
  REQUIRE_FALSE(st.active);
  REQUIRE(st.kept.empty());
  REQUIRE(e.sum() == 16.0f);
}

TEST_CASE("nn::Dropout: forward_add and backward_into give the bits of the separate passes", "[nn][dropout]") {
  // x1 = x + Dropout(a) and y = x1 + Dropout(f) (out aliasing the branch), dx = g .* m: each against forward or
  // backward followed by the add or preceded by the copy, in float and over several parallel chunks, active and not.
  nn::Dropout d(0.25);
  for (const Index rows : {Index(3), Index(700)}) {  // 700 x 30 spans several chunks
    for (const int threads : {1, 2}) {
      for (const bool training : {true, false}) {
        set_num_threads(threads);
        const Mat<float> x = randn(rows, 30, 41).cast<float>(), a0 = randn(rows, 30, 42).cast<float>();
        Rng r1(7), r2(7);
        nn::DropoutState s1, s2;
        Mat<float> a1 = a0, a2 = a0, y1, y2;
        d.forward(a1, training, &r1, s1);  // the separate passes
        y1 = x + a1;
        d.forward_add(a2, x, training, &r2, s2, y2);
        CHECK((y1.array() == y2.array()).all());
        CHECK((a1.array() == a2.array()).all());
        CHECK(s1.active == s2.active);
        CHECK(s1.seed == s2.seed);
        CHECK(s1.kept == s2.kept);
        Mat<float> f1 = a0, f2 = a0;  // out aliasing the dropped branch, as the FFN's residual does
        d.forward(f1, training, &r1, s1);
        f1 += x;
        d.forward_add(f2, x, training, &r2, s2, f2);
        CHECK((f1.array() == f2.array()).all());
        const Mat<float> g = randn(rows, 30, 43).cast<float>();
        Mat<float> dg1 = g, dg2;
        nn::Dropout::backward(dg1, s1);
        nn::Dropout::backward_into(g, s2, dg2);
        CHECK((dg1.array() == dg2.array()).all());
        CHECK((g.array() == randn(rows, 30, 43).cast<float>().array()).all());  // g unchanged
        set_num_threads(1);
      }
    }
  }
  Mat<float> a = Mat<float>::Ones(2, 3), x = Mat<float>::Ones(3, 2), out;
  Rng rng(1);
  nn::DropoutState st;
  CHECK_THROWS_WITH(d.forward_add(a, x, true, &rng, st, out), Catch::Contains("Dropout::forward_add"));
  CHECK_THROWS_WITH(nn::Dropout::backward_into(a, st, a), Catch::Contains("must not be"));
}

TEST_CASE("EncoderLayer task-path gradients match finite differences", "[nn][encoder][gradcheck]") {
  struct LC {
    const char* name;
    bool oracle, mask;
    double dropout;
  };
  for (const LC& lc : {LC{"inference path", false, false, 0.0}, LC{"oracle + mask", true, true, 0.0},
                       LC{"oracle + mask + dropout 0.2", true, true, 0.2}}) {
    SECTION(lc.name) {
      const Index B = 2, T = 4, D = 8, H = 2;
      Rng rng(21);
      nn::EncoderLayer<double> layer(D, H, 12, lc.dropout, rng);
      for (Param<double>* p : layer.parameters())
        if (p->name.find("bias") != std::string::npos) init::uniform(p->value, rng, -0.3, 0.3);
      init::uniform(layer.ln1().weight.value, rng, 0.6, 1.4);
      init::uniform(layer.ln2().weight.value, rng, 0.6, 1.4);
      REQUIRE(layer.parameters().size() == 19);
      REQUIRE(layer.parameters()[0]->name == "attn.W_q.weight");
      REQUIRE(layer.parameters()[11]->name == "ln1.weight");
      REQUIRE(layer.parameters()[15]->name == "ff.0.weight");
      Mat<double> x = randn(B * T, D, 22);
      Tensor<std::uint8_t> km({B, T}, 1);
      km[B * T - 1] = 0;
      Tensor<double> oracle({B, T, T});
      Rng orng(23);
      for (Index k = 0; k < oracle.numel(); ++k) oracle[k] = orng.uniform() < 0.4 ? kNaN : orng.uniform();
      AttnInputs<double> in(B, T);
      if (lc.mask) in.set_key_mask(km);
      if (lc.oracle) in.set_oracle(oracle);
      in.set_gamma_mix(0.5);
      Rng drop(31);
      in.set_training(lc.dropout > 0, &drop);
      nn::EncoderLayer<double>::Cache c0;
      layer.forward(x, in, c0);
      Tensor<double> frozen({B, H, T, T});
      for (Index k = 0; k < frozen.numel(); ++k) frozen[k] = c0.attn.alpha_hat[static_cast<std::size_t>(k)];
      in.set_frozen_alpha_hat(frozen);
      const Mat<double> R = testing::random_projection(B * T, D, 24);
      Mat<double> dx = Mat<double>::Zero(B * T, D);
      auto objective = [&] {
        drop.reseed(31);
        nn::EncoderLayer<double>::Cache c;
        return dot(layer.forward(x, in, c), R);
      };
      auto analytic = [&] {
        drop.reseed(31);
        layer.zero_grad();
        nn::EncoderLayer<double>::Cache c;
        layer.forward(x, in, c);
        const Mat<double> g = layer.backward(R, c);
        dx = g;  // copy into the registered buffer
      };
      testing::GradCheck gc;
      gc.add_except(layer.parameters(), {"W_gate", "c_gate"});
      gc.add("x", x.data(), dx.data(), x.size());
      const auto rep = gc.run(objective, analytic);
      INFO(rep.str());
      REQUIRE(rep.ok);
      analytic();
      REQUIRE(layer.attention().W_gate().grad.cwiseAbs().maxCoeff() == 0.0);
      REQUIRE(layer.attention().c_gate().grad.cwiseAbs().maxCoeff() == 0.0);
    }
  }
}

// =============================================================================================== model

TEST_CASE("TransformerModel parameters: the reference's state_dict names, shapes and groups", "[nn][model]") {
  ModelCase mc;
  Model model = make_model<Model>(mc);
  const ParamList<double> ps = model.parameters();
  REQUIRE(ps.size() == 2 + 19 * 2 + 2 + 4 + 1);
  REQUIRE(ps.front()->name == "tok_emb.weight");
  REQUIRE(ps.front()->shape == Shape{11, 8});
  REQUIRE(ps[1]->name == "seg_emb.weight");
  REQUIRE(ps[1]->shape == Shape{2, 8});
  REQUIRE(ps.back()->name == "mlm_head.bias");
  std::set<std::string> names;
  for (Param<double>* p : ps) {
    names.insert(p->name);
    const bool gate = p->name.find("W_gate") != std::string::npos || p->name.find("c_gate") != std::string::npos;
    REQUIRE(p->group == (gate ? "gate" : "main"));
  }
  REQUIRE(names.size() == ps.size());
  for (const char* n : {"layers.0.attn.W_rel", "layers.1.attn.W_gate", "layers.1.attn.c_gate", "layers.0.ln1.weight",
                        "layers.1.ln2.bias", "layers.0.ff.0.weight", "layers.1.ff.3.bias", "ln_f.weight", "ln_f.bias",
                        "cls_head.0.weight", "cls_head.0.bias", "cls_head.3.weight", "cls_head.3.bias"})
    REQUIRE(names.count(n) == 1);
  REQUIRE(find_param(ps, "cls_head.3.weight").shape == Shape{3, 8});
  REQUIRE(find_param(ps, "layers.1.ff.0.weight").shape == Shape{12, 8});
  REQUIRE(find_param(ps, "layers.0.attn.W_gate").shape == Shape{2, 2 * 4 + 2});
  // initialisation: LayerNorms 1 / 0, tok_emb ~ N(0, 1/D) including the padding row, seg_emb ~ N(0, 1)
  Rng rng(1);
  nn::ModelConfig big = make_config(mc);
  big.vocab_size = 4000;
  big.d_model = 16;
  big.n_heads = 4;
  big.n_layers = 1;
  Model m(big, rng);
  REQUIRE(m.ln_f().weight.value.minCoeff() == 1.0);
  REQUIRE(m.ln_f().bias.value.cwiseAbs().maxCoeff() == 0.0);
  const auto& E = m.tok_emb().weight.value;
  const double var = E.squaredNorm() / static_cast<double>(E.size());
  REQUIRE(var == Approx(1.0 / 16).epsilon(0.05));
  REQUIRE(m.tok_emb().weight.value.head(16).cwiseAbs().maxCoeff() > 0);  // pad row 0
  const double bound = 1.0 / 4.0;  // 1/sqrt(16)
  REQUIRE(m.cls_head0().weight.value.cwiseAbs().maxCoeff() <= bound);
  REQUIRE(m.mlm_bias().value.cwiseAbs().maxCoeff() <= bound);
  REQUIRE(m.layer(0).feed_forward().linear3().weight.value.cwiseAbs().maxCoeff() <= 1.0 / std::sqrt(12.0));
}

TEST_CASE("TransformerModel task-path gradients match finite differences", "[nn][model][gradcheck]") {
  std::vector<std::pair<std::string, ModelCase>> cases;
  ModelCase c0;
  cases.push_back({"cls, oracle, mask, segments", c0});
  ModelCase c1 = c0;
  c1.oracle = false;
  c1.segments = false;
  cases.push_back({"cls, no oracle, no segments", c1});
  ModelCase c2 = c0;
  c2.task = nn::Task::mlm;
  cases.push_back({"mlm, oracle (tied head)", c2});
  ModelCase c3 = c2;
  c3.oracle = false;
  c3.mask = false;
  cases.push_back({"mlm, no oracle, no mask", c3});
  ModelCase c4 = c0;
  c4.targets = true;
  c4.gamma = 1.0;
  c4.supervise = std::vector<Index>{-1};
  cases.push_back({"cls, targets, gamma 1, only the last layer supervised", c4});
  ModelCase c5 = c0;
  c5.dropout = 0.2;
  cases.push_back({"cls with dropout 0.2 (fixed masks)", c5});
  ModelCase c6 = c2;
  c6.dropout = 0.2;
  c6.L = 1;
  cases.push_back({"mlm with dropout 0.2, one layer", c6});
  for (auto& [name, mc] : cases) {
    SECTION(name) {
      const auto rep = check_model_task<Model>(mc);
      INFO(rep.str());
      REQUIRE(rep.ok);
      REQUIRE(rep.tensors.size() == (mc.L == 2 ? 2 + 17 * 2 + 2 + 4 + 1 : 2 + 17 + 2 + 4 + 1));
    }
  }
  SECTION("cls, objective <logits, R> through backward_logits") {
    const auto rep = check_model_task<Model>(c0, true);
    INFO(rep.str());
    REQUIRE(rep.ok);
  }
}

TEST_CASE("TransformerModel gate-path gradients match the averaged gate loss", "[nn][model][gradcheck]") {
  std::vector<std::pair<std::string, ModelCase>> cases;
  ModelCase c0;
  cases.push_back({"cls, every layer supervised", c0});
  ModelCase c1 = c0;
  c1.targets = true;
  c1.L = 3;
  cases.push_back({"3 layers, targets", c1});
  ModelCase c2 = c0;
  c2.L = 3;
  c2.supervise = std::vector<Index>{0, -1, 2};  // {0, 2}: duplicates count once
  cases.push_back({"3 layers, layers 0 and 2 supervised", c2});
  ModelCase c3 = c0;
  c3.task = nn::Task::mlm;
  c3.gamma = 0.0;
  cases.push_back({"mlm, gamma 0", c3});
  for (auto& [name, mc] : cases) {
    SECTION(name) {
      const auto rep = check_model_gate(mc);
      INFO(rep.str());
      REQUIRE(rep.ok);
      for (const auto& t : rep.tensors) INFO(t.name << " max|g| " << t.max_abs_grad);
      // supervised layers carry gate gradient; unsupervised ones none
      Model model = make_model<Model>(mc);
      Model::Cache c;
      model.forward(make_batch(mc), mc.gamma, false, nullptr, c);
      model.zero_grad();
      model.backward_gate(c);
      for (Index l = 0; l < model.n_layers(); ++l) {
        const double g = model.layer(l).attention().W_gate().grad.cwiseAbs().sum();
        if (model.is_supervised(l))
          REQUIRE(g > 0);
        else
          REQUIRE(g == 0.0);
      }
    }
  }
}

TEST_CASE("TransformerModel loss_gate is the mean over supervised layers; oracle only reaches them", "[nn][model]") {
  ModelCase mc;
  mc.L = 3;
  mc.supervise = std::vector<Index>{1, -1};
  Model model = make_model<Model>(mc);
  REQUIRE(model.n_supervised() == 2);
  REQUIRE_FALSE(model.is_supervised(0));
  Model::Cache c;
  const auto out = model.forward(make_batch(mc), mc.gamma, false, nullptr, c);
  REQUIRE(out.layer_supervised == std::vector<std::uint8_t>{0, 1, 1});
  REQUIRE(out.layer_loss_gate[0] == 0.0);
  REQUIRE_FALSE(c.layers[0].attn.has_oracle);
  REQUIRE(c.layers[2].attn.has_oracle);
  REQUIRE(out.layer_loss_gate[1] > 0);
  REQUIRE(out.loss_gate == Approx((out.layer_loss_gate[1] + out.layer_loss_gate[2]) / 2).epsilon(1e-15));
  REQUIRE(out.layer_stats[1].n_labelled > 0);
  REQUIRE(out.loss() == out.task_loss + out.loss_gate);
  // no oracle: zero gate loss and a no-op gate backward
  ModelCase mn = mc;
  mn.oracle = false;
  Model::Cache cn;
  const auto on = model.forward(make_batch(mn), 0.5, false, nullptr, cn);
  REQUIRE(on.loss_gate == 0.0);
  model.zero_grad();
  model.backward_gate(cn);
  for (Param<double>* p : model.parameters()) REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
  // an empty supervise list: the oracle reaches no layer
  ModelCase me = mc;
  me.supervise = std::vector<Index>{};
  Model m2 = make_model<Model>(me);
  REQUIRE(m2.n_supervised() == 0);
  Model::Cache ce;
  REQUIRE(m2.forward(make_batch(me), 0.5, false, nullptr, ce).loss_gate == 0.0);
}

TEST_CASE("TransformerModel gradient isolation is exact", "[nn][model][isolation]") {
  for (nn::Task task : {nn::Task::cls, nn::Task::mlm}) {
    ModelCase mc;
    mc.task = task;
    mc.dropout = 0.1;
    Model model = make_model<Model>(mc);
    const auto r = model.verify_gradient_isolation(make_batch(mc), 0.5, 7);
    INFO(nn::to_string(task) << ": task->gate " << r.task_gate_grad << " task->W_rel " << r.task_rel_grad
                             << " gate->main " << r.gate_main_grad << " gate->gate " << r.gate_gate_grad);
    REQUIRE(r.ok);
    REQUIRE(r.task_gate_grad == 0.0);
    REQUIRE(r.gate_main_grad == 0.0);
    REQUIRE(r.task_rel_grad > 0);
    REQUIRE(r.gate_gate_grad > 0);
    for (Param<double>* p : model.parameters()) REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);  // cleared after
  }
  ModelCase mn;
  mn.oracle = false;
  Model model = make_model<Model>(mn);
  REQUIRE_THROWS_AS(model.verify_gradient_isolation(make_batch(mn)), Error);
}

TEST_CASE("TransformerModel backward accumulates; backward = backward_task + backward_gate", "[nn][model]") {
  ModelCase mc;
  mc.targets = true;
  Model model = make_model<Model>(mc);
  const auto batch = make_batch(mc);
  Model::Cache c;
  model.forward(batch, mc.gamma, false, nullptr, c);
  model.zero_grad();
  model.backward_task(c);
  std::vector<Vec<double>> task;
  for (Param<double>* p : model.parameters()) task.push_back(p->grad);
  model.zero_grad();
  model.backward_gate(c);
  std::vector<Vec<double>> gate;
  for (Param<double>* p : model.parameters()) gate.push_back(p->grad);
  model.zero_grad();
  model.backward(c);
  std::vector<Vec<double>> both;
  for (Param<double>* p : model.parameters()) both.push_back(p->grad);
  const ParamList<double> ps = model.parameters();
  for (std::size_t k = 0; k < ps.size(); ++k) {
    INFO(ps[k]->name);
    // the two parameter sets are disjoint, so the sum is exact
    REQUIRE((both[k] - (task[k] + gate[k])).cwiseAbs().maxCoeff() == 0.0);
  }
  model.backward(c);  // a second backward with the same cache adds the same gradients again
  for (std::size_t k = 0; k < ps.size(); ++k) {
    INFO(ps[k]->name);
    REQUIRE((ps[k]->grad - 2.0 * both[k]).cwiseAbs().maxCoeff() <= 1e-15 * (1 + both[k].cwiseAbs().maxCoeff()));
  }
}

TEST_CASE("TransformerModel: every parameter gets gradient, the padding row only through the tied head",
          "[nn][model]") {
  for (nn::Task task : {nn::Task::cls, nn::Task::mlm}) {
    ModelCase mc;
    mc.task = task;
    Model model = make_model<Model>(mc);
    Model::Cache c;
    model.forward(make_batch(mc), mc.gamma, false, nullptr, c);
    model.zero_grad();
    model.backward(c);
    for (Param<double>* p : model.parameters()) {
      INFO(nn::to_string(task) << " " << p->name);
      const bool unused = task == nn::Task::cls ? p->name == "mlm_head.bias" : p->name.rfind("cls_head", 0) == 0;
      if (unused)
        REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
      else
        REQUIRE(p->grad.cwiseAbs().maxCoeff() > 0.0);
    }
    const auto pad_row = model.tok_emb().weight.grad_mat().row(0);
    if (task == nn::Task::cls) {
      REQUIRE(pad_row.cwiseAbs().maxCoeff() == 0.0);  // padding_idx: no lookup gradient
    } else {
      // mlm: the head's gradient only: dE[0] = sum_n dlogits[n, 0] y_n
      const RowVec<double> head = c.dlogits.col(0).transpose() * c.yf;
      REQUIRE((pad_row - head).cwiseAbs().maxCoeff() < 1e-15);
      REQUIRE(head.cwiseAbs().maxCoeff() > 0);
    }
  }
}

TEST_CASE("TransformerModel: padding never produces NaN; eval mode is deterministic; dropout follows the seed",
          "[nn][model]") {
  ModelCase mc;
  mc.dropout = 0.3;
  mc.B = 3;
  Model model = make_model<Model>(mc);
  auto batch = make_batch(mc);
  for (Index t = 1; t < mc.T; ++t) batch.attention_mask[2 * mc.T + t] = 0;  // row 2: one real token
  Model::Cache c1, c2, c3, c4;
  const auto e1 = model.forward(batch, 0.3, false, nullptr, c1);
  const auto e2 = model.forward(batch, 0.3, false, nullptr, c2);
  REQUIRE(e1.logits.allFinite());
  REQUIRE(std::isfinite(e1.task_loss));
  REQUIRE(std::isfinite(e1.loss_gate));
  REQUIRE((e1.logits - e2.logits).cwiseAbs().maxCoeff() == 0.0);
  Rng r1(9), r2(9), r3(10);
  const auto t1 = model.forward(batch, 0.3, true, &r1, c3);
  const auto t2 = model.forward(batch, 0.3, true, &r2, c4);
  REQUIRE((t1.logits - t2.logits).cwiseAbs().maxCoeff() == 0.0);
  REQUIRE((t1.logits - e1.logits).cwiseAbs().maxCoeff() > 0.0);
  Model::Cache c5;
  const auto t3 = model.forward(batch, 0.3, true, &r3, c5);
  REQUIRE((t3.logits - t1.logits).cwiseAbs().maxCoeff() > 0.0);
  model.zero_grad();
  model.backward(c3);
  for (Param<double>* p : model.parameters()) REQUIRE(p->grad.allFinite());
  REQUIRE_THROWS_AS(model.forward(batch, 0.3, true, nullptr, c5), Error);
}

namespace {
/// Logits, losses and every gradient of one training step at `threads` threads.
template <class M>
std::vector<double> step_bits(M& model, const nn::ModelBatch<double>& batch, int threads) {
  set_num_threads(threads);
  Rng rng(4);
  typename M::Cache c;
  const auto out = model.forward(batch, 0.5, true, &rng, c);
  model.zero_grad();
  model.backward(c);
  std::vector<double> v(out.logits.data(), out.logits.data() + out.logits.size());
  v.push_back(out.task_loss);
  v.push_back(out.loss_gate);
  for (Param<double>* p : model.parameters()) v.insert(v.end(), p->grad.data(), p->grad.data() + p->numel());
  set_num_threads(1);
  return v;
}

ModelCase threads_case() {
  ModelCase mc;
  mc.B = 4;
  mc.T = 40;
  mc.max_len = 64;
  mc.D = 16;
  mc.d_ff = 24;
  mc.dropout = 0.1;
  return mc;
}
}  // namespace

TEST_CASE("TransformerModel (dot-product attention): 1 and 2 threads give identical bits", "[nn][model][threads]") {
  // The model's own kernels (embeddings, LayerNorm, FFN, dropout, heads, CE) with an attention whose products are
  // address-independent.
  ModelCase mc = threads_case();
  mc.oracle = false;
  auto model = make_model<nn::TransformerModel<double, DotProductAttention<double>>>(mc);
  const auto batch = make_batch(mc);
  const auto a = step_bits(model, batch, 1), b = step_bits(model, batch, 2), c = step_bits(model, batch, 1);
  REQUIRE(a == b);
  REQUIRE(a == c);
}

// Dual-Expert attention keeps its per-(b, h) slices in aligned buffers, so vectorised reductions run in the same
// order whatever the heap addresses: whole-model results are identical across calls and thread counts.
TEST_CASE("TransformerModel (Dual-Expert): 1 and 2 threads give identical bits", "[nn][model][threads]") {
  const ModelCase mc = threads_case();
  Model model = make_model<Model>(mc);
  const auto batch = make_batch(mc);
  const auto a = step_bits(model, batch, 1), b = step_bits(model, batch, 2);
  REQUIRE(a == b);
}

TEST_CASE("TransformerModel on the tiled Dual-Expert kernel: a training step agrees with the reference kernel",
          "[nn][model][tiled]") {
  // Same initial weights (same seed, same draws), same batch, same dropout masks (counter-based in both kernels):
  // logits, losses and every gradient agree to round-off; training forwards keep only the last layer's alpha-hat;
  // evaluation forwards run the reference kernel (every map kept) unless the map policy says otherwise.
  ModelCase mc = threads_case();
  mc.L = 3;
  mc.targets = true;
  mc.supervise = std::vector<Index>{0, 2};
  ModelCase mt = mc;
  mt.tiled = true;
  Model ref = make_model<Model>(mc), til = make_model<Model>(mt);
  const auto batch = make_batch(mc);
  for (double gamma : {0.0, 0.5, 1.0}) {
    INFO("gamma " << gamma);
    Model::Cache cr, ct;
    Rng r1(31), r2(31);
    const auto o1 = ref.forward(batch, gamma, true, &r1, cr);
    const auto o2 = til.forward(batch, gamma, true, &r2, ct);
    REQUIRE(ct.layers[0].attn.kernel == DeaKernel::tiled);
    REQUIRE(cr.layers[0].attn.kernel == DeaKernel::reference);
    REQUIRE((o1.logits - o2.logits).cwiseAbs().maxCoeff() <= 1e-11);
    REQUIRE(std::abs(o1.task_loss - o2.task_loss) <= 1e-11);
    REQUIRE(std::abs(o1.loss_gate - o2.loss_gate) <= 1e-11);
    REQUIRE(o1.loss_gate > 0);
    for (std::size_t l = 0; l < 3; ++l) {
      REQUIRE(o1.layer_stats[l].n_decision_pairs == o2.layer_stats[l].n_decision_pairs);
      REQUIRE(std::abs(o1.layer_stats[l].loss_decision - o2.layer_stats[l].loss_decision) <= 1e-11);
      REQUIRE(ct.layers[l].attn.attn.empty());  // no [B, H, T, T] map in a tiled training cache ...
    }
    REQUIRE(ct.layers[0].attn.alpha_hat.empty());
    const auto& a1 = cr.layers[2].attn.alpha_hat;  // ... except the last layer's alpha-hat (training metrics)
    const auto& a2 = ct.layers[2].attn.alpha_hat;
    REQUIRE(a2.size() == a1.size());
    double da = 0;
    for (std::size_t k = 0; k < a1.size(); ++k) da = std::max(da, std::abs(a1[k] - a2[k]));
    REQUIRE(da <= 1e-12);
    ref.zero_grad();
    til.zero_grad();
    ref.backward(cr);
    til.backward(ct);
    const auto pr = ref.parameters(), pt = til.parameters();
    for (std::size_t k = 0; k < pr.size(); ++k) {
      INFO(pr[k]->name);
      const double scale = std::max(1e-3, pr[k]->grad.cwiseAbs().maxCoeff());
      REQUIRE((pr[k]->grad - pt[k]->grad).cwiseAbs().maxCoeff() <= 1e-10 * scale);
    }
  }
  // evaluation mode: the reference kernel, so every map is there, and the same bits as the reference model
  Model::Cache er, et;
  const auto e1 = ref.forward(batch, 0.0, false, nullptr, er);
  const auto e2 = til.forward(batch, 0.0, false, nullptr, et);
  REQUIRE(et.layers[1].attn.kernel == DeaKernel::reference);
  REQUIRE(et.layers[1].attn.attn.size() == er.layers[1].attn.attn.size());
  REQUIRE((e1.logits - e2.logits).cwiseAbs().maxCoeff() == 0.0);
  // a map-free policy: tiled in both modes, nothing of size T^2 kept
  til.set_map_policy(false, false);
  Model::Cache ft, fe;
  Rng r3(31);
  til.forward(batch, 0.5, true, &r3, ft);
  const auto e3 = til.forward(batch, 0.0, false, nullptr, fe);
  for (const Model::Cache* c : {&ft, &fe})
    for (std::size_t l = 0; l < 3; ++l) {
      REQUIRE(c->layers[l].attn.kernel == DeaKernel::tiled);
      REQUIRE(c->layers[l].attn.alpha_hat.empty());
    }
  REQUIRE((e1.logits - e3.logits).cwiseAbs().maxCoeff() <= 1e-11);
}

TEST_CASE("TransformerModel rejects bad configurations and batches", "[nn][model][errors]") {
  ModelCase mc;
  nn::ModelConfig cfg = make_config(mc);
  Rng rng(1);
  auto bad = [&](auto edit) {
    nn::ModelConfig c = cfg;
    edit(c);
    return c;
  };
  REQUIRE_THROWS_AS(Model(bad([](nn::ModelConfig& c) { c.vocab_size = 0; }), rng), Error);
  REQUIRE_THROWS_AS(Model(bad([](nn::ModelConfig& c) { c.n_heads = 3; }), rng), Error);
  REQUIRE_THROWS_AS(Model(bad([](nn::ModelConfig& c) { c.dropout = 1.0; }), rng), Error);
  REQUIRE_THROWS_AS(Model(bad([](nn::ModelConfig& c) { c.pad_id = 11; }), rng), Error);
  REQUIRE_THROWS_AS(nn::parse_task("seq"), Error);
  Model model = make_model<Model>(mc);
  Model::Cache c;
  {
    auto b = make_batch(mc);
    b.input_ids[3] = 11;  // out of the vocabulary
    REQUIRE_THROWS_AS(model.forward(b, 0.5, false, nullptr, c), Error);
  }
  {
    auto b = make_batch(mc);
    b.token_type_ids[1] = 2;
    REQUIRE_THROWS_AS(model.forward(b, 0.5, false, nullptr, c), Error);
  }
  {
    auto b = make_batch(mc);
    b.labels = Tensor<std::int64_t>({mc.B, mc.T}, 0);  // mlm-shaped labels for a cls model
    REQUIRE_THROWS_AS(model.forward(b, 0.5, false, nullptr, c), Error);
  }
  {
    auto b = make_batch(mc);
    b.labels[0] = 3;  // n_classes = 3
    REQUIRE_THROWS_AS(model.forward(b, 0.5, false, nullptr, c), Error);
  }
  {
    auto b = make_batch(mc);
    b.alpha_oracle = Tensor<double>({mc.B, mc.T, mc.T + 1});
    REQUIRE_THROWS_AS(model.forward(b, 0.5, false, nullptr, c), Error);
  }
  {
    auto b = make_batch(mc);
    b.attention_mask = Tensor<std::uint8_t>({mc.B, mc.T - 1}, 1);
    REQUIRE_THROWS_AS(model.forward(b, 0.5, false, nullptr, c), Error);
  }
  {
    ModelCase lc = mc;
    lc.T = 17;  // max_len 16
    REQUIRE_THROWS_AS(model.forward(make_batch(lc), 0.5, false, nullptr, c), Error);
  }
  REQUIRE_THROWS_AS(model.forward(make_batch(mc), 1.5, false, nullptr, c), Error);
  Model::Cache empty;
  REQUIRE_THROWS_AS(model.backward(empty), Error);
}

TEST_CASE("TransformerModel with another attention class (dot-product) plugs in", "[nn][model][gradcheck]") {
  using DPModel = nn::TransformerModel<double, DotProductAttention<double>>;
  static_assert(!DPModel::has_gate, "dot-product attention has no gate");
  ModelCase mc;
  mc.oracle = false;
  // W_k.bias adds q.b_k to every key of a query row, which the softmax cancels: its gradient is exactly zero in
  // theory and finite differences see only rounding noise, so it is checked for (near) zero instead.
  const auto rep = check_model_task<DPModel>(mc, false, {"W_k.bias"});
  INFO(rep.str());
  REQUIRE(rep.ok);
  DPModel model = make_model<DPModel>(mc);
  DPModel::Cache c;
  model.forward(make_batch(mc), 0.0, false, nullptr, c);
  model.zero_grad();
  model.backward(c);
  for (Index l = 0; l < model.n_layers(); ++l)
    REQUIRE(find_param(model.parameters(), "layers." + std::to_string(l) + ".attn.W_k.bias").grad.cwiseAbs().maxCoeff() <
            1e-15);
  REQUIRE(find_param(model.parameters(), "layers.1.attn.W_o.bias").numel() == 8);
}

TEST_CASE("TransformerModel in float: realistic sizes run and stay finite", "[nn][model][float]") {
  nn::ModelConfig cfg;
  cfg.vocab_size = 200;
  cfg.d_model = 64;
  cfg.n_heads = 4;
  cfg.n_layers = 2;
  cfg.d_ff = 128;
  cfg.max_len = 64;
  cfg.dropout = 0.1;
  Rng rng(3);
  nn::TransformerModel<float> model(cfg, rng);
  nn::ModelBatch<float> b;
  const Index B = 8, T = 48;
  b.input_ids = Tensor<std::int64_t>({B, T});
  b.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  b.alpha_oracle = Tensor<float>({B, T, T}, std::numeric_limits<float>::quiet_NaN());
  for (Index k = 0; k < B * T; ++k) b.input_ids[k] = 5 + static_cast<std::int64_t>(rng.below(195));
  for (Index bb = 0; bb < B; ++bb)
    for (Index i = 1; i < 10; ++i)
      for (Index j = 12; j < 20; ++j) b.alpha_oracle[(bb * T + i) * T + j] = static_cast<float>(rng.uniform(0, 0.9));
  b.labels = Tensor<std::int64_t>({B});
  for (Index k = 0; k < B; ++k) b.labels[k] = k % 2;
  nn::TransformerModel<float>::Cache c;
  const auto out = model.forward(b, 1.0f, true, &rng, c);
  REQUIRE(std::isfinite(out.task_loss));
  // The task loss is the mean cross-entropy of the returned logits: recomputed here in double from the logits and
  // labels, it agrees to float round-off (a few ulp of values below 10 over 8 rows: 1e-5 leaves a wide margin).
  // (It is near log 2 only as far as the initial head's logits are near each other: each row's loss is
  // softplus(z_other - z_label), log 2 at equal logits.)
  REQUIRE(out.logits.rows() == B);
  REQUIRE(out.logits.cols() == 2);
  double ce = 0;
  for (Index k = 0; k < B; ++k) {
    const double z0 = out.logits(k, 0), z1 = out.logits(k, 1);
    const double zl = b.labels[k] == 0 ? z0 : z1;
    const double m = std::max(z0, z1);
    ce += m + std::log(std::exp(z0 - m) + std::exp(z1 - m)) - zl;
  }
  ce /= double(B);
  REQUIRE(out.task_loss == Approx(ce).epsilon(0).margin(1e-5));
  REQUIRE(out.n_targets == B);
  REQUIRE(out.loss_gate > 0);
  model.zero_grad();
  model.backward(c);
  for (Param<float>* p : model.parameters()) {
    INFO(p->name);
    REQUIRE(p->grad.allFinite());
  }
  REQUIRE(model.verify_gradient_isolation(b, 0.5f).ok);
}

TEST_CASE("TransformerModel builds one set of attention inputs per forward: every layer reads one oracle",
          "[nn][model][inputs]") {
  ModelCase mc;
  mc.L = 3;
  mc.targets = true;
  mc.supervise = std::vector<Index>{0, 2};
  Model model = make_model<Model>(mc);
  const nn::ModelBatch<double> batch = make_batch(mc);
  Model::Cache c;
  const auto out = model.forward(batch, mc.gamma, false, nullptr, c);
  // the model's cache holds the inputs: one copy of the oracle and targets, validated once
  REQUIRE(c.inputs.batch() == mc.B);
  REQUIRE(c.inputs.q_len() == mc.T);
  REQUIRE(c.inputs.has_oracle());
  REQUIRE(c.inputs.has_targets());
  REQUIRE(c.inputs.has_key_mask());
  REQUIRE(c.inputs.gamma_mix() == mc.gamma);
  REQUIRE(c.inputs.oracle().ptr() != batch.alpha_oracle.ptr());  // a copy: the caller keeps its batch
  for (Index k = 0; k < batch.alpha_oracle.numel(); ++k) {
    const double a = batch.alpha_oracle[k], b = c.inputs.oracle()[k];
    REQUIRE(((std::isnan(a) && std::isnan(b)) || a == b));
  }
  // supervised layers read that very tensor (shared, not copied); the others read the same mask without it
  for (Index l : {0, 2}) {
    const auto& li = c.layers[static_cast<std::size_t>(l)].inputs;
    REQUIRE(li.has_oracle());
    REQUIRE(&li.oracle() == &c.inputs.oracle());
    REQUIRE(&li.targets() == &c.inputs.targets());
    REQUIRE(li.key_mask(0) == c.inputs.key_mask(0));
  }
  const auto& u = c.layers[1].inputs;
  REQUIRE_FALSE(u.has_oracle());
  REQUIRE_FALSE(u.has_targets());
  REQUIRE(u.key_mask(1) == c.inputs.key_mask(1));
  REQUIRE(u.key_bias(1) == c.inputs.key_bias(1));
  REQUIRE(out.layer_supervised == std::vector<std::uint8_t>{1, 0, 1});
  // a batch given away: its oracle is moved in (no copy at all), with the same results bit for bit
  nn::ModelBatch<double> moved = batch;
  const double* storage = moved.alpha_oracle.ptr();
  Model::Cache cm;
  const auto om = model.forward(std::move(moved), mc.gamma, false, nullptr, cm);
  REQUIRE(cm.inputs.oracle().ptr() == storage);
  REQUIRE(om.logits == out.logits);
  REQUIRE(om.loss_gate == out.loss_gate);
  REQUIRE(om.task_loss == out.task_loss);
  model.zero_grad();
  model.backward(c);
  std::vector<Vec<double>> g1;
  for (Param<double>* p : model.parameters()) g1.push_back(p->grad);
  model.zero_grad();
  model.backward(cm);
  const ParamList<double> ps = model.parameters();
  for (std::size_t k = 0; k < ps.size(); ++k) REQUIRE(ps[k]->grad == g1[k]);
}

TEST_CASE("TransformerModel: one spelling of an absent input, and inputs the attention cannot take are refused",
          "[nn][model][inputs][errors]") {
  ModelCase mc;
  Model model = make_model<Model>(mc);
  Model::Cache c;
  // absent = default-constructed: no oracle reaches any layer
  ModelCase mn = mc;
  mn.oracle = false;
  model.forward(make_batch(mn), 0.5, false, nullptr, c);
  REQUIRE_FALSE(c.inputs.has_oracle());
  REQUIRE_FALSE(c.has_oracle);
  // targets need the oracle
  auto b = make_batch(mn);
  b.target_idx = Tensor<std::int64_t>({mc.B, mc.T}, 0);
  REQUIRE_THROWS_WITH(model.forward(b, 0.5, false, nullptr, c),
                      Catch::Contains("target_idx") && Catch::Contains("without alpha_oracle"));
  // +-inf in the oracle is rejected once, naming the argument
  auto bi = make_batch(mc);
  bi.alpha_oracle[3] = std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_WITH(model.forward(bi, 0.5, false, nullptr, c), Catch::Contains("alpha") && Catch::Contains("inf"));
  // a model on dot-product attention refuses an oracle instead of ignoring it
  using DPModel = nn::TransformerModel<double, DotProductAttention<double>>;
  DPModel dp = make_model<DPModel>(mc);
  DPModel::Cache dc;
  REQUIRE_THROWS_WITH(dp.forward(make_batch(mc), 0.5, false, nullptr, dc),
                      Catch::Contains("DotProductAttention") && Catch::Contains("oracle") &&
                          Catch::Contains("not supported"));
  REQUIRE(dp.forward(make_batch(mn), 0.5, false, nullptr, dc).logits.allFinite());
  // a collated batch in which no record is labelled has no oracle (absent, not an all-NaN tensor)
  data::SimpleTokenizer tok;
  tok.build_vocab({"paris france car wheel"});
  std::vector<data::Record> recs{data::make_record("paris", "france", 1, "conceptnet", "capital", "strong"),
                                 data::make_record("car", "wheel", 0, "conceptnet", "random_negative", "none")};
  const data::PairBatch<double> none = data::collate_pairs<double>(recs, tok, 16);
  REQUIRE(none.alpha_oracle.dim() == 0);
  recs[1].alpha = 0.25;
  const data::PairBatch<double> one = data::collate_pairs<double>(recs, tok, 16);
  REQUIRE(one.alpha_oracle.shape == Shape{2, one.seq_len(), one.seq_len()});
}

// What the model asks of an attention class is told apart at compile time (nn/attention_traits.hpp).
static_assert(nn::traits::takes_token_ids<TokenRoutedAttention<double>>::value, "token-routed forward takes ids");
static_assert(!nn::traits::takes_token_ids<DotProductAttention<double>>::value, "dot-product forward takes no ids");
static_assert(!nn::traits::takes_token_ids<LaplacianAttention<double>>::value, "Laplacian forward takes no ids");
static_assert(!nn::traits::takes_token_ids<DualExpertAttention<double>>::value, "Dual-Expert forward takes no ids");
static_assert(nn::traits::has_gate_loss<DualExpertAttention<double>>::value, "Dual-Expert has a gate loss");
static_assert(!nn::traits::has_gate_loss<DotProductAttention<double>>::value, "dot-product has no gate loss");
static_assert(nn::traits::support<DualExpertAttention<double>>().oracle &&
                  nn::traits::support<DualExpertAttention<double>>().causal,
              "Dual-Expert: oracle and causal masking");
static_assert(!nn::traits::support<DotProductAttention<double>>().oracle &&
                  nn::traits::support<LaplacianAttention<double>>().causal &&
                  nn::traits::support<TokenRoutedAttention<double>>().causal,
              "dot-product, Laplacian, token-routed: causal masking, no oracle");
namespace {
struct NoSupportDeclared {};  // a class that declares no kSupport accepts none of the optional inputs
}  // namespace
static_assert(!nn::traits::support<NoSupportDeclared>().oracle && !nn::traits::support<NoSupportDeclared>().causal &&
                  !nn::traits::support<NoSupportDeclared>().keep_maps,
              "no kSupport: nothing optional");

}  // namespace test_nn
