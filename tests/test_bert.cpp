// Tests of include/dea/bert (Hugging Face BERT): the public golden cases (bert_model, bert_seq_cls,
// sentence_embedding) in double (1e-9) and float (the golden set's tolerances), every hub-style model directory of
// tests/data/bert/hf_fixtures, the exact F16 / BF16 upcast, finite-difference checks of every parameter and of the
// input embeddings (padded rows and a sequence with no real token included), 1 and 2 threads bit for bit, the
// accumulation contract, HF names and a save / load round trip, and every bad input of the loader with its message.
#include <catch2/catch.hpp>

#include "same_results.hpp"
#include "test_files.hpp"
#include <dea/bert/config.hpp>
#include <dea/bert/hf_dir.hpp>
#include <dea/bert/model.hpp>
#include <dea/bert/sentence_embedding.hpp>
#include <dea/bert/seq_cls.hpp>
#include <dea/core/parallel.hpp>
#include <dea/interop/bert_case.hpp>
#include <dea/io/safetensors.hpp>
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_bert {

using namespace dea;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

std::string data(const std::string& rel) { return std::string(DEA_TEST_DATA_DIR) + "/bert/" + rel; }

std::string fresh_dir(const std::string& name) { return dea_tests::fresh_dir("bert", name); }
using dea_tests::read_bytes;
using dea_tests::write_text;

/// A copy of the fixture directory `variant` (config.json and model.safetensors) in a fresh directory.
std::string copy_fixture(const std::string& variant, const std::string& name) {
  const std::string dir = fresh_dir(name);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(data("hf_fixtures/" + variant + "/" + f), dir + "/" + f);
  return dir;
}

struct Worst {
  double rel = 0;
  std::string name;
};

/// Every tensor of the case is compared and within the golden set's tolerance; returns the worst relative error.
Worst check_case(const io::SafeTensors& cs, const io::SafeTensors& got, bool is_float, std::size_t expected_count,
                 bool only_computed = false) {
  const auto cmp = interop::compare_bert_case(cs, got, is_float, only_computed);
  CHECK(cmp.size() == expected_count);
  Worst w;
  for (const auto& c : cmp) {
    INFO(cs.source() << (is_float ? " float: " : " double: ") << c.name << " rel " << c.rel_error << " max|ref| "
                     << c.max_expected);
    CHECK_FALSE(c.missing);
    CHECK(c.ok);
    if (c.rel_error > w.rel) w = {c.rel_error, c.name};
  }
  return w;
}

double dot(const Mat<double>& a, const Mat<double>& b) { return a.cwiseProduct(b).sum(); }

/// A tiny configuration for finite differences: 2 layers, 2 heads of 4, no padding row (so that every lookup,
/// padded positions too, has a gradient), dropout 0.
bert::BertConfig tiny_config(bert::HiddenAct act) {
  bert::BertConfig c;
  c.vocab_size = 13;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 12;
  c.max_position_embeddings = 9;
  c.type_vocab_size = 3;
  c.hidden_act = act;
  c.layer_norm_eps = 1e-12;
  c.pad_token_id = -1;
  c.hidden_dropout_prob = 0;
  c.attention_probs_dropout_prob = 0;
  c.initializer_range = 0.5;
  c.id2label = {"a", "b", "c"};
  return c;
}

/// Moves every parameter off HF's init (biases 0, LayerNorms 1 / 0), so that every gradient is exercised.
void perturb(const ParamList<double>& params, std::uint64_t seed) {
  Rng rng(seed);
  for (Param<double>* p : params)
    for (Index k = 0; k < p->numel(); ++k) p->value[k] += 0.3 * rng.normal();
}

/// B = 3 sequences of T = 5: all real, the last two padded, and one with no real token at all.
bert::BertBatch<double> tiny_batch(const bert::BertConfig& cfg, std::uint64_t seed) {
  const Index B = 3, T = 5;
  bert::BertBatch<double> b;
  Rng rng(seed);
  b.input_ids = Tensor<std::int64_t>({B, T});
  b.token_type_ids = Tensor<std::int64_t>({B, T});
  b.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  for (Index k = 0; k < B * T; ++k) {
    b.input_ids[k] = static_cast<std::int64_t>(rng.next_u64() % static_cast<std::uint64_t>(cfg.vocab_size));
    b.token_type_ids[k] = static_cast<std::int64_t>(rng.next_u64() % static_cast<std::uint64_t>(cfg.type_vocab_size));
  }
  for (Index t = 3; t < T; ++t) b.attention_mask[1 * T + t] = 0;
  for (Index t = 0; t < T; ++t) b.attention_mask[2 * T + t] = 0;
  return b;
}

/// Finite differences of `objective` on every parameter of `params` (and what `extra` registers): relative error
/// <= 1e-6 per tensor. The key biases are checked apart: softmax is invariant to adding q_i . b_k to every score of
/// row i, so their gradient is zero in exact arithmetic and both sides are round-off; there the analytic gradient
/// must be at round-off level (<= 1e-12 of the largest gradient) and the central differences must agree with it to
/// 1e-8 absolute (their own noise is about 1e-9).
struct ParamCheck {
  testing::GradCheckReport main, key_bias;
  bool ok() const { return main.ok && key_bias.ok; }
};
ParamCheck check_parameters(const ParamList<double>& params, const std::function<double()>& objective,
                            const std::function<void()>& analytic,
                            const std::function<void(testing::GradCheck&)>& extra = {}) {
  testing::GradCheck gc;
  gc.add_except(params, {"attention.self.key.bias"});
  if (extra) extra(gc);
  testing::GradCheck::Options abs_opt;
  abs_opt.floor = 1e-2;  // relative error = |a - n| / max(max|g|, 1e-2) <= 1e-6: 1e-8 absolute for ~0 gradients
  testing::GradCheck kb(abs_opt);
  ParamList<double> key_biases;
  for (Param<double>* p : params)
    if (p->name.find("attention.self.key.bias") != std::string::npos) key_biases.push_back(p);
  kb.add(key_biases);
  ParamCheck r;
  r.main = gc.run(objective, analytic);
  r.key_bias = kb.run(objective, analytic);
  analytic();
  double largest = 0, kb_largest = 0;
  for (Param<double>* p : params) largest = std::max(largest, p->grad.cwiseAbs().maxCoeff());
  for (Param<double>* p : key_biases) kb_largest = std::max(kb_largest, p->grad.cwiseAbs().maxCoeff());
  CHECK(key_biases.size() == 2);
  CHECK(kb_largest <= 1e-12 * largest);
  return r;
}

}  // namespace

// ------------------------------------------------------------------------------------------------ golden cases

TEST_CASE("bert_model golden case: every output and gradient, double and float", "[bert][golden]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("bert_model_basic.safetensors"));
  const std::size_t n = 2 + bert::bert_parameter_shapes(interop::bert_case_config(cs)).size();
  REQUIRE(n == 41);
  const Worst wd = check_case(cs, interop::run_bert_case<double>(cs), false, n);
  const Worst wf = check_case(cs, interop::run_bert_case<float>(cs), true, n);
  WARN("bert_model_basic: worst relative error double " << wd.rel << " (" << wd.name << "), float " << wf.rel << " ("
                                                        << wf.name << ")");
  // the objective reaches every parameter; the padding row of the word embeddings gets exactly nothing
  const io::SafeTensors got = interop::run_bert_case<double>(cs);
  for (const std::string& name : got.names())
    if (name.rfind("grad.", 0) == 0) CHECK(got.get<double>(name).data.cwiseAbs().maxCoeff() > 0);
  const Tensor<double> gw = got.get<double>("grad.embeddings.word_embeddings.weight");
  CHECK(gw.matrix(32).row(0).cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("bert_seq_cls golden case: logits, loss and every gradient, double and float", "[bert][golden]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("bert_seq_cls_basic.safetensors"));
  const Worst wd = check_case(cs, interop::run_bert_case<double>(cs), false, 43);
  const Worst wf = check_case(cs, interop::run_bert_case<float>(cs), true, 43);
  WARN("bert_seq_cls_basic: worst relative error double " << wd.rel << " (" << wd.name << "), float " << wf.rel << " ("
                                                          << wf.name << ")");
}

TEST_CASE("sentence_embedding golden case: mean pooling over the mask, L2-normalised", "[bert][golden]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("sentence_embedding_basic.safetensors"));
  const Worst wd = check_case(cs, interop::run_bert_case<double>(cs), false, 2);
  const Worst wf = check_case(cs, interop::run_bert_case<float>(cs), true, 2);
  WARN("sentence_embedding_basic: worst relative error double " << wd.rel << " (" << wd.name << "), float " << wf.rel
                                                                << " (" << wf.name << ")");
  // padding does not change an embedding: the padded sequence alone, without its padding, gives the same vector
  bert::BertModel<double> model(interop::bert_case_config(cs));
  bert::copy_matched(model.parameters(), cs,
                     bert::match_checkpoint(cs, bert::bert_parameter_shapes(model.config()), "", cs.source(), {},
                                            {"in.", "out.", "grad."}));
  const auto full = interop::detail::bert_case_batch<double>(cs);
  const Mat<double> e = bert::sentence_embedding(model, full);
  const Index T = full.seq_len(), b = 2;
  Index real = 0;
  for (Index t = 0; t < T; ++t) real += full.attention_mask[b * T + t];
  REQUIRE(real < T);
  bert::BertBatch<double> one;
  one.input_ids = Tensor<std::int64_t>({1, real});
  one.token_type_ids = Tensor<std::int64_t>({1, real});
  for (Index t = 0; t < real; ++t) {
    one.input_ids[t] = full.input_ids[b * T + t];
    one.token_type_ids[t] = full.token_type_ids[b * T + t];
  }
  const Mat<double> e1 = bert::sentence_embedding(model, one);
  CHECK((e1.row(0) - e.row(b)).cwiseAbs().maxCoeff() < 1e-13);
  CHECK(std::abs(e.row(b).norm() - 1.0) < 1e-14);
}

TEST_CASE("hf_fixtures: every model directory variant loads and reproduces its expectations", "[bert][hf_dir]") {
  for (const char* variant : {"f32", "f16", "bf16", "pretraining_prefixed", "legacy_gamma_beta"}) {
    INFO(variant);
    const std::string dir = data(std::string("hf_fixtures/") + variant);
    const io::SafeTensors cs = io::SafeTensors::load(dir + "/expected.safetensors");
    bert::HfLoadReport rep;
    const Worst wd = check_case(cs, interop::run_hf_model_case<double>(dir, cs, &rep), false, 2, true);
    const Worst wf = check_case(cs, interop::run_hf_model_case<float>(dir, cs), true, 2, true);
    WARN("hf_fixtures/" << variant << ": worst relative error double " << wd.rel << " (" << wd.name << "), float "
                        << wf.rel << " (" << wf.name << "); " << rep.str());
    CHECK(rep.n_parameters == 39);
    const std::string v = variant;
    const std::string dtype = v == "f16" ? "F16" : v == "bf16" ? "BF16" : "F32";
    CHECK(rep.dtypes.size() == 1);
    CHECK(rep.dtypes.count(dtype) == 1);
    CHECK(rep.stripped_prefix == (v == "pretraining_prefixed" || v == "legacy_gamma_beta"));
    CHECK(rep.legacy_names == (v == "legacy_gamma_beta" ? 10 : 0));
    if (v == "pretraining_prefixed") {
      CHECK(rep.ignored.size() == 9);  // position_ids and the eight cls.* tensors
      CHECK(std::find(rep.ignored.begin(), rep.ignored.end(), "bert.embeddings.position_ids") != rep.ignored.end());
      CHECK(std::find(rep.ignored.begin(), rep.ignored.end(), "cls.predictions.decoder.weight") != rep.ignored.end());
    } else {
      CHECK(rep.ignored.empty());
    }
  }
}

TEST_CASE("hf_fixtures: the loaded parameters are the stored values upcast exactly", "[bert][hf_dir]") {
  // f32 upcast to double and back: the same float bits; bf16 values are f32 values with 16 zero low bits
  bert::BertModel<double> md = bert::load_bert_model<double>(data("hf_fixtures/f32"));
  bert::BertModel<float> mf = bert::load_bert_model<float>(data("hf_fixtures/f32"));
  bert::BertModel<double> mb = bert::load_bert_model<double>(data("hf_fixtures/bf16"));
  const io::SafeTensors st = io::SafeTensors::load(data("hf_fixtures/f32/model.safetensors"));
  const auto pd = md.parameters();
  const auto pf = mf.parameters();
  const auto pb = mb.parameters();
  for (std::size_t i = 0; i < pd.size(); ++i) {
    INFO(pd[i]->name);
    const Tensor<float> stored = st.get<float>(pd[i]->name);
    for (Index k = 0; k < pd[i]->numel(); ++k) {
      REQUIRE(pd[i]->value[k] == static_cast<double>(stored[k]));
      REQUIRE(pf[i]->value[k] == stored[k]);
      const float b = static_cast<float>(pb[i]->value[k]);
      std::uint32_t bits;
      std::memcpy(&bits, &b, 4);
      REQUIRE((bits & 0xffffu) == 0u);
      REQUIRE(static_cast<double>(b) == pb[i]->value[k]);
    }
  }
}

// ------------------------------------------------------------------------------------------------ F16 / BF16

TEST_CASE("safetensors F16 and BF16: exact upcast of every bit pattern", "[bert][safetensors]") {
  using io::detail::bfloat16_to_float;
  using io::detail::float_to_bfloat16_exact;
  using io::detail::float_to_half_exact;
  using io::detail::half_to_float;
  // every binary16 pattern against the definition (-1)^s 2^(e-15) (1 + m/1024), subnormals m 2^-24
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const std::uint32_t s = h >> 15, e = (h >> 10) & 31u, m = h & 1023u;
    const float f = half_to_float(static_cast<std::uint16_t>(h));
    if (e == 31) {
      REQUIRE((m == 0 ? std::isinf(f) : std::isnan(f)));
      REQUIRE(std::signbit(f) == (s == 1));
      continue;
    }
    const double ref = (s ? -1.0 : 1.0) * (e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, int(e) - 15));
    REQUIRE(static_cast<double>(f) == ref);
    REQUIRE(std::signbit(f) == (s == 1));
    std::uint16_t back = 0;
    REQUIRE(float_to_half_exact(f, back));
    REQUIRE(back == h);
  }
  // every bfloat16 pattern is the upper half of the binary32 with the same bits
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = bfloat16_to_float(static_cast<std::uint16_t>(h));
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    REQUIRE(bits == h << 16);
    std::uint16_t back = 0;
    REQUIRE(float_to_bfloat16_exact(f, back));
    REQUIRE(back == h);
  }
  // values that are not exact there are refused on write
  std::uint16_t out = 0;
  CHECK_FALSE(float_to_half_exact(0.1f, out));
  CHECK_FALSE(float_to_half_exact(65520.0f, out));            // beyond the largest half, 65504
  CHECK_FALSE(float_to_half_exact(std::ldexp(1.0f, -25), out));  // below the smallest subnormal
  CHECK(float_to_half_exact(std::ldexp(3.0f, -24), out));
  CHECK(out == 3);
  CHECK_FALSE(float_to_bfloat16_exact(1.0f + std::ldexp(1.0f, -10), out));

  // through the container: a file with F16 and BF16 tensors reads exactly as float and double
  io::SafeTensors st("halves");
  const std::vector<double> vals{0.0, -0.0, 1.0, -2.5, 65504.0, std::ldexp(1.0, -24), std::ldexp(1023.0, -24),
                                 std::ldexp(1.0, -14), std::numeric_limits<double>::infinity()};
  st.put("h", Shape{Index(vals.size())}, vals.data(), io::DType::F16);
  const std::vector<double> bvals{0.0, -0.0, 1.0, -2.5, 3.140625, std::ldexp(1.0, -133), 65536.0,
                                  -std::numeric_limits<double>::infinity()};
  st.put("b", Shape{Index(bvals.size())}, bvals.data(), io::DType::BF16);
  CHECK_THROWS_WITH(st.put("bad", Shape{1}, &vals[4], io::DType::BF16), Contains("cannot be stored as BF16"));
  const double tenth = 0.1;
  CHECK_THROWS_WITH(st.put("bad", Shape{1}, &tenth, io::DType::F16), Contains("cannot be stored as F16"));
  const io::SafeTensors back = io::SafeTensors::parse(st.serialize(), "halves");
  REQUIRE(back.dtype("h") == io::DType::F16);
  REQUIRE(back.dtype("b") == io::DType::BF16);
  REQUIRE(back.nbytes("h") == 2 * vals.size());
  const Tensor<double> hd = back.get<double>("h");
  const Tensor<float> hf = back.get<float>("h");
  for (std::size_t k = 0; k < vals.size(); ++k) {
    CHECK(hd[Index(k)] == vals[k]);
    CHECK(static_cast<double>(hf[Index(k)]) == vals[k]);
    CHECK(std::signbit(hd[Index(k)]) == std::signbit(vals[k]));
  }
  const Tensor<double> bd = back.get<double>("b");
  for (Index k = 0; k < bd.numel(); ++k) CHECK(bd[k] == bvals[static_cast<std::size_t>(k)]);
  CHECK_THROWS_WITH(back.get<std::int64_t>("h"), Contains("'h'") && Contains("F16") && Contains("drop the fraction"));
}

TEST_CASE("safetensors F16 with the loader: an F16 directory equals its values upcast", "[bert][hf_dir]") {
  const io::SafeTensors st = io::SafeTensors::load(data("hf_fixtures/f16/model.safetensors"));
  bert::BertModel<double> m = bert::load_bert_model<double>(data("hf_fixtures/f16"));
  for (Param<double>* p : m.parameters()) {
    INFO(p->name);
    REQUIRE(st.dtype(p->name) == io::DType::F16);
    const Tensor<float> f = st.get<float>(p->name);
    for (Index k = 0; k < p->numel(); ++k) {
      REQUIRE(p->value[k] == static_cast<double>(f[k]));
      std::uint16_t h = 0;
      REQUIRE(io::detail::float_to_half_exact(f[k], h));
    }
  }
}

// ------------------------------------------------------------------------------------------------ gradients

TEST_CASE("BertModel: finite differences on every parameter, padded rows and a sequence without real tokens",
          "[bert][gradcheck]") {
  for (const bert::HiddenAct act : {bert::HiddenAct::gelu, bert::HiddenAct::gelu_tanh, bert::HiddenAct::relu}) {
    INFO("hidden_act " << bert::to_string(act));
    const bert::BertConfig cfg = tiny_config(act);
    Rng rng(7);
    bert::BertModel<double> model(cfg, rng);
    perturb(model.parameters(), 11);
    const bert::BertBatch<double> batch = tiny_batch(cfg, 3);
    const Index B = batch.batch(), T = batch.seq_len(), H = cfg.hidden_size;
    const Mat<double> R1 = testing::random_projection(B * T, H, 21), R2 = testing::random_projection(B, H, 22);
    bert::BertModel<double>::Cache c;
    auto objective = [&] {
      const auto out = model.forward(batch, c);
      return dot(out.last_hidden_state, R1) + dot(out.pooler_output, R2);
    };
    auto analytic = [&] {
      model.zero_grad();
      model.forward(batch, c);
      model.backward(&R1, &R2, c);
    };
    const ParamCheck rep = check_parameters(model.parameters(), objective, analytic);
    INFO(rep.main.str() << rep.key_bias.str());
    CHECK(rep.ok());
    CHECK(rep.main.tensors.size() == 37);
    for (const auto& t : rep.main.tensors) CHECK(t.max_abs_grad > 0);
    WARN("BertModel gradcheck (" << bert::to_string(act) << "): worst relative error " << rep.main.worst_rel_error
                                 << "; key biases: worst |analytic - numeric| "
                                 << std::max(rep.key_bias.tensors[0].max_abs_error, rep.key_bias.tensors[1].max_abs_error));
  }
}

TEST_CASE("BertModel: finite differences on the input embeddings (inputs_embeds)", "[bert][gradcheck]") {
  const bert::BertConfig cfg = tiny_config(bert::HiddenAct::gelu);
  Rng rng(8);
  bert::BertModel<double> model(cfg, rng);
  perturb(model.parameters(), 12);
  bert::BertBatch<double> batch = tiny_batch(cfg, 4);
  const Index B = batch.batch(), T = batch.seq_len(), H = cfg.hidden_size;
  // inputs_embeds = word_embeddings[input_ids] gives the same model as the ids do
  bert::BertModel<double>::Cache c;
  const auto by_ids = model.forward(batch, c);
  batch.inputs_embeds = Tensor<double>({B, T, H});
  for (Index n = 0; n < B * T; ++n)
    batch.inputs_embeds.matrix(H).row(n) = model.word_embeddings().weight.mat().row(batch.input_ids[n]);
  batch.input_ids = Tensor<std::int64_t>();
  const auto by_embeds = model.forward(batch, c);
  CHECK(by_embeds.last_hidden_state == by_ids.last_hidden_state);

  const Mat<double> R1 = testing::random_projection(B * T, H, 31), R2 = testing::random_projection(B, H, 32);
  Mat<double> dE;
  auto objective = [&] {
    const auto out = model.forward(batch, c);
    return dot(out.last_hidden_state, R1) + dot(out.pooler_output, R2);
  };
  auto analytic = [&] {
    model.zero_grad();
    model.forward(batch, c);
    const Mat<double> g = model.backward(&R1, &R2, c);
    dE = g;  // into the same buffer: the checker holds its address
  };
  analytic();  // sizes dE
  ParamList<double> params;
  for (Param<double>* p : model.parameters())
    if (p->name.find("word_embeddings") == std::string::npos) params.push_back(p);
  const ParamCheck rep = check_parameters(params, objective, analytic, [&](testing::GradCheck& gc) {
    gc.add("inputs_embeds", batch.inputs_embeds.ptr(), dE.data(), dE.size());
  });
  INFO(rep.main.str() << rep.key_bias.str());
  CHECK(rep.ok());
  CHECK(rep.main.tensors.back().name == "inputs_embeds");
  // the word embeddings are not used on this path
  CHECK(model.word_embeddings().weight.grad.cwiseAbs().maxCoeff() == 0.0);
  WARN("BertModel gradcheck (inputs_embeds): worst relative error " << rep.main.worst_rel_error << " (inputs_embeds "
                                                                   << rep.main.tensors.back().rel_error << ")");
}

TEST_CASE("BertForSequenceClassification: finite differences of the mean cross-entropy", "[bert][gradcheck]") {
  const bert::BertConfig cfg = tiny_config(bert::HiddenAct::gelu);
  Rng rng(9);
  bert::BertForSequenceClassification<double> model(cfg, rng);
  perturb(model.parameters(), 13);
  const bert::BertBatch<double> batch = tiny_batch(cfg, 5);
  Tensor<std::int64_t> labels({3});
  labels[0] = 2;
  labels[1] = -100;  // ignored, as F.cross_entropy
  labels[2] = 0;
  bert::BertForSequenceClassification<double>::Cache c;
  auto objective = [&] { return model.forward(batch, &labels, false, nullptr, c).loss; };
  auto analytic = [&] {
    model.zero_grad();
    model.forward(batch, &labels, false, nullptr, c);
    model.backward(c);
  };
  const ParamCheck rep = check_parameters(model.parameters(), objective, analytic);
  INFO(rep.main.str() << rep.key_bias.str());
  CHECK(rep.ok());
  CHECK(rep.main.tensors.size() == 39);
  WARN("BertForSequenceClassification gradcheck: worst relative error " << rep.main.worst_rel_error);
}

TEST_CASE("BertModel: a sequence without real tokens attends uniformly, padded rows are computed", "[bert][mask]") {
  const bert::BertConfig cfg = tiny_config(bert::HiddenAct::gelu);
  Rng rng(10);
  bert::BertModel<double> model(cfg, rng);
  const bert::BertBatch<double> batch = tiny_batch(cfg, 6);
  bert::BertModel<double>::Cache c;
  const auto out = model.forward(batch, c);
  REQUIRE(out.last_hidden_state.allFinite());
  const Index T = 5, A = 2, TT = T * T, stride = bert::BertSelfAttention<double>::pair_stride(T);
  REQUIRE(stride >= TT);
  const Vec<double>& p = c.layers[0].attn.p;
  for (Index a = 0; a < A; ++a)
    for (Index k = 0; k < TT; ++k) CHECK(p[(2 * A + a) * stride + k] == 1.0 / T);  // sequence 2: no real token
  for (Index a = 0; a < A; ++a)
    for (Index i = 0; i < T; ++i)                   // sequence 1: the padded keys 3, 4 get exactly 0 in every row,
      for (Index j = 3; j < T; ++j) CHECK(p[(1 * A + a) * stride + i * T + j] == 0.0);  // padded query rows too
  CHECK(out.last_hidden_state.row(1 * T + 4).cwiseAbs().maxCoeff() > 0);  // a padded query row is defined
  // padding changes nothing for the real rows: sequence 1 alone, cut to its 3 real tokens
  bert::BertBatch<double> cut;
  cut.input_ids = Tensor<std::int64_t>({1, 3});
  cut.token_type_ids = Tensor<std::int64_t>({1, 3});
  for (Index t = 0; t < 3; ++t) {
    cut.input_ids[t] = batch.input_ids[T + t];
    cut.token_type_ids[t] = batch.token_type_ids[T + t];
  }
  bert::BertModel<double>::Cache c2;
  const auto alone = model.forward(cut, c2);
  CHECK((alone.last_hidden_state - out.last_hidden_state.middleRows(T, 3)).cwiseAbs().maxCoeff() < 1e-13);
}

TEST_CASE("BertModel: the padding row of the word embeddings gets no gradient; gradients accumulate",
          "[bert][contract]") {
  bert::BertConfig cfg = tiny_config(bert::HiddenAct::gelu);
  Rng r1(14), r2(14);
  bert::BertModel<double> plain(cfg, r1);
  cfg.pad_token_id = 0;
  bert::BertModel<double> padded(cfg, r2);
  for (Param<double>* p : padded.parameters()) find_param(plain.parameters(), p->name).value = p->value;
  bert::BertBatch<double> batch = tiny_batch(cfg, 15);
  batch.input_ids[4] = 0;  // id 0 occurs
  const Mat<double> R1 = testing::random_projection(15, 8, 41), R2 = testing::random_projection(3, 8, 42);
  bert::BertModel<double>::Cache c;
  for (auto* m : {&plain, &padded}) {
    m->zero_grad();
    m->forward(batch, c);
    m->backward(&R1, &R2, c);
  }
  const auto gp = padded.word_embeddings().weight.grad_mat(), gq = plain.word_embeddings().weight.grad_mat();
  CHECK(gp.row(0).cwiseAbs().maxCoeff() == 0.0);
  CHECK(gq.row(0).cwiseAbs().maxCoeff() > 0.0);
  CHECK(gp.bottomRows(12) == gq.bottomRows(12));
  // a second backward adds the same gradients again
  std::vector<Vec<double>> once;
  for (Param<double>* p : padded.parameters()) once.push_back(p->grad);
  padded.forward(batch, c);
  padded.backward(&R1, &R2, c);
  const auto params = padded.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i]->name);
    // a sum added twice: equal up to the rounding of the second addition
    CHECK((params[i]->grad - 2.0 * once[i]).cwiseAbs().maxCoeff() <= 1e-14 * std::max(1.0, once[i].cwiseAbs().maxCoeff()));
  }
}

// ------------------------------------------------------------------------------------------------ threads

namespace {
/// Logits, loss, last hidden state, every gradient and the input-embedding gradient of one training step (dropout
/// on) of a BertForSequenceClassification in S at `threads` threads, as bytes.
template <class S>
std::vector<char> step_bits(int threads) {
  bert::BertConfig cfg;
  cfg.vocab_size = 50;
  cfg.hidden_size = 32;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 4;
  cfg.intermediate_size = 48;
  cfg.max_position_embeddings = 64;
  cfg.hidden_dropout_prob = 0.1;
  cfg.attention_probs_dropout_prob = 0.1;
  cfg.id2label = {"x", "y", "z"};
  Rng init(1);
  bert::BertForSequenceClassification<S> model(cfg, init);
  const Index B = 6, T = 40;
  bert::BertBatch<S> batch;
  batch.input_ids = Tensor<std::int64_t>({B, T});
  batch.token_type_ids = Tensor<std::int64_t>({B, T}, 0);
  batch.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  Rng d(2);
  for (Index k = 0; k < B * T; ++k) batch.input_ids[k] = static_cast<std::int64_t>(d.next_u64() % 50);
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t) {
      if (t >= T - 7 * b) batch.attention_mask[b * T + t] = 0;  // b = 0 unpadded ... b = 5 with 5 real tokens
      if (t >= T / 2) batch.token_type_ids[b * T + t] = 1;
    }
  for (Index t = 0; t < T; ++t) batch.attention_mask[5 * T + t] = 0;  // and one sequence without a real token
  Tensor<std::int64_t> labels({B});
  for (Index b = 0; b < B; ++b) labels[b] = b % 3;
  set_num_threads(threads);
  Rng rng(3);
  typename bert::BertForSequenceClassification<S>::Cache c;
  model.zero_grad();
  const auto out = model.forward(batch, &labels, true, &rng, c);
  const Mat<S> dE = model.backward(c);
  set_num_threads(1);
  std::vector<char> v;
  auto add = [&](const S* p, Index n) {
    const char* b = reinterpret_cast<const char*>(p);
    v.insert(v.end(), b, b + n * Index(sizeof(S)));
  };
  add(out.logits.data(), out.logits.size());
  add(&out.loss, 1);
  add(out.bert.last_hidden_state.data(), out.bert.last_hidden_state.size());
  add(dE.data(), dE.size());
  for (Param<S>* p : model.parameters()) add(p->grad.data(), p->numel());
  return v;
}
}  // namespace

TEST_CASE("BertForSequenceClassification: 1 and 2 threads give identical bits (training, dropout, padding)",
          "[bert][threads]") {
  const auto d1 = step_bits<double>(1), d2 = step_bits<double>(2), d1b = step_bits<double>(1);
  CHECK(d1 == d2);
  CHECK(d1 == d1b);
  const auto f1 = step_bits<float>(1), f2 = step_bits<float>(2);
  CHECK(f1 == f2);
}

TEST_CASE("BertModel: dropout is drawn from the Rng; evaluation mode is deterministic", "[bert][dropout]") {
  bert::BertConfig cfg = tiny_config(bert::HiddenAct::gelu);
  cfg.hidden_dropout_prob = 0.2;
  cfg.attention_probs_dropout_prob = 0.2;
  Rng init(3);
  bert::BertModel<double> model(cfg, init);
  const auto batch = tiny_batch(cfg, 7);
  bert::BertModel<double>::Cache c;
  Rng a(5), b(5), e(6);
  const auto ta = model.forward(batch, true, &a, c), tb = model.forward(batch, true, &b, c),
             te = model.forward(batch, true, &e, c);
  CHECK(ta.last_hidden_state == tb.last_hidden_state);
  CHECK(ta.last_hidden_state != te.last_hidden_state);
  const auto ev1 = model.forward(batch, c), ev2 = model.forward(batch, c);
  CHECK(ev1.last_hidden_state == ev2.last_hidden_state);
  CHECK(ev1.last_hidden_state != ta.last_hidden_state);
  CHECK_THROWS_WITH(model.forward(batch, true, nullptr, c), Contains("needs an Rng"));
}

// ------------------------------------------------------------------------------------------------ names, round trip

TEST_CASE("BertModel: Hugging Face names and shapes; a save / load round trip through a model directory",
          "[bert][hf_dir]") {
  bert::BertConfig cfg = tiny_config(bert::HiddenAct::gelu_tanh);
  cfg.pad_token_id = 0;
  Rng rng(17);
  bert::BertForSequenceClassification<double> model(cfg, rng);
  perturb(model.parameters(), 18);
  const auto shapes = bert::seq_cls_parameter_shapes(cfg);
  const auto params = model.parameters();
  REQUIRE(params.size() == shapes.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i]->name == shapes[i].first);
    CHECK(params[i]->shape == shapes[i].second);
  }
  CHECK(params[5]->name == "bert.encoder.layer.0.attention.self.query.weight");
  CHECK(params.back()->name == "classifier.bias");

  // the configuration's JSON parses back to itself
  const bert::BertConfig back = bert::parse_bert_config(bert::bert_config_json(cfg));
  CHECK(back.hidden_act == cfg.hidden_act);
  CHECK(back.id2label == cfg.id2label);
  CHECK(back.pad_token_id == 0);
  CHECK(bert::bert_config_json(back) == bert::bert_config_json(cfg));

  const std::string dir = fresh_dir("roundtrip");
  write_text(dir + "/config.json", bert::bert_config_json(cfg).dump(2));
  io::save_parameters(model.parameters(), dir + "/model.safetensors", {{"format", "pt"}}, io::DType::F64);
  bert::HfLoadReport rep;
  bert::BertForSequenceClassification<double> loaded = bert::load_bert_for_sequence_classification<double>(dir, &rep);
  CHECK(rep.n_parameters == 41);
  const auto lp = loaded.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) CHECK(lp[i]->value == params[i]->value);
  const auto batch = tiny_batch(cfg, 19);
  bert::BertForSequenceClassification<double>::Cache c1, c2;
  CHECK(model.forward(batch, nullptr, false, nullptr, c1).logits == loaded.forward(batch, nullptr, false, nullptr, c2).logits);
  // the base model of the same directory: "bert." stripped, the classifier ignored
  bert::BertModel<double> base = bert::load_bert_model<double>(dir, &rep);
  CHECK(rep.stripped_prefix);
  CHECK(rep.ignored == std::vector<std::string>{"classifier.bias", "classifier.weight"});
  CHECK(base.parameters()[0]->value == params[0]->value);
  // a task model from a base checkpoint: bare names taken, a missing head is an error unless asked for fresh
  const std::string bdir = fresh_dir("base_only");
  write_text(bdir + "/config.json", bert::bert_config_json(cfg).dump());
  io::save_parameters(base.parameters(), bdir + "/model.safetensors");
  CHECK_THROWS_WITH(bert::load_bert_for_sequence_classification<double>(bdir),
                    Contains("2 required tensor(s) missing: 'classifier.weight' [3, 8], 'classifier.bias' [3]"));
  bert::HfLoadOptions opt;
  opt.init_missing_head = true;
  bert::BertForSequenceClassification<double> fine = bert::load_bert_for_sequence_classification<double>(bdir, &rep, opt);
  CHECK(rep.fresh.size() == 2);
  CHECK(fine.classifier().weight.value.cwiseAbs().maxCoeff() > 0);
  CHECK(fine.parameters()[0]->value == params[0]->value);
  fs::remove_all(dir);
  fs::remove_all(bdir);
}

TEST_CASE("BertModel: float forward at a realistic size agrees with double", "[bert][float]") {
  bert::BertConfig cfg;
  cfg.vocab_size = 1000;
  cfg.hidden_size = 128;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 4;
  cfg.intermediate_size = 512;
  cfg.max_position_embeddings = 128;
  Rng rng(20);
  bert::BertModel<double> md(cfg, rng);
  bert::BertModel<float> mf(cfg);
  const auto pd = md.parameters();
  const auto pf = mf.parameters();
  for (std::size_t i = 0; i < pd.size(); ++i) pf[i]->value = pd[i]->value.cast<float>();
  const Index B = 4, T = 64;
  bert::BertBatch<double> bd;
  bert::BertBatch<float> bf;
  bd.input_ids = Tensor<std::int64_t>({B, T});
  Rng d(21);
  for (Index k = 0; k < B * T; ++k) bd.input_ids[k] = static_cast<std::int64_t>(d.next_u64() % 1000);
  bd.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  for (Index t = 40; t < T; ++t) bd.attention_mask[T + t] = 0;
  bf.input_ids = bd.input_ids;
  bf.attention_mask = bd.attention_mask;
  bert::BertModel<double>::Cache cd;
  bert::BertModel<float>::Cache cf;
  const auto od = md.forward(bd, cd);
  const auto of = mf.forward(bf, cf);
  const double rel = (of.last_hidden_state.cast<double>() - od.last_hidden_state).cwiseAbs().maxCoeff() /
                     od.last_hidden_state.cwiseAbs().maxCoeff();
  CHECK(rel < 1e-4);
}

// ------------------------------------------------------------------------------------------------ bad input

TEST_CASE("bad input B23 model directories: every problem is an Error naming the file, the tensor and the sizes",
          "[bert][bad_input]") {
  // a directory without config.json, a missing directory, a file instead of a directory
  {
    const std::string dir = fresh_dir("no_config");
    fs::copy_file(data("hf_fixtures/f32/model.safetensors"), dir + "/model.safetensors");
    CHECK_THROWS_WITH(bert::load_bert_model<float>(dir), Contains(dir) && Contains("has no config.json"));
    CHECK_THROWS_WITH(bert::load_bert_model<float>(dir + "/nope"), Contains("does not exist"));
    CHECK_THROWS_WITH(bert::load_bert_model<float>(dir + "/model.safetensors"), Contains("is not a directory"));
    fs::remove_all(dir);
  }
  // no model.safetensors; a PyTorch pickle only
  {
    const std::string dir = fresh_dir("no_weights");
    fs::copy_file(data("hf_fixtures/f32/config.json"), dir + "/config.json");
    CHECK_THROWS_WITH(bert::load_bert_model<float>(dir), Contains("has no model.safetensors"));
    write_text(dir + "/pytorch_model.bin", "PK");
    CHECK_THROWS_WITH(bert::load_bert_model<float>(dir), Contains("pytorch_model.bin") && Contains("safetensors only"));
    fs::remove_all(dir);
  }
}

TEST_CASE("bad input B24 config.json: sizes, hidden_act, position embeddings, JSON types", "[bert][bad_input]") {
  const std::string good = read_bytes(data("hf_fixtures/f32/config.json"));
  nlohmann::json base = nlohmann::json::parse(good);
  auto expect = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& msg) {
    const std::string dir = copy_fixture("f32", "cfg");
    nlohmann::json j = base;
    edit(j);
    write_text(dir + "/config.json", j.dump());
    INFO(j.dump());
    CHECK_THROWS_WITH(bert::load_bert_model<double>(dir), Contains(dir + "/config.json") && Contains(msg));
    fs::remove_all(dir);
  };
  expect([](nlohmann::json& j) { j["hidden_size"] = 30; },
         "hidden_size (30) must be divisible by num_attention_heads (4)");
  expect([](nlohmann::json& j) { j["hidden_act"] = "swish"; },
         "hidden_act: expected \"gelu\", \"gelu_new\", \"gelu_pytorch_tanh\" or \"relu\", got \"swish\"");
  expect([](nlohmann::json& j) { j["position_embedding_type"] = "relative_key"; },
         "position_embedding_type: expected \"absolute\"");
  expect([](nlohmann::json& j) { j["num_hidden_layers"] = 2.5; }, "num_hidden_layers: expected an integer, got 2.5");
  expect([](nlohmann::json& j) { j["vocab_size"] = -3; }, "vocab_size: expected an integer in [1, 16777216], got -3");
  expect([](nlohmann::json& j) { j["layer_norm_eps"] = "small"; }, "layer_norm_eps: expected a number, got string");
  expect([](nlohmann::json& j) { j["model_type"] = "roberta"; }, "model_type: expected \"bert\"");
  expect([](nlohmann::json& j) { j["id2label"] = {{"0", "a"}, {"2", "b"}}; }, "id2label: key \"2\"");
  expect([](nlohmann::json& j) { j["hidden_dropout_prob"] = 1.0; }, "hidden_dropout_prob: expected a probability");
  expect([](nlohmann::json& j) { j["is_decoder"] = true; }, "is_decoder: expected false");
  // not JSON at all
  const std::string dir = copy_fixture("f32", "cfg_text");
  write_text(dir + "/config.json", "{\"hidden_size\": 32,");
  CHECK_THROWS_WITH(bert::load_bert_model<double>(dir), Contains("config.json") && Contains("invalid JSON"));
  fs::remove_all(dir);
}

TEST_CASE("bad input B25 model.safetensors: wrong shape, unknown or integer dtype, truncated, missing or doubled "
          "tensors, non-finite values",
          "[bert][bad_input]") {
  const io::SafeTensors good = io::SafeTensors::load(data("hf_fixtures/f32/model.safetensors"));
  auto expect = [&](const std::function<void(io::SafeTensors&)>& edit, const std::vector<std::string>& msgs) {
    dea_tests::require_weights_refused(copy_fixture("f32", "weights"), good, edit,
                                       [](const std::string& dir) { bert::load_bert_model<float>(dir); }, msgs);
  };
  const std::string q = "encoder.layer.0.attention.self.query.weight";
  expect([&](io::SafeTensors& st) { st.put(q, Tensor<float>({32, 31}, 0.5f)); },
         {"tensor '" + q + "'", "expected shape [32, 32], found [32, 31]"});
  expect([&](io::SafeTensors& st) { st.put("pooler.dense.bias", Tensor<std::int64_t>({32}, 1)); },
         {"tensor 'pooler.dense.bias'", "expected a floating-point dtype (F32, F16, BF16 or F64), found I64"});
  expect([&](io::SafeTensors& st) { st.erase("encoder.layer.1.output.LayerNorm.bias"); },
         {"1 required tensor(s) missing: 'encoder.layer.1.output.LayerNorm.bias' [32]"});
  expect([&](io::SafeTensors& st) { st.put("bert." + q, st.get<float>(q)); },
         {"tensors 'bert." + q + "' and '" + q + "' both stand for parameter '" + q + "'"});
  expect([&](io::SafeTensors& st) {
    Tensor<float> t = st.get<float>("embeddings.LayerNorm.weight");
    t[3] = std::numeric_limits<float>::quiet_NaN();
    st.put("embeddings.LayerNorm.weight", t);
  }, {"tensor 'embeddings.LayerNorm.weight'", "non-finite value", "flat index 3"});

  // an unknown dtype: the header names one this library does not read
  {
    const std::string dir = copy_fixture("f32", "dtype");
    const std::string bytes = read_bytes(dir + "/model.safetensors");
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
    h["pooler.dense.bias"]["dtype"] = "F8_E4M3";
    const std::string hs = h.dump();
    const std::uint64_t hn = hs.size();
    std::string out(reinterpret_cast<const char*>(&hn), 8);
    out += hs + bytes.substr(8 + n);
    write_text(dir + "/model.safetensors", out);
    CHECK_THROWS_WITH(bert::load_bert_model<float>(dir), Contains(dir + "/model.safetensors") &&
                                                             Contains("tensor 'pooler.dense.bias'") &&
                                                             Contains("unsupported dtype \"F8_E4M3\""));
    fs::remove_all(dir);
  }
  // a truncated file
  {
    const std::string dir = copy_fixture("f32", "truncated");
    const std::string bytes = read_bytes(dir + "/model.safetensors");
    write_text(dir + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
    CHECK_THROWS_WITH(bert::load_bert_model<float>(dir), Contains(dir + "/model.safetensors") && Contains("truncated"));
    write_text(dir + "/model.safetensors", bytes.substr(0, 5));
    CHECK_THROWS_WITH(bert::load_bert_model<float>(dir), Contains(dir + "/model.safetensors") && Contains("truncated"));
    fs::remove_all(dir);
  }
}

TEST_CASE("bad input B26 the directory is validated before the model is allocated", "[bert][bad_input]") {
  // a config whose sizes would need petabytes: the mismatch with the stored tensors is found first
  const std::string dir = copy_fixture("f32", "huge");
  nlohmann::json j = nlohmann::json::parse(read_bytes(dir + "/config.json"));
  j["vocab_size"] = 16777216;
  j["hidden_size"] = 65536;
  j["num_attention_heads"] = 1;
  j["intermediate_size"] = 1048576;
  j["num_hidden_layers"] = 1024;
  write_text(dir + "/config.json", j.dump());
  CHECK_THROWS_WITH(bert::load_bert_model<double>(dir),
                    Contains("tensor 'embeddings.word_embeddings.weight': expected shape [16777216, 65536], found "
                             "[120, 32]"));
  fs::remove_all(dir);
}

TEST_CASE("bad input: BertModel::forward refuses bad batches by name", "[bert][bad_input]") {
  const bert::BertConfig cfg = tiny_config(bert::HiddenAct::gelu);
  Rng rng(1);
  bert::BertModel<double> model(cfg, rng);
  bert::BertModel<double>::Cache c;
  bert::BertBatch<double> b = tiny_batch(cfg, 2);
  b.input_ids[7] = 13;
  CHECK_THROWS_WITH(model.forward(b, c), Contains("input_ids[7]: expected an id in [0, 13), got 13"));
  b = tiny_batch(cfg, 2);
  b.token_type_ids[2] = 3;
  CHECK_THROWS_WITH(model.forward(b, c), Contains("token_type_ids[2]: expected an id in [0, 3), got 3"));
  b = tiny_batch(cfg, 2);
  b.attention_mask = Tensor<std::uint8_t>({3, 4}, 1);
  CHECK_THROWS_WITH(model.forward(b, c), Contains("attention_mask: expected shape [3, 5], got [3, 4]"));
  bert::BertBatch<double> lng;
  lng.input_ids = Tensor<std::int64_t>({1, 10}, 1);
  CHECK_THROWS_WITH(model.forward(lng, c), Contains("sequence length 10 exceeds max_position_embeddings 9"));
  CHECK_THROWS_WITH(model.forward(bert::BertBatch<double>(), c), Contains("needs input_ids"));
  bert::BertModel<double>::Cache empty;
  CHECK_THROWS_WITH(model.backward(nullptr, nullptr, empty), Contains("holds no forward pass"));
}

// ------------------------------------------------------------------------------------------------ compile-time sizes

namespace {

/// Key mask [B, T]: sequence 0 ends in padding, sequence 1 has no real key (HF: uniform attention), the rest real.
Tensor<std::uint8_t> self_attention_mask(Index B, Index T) {
  Tensor<std::uint8_t> m({B, T}, 1);
  for (Index t = T - 2; t < T; ++t) m[t] = 0;
  for (Index t = 0; t < T; ++t) m[T + t] = 0;
  return m;
}

/// Forward and backward of a BertSelfAttention type on one batch (dropout on): the context, dx and every gradient.
template <class SA>
std::vector<Mat<float>> self_attention_run(Index B, Index T, Index hidden, Index heads) {
  Rng rng(81);
  typename SA::Options opt;
  opt.dropout = 0.1f;
  SA att(hidden, heads, rng, opt);
  Rng brng(82);
  for (auto* p : att.parameters())
    if (p->name.find("bias") != std::string::npos) init::normal(p->value, brng, 0.0, 0.5);
  Mat<float> x(B * T, hidden);
  Rng xr(83);
  init::normal(x, xr, 0.0, 1.0);
  Rng drop(84);
  AttnInputs<float> in(B, T);
  in.set_key_mask(self_attention_mask(B, T)).set_training(true, &drop);
  typename SA::Cache c;
  std::vector<Mat<float>> out{att.forward(x, in, c)};
  out.push_back(att.backward(testing::random_projection(B * T, hidden, 85).cast<float>(), c));
  for (auto* p : att.parameters()) out.push_back(p->grad);
  return out;
}

}  // namespace

TEST_CASE("BertSelfAttention: fixed Heads and DHead give the dynamic instance's bits", "[bert][fixed]") {
  // the per-head products take the same steps with a compile-time head width: every result is bit-identical
  const auto same = dea_tests::require_same_results;
  SECTION("hidden 64, 4 heads of 16") {
    same(self_attention_run<bert::BertSelfAttention<float, 4, 16>>(3, 21, 64, 4),
         self_attention_run<bert::BertSelfAttention<float>>(3, 21, 64, 4));
  }
  SECTION("hidden 128, 8 heads of 16") {
    same(self_attention_run<bert::BertSelfAttention<float, 8, 16>>(3, 12, 128, 8),
         self_attention_run<bert::BertSelfAttention<float>>(3, 12, 128, 8));
  }
  SECTION("64-wide heads") {
    same(self_attention_run<bert::BertSelfAttention<float, Dynamic, 64>>(3, 17, 128, 2),
         self_attention_run<bert::BertSelfAttention<float>>(3, 17, 128, 2));
  }
}

TEST_CASE("BertSelfAttention with fixed sizes: finite differences on every parameter and the input",
          "[bert][gradcheck]") {
  // the padded keys, a sequence without real keys (uniform rows, no gradient to Q and K) and dropout included
  const Index B = 3, T = 4, hidden = 6, heads = 2, N = B * T;
  using SA = bert::BertSelfAttention<double, 2, 3>;
  Rng rng(91);
  SA::Options opt;
  opt.dropout = 0.2;
  opt.initializer_range = 0.5;
  SA att(hidden, heads, rng, opt);
  perturb(att.parameters(), 92);
  Mat<double> x = testing::random_projection(N, hidden, 93);
  const Mat<double> R = testing::random_projection(N, hidden, 94);
  Rng drop(95);
  AttnInputs<double> in(B, T);
  in.set_key_mask(self_attention_mask(B, T)).set_training(true, &drop);
  SA::Cache c;
  Mat<double> dx = Mat<double>::Zero(N, hidden);
  auto objective = [&] {
    drop.reseed(95);  // the same dropout mask at every evaluation
    return dot(att.forward(x, in, c), R);
  };
  auto analytic = [&] {
    att.zero_grad();
    drop.reseed(95);
    att.forward(x, in, c);
    const Mat<double> g = att.backward(R, c);
    dx = g;  // a copy into the buffer the checker holds (a move would swap it away)
  };
  testing::GradCheck gc;
  gc.add_except(att.parameters(), {"key.bias"});
  gc.add("x", x.data(), dx.data(), x.size());
  const testing::GradCheckReport rep = gc.run(objective, analytic);
  INFO(rep.str());
  CHECK(rep.ok);
  CHECK(rep.tensors.size() == 6);  // query, key and value weights, query and value biases, x
  for (const auto& t : rep.tensors) CHECK(t.max_abs_grad > 0);
  // key.bias adds q_i . b_k to every score of row i, a shift the softmax ignores: its gradient is 0 up to round-off,
  // checked against the differences in absolute terms
  testing::GradCheck::Options abs_opt;
  abs_opt.floor = 1e-2;
  testing::GradCheck kb(abs_opt);
  ParamList<double> key_bias;
  for (Param<double>* p : att.parameters())
    if (p->name == "key.bias") key_bias.push_back(p);
  REQUIRE(key_bias.size() == 1);
  kb.add(key_bias);
  const testing::GradCheckReport kb_rep = kb.run(objective, analytic);
  INFO(kb_rep.str());
  CHECK(kb_rep.ok);
}

TEST_CASE("BertSelfAttention refuses sizes that differ from its compile-time Heads and DHead, by name",
          "[bert][bad_input]") {
  Rng rng(96);
  CHECK_THROWS_WITH((bert::BertSelfAttention<double, 4>(8, 2, rng)),
                    Contains("BertSelfAttention") && Contains("n_heads") && Contains("4"));
  CHECK_THROWS_WITH((bert::BertSelfAttention<double, 2, 8>(8, 2, rng)),
                    Contains("BertSelfAttention") && Contains("DHead") && Contains("8 / 2 = 4"));
  CHECK_NOTHROW(bert::BertSelfAttention<double, 2, 4>(8, 2, rng));
}

}  // namespace test_bert
