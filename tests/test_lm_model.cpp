// Tests of the decoder-only causal LM (dea/lm/*.hpp): the public golden case of the reference in double and float,
// finite-difference gradients of every parameter and of the input embeddings for each attention type, the loss
// conventions (pre-shifted labels, -100, label smoothing, z-loss) against a direct computation, causal attention
// against a plain masked computation written here, KV-cached decoding against the full forward, thread-count
// invariance, accumulation, the init statistics and bad configurations.
#include <catch2/catch.hpp>
#include <dea/interop/lm_case.hpp>
#include <dea/lm/model.hpp>
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_lm_model {

using namespace dea;
using lm::DecoderConfig;
using lm::DecoderLM;
using IdTensor = Tensor<std::int64_t>;

namespace {

const std::string kGolden = std::string(DEA_TEST_DATA_DIR) + "/golden/lm/";

DecoderConfig tiny_config(const std::string& attention, Index D = 8, Index H = 2, Index Hkv = -1) {
  DecoderConfig c;
  c.hidden_size = D;
  c.num_hidden_layers = 2;
  c.num_attention_heads = H;
  c.num_key_value_heads = Hkv;
  c.attention_type = attention;
  c.intermediate_size = 12;
  c.vocab_size = 11;
  c.mlp_type = "dense_deterministic";
  c.tr_mha_num_experts = 4;
  c.tr_mha_adapter_rank = 2;
  c.tr_mha_top_k = 2;
  return c;
}

IdTensor random_ids(Index B, Index T, Index V, Rng& rng) {
  IdTensor t({B, T});
  for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(V)));
  return t;
}

/// Runs the scope on one thread: the thousands of tiny forward passes of a gradient check would otherwise mostly wait
/// on thread wake-ups (the thread count does not change the bits: tested below).
struct OneThread {
  int saved = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved); }
};

/// Moves every parameter away from its init (as the golden cases do) so that every path carries a gradient of
/// the size of the values: gains 1 + N(0, 0.1^2), the v2 scalars fixed, the rest N(0, std^2).
template <class S>
void randomise(DecoderLM<S>& m, Rng& rng, double std = 0.3) {
  for (Param<S>* p : m.parameters()) {
    const std::string& n = p->name;
    if (n.find("norm") != std::string::npos) {
      for (Index i = 0; i < p->numel(); ++i) p->value[i] = static_cast<S>(1.0 + 0.1 * rng.normal());
    } else if (n.find("adapter_output_gate") != std::string::npos) {
      p->value[0] = S(0.7);
    } else if (n.find("verifier_gate_bias") != std::string::npos) {
      p->value[0] = S(0.4);
    } else {
      for (Index i = 0; i < p->numel(); ++i) p->value[i] = static_cast<S>(std * rng.normal());
    }
  }
}

/// Gradient check of the objective loss(logits) + w <logits, R> (R random: it also reaches the dropped last
/// position) with respect to every parameter, then with respect to the input embeddings h_0 (forward_embeds).
void gradcheck_model(const DecoderConfig& cfg, const lm::CausalLmLossOptions& lopt, bool with_ignored_labels,
                     double* worst = nullptr) {
  const OneThread one_thread;
  Rng rng(7);
  DecoderLM<double> m(cfg, rng);
  randomise(m, rng);
  const Index B = 2, T = 5, V = cfg.vocab_size, D = cfg.hidden_size;
  const IdTensor ids = random_ids(B, T, V, rng);
  IdTensor labels = random_ids(B, T, V, rng);
  if (with_ignored_labels) {
    labels[1] = -100;
    labels[B * T - 2] = -100;
  }
  const Mat<double> R = testing::random_projection(B * T, V, 99);
  const double w = 0.05;
  typename DecoderLM<double>::Cache cache;
  auto objective_of = [&](const Mat<double>& logits) {
    return DecoderLM<double>::loss(logits, labels, lopt, false).loss + w * (logits.array() * R.array()).sum();
  };
  auto dlogits_of = [&](const Mat<double>& logits) {
    Mat<double> d = DecoderLM<double>::loss(logits, labels, lopt, true).dlogits;
    d += w * R;
    return d;
  };
  {
    testing::GradCheck gc;
    gc.add(m.parameters());
    auto rep = gc.run([&] { return objective_of(m.forward(ids, cache)); },
                      [&] {
                        m.zero_grad();
                        const Mat<double> logits = m.forward(ids, cache);
                        m.backward(dlogits_of(logits), cache);
                      });
    INFO(cfg.attention_type << " parameters:\n" << rep.str());
    CHECK(rep.ok);
    if (worst) *worst = std::max(*worst, rep.worst_rel_error);
    for (const auto& t : rep.tensors) CHECK(t.max_abs_grad > 0);  // every parameter takes part
  }
  {  // the input path: d objective / d h_0 through forward_embeds
    Mat<double> h0(B * T, D), dh0(B * T, D);
    init::normal(h0, rng, 0.0, 1.0);
    testing::GradCheck gc;
    gc.add("h0", h0.data(), dh0.data(), h0.size());
    auto rep = gc.run([&] { return objective_of(m.forward_embeds(h0, ids, cache)); },
                      [&] {
                        m.zero_grad();
                        const Mat<double> logits = m.forward_embeds(h0, ids, cache);
                        const Mat<double> g = m.backward(dlogits_of(logits), cache);
                        dh0 = g;  // a copy into the registered buffer (a move would swap it away)
                      });
    INFO(cfg.attention_type << " input:\n" << rep.str());
    CHECK(rep.ok);
    if (worst) *worst = std::max(*worst, rep.worst_rel_error);
  }
}

double stddev(const Vec<double>& v) {
  const double mean = v.mean();
  return std::sqrt((v.array() - mean).square().sum() / static_cast<double>(v.size()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Golden cases of the reference

TEST_CASE("lm golden: lm_a_mha_dense in double matches every tensor (2e-6 x scale)", "[lm]") {
  const auto r = interop::run_lm_case<double>(kGolden + "lm_a_mha_dense.safetensors");
  INFO(r.str());
  CHECK(r.ok);
  CHECK(r.tensors.size() == 4 + 2 * 11 + 2);  // 4 outputs, 11 parameters per layer, embed_tokens and norm
  // a pure-float64 evaluation is 1.5e-7 x scale from the reference (the golden files' note): so are we
  CHECK(r.worst_rel_error < 2e-7);
  CHECK(std::abs(r.loss - 6.0175940959472225) < 1e-7);  // metadata loss_ce (the case has no z-loss)
}

TEST_CASE("lm golden: lm_a_mha_dense in float matches every tensor (1e-4 x scale)", "[lm]") {
  const auto r = interop::run_lm_case<float>(kGolden + "lm_a_mha_dense.safetensors");
  INFO(r.str());
  CHECK(r.ok);
  CHECK(r.tensors.size() == 28);
  CHECK(r.worst_rel_error < 1e-5);
}

TEST_CASE("lm golden: lm_b_mha_trmoe_shared (MHA + TR-MoE, shared expert) in double and float", "[lm]") {
  const auto d = interop::run_lm_case<double>(kGolden + "lm_b_mha_trmoe_shared.safetensors");
  INFO(d.str());
  CHECK(d.ok);
  CHECK(d.worst_rel_error < 2e-7);
  std::size_t tables = 0;
  for (const auto& t : d.tensors)
    if (t.name.rfind("out.route_table.layers.", 0) == 0) {
      ++tables;
      CHECK(t.max_abs_error == 0);  // the reference's route tables, integer for integer
    }
  CHECK(tables == 2);
  const auto f = interop::run_lm_case<float>(kGolden + "lm_b_mha_trmoe_shared.safetensors");
  INFO(f.str());
  CHECK(f.ok);
  CHECK(f.worst_rel_error < 1e-5);
}

TEST_CASE("lm config from JSON: fields, nulls and bad types", "[lm]") {
  lm::CausalLmLossOptions lo;
  const auto c = interop::decoder_config_from_json(
      nlohmann::json::parse(R"({"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": null,
        "attention_type": "gqa", "shared_intermediate_size": null, "label_smoothing": 0.1, "z_loss_coef": 1e-4,
        "tie_word_embeddings": false})"),
      &lo);
  CHECK(c.hidden_size == 64);
  CHECK(c.kv_heads() == 2);  // gqa default max(1, H / 4)
  CHECK(c.shared_intermediate_size == -1);
  CHECK(!c.tie_word_embeddings);
  CHECK(lo.label_smoothing == 0.1);
  CHECK(lo.z_loss_coef == 1e-4);
  CHECK_THROWS_WITH(interop::decoder_config_from_json(nlohmann::json::parse(R"({"hidden_size": "x"})")),
                    Catch::Contains("hidden_size expected a number"));
  CHECK_THROWS_WITH(interop::decoder_config_from_json(nlohmann::json::parse(R"({"num_hidden_layers": 2.5})")),
                    Catch::Contains("num_hidden_layers expected an integer"));
}

// ---------------------------------------------------------------------------------------------------------------
// Gradients (finite differences, double, every parameter and the input embeddings)

TEST_CASE("lm gradcheck: every attention type, the head, smoothing, z-loss and ignored labels", "[lm]") {
  double worst = 0;
  SECTION("mha + dense") { gradcheck_model(tiny_config("mha"), {}, false, &worst); }
  SECTION("gqa (H = 4, H_kv = 2) + dense") { gradcheck_model(tiny_config("gqa", 16, 4, 2), {}, false, &worst); }
  SECTION("mqa + dense") { gradcheck_model(tiny_config("mqa", 16, 4), {}, false, &worst); }
  SECTION("tr_mha_v2 + dense (adapter up maps nonzero)") {
    gradcheck_model(tiny_config("tr_mha_v2", 8, 2), {}, false, &worst);
  }
  SECTION("untied head") {
    DecoderConfig c = tiny_config("gqa", 16, 4, 2);
    c.tie_word_embeddings = false;
    gradcheck_model(c, {}, false, &worst);
  }
  SECTION("no qk-norm") {
    DecoderConfig c = tiny_config("gqa", 16, 4, 2);
    c.use_qk_norm = false;
    gradcheck_model(c, {}, false, &worst);
  }
  SECTION("label smoothing 0.1 + z-loss 1e-2, labels with -100") {
    lm::CausalLmLossOptions lo;
    lo.label_smoothing = 0.1;
    lo.z_loss_coef = 1e-2;
    gradcheck_model(tiny_config("mha"), lo, true, &worst);
  }
  SECTION("labels with -100") { gradcheck_model(tiny_config("mqa", 16, 4), {}, true, &worst); }
  SECTION("dea (causal Dual-Expert) + dense: every parameter but the gate's, which no loss trains") {
    const OneThread one_thread;
    const DecoderConfig c = tiny_config("dea", 8, 2);
    Rng rng(7);
    DecoderLM<double> m(c, rng);
    randomise(m, rng);
    const Index B = 2, T = 5;
    const IdTensor ids = random_ids(B, T, c.vocab_size, rng), labels = random_ids(B, T, c.vocab_size, rng);
    const Mat<double> R = testing::random_projection(B * T, c.vocab_size, 99);
    typename DecoderLM<double>::Cache cache;
    auto objective = [&](const Mat<double>& lg) { return DecoderLM<double>::loss(lg, labels, {}, false).loss + 0.05 * (lg.array() * R.array()).sum(); };
    ParamList<double> checked, gate;
    for (Param<double>* p : m.parameters())
      (p->name.find("W_gate") != std::string::npos || p->name.find("c_gate") != std::string::npos ? gate : checked)
          .push_back(p);
    REQUIRE(gate.size() == 2 * std::size_t(c.num_hidden_layers));
    // The task backward reads alpha-hat as a constant (gradient isolation), while a finite difference of the loss
    // also moves alpha-hat through Q, K and the normalised experts. With W_gate = 0 alpha-hat = min(0.95,
    // sigmoid(c_gate)) depends on no input, so the two agree; the layer's own tests (test_dea_causal) check the
    // input-dependent gate with a frozen alpha-hat.
    for (Param<double>* p : gate)
      if (p->name.find("W_gate") != std::string::npos) p->value.setZero();
    testing::GradCheck gc;
    gc.add(checked);
    auto rep = gc.run([&] { return objective(m.forward(ids, cache)); },
                      [&] {
                        m.zero_grad();
                        const Mat<double> lg = m.forward(ids, cache);
                        Mat<double> d = DecoderLM<double>::loss(lg, labels, {}, true).dlogits;
                        d += 0.05 * R;
                        m.backward(d, cache);
                      });
    INFO(rep.str());
    CHECK(rep.ok);
    worst = std::max(worst, rep.worst_rel_error);
    for (const auto& t : rep.tensors) CHECK(t.max_abs_grad > 0);
    for (Param<double>* p : gate) CHECK(p->grad.cwiseAbs().maxCoeff() == 0.0);  // isolation: the task never writes the gate
  }
  SECTION("tr_mha_v2 + TR-MoE (E = 4, k = 2, balanced hash, shared expert)") {
    DecoderConfig c = tiny_config("tr_mha_v2", 8, 2);
    c.mlp_type = "tr_hash_engine";
    c.num_experts = 4;
    c.top_k = 2;
    c.intermediate_size = 8;
    c.shared_intermediate_size = 6;
    c.routing_strategy = "token_id_balanced_hash";
    gradcheck_model(c, {}, false, &worst);
  }
  SECTION("gqa + TR-MoE (E = 2, k = 1, modulo cyclic, no shared expert)") {
    DecoderConfig c = tiny_config("gqa", 16, 4, 2);
    c.mlp_type = "tr_hash_engine";
    c.num_experts = 2;
    c.top_k = 1;
    c.shared_expert = false;
    gradcheck_model(c, {}, false, &worst);
  }
  WARN("worst gradcheck relative error " << worst);
}

// ---------------------------------------------------------------------------------------------------------------
// Loss conventions

TEST_CASE("lm loss: pre-shifted labels, last position dropped, -100, smoothing and z-loss by direct computation",
          "[lm]") {
  Rng rng(3);
  const Index B = 2, T = 4, V = 5;
  Mat<double> z(B * T, V);
  init::normal(z, rng, 0.0, 2.0);
  IdTensor labels({B, T});
  const std::int64_t lab[] = {1, -100, 4, 2, 0, 3, 3, -100};
  for (Index i = 0; i < B * T; ++i) labels[i] = lab[i];
  for (double eps : {0.0, 0.1}) {
    for (double c : {0.0, 1e-3}) {
      lm::CausalLmLossOptions o;
      o.label_smoothing = eps;
      o.z_loss_coef = c;
      // direct: rows t <= T - 2 with a label; position 3 of each row is dropped (its label 2 is valid)
      double ce = 0, zz = 0;
      int m = 0;
      for (Index b = 0; b < B; ++b)
        for (Index t = 0; t + 1 < T; ++t) {
          const Index n = b * T + t;
          if (labels[n] == -100) continue;
          double s = 0;
          for (Index v = 0; v < V; ++v) s += std::exp(z(n, v));
          const double lse = std::log(s);
          double smooth = 0;
          for (Index v = 0; v < V; ++v) smooth += (lse - z(n, v)) / V;
          ce += (1 - eps) * (lse - z(n, labels[n])) + eps * smooth;
          zz += lse * lse;
          ++m;
        }
      REQUIRE(m == 5);
      const auto r = DecoderLM<double>::loss(z, labels, o);
      CHECK(r.count == 5);
      CHECK(r.ce == Approx(ce / m).epsilon(1e-13));
      CHECK(r.loss == Approx(ce / m + c * zz / m).epsilon(1e-13));
      // the dropped and ignored rows carry no gradient
      CHECK(r.dlogits.row(3).isZero(0));
      CHECK(r.dlogits.row(7).isZero(0));
      CHECK(r.dlogits.row(1).isZero(0));
    }
  }
  SECTION("no counted entry: the cross-entropy is 0 and the z mean runs over every scored row") {
    IdTensor none({B, T}, -100);
    lm::CausalLmLossOptions o;
    o.z_loss_coef = 1.0;
    const auto r = DecoderLM<double>::loss(z, none, o);
    CHECK(r.count == 0);
    CHECK(r.ce == 0);
    double zz = 0;
    for (Index n = 0; n < B * T; ++n)
      if (n % T != T - 1) {
        const double lse = std::log(z.row(n).array().exp().sum());
        zz += lse * lse;
      }
    CHECK(r.z_loss == Approx(zz / 6).epsilon(1e-13));
  }
  SECTION("bad labels and options throw naming them") {
    IdTensor bad = labels;
    bad[2] = V;
    CHECK_THROWS_WITH(DecoderLM<double>::loss(z, bad), Catch::Contains("labels[2]"));
    lm::CausalLmLossOptions o;
    o.label_smoothing = 1.5;
    CHECK_THROWS_WITH(DecoderLM<double>::loss(z, labels, o), Catch::Contains("label_smoothing"));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Causal attention against a plain masked computation

TEST_CASE("lm attention: GQA / MQA / MHA equal a plain masked computation", "[lm]") {
  for (Index Hkv : {Index(1), Index(2), Index(4)}) {
    for (bool qk_norm : {true, false}) {
      lm::CausalAttentionOptions o;
      o.d_model = 16;
      o.n_heads = 4;
      o.n_kv_heads = Hkv;
      o.use_qk_norm = qk_norm;
      o.rope_theta = 500.0;
      lm::CausalSelfAttention<double> att(o);
      Rng rng(11 + static_cast<std::uint64_t>(Hkv));
      for (Param<double>* p : att.parameters())
        for (Index i = 0; i < p->numel(); ++i)
          p->value[i] = p->name.find("norm") != std::string::npos ? 1.0 + 0.2 * rng.normal() : 0.3 * rng.normal();
      const Index B = 2, T = 6, D = 16, H = 4, dh = 4, half = 2;
      Mat<double> x(B * T, D);
      init::normal(x, rng, 0.0, 1.0);
      typename lm::CausalSelfAttention<double>::Cache cache;
      const Mat<double> y = att.forward(x, B, cache);

      const ParamList<double> ps = att.parameters();
      const Mat<double> Wk = ps[0]->mat(), Wq = ps[1]->mat(), Wv = ps[2]->mat(), Wo = ps[3]->mat();
      const Mat<double> K = x * Wk.transpose(), Q = x * Wq.transpose(), Vv = x * Wv.transpose();
      auto norm_rope = [&](Eigen::RowVectorXd r, const Param<double>* gain, Index pos) {
        if (qk_norm) {
          const double rms = std::sqrt(r.squaredNorm() / dh + 1e-6);
          for (Index i = 0; i < dh; ++i) r[i] = r[i] / rms * gain->value[i];
        }
        Eigen::RowVectorXd out(dh);
        for (Index i = 0; i < half; ++i) {
          const double phi = static_cast<double>(pos) * std::pow(500.0, -2.0 * static_cast<double>(i) / dh);
          out[i] = r[i] * std::cos(phi) - r[i + half] * std::sin(phi);
          out[i + half] = r[i + half] * std::cos(phi) + r[i] * std::sin(phi);
        }
        return out;
      };
      Mat<double> O = Mat<double>::Zero(B * T, D);
      for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h) {
          const Index g = h / (H / Hkv);
          for (Index i = 0; i < T; ++i) {
            const Eigen::RowVectorXd qi = norm_rope(Q.block(b * T + i, h * dh, 1, dh), qk_norm ? ps[4] : nullptr, i);
            std::vector<double> s(static_cast<std::size_t>(i + 1));
            double mx = -1e300, den = 0;
            for (Index j = 0; j <= i; ++j) {  // causal: j <= i only
              const Eigen::RowVectorXd kj = norm_rope(K.block(b * T + j, g * dh, 1, dh), qk_norm ? ps[5] : nullptr, j);
              s[static_cast<std::size_t>(j)] = qi.dot(kj) / std::sqrt(double(dh));
              mx = std::max(mx, s[static_cast<std::size_t>(j)]);
            }
            for (auto& v : s) den += (v = std::exp(v - mx));
            for (Index j = 0; j <= i; ++j)
              O.block(b * T + i, h * dh, 1, dh) += (s[static_cast<std::size_t>(j)] / den) * Vv.block(b * T + j, g * dh, 1, dh);
          }
        }
      const Mat<double> yref = O * Wo.transpose();
      INFO("H_kv " << Hkv << " qk_norm " << qk_norm);
      CHECK((y - yref).cwiseAbs().maxCoeff() < 1e-12);
    }
  }
}

namespace {

/// Forward, backward and a two-step cached decode of a CausalSelfAttention type (GQA, qk-norm, B = 2 sequences of T):
/// y, dx, every parameter gradient, then the decoded outputs.
template <class Att>
std::vector<Mat<float>> causal_attention_run(Index T, Index D, Index H, Index Hkv) {
  lm::CausalAttentionOptions o;
  o.d_model = D;
  o.n_heads = H;
  o.n_kv_heads = Hkv;
  o.rope_theta = 500.0;
  Att att(o);
  Rng rng(31);
  for (Param<float>* p : att.parameters())
    for (Index i = 0; i < p->numel(); ++i)
      p->value[i] = static_cast<float>(p->name.find("norm") != std::string::npos ? 1.0 + 0.2 * rng.normal()
                                                                                 : 0.3 * rng.normal());
  const Index B = 2;
  Mat<float> x(B * T, D);
  init::normal(x, rng, 0.0, 1.0);
  typename Att::Cache cache;
  std::vector<Mat<float>> out{att.forward(x, B, cache)};
  out.push_back(att.backward(testing::random_projection(B * T, D, 32).cast<float>(), cache));
  for (Param<float>* p : att.parameters()) out.push_back(p->grad);
  typename Att::KVCache kv;
  Mat<float> prompt(B * 3, D), next(B, D);
  for (Index b = 0; b < B; ++b) {
    prompt.middleRows(b * 3, 3) = x.middleRows(b * T, 3);
    next.row(b) = x.row(b * T + 3);
  }
  out.push_back(att.forward_cached(prompt, B, kv));
  out.push_back(att.forward_cached(next, B, kv));
  return out;
}

/// Largest |a - b| over max(|b|, 1) of every pair of results (and every result is live).
double worst_difference(const std::vector<Mat<float>>& a, const std::vector<Mat<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    REQUIRE(a[k].cwiseAbs().maxCoeff() > 0);
    worst = std::max(worst, static_cast<double>((a[k] - b[k]).cwiseAbs().maxCoeff()) /
                                std::max(1.0, static_cast<double>(b[k].cwiseAbs().maxCoeff())));
  }
  return worst;
}

}  // namespace

TEST_CASE("lm attention: fixed Heads and DHead agree with the dynamic instance, forward, backward and decoding",
          "[lm][fixed]") {
  // the same arithmetic, but Eigen may order a product or a reduction over a fixed-size head row differently (on
  // AVX-512 the bits agree at d_h = 16 and differ in the last places at d_h = 64)
  SECTION("d_model 64, 4 heads of 16 over 2 KV heads, two causal tiles") {
    CHECK(worst_difference(causal_attention_run<lm::CausalSelfAttention<float, 4, 16>>(80, 64, 4, 2),
                           causal_attention_run<lm::CausalSelfAttention<float>>(80, 64, 4, 2)) < 1e-5);
  }
  SECTION("d_model 128, 8 heads of 16, MHA") {
    CHECK(worst_difference(causal_attention_run<lm::CausalSelfAttention<float, 8, 16>>(20, 128, 8, 8),
                           causal_attention_run<lm::CausalSelfAttention<float>>(20, 128, 8, 8)) < 1e-5);
  }
  SECTION("64-wide heads, MQA") {
    CHECK(worst_difference(causal_attention_run<lm::CausalSelfAttention<float, Dynamic, 64>>(70, 128, 2, 1),
                           causal_attention_run<lm::CausalSelfAttention<float>>(70, 128, 2, 1)) < 1e-5);
  }
}

TEST_CASE("lm attention: finite differences of a fixed-size GQA attention, every parameter and the input",
          "[lm][fixed]") {
  for (Index T : {Index(5), Index(67)}) {  // one causal tile, and two
    INFO("T " << T);
    lm::CausalAttentionOptions o;
    o.d_model = 8;
    o.n_heads = 2;
    o.n_kv_heads = 1;
    o.rope_theta = 500.0;
    lm::CausalSelfAttention<double, 2, 4> att(o);
    Rng rng(41);
    for (Param<double>* p : att.parameters())
      for (Index i = 0; i < p->numel(); ++i)
        p->value[i] = p->name.find("norm") != std::string::npos ? 1.0 + 0.2 * rng.normal() : 0.4 * rng.normal();
    const Index B = 2, N = B * T;
    Mat<double> x(N, 8);
    init::normal(x, rng, 0.0, 1.0);
    const Mat<double> R = testing::random_projection(N, 8, 42);
    typename lm::CausalSelfAttention<double, 2, 4>::Cache cache;
    Mat<double> dx;
    auto objective = [&] { return (att.forward(x, B, cache).array() * R.array()).sum(); };
    auto analytic = [&] {
      att.zero_grad();
      att.forward(x, B, cache);
      const Mat<double> g = att.backward(R, cache);
      dx = g;  // a copy into the buffer the checker holds (a move would swap it away)
    };
    analytic();
    testing::GradCheck gc;
    gc.add(att.parameters());
    gc.add("x", x.data(), dx.data(), x.size());
    const OneThread one;
    const testing::GradCheckReport rep = gc.run(objective, analytic);
    INFO(rep.str());
    CHECK(rep.ok);
    CHECK(rep.tensors.size() == 7);  // k, q, v, o projections, the two gains, x
    for (const auto& t : rep.tensors) CHECK(t.max_abs_grad > 0);
  }
}

TEST_CASE("lm attention: sizes that differ from the compile-time Heads and DHead are refused by name", "[lm][fixed]") {
  lm::CausalAttentionOptions o;
  o.d_model = 16;
  o.n_heads = 2;
  CHECK_THROWS_WITH((lm::CausalSelfAttention<double, 4>(o)),
                    Catch::Contains("CausalSelfAttention") && Catch::Contains("n_heads") && Catch::Contains("4"));
  CHECK_THROWS_WITH((lm::CausalSelfAttention<double, 2, 4>(o)),
                    Catch::Contains("CausalSelfAttention") && Catch::Contains("DHead") &&
                        Catch::Contains("16 / 2 = 8"));
  CHECK_NOTHROW(lm::CausalSelfAttention<double, 2, 8>(o));
}

// ---------------------------------------------------------------------------------------------------------------
// KV-cached decoding

TEST_CASE("lm decoding: forward_step equals the full forward, token by token and prompt then tokens", "[lm]") {
  const OneThread one_thread;
  for (const char* attn : {"gqa", "mha", "mqa", "tr_mha_v2", "dea"}) {
    DecoderConfig c = tiny_config(attn, 16, 4, 2);
    c.vocab_size = 23;
    Rng rng(5);
    DecoderLM<double> m(c, rng);
    randomise(m, rng, 0.2);
    const Index B = 2, T = 9, V = c.vocab_size;
    const IdTensor ids = random_ids(B, T, V, rng);
    typename DecoderLM<double>::Cache cache;
    const Mat<double> full = m.forward(ids, cache);
    auto slice = [&](Index t0, Index n) {
      IdTensor s({B, n});
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < n; ++i) s[b * n + i] = ids[b * T + t0 + i];
      return s;
    };
    auto compare = [&](const Mat<double>& got, Index t0, Index n) {
      double err = 0;
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < n; ++i) err = std::max(err, (got.row(b * n + i) - full.row(b * T + t0 + i)).cwiseAbs().maxCoeff());
      return err;
    };
    INFO(attn);
    {  // one token at a time
      typename DecoderLM<double>::DecodeState st;
      double err = 0;
      for (Index t = 0; t < T; ++t) err = std::max(err, compare(m.forward_step(slice(t, 1), st), t, 1));
      CHECK(st.length == T);
      CHECK(err < 1e-12);
    }
    {  // a prompt of 4, then single tokens, then a chunk of 2
      typename DecoderLM<double>::DecodeState st;
      double err = compare(m.forward_step(slice(0, 4), st), 0, 4);
      for (Index t = 4; t < 7; ++t) err = std::max(err, compare(m.forward_step(slice(t, 1), st), t, 1));
      err = std::max(err, compare(m.forward_step(slice(7, 2), st), 7, 2));
      CHECK(err < 1e-12);
      IdTensor wrong({3, 1}, 0);
      CHECK_THROWS_WITH(m.forward_step(wrong, st), Catch::Contains("batch expected 2"));
    }
  }
}

TEST_CASE("lm dea: the attention rotates its experts' queries and keys with the config's rope_theta", "[lm]") {
  const OneThread one_thread;
  DecoderConfig c = tiny_config("dea", 16, 4);
  c.vocab_size = 23;
  const Index B = 2, T = 9;
  Rng id_rng(3);
  const IdTensor ids = random_ids(B, T, c.vocab_size, id_rng);
  auto logits = [&](double theta, double* dec_err) {  // dec_err: the worst |decoded - full|
    DecoderConfig ct = c;
    ct.rope_theta = theta;
    Rng rng(5);
    DecoderLM<double> m(ct, rng);  // (the init draws do not depend on theta)
    randomise(m, rng, 0.2);
    typename DecoderLM<double>::Cache cache;
    const Mat<double> full = m.forward(ids, cache);
    if (dec_err) {  // one token at a time against the full forward
      typename DecoderLM<double>::DecodeState st;
      for (Index t = 0; t < T; ++t) {
        IdTensor s({B, 1});
        for (Index b = 0; b < B; ++b) s[b] = ids[b * T + t];
        const Mat<double> lg = m.forward_step(s, st);
        for (Index b = 0; b < B; ++b)
          *dec_err = std::max(*dec_err, (lg.row(b) - full.row(b * T + t)).cwiseAbs().maxCoeff());
      }
    }
    return full;
  };
  double e1e4 = 0, e20 = 0;
  const Mat<double> a = logits(10000.0, &e1e4), b = logits(20.0, &e20);
  CHECK(e1e4 < 1e-12);
  CHECK(e20 < 1e-12);
  for (Index s = 0; s < B; ++s) {
    // position 0 is rotated by the identity; every later position sees the keys at other angles
    CHECK((a.row(s * T) - b.row(s * T)).cwiseAbs().maxCoeff() <= 1e-12);
    for (Index t = 1; t < T; ++t) CHECK((a.row(s * T + t) - b.row(s * T + t)).cwiseAbs().maxCoeff() > 1e-6);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Thread-count invariance and accumulation

TEST_CASE("lm threads: 1 and 2 threads give identical bits; gradients accumulate", "[lm]") {
  for (const char* attn : {"gqa", "tr_mha_v2", "dea"}) {
    DecoderConfig c = tiny_config(attn, 32, 4, 2);
    c.vocab_size = 97;
    c.intermediate_size = 48;
    Rng rng(9);
    DecoderLM<float> m(c, rng);
    randomise(m, rng, 0.2);
    const IdTensor ids = random_ids(4, 40, c.vocab_size, rng);
    const IdTensor labels = random_ids(4, 40, c.vocab_size, rng);
    auto run = [&](int threads, std::vector<float>& out) {
      set_num_threads(threads);
      m.zero_grad();
      typename DecoderLM<float>::Cache cache;
      const auto r = m.forward_backward(ids, labels, cache);
      out.assign(1, r.loss);
      for (Param<float>* p : m.parameters()) out.insert(out.end(), p->grad.data(), p->grad.data() + p->numel());
      out.insert(out.end(), cache.hf.data(), cache.hf.data() + cache.hf.size());
    };
    std::vector<float> one, two;
    run(1, one);
    run(2, two);
    set_num_threads(1);
    INFO(attn);
    REQUIRE(one.size() == two.size());
    CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
    // a second backward adds the same gradients again: twice the first (up to the rounding of the sums, which
    // accumulate row by row into the gradient buffers)
    typename DecoderLM<float>::Cache cache;
    m.forward_backward(ids, labels, cache);
    std::size_t k = 1;
    double worst = 0;
    for (Param<float>* p : m.parameters()) {
      const double scale = std::max(1e-30, static_cast<double>(p->grad.cwiseAbs().maxCoeff()));
      for (Index i = 0; i < p->numel(); ++i, ++k)
        worst = std::max(worst, std::abs(double(p->grad[i]) - 2.0 * double(one[k])) / scale);
    }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("lm forward_backward: a non-finite loss returns without a backward pass, no gradient added", "[lm]") {
  DecoderConfig c = tiny_config("mha", 16, 2);
  c.vocab_size = 31;
  Rng rng(4);
  DecoderLM<float> m(c, rng);
  const IdTensor ids = random_ids(2, 12, c.vocab_size, rng);
  const IdTensor labels = random_ids(2, 12, c.vocab_size, rng);
  typename DecoderLM<float>::Cache cache;
  m.zero_grad();
  CHECK(std::isfinite(m.forward_backward(ids, labels, cache).loss));  // the same model trains as usual
  bool some_grad = false;
  for (Param<float>* p : m.parameters()) some_grad = some_grad || p->grad.cwiseAbs().maxCoeff() > 0;
  CHECK(some_grad);
  // a diverged final norm (after the last attention layer, so no layer's input check sees it): the loss is NaN
  m.zero_grad();
  for (Param<float>* p : m.parameters())
    if (p->name == "norm.weight") p->value[3] = std::numeric_limits<float>::infinity();
  const auto r = m.forward_backward(ids, labels, cache);
  CHECK_FALSE(std::isfinite(r.loss));
  for (Param<float>* p : m.parameters()) {
    INFO(p->name);
    CHECK(p->grad.cwiseAbs().maxCoeff() == 0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Init and configuration

TEST_CASE("lm init: stds 0.02 and 0.02/sqrt(2L), gains 1", "[lm]") {
  DecoderConfig c;
  c.hidden_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.attention_type = "gqa";
  c.vocab_size = 2048;
  c.intermediate_size = 256;
  c.mlp_type = "dense_deterministic";
  c.tie_word_embeddings = false;
  DecoderLM<double> m(c, 123);
  CHECK(m.num_kv_heads() == 1);  // gqa default max(1, 4 / 4)
  const double res = 0.02 / std::sqrt(8.0);
  int n_checked = 0;
  for (Param<double>* p : m.parameters()) {
    const std::string& n = p->name;
    INFO(n);
    if (n.find("norm") != std::string::npos) {
      CHECK(p->value.isOnes(0));
    } else {
      const bool residual = n.find("o_proj") != std::string::npos || n.find("down_proj") != std::string::npos;
      const double want = residual ? res : 0.02;
      const double tol = 4.0 / std::sqrt(2.0 * static_cast<double>(p->numel()));  // ~4 standard errors of a std
      CHECK(std::abs(stddev(p->value) / want - 1.0) < tol);
      CHECK(std::abs(p->value.mean()) < 4.0 * want / std::sqrt(static_cast<double>(p->numel())));
    }
    ++n_checked;
  }
  CHECK(n_checked == 1 + 4 * 11 + 2);  // embed; per layer 2 norms, 4 projections, 2 qk gains, 3 MLP; norm, lm_head
  SECTION("tr_mha_v2: the adapter up map starts at 0, the block is plain attention") {
    DecoderConfig v = c;
    v.attention_type = "tr_mha_v2";
    DecoderLM<double> mv(v, 5);
    for (Param<double>* p : mv.parameters())
      if (p->name.find("qv_adapter_up") != std::string::npos) CHECK(p->value.isZero(0));
  }
}

TEST_CASE("lm config: bad fields throw naming them", "[lm]") {
  auto make = [](DecoderConfig c) { DecoderLM<double> m(c, 1); };
  DecoderConfig c = tiny_config("gqa", 16, 4, 2);
  {
    DecoderConfig b = c;
    b.num_attention_heads = 3;
    CHECK_THROWS_WITH(make(b), Catch::Contains("hidden_size (16) must be divisible by num_attention_heads (3)"));
  }
  {
    DecoderConfig b = c;
    b.num_key_value_heads = 3;
    CHECK_THROWS_WITH(make(b), Catch::Contains("num_attention_heads (4) must be divisible by num_key_value_heads (3)"));
  }
  {
    DecoderConfig b = c;
    b.hidden_size = 12;  // d_h = 3
    CHECK_THROWS_WITH(make(b), Catch::Contains("must be even"));
  }
  {
    DecoderConfig b = c;
    b.attention_type = "sliding";
    CHECK_THROWS_WITH(make(b), Catch::Contains("attention_type") && Catch::Contains("'sliding'"));
  }
  {
    DecoderConfig b = c;
    b.mlp_type = "swiglu";
    CHECK_THROWS_WITH(make(b), Catch::Contains("mlp_type") && Catch::Contains("'swiglu'"));
  }
  {
    DecoderConfig b = c;
    b.mlp_type = "tr_hash_engine";
    b.num_experts = 3;  // the TR-MoE MLP checks its own options
    CHECK_THROWS_WITH(make(b), Catch::Contains("num_experts"));
  }
  {
    DecoderConfig b = c;
    b.vocab_size = 0;
    CHECK_THROWS_WITH(make(b), Catch::Contains("vocab_size"));
  }
  SECTION("mha and mqa force their KV head counts") {
    DecoderConfig b = c;
    b.attention_type = "mha";
    CHECK(b.kv_heads() == 4);
    b.attention_type = "mqa";
    CHECK(b.kv_heads() == 1);
  }
  SECTION("bad ids") {
    DecoderLM<double> m(c, 1);
    typename DecoderLM<double>::Cache cache;
    IdTensor ids({1, 3}, 0);
    ids[2] = c.vocab_size;
    CHECK_THROWS_WITH(m.forward(ids, cache), Catch::Contains("ids[2]"));
    CHECK_THROWS_WITH(m.backward(Mat<double>::Zero(3, c.vocab_size), cache), Catch::Contains("cache is empty"));
  }
}

}  // namespace test_lm_model
