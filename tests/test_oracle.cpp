// The NLI oracle: the public golden case (tests/data/bert/oracle/), the isotonic calibrator against values
// derived by hand, the pairs / labels / cache files, the recovery rule of an interrupted run, and bad input.
#include <catch2/catch.hpp>
#include <dea/oracle/nli_oracle.hpp>
#include <dea/oracle/run.hpp>
#include <dea/core/files.hpp>
#include <dea/core/parallel.hpp>
#include <dea/oracle/isotonic.hpp>
#include <dea/io/jsonl.hpp>
#include <dea/oracle/files.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_oracle {

using namespace dea;
namespace fs = std::filesystem;

namespace {

const std::string kOracleDir = std::string(DEA_TEST_DATA_DIR) + "/bert/oracle";
const std::string kNli = kOracleDir + "/oracle_nli";
const std::string kSim = kOracleDir + "/oracle_sim";

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("dea_test_oracle_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "_" +
            std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& content) const {
    const std::string p = (path / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
  std::string name(const std::string& n) const { return (path / n).string(); }
};

nlohmann::json golden() { return nlohmann::json::parse(read_file(kOracleDir + "/oracle_cases.json")); }

template <class S>
bert::NliOracle<S>& oracle() {
  static bert::NliOracle<S> o = bert::NliOracle<S>::load(kNli, kSim);
  return o;
}

std::vector<std::int64_t> ids(const nlohmann::json& j) { return j.get<std::vector<std::int64_t>>(); }

/// True when a and b have the same shape and the same bits in every element.
bool same_bits(const Mat<float>& a, const Mat<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * std::size_t(a.size())) == 0;
}

/// The golden pairs as a pairs file's content, half of them under q_text / k_text.
std::string golden_pairs_file(const nlohmann::json& g, int repeat = 1) {
  std::string s;
  for (int r = 0; r < repeat; ++r)
    for (std::size_t i = 0; i < g["pairs"].size(); ++i) {
      const auto& p = g["pairs"][i];
      nlohmann::ordered_json j;
      const bool qk = (i + r) % 2 == 0;
      j[qk ? "q_text" : "premise"] = p["q_text"];
      j[qk ? "k_text" : "hypothesis"] = r == 0 ? p["k_text"].get<std::string>() : p["k_text"].get<std::string>() + " " + std::to_string(r);
      s += j.dump() + "\n";
    }
  return s;
}

template <class S>
std::string run_to(const std::string& pairs_path, const std::string& out, std::size_t batch, int threads) {
  set_num_threads(threads);
  auto& o = oracle<S>();
  const auto pairs = io::read_oracle_pairs(pairs_path);
  const auto resume = bert::prepare_oracle_resume(o, pairs, pairs_path, out);
  bert::OracleRunOptions ro;
  ro.batch_size = batch;
  bert::run_oracle(o, pairs, out, resume, ro, [](const bert::OracleProgress&) {});
  set_num_threads(2);
  return read_file(out);
}

}  // namespace

// =============================================================================================================
// The golden case
// =============================================================================================================

template <class S>
void check_golden(double tol) {
  const nlohmann::json g = golden();
  auto& o = oracle<S>();
  REQUIRE(o.entailment_index() == g["entailment_index"].get<Index>());
  REQUIRE(o.entailment_label() == "entailment");
  REQUIRE(o.options().nli_max_length == g["nli_max_length"].get<std::size_t>());
  REQUIRE(o.options().sim_max_length == g["sim_max_length"].get<std::size_t>());
  std::vector<bert::TextPair> pairs;
  for (const auto& p : g["pairs"]) pairs.push_back({p["q_text"], p["k_text"]});
  const std::vector<bert::OracleScore> batch = o.score(pairs);
  double worst[4] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const auto& p = g["pairs"][i];
    INFO("pair " << i << ": " << pairs[i].premise << " / " << pairs[i].hypothesis);
    const text::Encoding nli = o.nli_encoding(pairs[i].premise, pairs[i].hypothesis);
    CHECK(nli.input_ids == ids(p["nli_input_ids"]));
    CHECK(nli.token_type_ids == ids(p["nli_token_type_ids"]));
    CHECK(o.sim_encoding(pairs[i].premise).input_ids == ids(p["sim_input_ids_q"]));
    CHECK(o.sim_encoding(pairs[i].hypothesis).input_ids == ids(p["sim_input_ids_k"]));
    const bert::OracleScore& s = batch[i];
    const double err[4] = {std::abs(s.phi - p["phi"].get<double>()), std::abs(s.sim - p["sim"].get<double>()),
                           std::abs(s.alpha_raw - p["alpha_raw"].get<double>()),
                           std::abs(s.alpha - p["alpha"].get<double>())};
    for (int k = 0; k < 4; ++k) {
      CHECK(err[k] <= tol);
      worst[k] = std::max(worst[k], err[k]);
    }
    // one pair alone (the model's loops on all threads) gives the same bits as the pair in a batch
    const bert::OracleScore one = o.score(pairs[i].premise, pairs[i].hypothesis);
    CHECK(one.phi == s.phi);
    CHECK(one.sim == s.sim);
    CHECK(one.alpha == s.alpha);
  }
  std::printf("oracle golden case (%s): worst |error| phi %.3g, sim %.3g, alpha_raw %.3g, alpha %.3g (tolerance %g)\n",
              sizeof(S) == 8 ? "double" : "float", worst[0], worst[1], worst[2], worst[3], tol);
}

TEST_CASE("oracle golden case: token ids exact, phi / sim / alpha_raw / alpha to 1e-9 in double", "[oracle][golden]") {
  check_golden<double>(1e-9);
}

TEST_CASE("oracle golden case: float to 1e-5; phi is the float32 logit", "[oracle][golden]") {
  check_golden<float>(1e-5);
  const auto s = oracle<float>().score("a car has a wheel.", "wheel");
  CHECK(static_cast<double>(static_cast<float>(s.phi)) == s.phi);  // widened from float, exactly
  CHECK(static_cast<double>(static_cast<float>(s.sim)) == s.sim);
}

TEST_CASE("oracle bf16: alpha within 0.01 of the float oracle's on the golden pairs, the same bits on 1 and 2 threads "
          "and in any batch", "[oracle][bf16]") {
  const nlohmann::json g = golden();
  std::vector<bert::TextPair> pairs;
  for (const auto& p : g["pairs"]) pairs.push_back({p["q_text"], p["k_text"]});
  bert::OracleOptions opt;
  opt.precision = Precision::bf16;
  auto b16 = bert::NliOracle<float>::load(kNli, kSim, opt);
  const std::vector<bert::OracleScore> f = oracle<float>().score(pairs);
  const std::vector<bert::OracleScore> a = b16.score(pairs);
  double worst_alpha = 0, worst_phi = 0, worst_sim = 0;
  bool any_differs = false;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    INFO("pair " << i << ": " << pairs[i].premise << " / " << pairs[i].hypothesis);
    CHECK(std::abs(a[i].alpha - f[i].alpha) <= 0.01);
    worst_alpha = std::max(worst_alpha, std::abs(a[i].alpha - f[i].alpha));
    worst_phi = std::max(worst_phi, std::abs(a[i].phi - f[i].phi));
    worst_sim = std::max(worst_sim, std::abs(a[i].sim - f[i].sim));
    any_differs = any_differs || a[i].phi != f[i].phi;
  }
  CHECK(any_differs);  // the products did run in bf16
  std::printf("oracle golden pairs, bf16 against float: worst |difference| alpha %.3g, phi %.3g, sim %.3g\n",
              worst_alpha, worst_phi, worst_sim);
  // the bf16 oracle holds its product weights as bf16 (the float oracle's models still hold float weights)
  CHECK(b16.nli().has_bf16_weights());
  CHECK(b16.embedder().has_bf16_weights());
  CHECK(!oracle<float>().nli().has_bf16_weights());
  CHECK(b16.weight_bytes() < oracle<float>().weight_bytes());
  std::printf("oracle golden models: weights %zu bytes as float, %zu with bf16 product weights\n",
              oracle<float>().weight_bytes(), b16.weight_bytes());
  // the same bits as the float weights with bf16 products: each pair's phi and both embeddings, computed from the
  // float oracle's models under the bf16 oracle's policy (batch-invariant products, bf16 precision), one text alone
  {
    const ScopedBatchInvariantProducts invariant;
    const ScopedPrecision bf16_products(Precision::bf16);
    auto& f32 = oracle<float>();
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      INFO("pair " << i << ": " << pairs[i].premise << " / " << pairs[i].hypothesis);
      const text::Encoding e = f32.nli_encoding(pairs[i].premise, pairs[i].hypothesis);
      const Index T = Index(e.size());
      bert::BertBatch<float> nb;
      nb.input_ids = Tensor<std::int64_t>({1, T});
      nb.token_type_ids = Tensor<std::int64_t>({1, T});
      std::copy(e.input_ids.begin(), e.input_ids.end(), nb.input_ids.ptr());
      std::copy(e.token_type_ids.begin(), e.token_type_ids.end(), nb.token_type_ids.ptr());
      typename bert::BertForSequenceClassification<float>::Cache c;
      const float phi = f32.nli().forward(nb, nullptr, false, nullptr, c).logits(0, f32.entailment_index());
      CHECK(double(phi) == a[i].phi);
      for (const std::string& t : {pairs[i].premise, pairs[i].hypothesis}) {
        const text::Encoding s1 = f32.sim_encoding(t);
        bert::BertBatch<float> sb;
        sb.input_ids = Tensor<std::int64_t>({1, Index(s1.size())});
        std::copy(s1.input_ids.begin(), s1.input_ids.end(), sb.input_ids.ptr());
        const Mat<float> unstored = bert::sentence_embedding(f32.embedder(), sb);
        const Mat<float> stored = b16.embedding(b16.sim_encoding(t));
        REQUIRE(stored.cols() == unstored.cols());
        CHECK(same_bits(stored, unstored));
      }
    }
  }
  const int saved = num_threads();
  for (int t : {1, 2}) {
    set_num_threads(t);
    const std::vector<bert::TextPair> tail(pairs.begin() + 5, pairs.end());  // another batch composition
    const auto c = b16.score(tail);
    for (std::size_t i = 5; i < pairs.size(); ++i) {
      CHECK(c[i - 5].phi == a[i].phi);
      CHECK(c[i - 5].sim == a[i].sim);
    }
    const auto one = b16.score(pairs[0].premise, pairs[0].hypothesis);
    CHECK(one.phi == a[0].phi);
    CHECK(one.sim == a[0].sim);
  }
  set_num_threads(saved);
  CHECK_THROWS_WITH(bert::NliOracle<double>::load(kNli, kSim, opt), Catch::Contains("bf16"));
}

namespace {

/// A small BERT configuration with random-size corners: hidden H, heads A, intermediate I, 2 layers, 3 labels.
bert::BertConfig small_config(Index H, Index A, Index I) {
  bert::BertConfig c;
  c.vocab_size = 40;
  c.hidden_size = H;
  c.num_hidden_layers = 2;
  c.num_attention_heads = A;
  c.intermediate_size = I;
  c.max_position_embeddings = 16;
  c.type_vocab_size = 2;
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.1;
  c.initializer_range = 0.2;
  c.id2label = {"contradiction", "entailment", "neutral"};
  return c;
}

/// B = 3 sequences of T = 9 with token types; the last two of the second sequence padded.
bert::BertBatch<float> small_batch(const bert::BertConfig& cfg, std::uint64_t seed) {
  const Index B = 3, T = 9;
  bert::BertBatch<float> b;
  Rng rng(seed);
  b.input_ids = Tensor<std::int64_t>({B, T});
  b.token_type_ids = Tensor<std::int64_t>({B, T});
  b.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  for (Index k = 0; k < B * T; ++k) {
    b.input_ids[k] = static_cast<std::int64_t>(rng.next_u64() % static_cast<std::uint64_t>(cfg.vocab_size));
    b.token_type_ids[k] = static_cast<std::int64_t>(rng.next_u64() % 2);
  }
  b.attention_mask[1 * T + 7] = b.attention_mask[1 * T + 8] = 0;
  return b;
}

}  // namespace

TEST_CASE("bert bf16 weights: the bits of the float weights with bf16 products, on 1 and 2 threads",
          "[oracle][bf16][bert]") {
  // (H, A, I): whole register panels; then odd inner dimensions and a last panel of a few columns
  for (const auto& dims : {std::array<Index, 3>{64, 4, 128}, std::array<Index, 3>{33, 3, 45}}) {
    INFO("hidden " << dims[0] << ", heads " << dims[1] << ", intermediate " << dims[2]);
    const bert::BertConfig cfg = small_config(dims[0], dims[1], dims[2]);
    Rng rng(7);
    bert::BertForSequenceClassification<float> f32(cfg, rng);
    for (Param<float>* p : f32.parameters())  // off HF's init: biases and LayerNorms not 0 / 1
      for (Index k = 0; k < p->numel(); ++k) p->value[k] += 0.05f * float(rng.normal());
    const bert::BertBatch<float> batch = small_batch(cfg, 3);
    // the float weights with bf16 products (the oracle's path before it stored its weights), and fp32
    typename bert::BertForSequenceClassification<float>::Cache c;
    bert::SeqClsOutput<float> ref, fp32;
    {
      const ScopedPrecision bf16_products(Precision::bf16);
      ref = f32.forward(batch, nullptr, false, nullptr, c);
    }
    fp32 = f32.forward(batch, nullptr, false, nullptr, c);
    bert::BertForSequenceClassification<float> b16 = f32;
    const std::size_t before = b16.weight_bytes();
    const std::size_t after = b16.store_bf16_weights();
    CHECK(b16.has_bf16_weights());
    CHECK(b16.bert().has_bf16_weights());
    CHECK(after == b16.weight_bytes());
    CHECK(after < before);
    for (Param<float>* p : b16.parameters()) CHECK(p->grad.size() == 0);  // inference only: no gradient buffers
    CHECK(b16.bert().layer(0).intermediate_dense().weight.value.size() == 0);  // the float copy is gone
    const int saved = num_threads();
    for (int t : {1, 2}) {
      set_num_threads(t);
      typename bert::BertForSequenceClassification<float>::Cache c16;
      const bert::SeqClsOutput<float> out = b16.forward(batch, nullptr, false, nullptr, c16);  // no scope needed
      CHECK(same_bits(out.logits, ref.logits));
      CHECK(same_bits(out.bert.pooler_output, ref.bert.pooler_output));
      CHECK(same_bits(out.bert.last_hidden_state, ref.bert.last_hidden_state));
      CHECK(!same_bits(out.logits, fp32.logits));  // the products did run in bf16
      // the encoder alone, as the oracle's embedder runs it
      bert::BertModel<float> emb = f32.bert();
      emb.store_bf16_weights();
      const Mat<float> e16 = bert::sentence_embedding(emb, batch);
      Mat<float> e_ref;
      {
        const ScopedPrecision bf16_products(Precision::bf16);
        e_ref = bert::sentence_embedding(f32.bert(), batch);
      }
      CHECK(same_bits(e16, e_ref));
    }
    set_num_threads(saved);
    // a stored model is for inference: training forwards and backward are refused by name
    Rng drop_rng(1);
    typename bert::BertForSequenceClassification<float>::Cache ct;
    CHECK_THROWS_WITH(b16.forward(batch, nullptr, true, &drop_rng, ct),
                      Catch::Contains("BertForSequenceClassification::forward") && Catch::Contains("bf16"));
    CHECK_THROWS_WITH(b16.bert().forward(batch, true, &drop_rng, ct.bert),
                      Catch::Contains("BertModel::forward") && Catch::Contains("bf16"));
    typename bert::BertForSequenceClassification<float>::Cache cb;
    Tensor<std::int64_t> labels({3});
    labels[0] = 0;
    labels[1] = 1;
    labels[2] = 2;
    (void)b16.forward(batch, &labels, false, nullptr, cb);  // an evaluation loss is fine
    CHECK_THROWS_WITH(b16.backward(cb), Catch::Contains("backward") && Catch::Contains("bf16"));
    CHECK_THROWS_WITH(b16.bert().backward(nullptr, nullptr, cb.bert), Catch::Contains("BertModel::backward"));
  }
  // float only
  const bert::BertConfig cfg = small_config(16, 2, 32);
  Rng rng(3);
  bert::BertModel<double> d(cfg, rng);
  CHECK_THROWS_WITH(d.store_bf16_weights(), Catch::Contains("float models only"));
  bert::BertForSequenceClassification<double> dc(cfg, rng);
  CHECK_THROWS_WITH(dc.store_bf16_weights(), Catch::Contains("float models only"));
}

TEST_CASE("bert bf16 weights: 2 bytes a product weight, everything else float as before", "[oracle][bf16][bert]") {
  // H and I multiples of the packed panel's 32 columns and even: no padding, so the bytes are exact
  const Index H = 128, I = 512, L = 2, V = 40, P = 16, C = 3;
  bert::BertConfig cfg = small_config(H, 4, I);
  Rng rng(5);
  bert::BertForSequenceClassification<float> m(cfg, rng);
  const std::size_t f = sizeof(float);
  const std::size_t product_weights = std::size_t(L * (4 * H * H + 2 * H * I) + H * H);  // layers and the pooler
  const std::size_t other = std::size_t((V + P + 2) * H + 2 * H)                         // embeddings, their LN
                            + std::size_t(L * (3 * H + H + I + H + 4 * H))              // biases, LayerNorms
                            + std::size_t(H);                                          // the pooler's bias
  CHECK(m.bert().weight_bytes() == f * (product_weights + other));
  CHECK(m.weight_bytes() == f * (product_weights + other + std::size_t(C * H + C)));
  m.store_bf16_weights();
  CHECK(m.bert().weight_bytes() == 2 * product_weights + f * other);
  // the classifier's 3 outputs take one panel of 32 columns
  CHECK(m.weight_bytes() == 2 * product_weights + f * other + 2 * std::size_t(32 * H) + f * std::size_t(C));
  // the layers (all their weights but the LayerNorms and biases are products) are about half as large
  const double layer_ratio = double(m.bert().layer(0).weight_bytes()) / double(f * std::size_t(4 * H * H + 2 * H * I + 9 * H + I));
  CHECK(layer_ratio < 0.51);
  CHECK(layer_ratio > 0.49);
}

TEST_CASE("oracle: 1 and 2 threads, any batch, give identical bits", "[oracle][threads]") {
  const nlohmann::json g = golden();
  std::vector<bert::TextPair> pairs;
  for (const auto& p : g["pairs"]) pairs.push_back({p["q_text"], p["k_text"]});
  for (int t : {1, 2}) {
    set_num_threads(t);
    const auto a = oracle<double>().score(pairs);
    const auto f = oracle<float>().score(pairs);
    set_num_threads(t == 1 ? 2 : 1);
    const auto b = oracle<double>().score(pairs);
    const auto h = oracle<float>().score(pairs);
    const std::vector<bert::TextPair> tail(pairs.begin() + 5, pairs.end());  // another batch composition
    const auto c = oracle<double>().score(tail);
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      CHECK(a[i].phi == b[i].phi);
      CHECK(a[i].sim == b[i].sim);
      CHECK(f[i].phi == h[i].phi);
      CHECK(f[i].sim == h[i].sim);
      if (i >= 5) CHECK(c[i - 5].phi == a[i].phi);
    }
    // each pair alone: a batch of one sequence per forward
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      const auto one = oracle<double>().score(pairs[i].premise, pairs[i].hypothesis);
      const auto onef = oracle<float>().score(pairs[i].premise, pairs[i].hypothesis);
      CHECK(one.phi == a[i].phi);
      CHECK(one.sim == a[i].sim);
      CHECK(onef.phi == f[i].phi);
      CHECK(onef.sim == f[i].sim);
    }
    // every pair three times: each length runs as a group of at least three sequences in one forward, and each
    // record keeps the bits it has alone
    std::vector<bert::TextPair> thrice;
    for (int r = 0; r < 3; ++r) thrice.insert(thrice.end(), pairs.begin(), pairs.end());
    const auto d = oracle<double>().score(thrice);
    const auto e = oracle<float>().score(thrice);
    for (std::size_t i = 0; i < thrice.size(); ++i) {
      const std::size_t k = i % pairs.size();
      CHECK(d[i].phi == a[k].phi);
      CHECK(d[i].sim == a[k].sim);
      CHECK(e[i].phi == f[k].phi);
      CHECK(e[i].sim == f[k].sim);
    }
  }
  set_num_threads(2);
}

TEST_CASE("oracle: each sequence alone gives the numbers of a batch padded to its longest sequence",
          "[oracle][padding]") {
  // the reference pads each batch; padded keys get weight 0 and padded rows are not pooled, so padding changes
  // nothing beyond round-off (the oracle runs every sequence alone so that a record depends on its text only)
  const nlohmann::json g = golden();
  auto& o = oracle<double>();
  std::vector<text::Encoding> enc, sims;
  for (const auto& p : g["pairs"]) {
    enc.push_back(o.nli_encoding(p["q_text"], p["k_text"]));
    sims.push_back(o.sim_encoding(p["q_text"]));
  }
  auto padded = [](const std::vector<text::Encoding>& e) {
    const Index B = static_cast<Index>(e.size());
    Index T = 0;
    for (const auto& x : e) T = std::max(T, static_cast<Index>(x.size()));
    bert::BertBatch<double> b;
    b.input_ids = Tensor<std::int64_t>({B, T}, 0);
    b.token_type_ids = Tensor<std::int64_t>({B, T}, 0);
    b.attention_mask = Tensor<std::uint8_t>({B, T}, 0);
    for (Index i = 0; i < B; ++i)
      for (Index t = 0; t < static_cast<Index>(e[std::size_t(i)].size()); ++t) {
        b.input_ids[i * T + t] = e[std::size_t(i)].input_ids[std::size_t(t)];
        b.token_type_ids[i * T + t] = e[std::size_t(i)].token_type_ids[std::size_t(t)];
        b.attention_mask[i * T + t] = 1;
      }
    return b;
  };
  const auto nb = padded(enc);
  typename bert::BertForSequenceClassification<double>::Cache c;
  const auto out = o.nli().forward(nb, nullptr, false, nullptr, c);
  const Mat<double> emb = bert::sentence_embedding(o.embedder(), padded(sims));
  double worst = 0;
  for (std::size_t i = 0; i < enc.size(); ++i) {
    worst = std::max(worst, std::abs(out.logits(Index(i), 1) - o.entailment_logit(enc[i])));
    worst = std::max(worst, (emb.row(Index(i)) - o.embedding(sims[i]).row(0)).cwiseAbs().maxCoeff());
  }
  CHECK(worst <= 1e-13);
  CHECK(out.logits.rows() == 12);
  // (and the batch was padded: its shortest sequence is shorter than its longest)
  CHECK(std::count(nb.attention_mask.ptr(), nb.attention_mask.ptr() + nb.attention_mask.numel(), 0) > 0);
}

TEST_CASE("oracle: the entailment index is the first label containing \"entail\"", "[oracle]") {
  CHECK(bert::find_entailment_index({"contradiction", "entailment", "neutral"}, "c") == 1);
  CHECK(bert::find_entailment_index({"ENTAILMENT", "neutral", "contradiction"}, "c") == 0);
  CHECK(bert::find_entailment_index({"contradiction", "not_entailment", "entailment"}, "c") == 1);  // first match wins
  CHECK_THROWS_WITH(bert::find_entailment_index({"LABEL_0", "LABEL_1"}, "m/config.json"),
                    Catch::Contains("m/config.json") && Catch::Contains("\"LABEL_1\"") &&
                        Catch::Contains("not an NLI model"));
}

// =============================================================================================================
// Isotonic regression (every expected value derived by hand in the comments)
// =============================================================================================================

TEST_CASE("isotonic: pool adjacent violators, interpolation, clipping of x", "[oracle][isotonic]") {
  using eval::IsotonicRegression;
  // y = 0.1, 0.5, 0.3, 0.7: (0.5, 0.3) pool to 0.4; no point equals both neighbours, all four stay thresholds
  IsotonicRegression iso;
  iso.fit({1, 2, 3, 4}, {0.1, 0.5, 0.3, 0.7});
  REQUIRE(iso.x_thresholds() == std::vector<double>{1, 2, 3, 4});
  REQUIRE(iso.y_thresholds().size() == 4);
  CHECK(iso.y_thresholds()[0] == 0.1);
  CHECK(iso.y_thresholds()[1] == Approx(0.4).margin(1e-16));
  CHECK(iso.y_thresholds()[2] == iso.y_thresholds()[1]);
  CHECK(iso.y_thresholds()[3] == 0.7);
  CHECK(iso.predict(2.5) == iso.y_thresholds()[1]);       // flat between 2 and 3
  CHECK(iso.predict(3.5) == Approx(0.55).margin(1e-15));  // halfway from 0.4 to 0.7
  CHECK(iso.predict(1.5) == Approx(0.25).margin(1e-15));  // halfway from 0.1 to 0.4
  CHECK(iso.predict(1.25) == Approx(0.175).margin(1e-15));
  CHECK(iso.predict(4.0) == 0.7);                         // exactly the threshold
  CHECK(iso.predict(-10.0) == 0.1);                       // x clipped to [1, 4]
  CHECK(iso.predict(10.0) == 0.7);
  CHECK(std::isnan(iso.predict(std::nan(""))));
  // unsorted input: the same fit
  IsotonicRegression iso2;
  iso2.fit({3, 1, 4, 2}, {0.3, 0.1, 0.7, 0.5});
  CHECK(iso2.predict(std::vector<double>{1.5, 2.5, 3.5}) == iso.predict(std::vector<double>{1.5, 2.5, 3.5}));
  // a chain 0.6, 0.2, 0.1 pools to (0.9) / 3 = 0.3; the middle point equals both neighbours and is dropped
  IsotonicRegression chain;
  chain.fit({0, 1, 2}, {0.6, 0.2, 0.1});
  CHECK(chain.x_thresholds() == std::vector<double>{0, 2});
  CHECK(chain.y_thresholds()[0] == Approx(0.3).margin(1e-16));
  CHECK(chain.predict(1.0) == chain.y_thresholds()[0]);
  // backtracking: 0.5, 0.6, 0.7, 0.1 -> (0.7, 0.1) = 0.4 < 0.6 -> (0.6, 0.7, 0.1) = 1.4/3 < 0.5 -> all 1.9/4 = 0.475
  IsotonicRegression back;
  back.fit({0, 1, 2, 3}, {0.5, 0.6, 0.7, 0.1});
  CHECK(back.x_thresholds() == std::vector<double>{0, 3});
  CHECK(back.y_thresholds()[0] == Approx(0.475).margin(1e-16));
  CHECK(back.y_thresholds()[1] == back.y_thresholds()[0]);
  // 0.3, 0.6, 0.2, 0.9 -> (0.6, 0.2) = 0.4 >= 0.3: no further pooling
  IsotonicRegression two;
  two.fit({0, 1, 2, 3}, {0.3, 0.6, 0.2, 0.9});
  CHECK(two.predict(0.0) == 0.3);
  CHECK(two.predict(1.0) == Approx(0.4).margin(1e-16));
  CHECK(two.predict(2.5) == Approx(0.65).margin(1e-15));
  // equal values pool too and the interior one is dropped
  IsotonicRegression flat;
  flat.fit({0, 1, 2}, {0.5, 0.5, 0.5});
  CHECK(flat.x_thresholds() == std::vector<double>{0, 2});
  CHECK(flat.predict(1.3) == 0.5);
}

TEST_CASE("isotonic: ties in x, weights, bounds applied after pooling", "[oracle][isotonic]") {
  using eval::IsotonicRegression;
  // equal x merge first: x = 1 -> (0.2 + 0.4) / 2 = 0.3 with weight 2; then (0.3, w 2) > (0.1, w 1) -> 0.7 / 3
  IsotonicRegression dup;
  dup.fit({1, 2, 1}, {0.4, 0.1, 0.2});
  CHECK(dup.x_thresholds() == std::vector<double>{1, 2});
  CHECK(dup.predict(1.0) == Approx(0.7 / 3.0).margin(1e-16));
  CHECK(dup.predict(2.0) == dup.predict(1.0));
  // ties within 1e-15 of the group's FIRST x merge (numpy's float64 resolution), measured from that first x:
  // x0 = 0.5, x1 = x0 + 5 ulp (5.6e-16: joins), x2 = x0 + 10 ulp (1.1e-15: a new group, although x2 - x1 < 1e-15)
  const double ulp = std::nextafter(0.5, 1.0) - 0.5;
  const double x0 = 0.5, x1 = 0.5 + 5 * ulp, x2 = 0.5 + 10 * ulp;
  REQUIRE(x1 - x0 < 1e-15);
  REQUIRE(x2 - x0 >= 1e-15);
  REQUIRE(x2 - x1 < 1e-15);
  IsotonicRegression near;
  near.fit({x2, x1, x0}, {0.9, 0.4, 0.2});
  CHECK(near.x_thresholds() == std::vector<double>{x0, x2});  // the group stands at its first x
  CHECK(near.y_thresholds()[0] == Approx(0.3).margin(1e-16));  // (0.2 + 0.4) / 2
  CHECK(near.y_thresholds()[1] == 0.9);
  CHECK(near.predict(x1) == Approx(0.3 + 0.6 * 0.5).margin(1e-9));  // interpolated: x1 is halfway from x0 to x2
  CHECK(near.x_max() == x2);
  // weights: (0.2, w 3) and (0.0, w 1) pool to 0.6 / 4 = 0.15
  IsotonicRegression w;
  w.fit({0, 1}, {0.2, 0.0}, {3, 1});
  CHECK(w.predict(0.5) == Approx(0.15).margin(1e-16));
  // a weight of 0 drops its point: (0, 0.1), (2, 0.5) -> 0.3 at x = 1
  IsotonicRegression zero;
  zero.fit({0, 1, 2}, {0.1, 0.9, 0.5}, {1, 0, 1});
  CHECK(zero.x_thresholds() == std::vector<double>{0, 2});
  CHECK(zero.predict(1.0) == Approx(0.3).margin(1e-16));
  // ... and leaves the x range: x_max = 1, so 5 clips to 1
  IsotonicRegression range;
  range.fit({0, 1, 5}, {0.1, 0.2, 0.9}, {1, 1, 0});
  CHECK(range.x_max() == 1.0);
  CHECK(range.predict(5.0) == 0.2);
  // outputs clipped to [0, 0.95]: -0.5 -> 0, 1.4 -> 0.95; between: 0.9 + 0.5 (0.95 - 0.9) = 0.925
  IsotonicRegression b;
  b.fit({0, 1, 2}, {-0.5, 0.9, 1.4});
  CHECK(b.predict(0.0) == 0.0);
  CHECK(b.predict(2.0) == 0.95);
  CHECK(b.predict(1.5) == Approx(0.925).margin(1e-15));
  CHECK(b.predict(0.5) == Approx(0.45).margin(1e-15));
  // the clip comes after the pooling: (1.2, 0.8) pool to 1.0, clipped to 0.95 (clipping first would give 0.875)
  IsotonicRegression after;
  after.fit({0, 1}, {1.2, 0.8});
  CHECK(after.predict(0.0) == 0.95);
  CHECK(after.predict(1.0) == 0.95);
  // one point, or one group of ties: constant
  IsotonicRegression one;
  one.fit({0.3}, {0.6});
  CHECK(one.predict(-1.0) == 0.6);
  CHECK(one.predict(5.0) == 0.6);
  IsotonicRegression ties;
  ties.fit({0.3, 0.3}, {0.2, 0.6});
  CHECK(ties.x_thresholds().size() == 1);
  CHECK(ties.predict(0.9) == Approx(0.4).margin(1e-16));
  // other bounds
  IsotonicRegression wide(-1.0, 2.0);
  wide.fit({0, 1}, {1.5, -0.5});
  CHECK(wide.predict(0.0) == 0.5);
  // thresholds round trip
  const auto restored = IsotonicRegression::from_thresholds({1, 2, 3, 4}, {0.1, 0.4, 0.4, 0.7});
  CHECK(restored.predict(3.5) == Approx(0.55).margin(1e-15));
  CHECK(restored.predict(0.0) == 0.1);
}

TEST_CASE("isotonic: bad input is an Error", "[oracle][isotonic][bad_input]") {
  using eval::IsotonicRegression;
  CHECK_THROWS_WITH(IsotonicRegression().fit({}, {}), Catch::Contains("no points"));
  CHECK_THROWS_WITH(IsotonicRegression().fit({1, 2}, {0.1}), Catch::Contains("x has 2 points, y has 1"));
  CHECK_THROWS_WITH(IsotonicRegression().fit({1, 2}, {0.1, 0.2}, {1, -1}), Catch::Contains("weight 1"));
  CHECK_THROWS_WITH(IsotonicRegression().fit({1, 2}, {0.1, 0.2}, {0, 0}), Catch::Contains("every weight is 0"));
  CHECK_THROWS_WITH(IsotonicRegression().fit({1, std::nan("")}, {0.1, 0.2}), Catch::Contains("point 1"));
  CHECK_THROWS_WITH(IsotonicRegression().predict(0.5), Catch::Contains("not fitted"));
  CHECK_THROWS_AS(IsotonicRegression(1.0, 0.0), Error);
  CHECK_THROWS_WITH(IsotonicRegression::from_thresholds({1, 0}, {0.1, 0.2}), Catch::Contains("breaks the order"));
  CHECK_THROWS_WITH(IsotonicRegression::from_thresholds({0, 1}, {0.1, 0.99}), Catch::Contains("outside"));
}

TEST_CASE("oracle: calibration fits alpha_raw against the human alpha and applies it", "[oracle][isotonic]") {
  const nlohmann::json g = golden();
  auto o = bert::NliOracle<double>::load(kNli, kSim);
  std::vector<bert::TextPair> pairs;
  std::vector<double> human, raw;
  for (const auto& p : g["pairs"]) {
    pairs.push_back({p["q_text"], p["k_text"]});
    raw.push_back(p["alpha_raw"]);
    human.push_back(p["alpha_raw"].get<double>() > 0.6 ? 0.9 : 0.1);  // a step at alpha_raw 0.6
  }
  const eval::IsotonicRegression& iso = o.calibrate(pairs, human);
  // the pooled means of equal labels: 0.1 and 0.9 up to the rounding of their sums
  CHECK(iso.y_thresholds().front() == Approx(0.1).margin(1e-15));
  CHECK(iso.y_thresholds().back() == Approx(0.9).margin(1e-15));
  const auto s = o.score(pairs);
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    CHECK(s[i].alpha_raw == Approx(raw[i]).margin(1e-9));  // alpha_raw is not calibrated
    CHECK(s[i].alpha == Approx(human[i]).margin(1e-15));    // the fit is the step itself
  }
  o.clear_calibrator();
  CHECK(o.score(pairs[0].premise, pairs[0].hypothesis).alpha == Approx(raw[0]).margin(1e-9));
  CHECK_THROWS_WITH(o.calibrate(pairs, {0.5}), Catch::Contains("12 pairs and 1 labels"));
}

// =============================================================================================================
// Files
// =============================================================================================================

TEST_CASE("oracle files: pairs, labels and cache lines", "[oracle][io]") {
  TempDir dir;
  const std::string p = dir.file("pairs.jsonl",
                                 "{\"premise\": \"a\", \"hypothesis\": \"b\"}\n\n"
                                 "{\"q_text\": \"c\", \"k_text\": \"d\", \"label\": 1, \"source\": \"x\"}\r\n"
                                 "{\"premise\": \"caf\\u00e9\", \"hypothesis\": \"\"}\n");
  const auto pairs = io::read_oracle_pairs(p);
  REQUIRE(pairs.size() == 3);
  CHECK(pairs[0].premise == "a");
  CHECK(!pairs[0].qk_names);
  CHECK(pairs[1].hypothesis == "d");
  CHECK(pairs[1].qk_names);
  CHECK(pairs[1].line == 3);
  CHECK(pairs[2].premise == "caf\xc3\xa9");
  CHECK(pairs[2].hypothesis.empty());
  CHECK(io::oracle_cache_line(pairs[0], 0.5, 0.5, 0.25, 1.0) ==
        "{\"premise\":\"a\",\"hypothesis\":\"b\",\"alpha\":0.5,\"alpha_raw\":0.5,\"phi\":0.25,\"sim\":1.0}\n");
  CHECK(io::oracle_cache_line(pairs[1], 0.95, 0.97, 3.0, -0.1) ==
        "{\"q_text\":\"c\",\"k_text\":\"d\",\"alpha\":0.95,\"alpha_raw\":0.97,\"phi\":3.0,\"sim\":-0.1}\n");
  // a cache is an alpha cache for the training side
  const std::string c = dir.file("c.jsonl", io::oracle_cache_line(pairs[0], 0.5, 0.5, 0.25, 1.0) +
                                                io::oracle_cache_line(pairs[1], 0.95, 0.97, 3.0, -0.1));
  const data::AlphaCache cache = io::read_alpha_cache(c);
  REQUIRE(cache.size() == 2);
  CHECK(cache.find("c", "d")->alpha == 0.95);
  CHECK(*cache.find("a", "b")->phi == 0.25);

  const auto labels = io::read_oracle_labels(
      dir.file("l.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 0.9}\n{\"q_text\": \"c\", \"k_text\": "
                          "\"d\", \"alpha\": 0}\n"));
  REQUIRE(labels.size() == 2);
  CHECK(labels[0].alpha == 0.9);
  CHECK(labels[1].pair.premise == "c");
}

TEST_CASE("bad input B27 a pairs file with a missing field, invalid JSON or invalid UTF-8", "[oracle][bad_input]") {
  TempDir dir;
  const std::string ok = "{\"premise\": \"a\", \"hypothesis\": \"b\"}\n";
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.file("m1.jsonl", ok + "{\"premise\": \"a\"}\n")),
                    Catch::Contains("m1.jsonl:2: missing field \"hypothesis\""));
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.file("m2.jsonl", ok + ok + "{\"k_text\": \"a\"}\n")),
                    Catch::Contains("m2.jsonl:3: missing field \"q_text\""));
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.file("m3.jsonl", "{\"text\": \"a\"}\n")),
                    Catch::Contains("m3.jsonl:1: missing field \"premise\"") && Catch::Contains("q_text"));
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.file("m4.jsonl", "{\"premise\": 1, \"hypothesis\": \"b\"}\n")),
                    Catch::Contains("m4.jsonl:1: field \"premise\" must be a string, got number"));
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.file("j.jsonl", ok + "{\"premise\": \"a\", \n")),
                    Catch::Contains("j.jsonl:2: invalid JSON"));
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.file("arr.jsonl", "[\"a\", \"b\"]\n")),
                    Catch::Contains("arr.jsonl:1: expected a JSON object, got array"));
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.file("u.jsonl", ok + "{\"premise\": \"caf\xff\", \"hypothesis\": \"b\"}\n")),
                    Catch::Contains("u.jsonl:2: the line is not valid UTF-8 (byte 0xFF at byte offset 16)"));
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.file("e.jsonl", "\n\n")), Catch::Contains("e.jsonl: no pairs"));
  CHECK_THROWS_WITH(io::read_oracle_pairs(dir.name("absent.jsonl")), Catch::Contains("absent.jsonl"));
  CHECK_THROWS_WITH(io::read_oracle_labels(dir.file("l1.jsonl", ok)),
                    Catch::Contains("l1.jsonl:1: missing field \"alpha\""));
  CHECK_THROWS_WITH(io::read_oracle_labels(dir.file("l2.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", "
                                                                "\"alpha\": 1.5}\n")),
                    Catch::Contains("l2.jsonl:1: alpha 1.5 outside [0, 1]"));
}

TEST_CASE("bad input B33 model directories for the oracle", "[oracle][bad_input]") {
  TempDir dir;
  CHECK_THROWS_WITH(bert::NliOracle<float>::load(dir.name("none"), kSim),
                    Catch::Contains("none' does not exist"));
  // a BertModel directory as the NLI model: no classifier
  CHECK_THROWS_WITH(bert::NliOracle<float>::load(kSim, kSim), Catch::Contains("classifier.weight"));
  // a classifier whose labels are not NLI labels
  const fs::path m = dir.path / "labels";
  fs::create_directories(m);
  for (const char* f : {"model.safetensors", "vocab.txt"}) fs::copy_file(fs::path(kNli) / f, m / f);
  std::string cfg = read_file(kNli + "/config.json");
  for (const char* from : {"contradiction", "entailment", "neutral"}) {
    const std::size_t at = cfg.find(std::string("\"") + from + "\"");
    REQUIRE(at != std::string::npos);
    cfg.replace(at + 1, std::char_traits<char>::length(from), std::string("L_") + from[0]);
  }
  dir.file("labels/config.json", cfg);
  CHECK_THROWS_WITH(bert::NliOracle<float>::load(m.string(), kSim), Catch::Contains("not an NLI model"));
  // no vocab.txt, a SentencePiece directory, a vocabulary larger than the model's
  const fs::path nv = dir.path / "novocab";
  fs::create_directories(nv);
  for (const char* f : {"model.safetensors", "config.json"}) fs::copy_file(fs::path(kNli) / f, nv / f);
  CHECK_THROWS_WITH(bert::NliOracle<float>::load(nv.string(), kSim), Catch::Contains("has no vocab.txt"));
  dir.file("novocab/spm.model", "x");
  CHECK_THROWS_WITH(bert::NliOracle<float>::load(nv.string(), kSim), Catch::Contains("SentencePiece"));
  fs::remove(nv / "spm.model");
  std::string big = read_file(kNli + "/vocab.txt");
  for (int i = 0; i < 10; ++i) big += "extra" + std::to_string(i) + "\n";
  dir.file("novocab/vocab.txt", big);
  CHECK_THROWS_WITH(bert::NliOracle<float>::load(nv.string(), kSim),
                    Catch::Contains("vocab.txt has 163 tokens but config.json's vocab_size is 153"));
  // a cased tokenizer_config.json is read; another tokenizer class is refused
  dir.file("novocab/vocab.txt", read_file(kNli + "/vocab.txt"));
  dir.file("novocab/tokenizer_config.json", "{\"do_lower_case\": false, \"tokenizer_class\": \"BertTokenizer\"}");
  auto cased = bert::NliOracle<float>::load(nv.string(), kSim);
  CHECK(cased.nli_encoding("Paris", "x").input_ids != oracle<float>().nli_encoding("Paris", "x").input_ids);
  dir.file("novocab/tokenizer_config.json", "{\"tokenizer_class\": \"DebertaV2Tokenizer\"}");
  CHECK_THROWS_WITH(bert::NliOracle<float>::load(nv.string(), kSim), Catch::Contains("\"DebertaV2Tokenizer\" is not"));
  // a max length beyond the positions
  bert::OracleOptions opt;
  opt.sim_max_length = 1000;
  CHECK_THROWS_WITH(bert::NliOracle<float>::load(kNli, kSim, opt),
                    Catch::Contains("sim_max_length 1000 exceeds its max_position_embeddings (160)"));
}

// =============================================================================================================
// The recovery rule
// =============================================================================================================

TEST_CASE("oracle run: an interrupted run continues to the file of an uninterrupted one", "[oracle][resume]") {
  const nlohmann::json g = golden();
  TempDir dir;
  const std::string pairs = dir.file("pairs.jsonl", golden_pairs_file(g, 3));  // 36 pairs
  const std::string full = run_to<float>(pairs, dir.name("full.jsonl"), 5, 2);
  REQUIRE(split_lines(full).size() == 36);
  REQUIRE(full.back() == '\n');
  const std::string out = dir.name("out.jsonl");
  auto cut = [&](std::size_t bytes) { dir.file("out.jsonl", full.substr(0, bytes)); };
  std::size_t line7 = 0;
  for (int i = 0; i < 7; ++i) line7 = full.find('\n', line7) + 1;

  SECTION("a torn line in the middle of a record, resumed with other batch size and threads") {
    cut(line7 + 17);
    CHECK(run_to<float>(pairs, out, 3, 1) == full);
  }
  SECTION("whole records, resumed on one thread") {
    cut(line7);
    const auto r = bert::prepare_oracle_resume(oracle<float>(), io::read_oracle_pairs(pairs), pairs, out);
    CHECK(r.records == 7);
    CHECK(r.dropped_bytes == 0);
    CHECK(run_to<float>(pairs, out, 64, 1) == full);
  }
  SECTION("an empty file, and a file cut inside its first record") {
    cut(0);
    CHECK(run_to<float>(pairs, out, 7, 2) == full);
    cut(10);
    CHECK(run_to<float>(pairs, out, 1, 2) == full);
  }
  SECTION("a complete file is left as it is; a torn piece after it is cut off") {
    cut(full.size());
    CHECK(run_to<float>(pairs, out, 4, 2) == full);
    dir.file("out.jsonl", full + "{\"premise\":\"pa");
    CHECK(run_to<float>(pairs, out, 4, 2) == full);
  }
  SECTION("a run stopped after a batch (an error in the callback, as a kill between batches) goes on") {
    const auto p = io::read_oracle_pairs(pairs);
    int batches = 0;
    bert::OracleRunOptions ro;
    ro.batch_size = 4;
    CHECK_THROWS(bert::run_oracle(oracle<float>(), p, out, bert::prepare_oracle_resume(oracle<float>(), p, pairs, out),
                                  ro, [&](const bert::OracleProgress& pr) {
                                    CHECK(pr.done == std::size_t(4 * (batches + 1)));
                                    if (++batches == 3) throw std::runtime_error("killed");
                                  }));
    CHECK(split_lines(read_file(out)).size() == 12);
    CHECK(run_to<float>(pairs, out, 5, 2) == full);
  }
}

TEST_CASE("bad input B34 a cache that does not continue the run is refused and left as it is", "[oracle][bad_input]") {
  const nlohmann::json g = golden();
  TempDir dir;
  const std::string pairs = dir.file("pairs.jsonl", golden_pairs_file(g, 3));
  const std::string full = run_to<float>(pairs, dir.name("full.jsonl"), 5, 2);
  const std::string out = dir.name("out.jsonl");
  std::size_t line7 = 0;
  for (int i = 0; i < 7; ++i) line7 = full.find('\n', line7) + 1;
  // the same first 12 pairs, then other ones
  const std::string other = dir.file("other.jsonl", golden_pairs_file(g, 1) + golden_pairs_file(g, 1));
  const auto po = io::read_oracle_pairs(other);
  std::size_t l12 = 0;
  for (int i = 0; i < 12; ++i) l12 = full.find('\n', l12) + 1;
  const std::size_t l13 = full.find('\n', l12) + 1;
  dir.file("out.jsonl", full.substr(0, l12));
  CHECK(bert::prepare_oracle_resume(oracle<float>(), po, other, out).records == 12);
  dir.file("out.jsonl", full.substr(0, l13));
  CHECK_THROWS_WITH(bert::prepare_oracle_resume(oracle<float>(), po, other, out),
                    Catch::Contains("out.jsonl:13: holds the pair") && Catch::Contains("other.jsonl (line 13)") &&
                        Catch::Contains("written for other pairs"));
  // fewer pairs than records
  const std::string few = dir.file("few.jsonl", golden_pairs_file(g, 1));
  CHECK_THROWS_WITH(bert::prepare_oracle_resume(oracle<float>(), io::read_oracle_pairs(few), few, out),
                    Catch::Contains("more records than the 12 pairs"));
  // a damaged line before the last
  std::string damaged = full.substr(0, l13);
  damaged[line7] = '#';
  dir.file("out.jsonl", damaged);
  CHECK_THROWS_WITH(bert::prepare_oracle_resume(oracle<float>(), io::read_oracle_pairs(pairs), pairs, out),
                    Catch::Contains("out.jsonl:8: invalid JSON"));
  CHECK(read_file(out) == damaged);
  // another precision: the last record computed again differs
  dir.file("out.jsonl", full.substr(0, l13));
  CHECK_THROWS_WITH(bert::prepare_oracle_resume(oracle<double>(), io::read_oracle_pairs(pairs), pairs, out),
                    Catch::Contains("out.jsonl:13: this record, computed again, differs") &&
                        Catch::Contains("another precision"));
  // another calibration
  auto calibrated = bert::NliOracle<float>::load(kNli, kSim);
  calibrated.set_calibrator(eval::IsotonicRegression().fit({0.0, 1.0}, {0.2, 0.3}));
  CHECK_THROWS_WITH(bert::prepare_oracle_resume(calibrated, io::read_oracle_pairs(pairs), pairs, out),
                    Catch::Contains("calibration"));
  CHECK(read_file(out) == full.substr(0, l13));
}

}  // namespace test_oracle
