// Tests of the decoder's bf16 inference: weights stored as bf16 (DecoderLM::store_bf16_weights), the bf16 KV cache,
// and the thread count of a decoding step.
#include <catch2/catch.hpp>
#include <dea/core/parallel.hpp>
#include <dea/lm/model.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_lm_bf16 {

using namespace dea;
using lm::DecoderConfig;
using lm::DecoderLM;
using IdTensor = Tensor<std::int64_t>;

namespace {

DecoderConfig config(const std::string& attention, const std::string& mlp) {
  DecoderConfig c;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = attention == "gqa" ? 2 : -1;
  c.attention_type = attention;
  c.mlp_type = mlp;
  c.intermediate_size = 192;
  c.num_experts = 4;
  c.top_k = 2;
  c.shared_expert = true;
  c.shared_intermediate_size = 128;
  c.vocab_size = 50;
  c.tr_mha_num_experts = 4;
  c.tr_mha_adapter_rank = 2;
  c.tr_mha_top_k = 2;
  c.initializer_range = 0.1;
  return c;
}

IdTensor random_ids(Index B, Index T, Index V, Rng& rng) {
  IdTensor t({B, T});
  for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(V)));
  return t;
}

IdTensor slice(const IdTensor& ids, Index t0, Index n) {
  const Index B = ids.size(0), T = ids.size(1);
  IdTensor s({B, n});
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < n; ++i) s[b * n + i] = ids[b * T + t0 + i];
  return s;
}

/// The logits of a prompt of `prompt` positions (one step), then single positions up to T, stacked in step order.
std::vector<Mat<float>> decode(DecoderLM<float>& m, const IdTensor& ids, Index prompt) {
  typename DecoderLM<float>::DecodeState st;
  std::vector<Mat<float>> out;
  out.push_back(m.forward_step(slice(ids, 0, prompt), st));
  for (Index t = prompt; t < ids.size(1); ++t) out.push_back(m.forward_step(slice(ids, t, 1), st));
  return out;
}

bool same_bits(const std::vector<Mat<float>>& a, const std::vector<Mat<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].rows() != b[i].rows() || a[i].cols() != b[i].cols() ||
        std::memcmp(a[i].data(), b[i].data(), sizeof(float) * static_cast<std::size_t>(a[i].size())) != 0)
      return false;
  return true;
}

struct Threads {
  int saved = num_threads();
  explicit Threads(int n) { set_num_threads(n); }
  ~Threads() { set_num_threads(saved); }
};

}  // namespace

TEST_CASE("lm bf16 inference: stored bf16 weights give the bits of bf16 products on the float model, for any thread "
          "count, and logits close to fp32's", "[lm][bf16]") {
  struct Case {
    const char* attention;
    const char* mlp;
  };
  for (const Case& k : {Case{"gqa", "dense_deterministic"}, Case{"mha", "tr_hash_engine"},
                        Case{"tr_mha_v2", "dense_deterministic"}}) {
    INFO(k.attention << " + " << k.mlp);
    const DecoderConfig c = config(k.attention, k.mlp);
    DecoderLM<float> f32(c, 7), b16(c, 7);  // the same draws
    const std::size_t float_bytes = b16.weight_bytes();
    b16.store_bf16_weights();
    CHECK(b16.has_bf16_weights());
    Rng rng(11);
    // batch 2: a prompt of 40 positions (80 rows: enough for the threads), then 6 single positions
    const IdTensor ids = random_ids(2, 46, c.vocab_size, rng);

    std::vector<Mat<float>> ref32, emulated, one, two;
    {
      const Threads t(1);
      ref32 = decode(f32, ids, 40);
      const ScopedPrecision bf16(Precision::bf16);
      emulated = decode(f32, ids, 40);
      one = decode(b16, ids, 40);
    }
    {
      const Threads t(2);
      two = decode(b16, ids, 40);
    }
    CHECK(same_bits(one, emulated));  // bf16 copies = the float weights rounded in the product
    CHECK(same_bits(one, two));       // thread-count invariance
    CHECK_FALSE(same_bits(one, ref32));  // (it is bf16: not the float bits)

    // close to fp32: the worst difference against the size of the logits, and the same greedy choices
    double worst = 0, scale = 0;
    Index argmax_same = 0, rows = 0;
    for (std::size_t s = 0; s < one.size(); ++s) {
      worst = std::max(worst, static_cast<double>((one[s] - ref32[s]).cwiseAbs().maxCoeff()));
      scale = std::max(scale, static_cast<double>(ref32[s].cwiseAbs().maxCoeff()));
      for (Index r = 0; r < one[s].rows(); ++r) {
        Index a = 0, b = 0;
        one[s].row(r).maxCoeff(&a);
        ref32[s].row(r).maxCoeff(&b);
        argmax_same += a == b;
        ++rows;
      }
    }
    INFO("worst |bf16 - fp32| " << worst << " of logits up to " << scale << "; same arg-max " << argmax_same << " / "
                                << rows);
    CHECK(scale > 0.5);
    CHECK(worst < 0.03 * scale);
    CHECK(argmax_same >= rows * 9 / 10);

    // memory: the product weights at 2 bytes instead of 4 (the token-routed attention keeps its float weights)
    if (std::string(k.attention) != "tr_mha_v2") CHECK(b16.weight_bytes() < float_bytes * 6 / 10);
    CHECK(b16.weight_bytes() < float_bytes);
    // and the model is for decoding only
    typename DecoderLM<float>::Cache cache;
    CHECK_THROWS_WITH(b16.forward(ids, cache), Catch::Contains("bf16"));
  }
}

TEST_CASE("lm bf16 inference: the KV cache holds bf16 keys and values, half the bytes of float's", "[lm][bf16]") {
  const DecoderConfig c = config("gqa", "dense_deterministic");
  DecoderLM<float> f32(c, 3), b16(c, 3);
  b16.store_bf16_weights();
  Rng rng(2);
  const IdTensor ids = random_ids(2, 9, c.vocab_size, rng);
  typename DecoderLM<float>::DecodeState s32, s16;
  f32.forward_step(ids, s32);
  b16.forward_step(ids, s16);
  // 2 layers, K and V, 2 rows of 9 positions, 2 KV heads of 16
  CHECK(s32.kv_bytes() == std::size_t(2 * 2 * 2 * 9 * 32) * 4);
  CHECK(s16.kv_bytes() == std::size_t(2 * 2 * 2 * 9 * 32) * 2);
  // a float cache cannot go on in bf16 within a sequence
  const ScopedPrecision bf16(Precision::bf16);
  CHECK_THROWS_WITH(f32.forward_step(slice(ids, 0, 1), s32), Catch::Contains("precision changed"));
}

TEST_CASE("lm decoding: the prefill (split between threads) and the one-row steps (one thread) give the same bits on "
          "1 and 2 threads", "[lm]") {
  const DecoderConfig c = config("gqa", "tr_hash_engine");
  DecoderLM<float> m(c, 5);
  Rng rng(4);
  const IdTensor ids = random_ids(1, 90, c.vocab_size, rng);
  std::vector<Mat<float>> one, two;
  {
    const Threads t(1);
    one = decode(m, ids, 70);  // a prefill of 70 rows (split), then one-row steps (not)
  }
  {
    const Threads t(2);
    two = decode(m, ids, 70);
  }
  CHECK(same_bits(one, two));
  CHECK(DecoderLM<float>::kSerialStepRows > 1);
  CHECK(DecoderLM<float>::kSerialStepRows <= 70);
}

}  // namespace test_lm_bf16
