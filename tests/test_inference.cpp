// nn::InferenceModel (the embedded profile's model: bound parameters, one workspace) against TransformerModel's
// evaluation forward, with dynamic and compile-time sizes, and its contracts: thread independence, no stale
// state between calls, masks, and errors that name the bad argument.
#include <catch2/catch.hpp>
#include <dea/nn/inference.hpp>
#include <dea/nn/transformer.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_inference {

using namespace dea;

namespace {

nn::ModelConfig small_config(nn::Task task, Index D, Index H, Index L) {
  nn::ModelConfig mc;
  mc.vocab_size = 31;
  mc.d_model = D;
  mc.n_heads = H;
  mc.n_layers = L;
  mc.d_ff = 2 * D + 4;
  mc.max_len = 16;
  mc.n_classes = 3;
  mc.task = task;
  return mc;
}

/// Moves every parameter away from its initial value (zero biases, unit LayerNorms), so each one matters.
template <class Model>
void perturb(Model& m, Rng& rng) {
  for (auto* p : m.parameters())
    for (Index k = 0; k < p->numel(); ++k)
      p->value[k] += static_cast<typename Model::Scalar>(rng.uniform(-0.2, 0.2));
}

struct Batch {
  Index B = 0, T = 0;
  std::vector<std::int64_t> ids, types;
  std::vector<std::uint8_t> mask;
};

Batch make_batch(Index B, Index T, Index V, Rng& rng, bool padded) {
  Batch b;
  b.B = B;
  b.T = T;
  b.ids.resize(static_cast<std::size_t>(B * T));
  b.types.resize(b.ids.size());
  b.mask.assign(b.ids.size(), 1);
  for (std::size_t k = 0; k < b.ids.size(); ++k) {
    b.ids[k] = 1 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(V - 1)));
    b.types[k] = static_cast<std::int64_t>(rng.below(2));
  }
  if (padded)
    for (Index bb = 0; bb < B; ++bb)
      for (Index t = T - bb % 3; t < T; ++t) {  // sequence bb has bb % 3 padded tokens at the end
        b.mask[static_cast<std::size_t>(bb * T + t)] = 0;
        b.ids[static_cast<std::size_t>(bb * T + t)] = 0;
      }
  return b;
}

/// The model's logits in evaluation mode (no oracle, gamma 0).
template <class S, class A>
Mat<S> model_logits(nn::TransformerModel<S, A>& m, const Batch& b, bool with_mask, bool with_types) {
  nn::ModelBatch<S> mb;
  mb.input_ids = Tensor<std::int64_t>({b.B, b.T});
  for (Index k = 0; k < b.B * b.T; ++k) mb.input_ids[k] = b.ids[static_cast<std::size_t>(k)];
  if (with_mask) {
    mb.attention_mask = Tensor<std::uint8_t>({b.B, b.T});
    for (Index k = 0; k < b.B * b.T; ++k) mb.attention_mask[k] = b.mask[static_cast<std::size_t>(k)];
  }
  if (with_types) {
    mb.token_type_ids = Tensor<std::int64_t>({b.B, b.T});
    for (Index k = 0; k < b.B * b.T; ++k) mb.token_type_ids[k] = b.types[static_cast<std::size_t>(k)];
  }
  typename nn::TransformerModel<S, A>::Cache cache;
  return m.forward(mb, S(0), false, nullptr, cache).logits;
}

template <class Inf>
Mat<typename Inf::Scalar> inference_logits(Inf& m, const Batch& b, bool with_mask, bool with_types) {
  return m.forward(b.ids.data(), b.B, b.T, with_mask ? b.mask.data() : nullptr, with_types ? b.types.data() : nullptr);
}

/// max |a - b| / max(1, max |b|)
template <class S>
double rel_diff(const Mat<S>& a, const Mat<S>& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  const double den = std::max(1.0, static_cast<double>(b.cwiseAbs().maxCoeff()));
  return static_cast<double>((a - b).cwiseAbs().maxCoeff()) / den;
}

template <class S>
double tolerance() {
  return std::is_same<S, float>::value ? 1e-5 : 1e-12;
}

}  // namespace

TEMPLATE_TEST_CASE("InferenceModel reproduces TransformerModel's evaluation logits (dynamic sizes)", "[inference]",
                   float, double) {
  using S = TestType;
  for (nn::Task task : {nn::Task::cls, nn::Task::mlm}) {
    const nn::ModelConfig mc = small_config(task, 32, 4, 2);
    Rng rng(11);
    nn::TransformerModel<S> model(mc, rng);
    perturb(model, rng);
    nn::InferenceModel<S> inf(nn::InferenceConfig::from(mc));
    inf.bind_parameters(model);
    inf.reserve(4, 13);
    Index bitwise = 0, cases = 0;
    for (const auto& bt : std::vector<std::pair<Index, Index>>{{4, 13}, {1, 1}, {2, 7}, {3, 13}, {4, 5}}) {
      const Batch b = make_batch(bt.first, bt.second, mc.vocab_size, rng, true);
      for (int variant = 0; variant < 3; ++variant) {
        const bool with_mask = variant >= 1, with_types = variant == 2;
        const Mat<S> want = model_logits(model, b, with_mask, with_types);
        const Mat<S> got = inference_logits(inf, b, with_mask, with_types);
        INFO(nn::to_string(task) << " B " << b.B << " T " << b.T << " mask " << with_mask << " types " << with_types);
        CHECK(rel_diff(got, want) <= tolerance<S>());
        bitwise += got == want;
        ++cases;
      }
    }
    // the kernels are the model's own, applied in the same order: the logits are expected to be the same bits
    INFO(nn::to_string(task) << ": " << bitwise << " of " << cases << " cases bitwise identical");
    CHECK(bitwise == cases);
  }
}

TEST_CASE("InferenceModel with compile-time sizes gives the dynamic-size results", "[inference][fixed]") {
  const nn::ModelConfig mc = small_config(nn::Task::cls, 16, 2, 2);
  Rng rng(12);
  nn::TransformerModel<float> dynamic_model(mc, rng);
  perturb(dynamic_model, rng);
  // the same parameters in a model whose attention has compile-time sizes
  Rng rng2(12);
  nn::TransformerModel<float, DualExpertAttention<float, 2, 8>> fixed_model(mc, rng2);
  {
    const ParamList<float> src = dynamic_model.parameters(), dst = fixed_model.parameters();
    REQUIRE(src.size() == dst.size());
    for (std::size_t i = 0; i < src.size(); ++i) dst[i]->value = src[i]->value;
  }
  nn::InferenceModel<float> inf_dyn(nn::InferenceConfig::from(mc));
  nn::InferenceModel<float, 2, 8, 2> inf_fixed(nn::InferenceConfig::from(mc));
  inf_dyn.bind_parameters(dynamic_model);
  inf_fixed.bind_parameters(fixed_model);
  inf_dyn.reserve(3, 16);
  inf_fixed.reserve(3, 16);
  for (Index T : {16, 9, 1}) {
    const Batch b = make_batch(3, T, mc.vocab_size, rng, true);
    const Mat<float> want = model_logits(dynamic_model, b, true, true);
    const Mat<float> fixed_want = model_logits(fixed_model, b, true, true);
    const Mat<float> got_fixed = inference_logits(inf_fixed, b, true, true);
    const Mat<float> got_dyn = inference_logits(inf_dyn, b, true, true);
    INFO("T " << T);
    CHECK(rel_diff(got_fixed, want) <= 1e-5);        // fixed sizes against the dynamic-size build
    CHECK(rel_diff(fixed_want, want) <= 1e-5);       // (the library's own fixed/dynamic agreement)
    CHECK(rel_diff(got_fixed, fixed_want) <= 1e-5);  // the inference kernel against the fixed-size model
    CHECK(got_dyn == want);
  }
}

TEST_CASE("InferenceModel: 1 and 2 threads give identical bits", "[inference][threads]") {
  const nn::ModelConfig mc = small_config(nn::Task::mlm, 32, 4, 2);
  Rng rng(13);
  nn::TransformerModel<float> model(mc, rng);
  perturb(model, rng);
  nn::InferenceModel<float> inf(nn::InferenceConfig::from(mc));
  inf.bind_parameters(model);
  inf.reserve(6, 16);
  const Batch b = make_batch(6, 16, mc.vocab_size, rng, true);  // large enough for the parallel paths
  const int before = num_threads();
  set_num_threads(1);
  const Mat<float> one = inference_logits(inf, b, true, false);
  set_num_threads(2);
  const Mat<float> two = inference_logits(inf, b, true, false);
  set_num_threads(before);
  CHECK(one == two);
}

TEST_CASE("InferenceModel: results do not depend on earlier calls or on the workspace's maximum sizes",
          "[inference]") {
  const nn::ModelConfig mc = small_config(nn::Task::cls, 16, 2, 1);
  Rng rng(14);
  nn::TransformerModel<float> model(mc, rng);
  perturb(model, rng);
  nn::InferenceModel<float> big(nn::InferenceConfig::from(mc)), exact(nn::InferenceConfig::from(mc));
  big.bind_parameters(model);
  exact.bind_parameters(model);
  big.reserve(5, 16);
  const Batch a = make_batch(2, 6, mc.vocab_size, rng, true), other = make_batch(5, 16, mc.vocab_size, rng, false);
  exact.reserve(2, 6);
  const Mat<float> first = inference_logits(big, a, true, true);
  inference_logits(big, other, false, true);
  const Mat<float> again = inference_logits(big, a, true, true);
  CHECK(first == again);
  CHECK(inference_logits(exact, a, true, true) == first);
}

TEST_CASE("InferenceModel: a mask is 'non-zero = real'; padded tokens do not reach the cls logits", "[inference]") {
  const nn::ModelConfig mc = small_config(nn::Task::cls, 16, 2, 2);
  Rng rng(15);
  nn::TransformerModel<float> model(mc, rng);
  perturb(model, rng);
  nn::InferenceModel<float> inf(nn::InferenceConfig::from(mc));
  inf.bind_parameters(model);
  inf.reserve(2, 10);
  Batch b = make_batch(2, 10, mc.vocab_size, rng, false);
  for (Index t = 6; t < 10; ++t) b.mask[static_cast<std::size_t>(t)] = 0;  // sequence 0: 4 padded tokens
  const Mat<float> base = inference_logits(inf, b, true, false);
  for (auto& m : b.mask) m = m ? 7 : 0;  // any non-zero value marks a real token
  CHECK(inference_logits(inf, b, true, false) == base);
  for (Index t = 6; t < 10; ++t) b.ids[static_cast<std::size_t>(t)] = (b.ids[static_cast<std::size_t>(t)] + 5) % 31;
  const Mat<float> changed = inference_logits(inf, b, true, false);
  CHECK(changed.row(0) == base.row(0));  // padded keys are masked for every query, and position 0 is pooled
  // without the mask the padded tokens are keys like any other
  CHECK(inference_logits(inf, b, false, false).row(0) != base.row(0));
}

namespace {

/// True for the weights of the model's matrix products (the tensors InferenceModel takes as bf16).
bool product_weight(const std::string& n) {
  for (const char* end : {"attn.W_v.weight", "attn.W_o.weight", "ff.0.weight", "ff.3.weight"})
    if (n.size() > std::strlen(end) && n.compare(n.size() - std::strlen(end), std::strlen(end), end) == 0) return true;
  return n == "cls_head.0.weight" || n == "cls_head.3.weight";
}

}  // namespace

TEST_CASE("InferenceModel with bf16 product weights: the bits of TransformerModel under bf16 products",
          "[inference][bf16]") {
  for (nn::Task task : {nn::Task::cls, nn::Task::mlm}) {
    // (D 36, d_ff 76: inner dimensions that are not multiples of the register panel)
    for (Index D : {Index(32), Index(36)}) {
      const nn::ModelConfig mc = small_config(task, D, 4, 2);
      Rng rng(21);
      nn::TransformerModel<float> model(mc, rng);
      perturb(model, rng);
      // the product weights rounded to bf16 (kept here, read in place), everything else bound as float
      std::vector<std::vector<bf16>> arrays;
      nn::InferenceModel<float> inf(nn::InferenceConfig::from(mc));
      std::size_t product_values = 0;
      for (Param<float>* p : model.parameters()) {
        if (!inf.bind(p->name.c_str(), p->value.data(), p->numel())) continue;  // (the tied mlm_head.weight)
        if (!product_weight(p->name)) continue;
        arrays.emplace_back(std::size_t(p->numel()));
        for (Index k = 0; k < p->numel(); ++k) arrays.back()[std::size_t(k)] = to_bf16(p->value[k]);
        CHECK(inf.bind(p->name.c_str(), arrays.back().data(), p->numel()));
        product_values += std::size_t(p->numel());
      }
      inf.check_bound();
      REQUIRE(inf.has_bf16_weights());
      CHECK(product_values > 0);
      inf.reserve(4, 13);
      Index cases = 0, bitwise = 0, differs = 0;
      for (int t : {1, 2}) {
        set_num_threads(t);
        for (const auto& bt : std::vector<std::pair<Index, Index>>{{4, 13}, {1, 1}, {3, 7}}) {
          const Batch b = make_batch(bt.first, bt.second, mc.vocab_size, rng, true);
          for (int variant = 0; variant < 2; ++variant) {
            const bool with_mask = variant == 1, with_types = variant == 1;
            Mat<float> want;
            {
              const ScopedPrecision bf16_products(Precision::bf16);
              want = model_logits(model, b, with_mask, with_types);
            }
            const Mat<float> fp32 = model_logits(model, b, with_mask, with_types);
            const Mat<float> got = inference_logits(inf, b, with_mask, with_types);  // no scope: the bf16 weights
            INFO(nn::to_string(task) << " D " << D << " threads " << t << " B " << b.B << " T " << b.T);
            bitwise += got == want;
            differs += got != fp32;
            ++cases;
          }
        }
      }
      set_num_threads(2);
      INFO(nn::to_string(task) << " D " << D << ": " << bitwise << " of " << cases << " cases bitwise identical");
      CHECK(bitwise == cases);
      CHECK(differs > 0);  // the products did run in bf16
    }
  }
}

TEST_CASE("InferenceModel: bf16 weights take 2 bytes each; only product weights, float models", "[inference][bf16]") {
  const nn::ModelConfig mc = small_config(nn::Task::cls, 16, 2, 2);
  const nn::InferenceConfig cfg = nn::InferenceConfig::from(mc);
  Rng rng(22);
  nn::TransformerModel<float> model(mc, rng);
  nn::InferenceModel<float> inf(cfg);
  inf.bind_parameters(model);
  const std::size_t float_bytes = inf.parameter_bytes();
  CHECK(float_bytes == std::size_t(inf.parameter_count()) * sizeof(float));
  std::vector<bf16> w(16 * 16);
  CHECK(inf.bind("layers.0.attn.W_v.weight", w.data(), 256));
  // W_q and W_k stay float: Q and K are the gate's inputs, fp32 products under the bf16 policy
  REQUIRE_THROWS_WITH(inf.bind("layers.0.attn.W_q.weight", w.data(), 256), Catch::Contains("stays float"));
  REQUIRE_THROWS_WITH(inf.bind("layers.0.attn.W_k.weight", w.data(), 256), Catch::Contains("stays float"));
  CHECK(inf.parameter_bytes() == float_bytes - 256 * 2);
  CHECK(inf.has_bf16_weights());
  CHECK_FALSE(inf.bind("layers.0.attn.W_x", w.data(), 1));
  REQUIRE_THROWS_WITH(inf.bind("layers.0.ln1.weight", w.data(), 16),
                      Catch::Contains("layers.0.ln1.weight") && Catch::Contains("stays float"));
  REQUIRE_THROWS_WITH(inf.bind("layers.0.attn.W_o.weight", w.data(), 100), Catch::Contains("expected 256 values"));
  // a workspace sized without the bf16 buffers is refused by name; one sized with them (constexpr: a static array
  // can hold it) works
  static_assert(nn::InferenceModel<float>::workspace_size(nn::InferenceConfig{29, 16, 2, 2, 36, 16, 3, nn::Task::cls},
                                                          2, 16, /*bf16*/ true) >
                    nn::InferenceModel<float>::workspace_size(nn::InferenceConfig{29, 16, 2, 2, 36, 16, 3, nn::Task::cls},
                                                              2, 16),
                "the bf16 buffers take room");
  std::vector<float> plain(std::size_t(nn::InferenceModel<float>::workspace_size(cfg, 1, 4)) + 64);
  float* p = plain.data();
  while (reinterpret_cast<std::uintptr_t>(p) % kWorkspaceAlign != 0) ++p;
  inf.set_workspace(p, nn::InferenceModel<float>::workspace_size(cfg, 1, 4), 1, 4);
  const std::int64_t ids[4] = {1, 2, 3, 4};
  REQUIRE_THROWS_WITH(inf.forward(ids, 1, 4), Catch::Contains("no room for the bf16 products"));
  inf.reserve(1, 4);
  // on a fresh thread (whose own bf16 buffers are empty), forward leaves them empty: its products used the workspace
  bool heap_untouched = false;
  Mat<float> a;
  std::thread([&] {
    a = inf.forward(ids, 1, 4);
    heap_untouched = ops::packed::bf16_detail::a_scratch().p == nullptr && ops::packed::bf16_detail::b_scratch().p == nullptr;
  }).join();
  CHECK(heap_untouched);
  CHECK(a.allFinite());
  // binding the float tensor again returns the model to float products
  for (Param<float>* q : model.parameters())
    if (q->name == "layers.0.attn.W_v.weight") inf.bind(q->name.c_str(), q->value.data(), q->numel());
  CHECK_FALSE(inf.has_bf16_weights());
  CHECK(inf.parameter_bytes() == float_bytes);
  nn::InferenceModel<double> d(cfg);
  REQUIRE_THROWS_WITH(d.bind("layers.0.attn.W_v.weight", w.data(), 256), Catch::Contains("float models"));
}

TEST_CASE("InferenceModel: bad bindings, sizes and inputs are errors that name them", "[inference][errors]") {
  const nn::ModelConfig mc = small_config(nn::Task::cls, 16, 2, 2);
  const nn::InferenceConfig cfg = nn::InferenceConfig::from(mc);
  Rng rng(16);
  nn::TransformerModel<float> model(mc, rng);
  std::vector<float> buf(4096, 0.5f);

  nn::InferenceModel<float> m(cfg);
  CHECK_FALSE(m.bind("mlm_head.weight", buf.data(), 31 * 16));  // the tied copy: not a tensor of its own
  CHECK_FALSE(m.bind("layers.0.attn.W_x", buf.data(), 1));
  REQUIRE_THROWS_WITH(m.bind("layers.0.attn.W_q.weight", buf.data(), 100),
                      Catch::Contains("layers.0.attn.W_q.weight") && Catch::Contains("expected 256 values, got 100"));
  REQUIRE_THROWS_WITH(m.bind("layers.2.ln1.weight", buf.data(), 16), Catch::Contains("has 2 layers"));
  REQUIRE_THROWS_WITH(m.check_bound(), Catch::Contains("'tok_emb.weight' is not bound"));
  for (Param<float>* p : model.parameters())
    if (p->name != "layers.1.ff.3.bias") m.bind(p->name.c_str(), p->value.data(), p->numel());
  REQUIRE_THROWS_WITH(m.check_bound(), Catch::Contains("'layers.1.ff.3.bias' is not bound"));
  m.bind_parameters(model);

  const std::int64_t ids[4] = {1, 2, 3, 40};
  REQUIRE_THROWS_WITH(m.forward(ids, 1, 3), Catch::Contains("no workspace"));
  REQUIRE_THROWS_WITH(m.reserve(1, 17), Catch::Contains("max_len must be in [1, 16], got 17"));
  m.reserve(1, 3);
  REQUIRE_THROWS_WITH(m.forward(ids, 2, 2), Catch::Contains("batch must be in [1, 1], got 2"));
  REQUIRE_THROWS_WITH(m.forward(ids, 1, 4), Catch::Contains("sequence length must be in [1, 3], got 4"));
  const std::int64_t bad_ids[3] = {1, 31, 2};
  REQUIRE_THROWS_WITH(m.forward(bad_ids, 1, 3), Catch::Contains("ids[1]: expected an id in [0, 31), got 31"));
  const std::int64_t bad_types[3] = {0, 1, 2};
  REQUIRE_THROWS_WITH(m.forward(ids, 1, 3, nullptr, bad_types), Catch::Contains("token_types[2]: expected 0 or 1"));

  alignas(kWorkspaceAlign) static float small[64];
  REQUIRE_THROWS_WITH(m.set_workspace(small, 64, 1, 3), Catch::Contains("are needed for max_batch 1 and max_len 3"));
  std::vector<float> big(static_cast<std::size_t>(nn::InferenceModel<float>::workspace_size(cfg, 1, 3) + 64));
  float* misaligned = big.data();
  while (reinterpret_cast<std::uintptr_t>(misaligned) % kWorkspaceAlign == 0) ++misaligned;
  REQUIRE_THROWS_WITH(m.set_workspace(misaligned, nn::InferenceModel<float>::workspace_size(cfg, 1, 3), 1, 3),
                      Catch::Contains("must be aligned"));

  // a model whose attention has RoPE: the inference kernel has none, so binding it is refused
  nn::TransformerModel<float> rope_model(mc, rng, [&](Index l) {
    auto o = nn::default_attention_options<DualExpertAttention<float>>(mc.dropout, l, mc.n_layers);
    o.rope_theta = 10000;
    return o;
  });
  nn::InferenceModel<float> r(cfg);
  REQUIRE_THROWS_WITH(r.bind_parameters(rope_model), Catch::Contains("layer 0") && Catch::Contains("rope_theta"));

  using Fixed = nn::InferenceModel<float, 4, 4, 2>;
  REQUIRE_THROWS_WITH(Fixed(cfg), Catch::Contains("n_heads: expected the compile-time 4, got 2"));
  using FixedLayers = nn::InferenceModel<float, 2, 8, 3>;
  REQUIRE_THROWS_WITH(FixedLayers(cfg), Catch::Contains("n_layers: expected the compile-time 3, got 2"));
}

}  // namespace test_inference
