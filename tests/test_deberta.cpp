// Tests of include/dea/deberta (Hugging Face DeBERTa-v2/v3, forward only): the public golden cases (deberta_model,
// deberta_seq_cls) in double (1e-9) and float (1e-4), the log-bucket table exactly, the hub-style model directories
// of tests/data/deberta/deberta_fixtures (F32, BF16, and F16 made from them), the model without relative attention
// against the BERT golden case, 1 and 2 threads bit for bit, a sequence's logits alone and in a batch, the
// configuration's defaults and refusals, and every bad input of the loader with its message.
#include <catch2/catch.hpp>

#include "test_files.hpp"

#include <dea/core/parallel.hpp>
#include <dea/deberta/config.hpp>
#include <dea/deberta/hf_dir.hpp>
#include <dea/deberta/model.hpp>
#include <dea/deberta/relative.hpp>
#include <dea/deberta/seq_cls.hpp>
#include <dea/interop/deberta_case.hpp>
#include <dea/io/safetensors.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

// (the file in a namespace of its own: a test program may compile several test files as one translation unit)
namespace test_deberta {

using namespace dea;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

std::string data(const std::string& rel) { return std::string(DEA_TEST_DATA_DIR) + "/deberta/" + rel; }

std::string fresh_dir(const std::string& name) { return dea_tests::fresh_dir("deberta", name); }
using dea_tests::read_bytes;
using dea_tests::write_text;

/// A copy of fixture `variant` (config.json and model.safetensors) in a fresh directory.
std::string copy_fixture(const std::string& variant, const std::string& name) {
  const std::string dir = fresh_dir(variant + "_" + name);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(data("deberta_fixtures/" + variant + "/" + f), dir + "/" + f);
  return dir;
}

/// Runs a golden case in S and requires every expected tensor computed and within the tolerance.
template <class S>
void require_case(const std::string& file, std::size_t min_tensors) {
  const io::SafeTensors cs = io::SafeTensors::load(data(file));
  const io::SafeTensors got = interop::run_deberta_case<S>(cs);
  const auto cmp = interop::compare_deberta_case(cs, got, std::is_same<S, float>::value);
  REQUIRE(cmp.size() >= min_tensors);
  double worst = 0;
  for (const auto& c : cmp) {
    INFO(file << " " << c.name << " rel " << c.rel_error << " max|ref| " << c.max_expected);
    CHECK(!c.missing);
    CHECK(c.ok);
    if (!c.integer) {
      CHECK(c.max_expected > 0);  // every stored output is non-trivial
      worst = std::max(worst, c.rel_error);
    }
  }
  WARN(file << (std::is_same<S, float>::value ? " float" : " double") << ": worst relative error " << worst);
}

/// A case's model (seq_cls) in S, loaded from the case's tensors.
template <class S>
deberta::DebertaV2ForSequenceClassification<S> case_seq_cls(const io::SafeTensors& cs) {
  const deberta::DebertaConfig cfg = interop::deberta_case_config(cs);
  deberta::DebertaV2ForSequenceClassification<S> model(cfg);
  const auto m = bert::match_checkpoint(cs, deberta::deberta_seq_cls_parameter_shapes(cfg), "", cs.source(), {},
                                        {"in.", "out."});
  bert::copy_matched(model.parameters(), cs, m);
  return model;
}

}  // namespace

// ------------------------------------------------------------------------------------------------ golden

TEST_CASE("deberta_model golden cases: every hidden state and the relative positions, double and float",
          "[deberta][golden]") {
  for (const char* f : {"deberta_model_v3like.safetensors", "deberta_model_clamp_noshare.safetensors",
                        "deberta_model_v2like_absolute.safetensors"}) {
    require_case<double>(f, 4);
    require_case<float>(f, 4);
  }
}

TEST_CASE("deberta_seq_cls golden cases: logits, hidden states, relative positions, double and float",
          "[deberta][golden]") {
  for (const char* f : {"deberta_seq_cls_ent0.safetensors", "deberta_seq_cls_ent1.safetensors"}) {
    require_case<double>(f, 5);
    require_case<float>(f, 5);
  }
  // the entailment index the metadata states is the one the configuration's labels give
  for (const char* f : {"deberta_seq_cls_ent0.safetensors", "deberta_seq_cls_ent1.safetensors"}) {
    const io::SafeTensors cs = io::SafeTensors::load(data(f));
    CHECK(interop::deberta_case_config(cs).entailment_index() ==
          std::stoi(cs.metadata().at("entailment_index")));
  }
}

TEST_CASE("relative positions: the float32 log buckets reproduce the stored table at 256 / 512 exactly",
          "[deberta][buckets]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("bucket_table_256_512.safetensors"));
  const io::SafeTensors got = interop::run_bucket_table_case(cs);
  const auto cmp = interop::compare_deberta_case(cs, got, false);
  REQUIRE(cmp.size() == 3);
  for (const auto& c : cmp) {
    INFO(c.name);
    CHECK(c.integer);
    CHECK(c.ok);
  }
  // the table's properties: odd, exact up to 128, +-255 at the ends of the range, growing past it
  CHECK(deberta::relative_bucket(128, 256, 512) == 128);
  CHECK(deberta::relative_bucket(-129, 256, 512) == -deberta::relative_bucket(129, 256, 512));
  CHECK(deberta::relative_bucket(511, 256, 512) == 255);
  CHECK(deberta::relative_bucket(-511, 256, 512) == -255);
  CHECK(deberta::relative_bucket(1023, 256, 512) > 255);
  CHECK(deberta::relative_bucket(7, -1, 512) == 7);  // no buckets: the distance itself
}

TEST_CASE("deberta_fixtures: the F32 and BF16 hub directories reproduce their expectations", "[deberta][hf_dir]") {
  for (const char* variant : {"f32", "bf16"}) {
    const std::string dir = data(std::string("deberta_fixtures/") + variant);
    const io::SafeTensors cs = io::SafeTensors::load(dir + "/expected.safetensors");
    for (bool is_float : {false, true}) {
      deberta::LoadReport rep;
      const io::SafeTensors got = is_float ? interop::run_deberta_hf_case<float>(dir, cs, &rep)
                                           : interop::run_deberta_hf_case<double>(dir, cs, &rep);
      INFO(variant << (is_float ? " float " : " double ") << rep.str());
      CHECK(rep.n_parameters == 42);
      CHECK(rep.dtypes.count(std::string(variant) == "f32" ? "F32" : "BF16") == 1);
      const auto cmp = interop::compare_deberta_case(cs, got, is_float);
      REQUIRE(cmp.size() == 2);  // out.logits, out.last_hidden_state
      for (const auto& c : cmp) {
        INFO(c.name << " rel " << c.rel_error);
        CHECK(c.ok);
      }
    }
  }
}

TEST_CASE("deberta hf_dir: a base model loads from a task model's file, stripping 'deberta.'; extras are ignored",
          "[deberta][hf_dir]") {
  const std::string dir = copy_fixture("f32", "base");
  io::SafeTensors st = io::SafeTensors::load(dir + "/model.safetensors");
  st.put("deberta.embeddings.position_ids", Tensor<std::int64_t>({1, 128}, 0), io::DType::I64);
  st.put("deberta.embeddings.position_embeddings.weight", Tensor<float>({128, 32}, 0.25f));  // position_biased_input off
  st.save(dir + "/model.safetensors");
  deberta::LoadReport rep;
  const auto base = deberta::load_deberta_model<double>(dir, &rep);
  INFO(rep.str());
  CHECK(rep.stripped_prefix);
  CHECK(rep.n_parameters == 38);
  CHECK(rep.ignored.size() == 6);  // position_ids, position table, pooler (2), classifier (2)
  // the base model's last hidden state is the classifier's
  const auto cls = deberta::load_deberta_for_sequence_classification<double>(dir);
  const io::SafeTensors cs = io::SafeTensors::load(data("deberta_fixtures/f32/expected.safetensors"));
  const deberta::DebertaBatch batch = interop::detail::deberta_case_batch(cs);
  CHECK(base.forward(batch).last_hidden_state == cls.forward(batch).deberta.last_hidden_state);
  fs::remove_all(dir);
}

TEST_CASE("deberta hf_dir: an F16 directory loads its values exactly", "[deberta][hf_dir]") {
  // the BF16 fixture's values written as F16 (8 significant bits fit in F16's 11; a value below F16's range is 0)
  const std::string dir = copy_fixture("bf16", "f16");
  const io::SafeTensors src = io::SafeTensors::load(dir + "/model.safetensors");
  io::SafeTensors f16;
  for (const std::string& name : src.names()) {
    Tensor<float> t = src.get<float>(name);
    for (Index k = 0; k < t.numel(); ++k) {
      std::uint16_t h = 0;
      if (!io::detail::float_to_half_exact(t[k], h)) t[k] = 0;
    }
    f16.put(name, t, io::DType::F16);
  }
  f16.save(dir + "/model.safetensors");
  deberta::LoadReport rep;
  auto model = deberta::load_deberta_for_sequence_classification<double>(dir, &rep);
  CHECK(rep.dtypes.count("F16") == 1);
  for (Param<double>* p : model.parameters()) {
    INFO(p->name);
    REQUIRE(f16.dtype(p->name) == io::DType::F16);
    const Tensor<float> f = f16.get<float>(p->name);
    for (Index k = 0; k < p->numel(); ++k) REQUIRE(p->value[k] == static_cast<double>(f[k]));
  }
  // the same weights as the BF16 fixture but for the few values below F16's range: its logits, nearly
  const io::SafeTensors cs = io::SafeTensors::load(data("deberta_fixtures/bf16/expected.safetensors"));
  const Mat<double> logits = model.forward(interop::detail::deberta_case_batch(cs)).logits;
  const Tensor<double> want = cs.get<double>("out.logits");
  for (Index k = 0; k < want.numel(); ++k) CHECK(std::abs(logits.data()[k] - want[k]) < 1e-3);
  fs::remove_all(dir);
}

// ------------------------------------------------------------------------------------------------ invariances

template <class S>
void check_thread_invariance() {
  const io::SafeTensors cs = io::SafeTensors::load(data("deberta_seq_cls_ent0.safetensors"));
  const auto model = case_seq_cls<S>(cs);
  const deberta::DebertaBatch batch = interop::detail::deberta_case_batch(cs);
  set_num_threads(1);
  const auto one = model.forward(batch, true);
  set_num_threads(2);
  const auto two = model.forward(batch, true);
  set_num_threads(1);
  REQUIRE(one.logits.cwiseAbs().maxCoeff() > 0);
  CHECK(one.logits == two.logits);
  REQUIRE(one.deberta.hidden_states.size() == two.deberta.hidden_states.size());
  for (std::size_t l = 0; l < one.deberta.hidden_states.size(); ++l)
    CHECK(one.deberta.hidden_states[l] == two.deberta.hidden_states[l]);
}

TEST_CASE("DebertaV2ForSequenceClassification: 1 and 2 threads give identical bits, float and double",
          "[deberta][threads]") {
  check_thread_invariance<float>();
  check_thread_invariance<double>();
}

template <class S>
void check_batch_invariance() {
  const io::SafeTensors cs = io::SafeTensors::load(data("deberta_seq_cls_ent1.safetensors"));
  const auto model = case_seq_cls<S>(cs);
  const Tensor<std::int64_t> ids = cs.get<std::int64_t>("in.input_ids"), types = cs.get<std::int64_t>("in.token_type_ids"),
                             mask = cs.get<std::int64_t>("in.attention_mask");
  const Index B = ids.size(0), T = ids.size(1);
  std::vector<std::vector<std::int64_t>> vi(B), vt(B), vm(B);
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t) {
      vi[b].push_back(ids[b * T + t]);
      vt[b].push_back(types[b * T + t]);
      vm[b].push_back(mask[b * T + t]);
    }
  const Mat<S> all = deberta::sequence_logits(model, vi, vt, vm);
  REQUIRE(all.rows() == B);
  REQUIRE(all.cols() == 3);
  // the batch's logits are the case's expected ones
  const Tensor<double> want = cs.get<double>("out.logits");
  for (Index k = 0; k < all.size(); ++k)
    CHECK(std::abs(double(all.data()[k]) - want[k]) <= (std::is_same<S, float>::value ? 1e-4 : 1e-9) * 10);
  for (Index b = 0; b < B; ++b) {
    const Mat<S> alone = deberta::sequence_logits(model, {vi[b]}, {vt[b]}, {vm[b]});
    INFO("sequence " << b);
    CHECK(alone.row(0) == all.row(b));
  }
  // reversed order: the same rows, bit for bit
  std::vector<std::vector<std::int64_t>> ri(vi.rbegin(), vi.rend()), rt(vt.rbegin(), vt.rend()), rm(vm.rbegin(), vm.rend());
  const Mat<S> rev = deberta::sequence_logits(model, ri, rt, rm);
  for (Index b = 0; b < B; ++b) CHECK(rev.row(B - 1 - b) == all.row(b));
}

TEST_CASE("sequence_logits: a sequence's logits are the same alone or in a batch, float and double",
          "[deberta][batch]") {
  check_batch_invariance<float>();
  check_batch_invariance<double>();
}

TEST_CASE("sequence_logits: widths that are not whole multiples of 64 bytes run sequence by sequence, same bits",
          "[deberta][batch]") {
  // H 24, I 40 (96 and 160 bytes in float), E 20 with its projection, separate position projections, 6 buckets over
  // 12 (so the table rows clamp for T = 20), absolute positions and token types: random weights
  deberta::DebertaConfig cfg;
  cfg.vocab_size = 50;
  cfg.hidden_size = 24;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 3;
  cfg.intermediate_size = 40;
  cfg.max_position_embeddings = 32;
  cfg.type_vocab_size = 2;
  cfg.embedding_size = 20;
  cfg.relative_attention = true;
  cfg.max_relative_positions = 12;
  cfg.position_buckets = 6;
  cfg.c2p = cfg.p2c = true;
  cfg.norm_rel_ebd = true;
  cfg.hidden_act = deberta::Activation::gelu_tanh;
  cfg.pooler_hidden_act = deberta::Activation::tanh;
  cfg.id2label = {"a", "b"};
  deberta::DebertaV2ForSequenceClassification<float> model(cfg);
  REQUIRE(!deberta::rows_batch_invariant<float>(cfg));
  Rng rng(7);
  for (Param<float>* p : model.parameters())
    for (Index k = 0; k < p->numel(); ++k) p->value[k] += static_cast<float>(rng.normal() * 0.3);
  const Index B = 5, T = 20;
  std::vector<std::vector<std::int64_t>> ids(B), types(B), mask(B);
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t) {
      ids[b].push_back(static_cast<std::int64_t>(rng.next_u64() % 50));
      types[b].push_back(t < T / 2 ? 0 : 1);
      mask[b].push_back(t < T - 3 * b ? 1 : 0);
    }
  set_num_threads(2);
  const Mat<float> all = deberta::sequence_logits(model, ids, types, mask);
  set_num_threads(1);
  REQUIRE(all.cwiseAbs().maxCoeff() > 0);
  for (Index b = 0; b < B; ++b) {
    INFO("sequence " << b);
    CHECK(deberta::sequence_logits(model, {ids[b]}, {types[b]}, {mask[b]}).row(0) == all.row(b));
  }
  // the same numbers as the double model, to float round-off
  deberta::DebertaV2ForSequenceClassification<double> md(cfg);
  const auto pf = model.parameters();
  const auto pd = md.parameters();
  for (std::size_t i = 0; i < pf.size(); ++i) pd[i]->value = pf[i]->value.cast<double>();
  const Mat<double> ref = deberta::sequence_logits(md, ids, types, mask);
  CHECK((all.cast<double>() - ref).cwiseAbs().maxCoeff() <= 1e-4 * ref.cwiseAbs().maxCoeff());
}

TEST_CASE("sequence_logits refuses sequences of different lengths and bad masks by name", "[deberta][bad_input]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("deberta_seq_cls_ent1.safetensors"));
  const auto model = case_seq_cls<double>(cs);
  CHECK_THROWS_WITH(deberta::sequence_logits(model, {{1, 5, 2}, {1, 2}}), Contains("sequence 1 has 2 tokens"));
  CHECK_THROWS_WITH(deberta::sequence_logits(model, {{1, 5, 2}}, {}, {{1, 2, 1}}),
                    Contains("attention_mask: expected 0 or 1, got 2"));
  CHECK_THROWS_WITH(deberta::sequence_logits(model, {{1, 500, 2}}), Contains("input_ids: id 500") &&
                                                                       Contains("outside [0, 128)"));
}

TEST_CASE("DebertaV2Model: padded positions are zero after the embeddings; padded rows never reach real rows",
          "[deberta][mask]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("deberta_model_v3like.safetensors"));
  const deberta::DebertaConfig cfg = interop::deberta_case_config(cs);
  deberta::DebertaV2Model<double> model(cfg);
  const auto m = interop::detail::match_case(cs, deberta::deberta_parameter_shapes(cfg), "");
  bert::copy_matched(model.parameters(), cs, m);
  deberta::DebertaBatch batch = interop::detail::deberta_case_batch(cs);
  const auto a = model.forward(batch, true);
  const Index T = batch.seq_len(), B = batch.batch();
  // change every padded token's id: the real rows do not move
  Index padded = 0;
  for (Index n = 0; n < B * T; ++n)
    if (!batch.attention_mask[n]) {
      CHECK(a.hidden_states[0].row(n).isZero(0));
      batch.input_ids[n] = 7;
      ++padded;
    }
  REQUIRE(padded > 0);
  const auto b = model.forward(batch);
  for (Index n = 0; n < B * T; ++n)
    if (batch.attention_mask[n]) CHECK(a.last_hidden_state.row(n) == b.last_hidden_state.row(n));
}

TEST_CASE("DebertaV2Model without relative attention is BERT's encoder: the BERT golden case's real rows",
          "[deberta][golden]") {
  // relative_attention off, no position terms (scale sqrt(d) in float32), absolute positions and two token types:
  // BERT's layers, but for the padded rows (zero here after the embeddings, attending to nothing). The BERT golden
  // case's weights under DeBERTa's names reproduce its last hidden state on every real row, to the scale's float32
  // rounding (sqrt(8) in float32 is 1.7e-8 relative off)
  const io::SafeTensors cs = io::SafeTensors::load(std::string(DEA_TEST_DATA_DIR) + "/bert/bert_model_basic.safetensors");
  const nlohmann::json bc = nlohmann::json::parse(cs.metadata().at("config"));
  deberta::DebertaConfig cfg;
  cfg.vocab_size = bc["vocab_size"];
  cfg.hidden_size = bc["hidden_size"];
  cfg.num_hidden_layers = bc["num_hidden_layers"];
  cfg.num_attention_heads = bc["num_attention_heads"];
  cfg.intermediate_size = bc["intermediate_size"];
  cfg.max_position_embeddings = bc["max_position_embeddings"];
  cfg.type_vocab_size = bc["type_vocab_size"];
  cfg.layer_norm_eps = bc["layer_norm_eps"];
  REQUIRE(!cfg.relative_attention);
  REQUIRE(cfg.position_biased_input);
  deberta::DebertaV2Model<double> model(cfg);
  std::size_t loaded = 0;
  for (Param<double>* p : model.parameters()) {
    std::string name = p->name;
    for (const char* proj : {"query", "key", "value"}) {
      const std::string from = std::string("attention.self.") + proj + "_proj.";
      const auto at = name.find(from);
      if (at != std::string::npos) name.replace(at, from.size(), std::string("attention.self.") + proj + ".");
    }
    INFO(name);
    REQUIRE(cs.has(name));
    cs.get_into<double>(name, p->value.data(), p->numel());
    ++loaded;
  }
  CHECK(loaded == 37);  // BERT's parameters but the pooler
  const deberta::DebertaBatch batch = interop::detail::deberta_case_batch(cs);
  const Mat<double> h = model.forward(batch).last_hidden_state;
  const Tensor<double> want = cs.get<double>("out.last_hidden_state");
  const Index H = cfg.hidden_size;
  double worst = 0, scale = 0;
  Index real = 0;
  for (Index n = 0; n < h.rows(); ++n) {
    if (!batch.attention_mask[n]) continue;
    ++real;
    for (Index c = 0; c < H; ++c) {
      worst = std::max(worst, std::abs(h(n, c) - want[n * H + c]));
      scale = std::max(scale, std::abs(want[n * H + c]));
    }
  }
  REQUIRE(real > 0);
  REQUIRE(real < h.rows());  // the case has padded rows
  CHECK(worst / scale < 1e-6);
  CHECK(worst / scale > 0);  // the float32 scale is not BERT's double one
}

// ------------------------------------------------------------------------------------------------ configuration

TEST_CASE("DebertaConfig: the defaults of the reference's config class, pos_att_type as a string or a list",
          "[deberta][config]") {
  const deberta::DebertaConfig d = deberta::parse_deberta_config(nlohmann::json::object());
  CHECK(d.vocab_size == 128100);
  CHECK(d.hidden_size == 1536);
  CHECK(d.num_hidden_layers == 24);
  CHECK(d.intermediate_size == 6144);
  CHECK(d.type_vocab_size == 0);
  CHECK(d.layer_norm_eps == 1e-7);
  CHECK(!d.relative_attention);
  CHECK(d.position_biased_input);
  CHECK(!d.c2p);
  CHECK(!d.p2c);
  CHECK(d.relative_range() == 512);
  CHECK(d.att_span() == 512);
  CHECK(d.scale_factor() == 1);
  const auto s = deberta::parse_deberta_config({{"pos_att_type", " P2C | c2p "}, {"position_buckets", 256}});
  CHECK(s.c2p);
  CHECK(s.p2c);
  CHECK(s.att_span() == 256);
  CHECK(s.scale_factor() == 3);
  const auto l = deberta::parse_deberta_config({{"pos_att_type", {"c2p"}}});
  CHECK(l.c2p);
  CHECK(!l.p2c);
  // the fixture's config.json round-trips through deberta_config_json
  const auto f = deberta::load_deberta_config(data("deberta_fixtures/f32/config.json"));
  CHECK(f.entailment_index() == 0);
  const nlohmann::json j = deberta::deberta_config_json(f);
  CHECK(deberta::deberta_config_json(deberta::parse_deberta_config(j)) == j);
}

TEST_CASE("DebertaV2Model: the float32 attention scale (sqrt(d f) rounded in float32)", "[deberta][scale]") {
  // d = 8, f = 3: float32 gives 4.898979663848877, double 4.898979485566356; the golden cases (d = 8, both terms) pass
  // at 1e-9 only with the float32 value, so they check it; here the value itself
  const double s = static_cast<double>(std::sqrt(static_cast<float>(8) * static_cast<float>(3)));
  CHECK(s == 4.898979663848877);
  CHECK(std::abs(s - std::sqrt(24.0)) > 1e-7);
}

// ------------------------------------------------------------------------------------------------ bad input

TEST_CASE("bad input B53 DeBERTa model.safetensors: wrong shape, missing tensor, NaN weight, truncated file",
          "[deberta][bad_input]") {
  const io::SafeTensors good = io::SafeTensors::load(data("deberta_fixtures/f32/model.safetensors"));
  auto expect = [&](const std::function<void(io::SafeTensors&)>& edit, const std::vector<std::string>& msgs) {
    dea_tests::require_weights_refused(copy_fixture("f32", "weights"), good, edit,
                                       [](const std::string& dir) { deberta::load_deberta_for_sequence_classification<float>(dir); }, msgs);
  };
  const std::string q = "deberta.encoder.layer.0.attention.self.query_proj.weight";
  expect([&](io::SafeTensors& st) { st.put(q, Tensor<float>({32, 31}, 0.5f)); },
         {"tensor '" + q + "'", "expected shape [32, 32], found [32, 31]"});
  expect([&](io::SafeTensors& st) { st.erase("classifier.bias"); },
         {"1 required tensor(s) missing: 'classifier.bias' [3]"});
  expect([&](io::SafeTensors& st) { st.erase("deberta.encoder.LayerNorm.weight"); },
         {"missing: 'deberta.encoder.LayerNorm.weight' [32]"});
  expect([&](io::SafeTensors& st) {
    Tensor<float> t = st.get<float>("pooler.dense.weight");
    t[5] = std::numeric_limits<float>::quiet_NaN();
    st.put("pooler.dense.weight", t);
  }, {"tensor 'pooler.dense.weight'", "non-finite value", "flat index 5"});
  expect([&](io::SafeTensors& st) { st.put("deberta.encoder.rel_embeddings.weight", Tensor<float>({64, 32}, 0.1f)); },
         {"'deberta.encoder.rel_embeddings.weight' has 64 rows", "2 S = 128", "position_buckets = 64",
          "do not fit the relative embeddings"});
  // a truncated file
  const std::string dir = copy_fixture("f32", "truncated");
  const std::string bytes = read_bytes(dir + "/model.safetensors");
  write_text(dir + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
  CHECK_THROWS_WITH(deberta::load_deberta_model<float>(dir), Contains(dir + "/model.safetensors") &&
                                                                 Contains("truncated"));
  // no model.safetensors, no config.json, not a directory
  fs::remove(dir + "/model.safetensors");
  CHECK_THROWS_WITH(deberta::load_deberta_model<float>(dir), Contains("has no model.safetensors"));
  fs::remove(dir + "/config.json");
  CHECK_THROWS_WITH(deberta::load_deberta_model<float>(dir), Contains(dir) && Contains("has no config.json"));
  CHECK_THROWS_WITH(deberta::load_deberta_model<float>(dir + "/nope"), Contains("does not exist"));
  fs::remove_all(dir);
}

TEST_CASE("bad input B50-B52 DeBERTa config.json in a model directory: Error naming the file and the field",
          "[deberta][bad_input]") {
  const nlohmann::json base = nlohmann::json::parse(read_bytes(data("deberta_fixtures/f32/config.json")));
  auto expect = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& msg) {
    const std::string dir = copy_fixture("f32", "cfg");
    nlohmann::json j = base;
    edit(j);
    write_text(dir + "/config.json", j.dump());
    INFO(j.dump());
    CHECK_THROWS_WITH(deberta::load_deberta_for_sequence_classification<double>(dir),
                      Contains(dir + "/config.json") && Contains(msg));
    fs::remove_all(dir);
  };
  expect([](nlohmann::json& j) { j["conv_kernel_size"] = 3; }, "conv_kernel_size: 3 asks for the convolution block");
  expect([](nlohmann::json& j) { j["talking_head"] = true; }, "talking_head: talking-heads attention is not supported");
  expect([](nlohmann::json& j) { j["pos_att_type"] = "p2c|c2p|p2p"; },
         "pos_att_type: the position term \"p2p\" is not supported");
  expect([](nlohmann::json& j) { j["position_buckets"] = 254; },
         "position_buckets (254) does not fit the relative range: half of it (127) equals max_relative_positions - 1");
  expect([](nlohmann::json& j) { j["position_buckets"] = 1; }, "position_buckets (1) must be at least 2");
  expect([](nlohmann::json& j) { j["hidden_size"] = 30; }, "hidden_size (30) must be divisible by num_attention_heads (4)");
  expect([](nlohmann::json& j) { j["attention_head_size"] = 16; }, "attention_head_size: 16 is not supported");
  expect([](nlohmann::json& j) { j["pooler_hidden_size"] = 16; }, "pooler_hidden_size (16) must equal hidden_size (32)");
  expect([](nlohmann::json& j) { j["model_type"] = "bert"; }, "model_type: expected \"deberta-v2\"");
  expect([](nlohmann::json& j) { j["hidden_act"] = "swish"; }, "hidden_act: expected \"gelu\"");
  expect([](nlohmann::json& j) { j["norm_rel_ebd"] = "layer_norm|batch_norm"; }, "norm_rel_ebd: \"batch_norm\"");
  expect([](nlohmann::json& j) { j["relative_attention"] = "yes"; }, "relative_attention: expected true or false");
  expect([](nlohmann::json& j) { j["num_hidden_layers"] = 2.5; }, "num_hidden_layers: expected an integer, got 2.5");
  expect([](nlohmann::json& j) { j["id2label"] = {{"0", "a"}, {"2", "b"}}; }, "id2label: key \"2\"");
}

TEST_CASE("bad input: DebertaV2Model::forward refuses bad batches by name", "[deberta][bad_input]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("deberta_model_v2like_absolute.safetensors"));
  const deberta::DebertaConfig cfg = interop::deberta_case_config(cs);
  const deberta::DebertaV2Model<double> model(cfg);
  deberta::DebertaBatch b;
  b.input_ids = Tensor<std::int64_t>({1, 65}, 4);  // position_biased_input, P = 64
  CHECK_THROWS_WITH(model.forward(b), Contains("sequence length 65 exceeds max_position_embeddings 64"));
  b.input_ids = Tensor<std::int64_t>({1, 4}, 4);
  b.token_type_ids = Tensor<std::int64_t>({1, 4}, 2);  // type_vocab_size 2
  CHECK_THROWS_WITH(model.forward(b), Contains("token_type_ids: id 2 at [0, 0] is outside [0, 2)"));
  b.token_type_ids = Tensor<std::int64_t>({1, 3}, 0);
  CHECK_THROWS_WITH(model.forward(b), Contains("token_type_ids: expected shape [1, 4]"));
}

// ------------------------------------------------------------------------------------------------ packed weights

/// A small DeBERTa cross-encoder with random weights whose products cover the packed product's corners: E 48 with
/// its projection, H 80 (a last panel of 16 columns), I 528 (two blocks of k in the output dense, a partial panel),
/// separate position projections (or shared keys), 3 labels.
template <class S>
deberta::DebertaV2ForSequenceClassification<S> packing_model(bool share_att_key, std::uint64_t seed) {
  deberta::DebertaConfig cfg;
  cfg.vocab_size = 60;
  cfg.hidden_size = 80;
  cfg.embedding_size = 48;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 5;
  cfg.intermediate_size = 528;
  cfg.max_position_embeddings = 64;
  cfg.relative_attention = true;
  cfg.max_relative_positions = 32;
  cfg.position_buckets = 8;
  cfg.c2p = cfg.p2c = true;
  cfg.share_att_key = share_att_key;
  cfg.norm_rel_ebd = true;
  cfg.position_biased_input = false;
  cfg.type_vocab_size = 0;
  cfg.id2label = {"entailment", "neutral", "contradiction"};
  deberta::DebertaV2ForSequenceClassification<S> m(cfg);
  Rng rng(seed);
  for (Param<S>* p : m.parameters())
    for (Index k = 0; k < p->numel(); ++k) p->value[k] += static_cast<S>(rng.normal() * 0.1);
  return m;
}

deberta::DebertaBatch packing_batch(Index B, Index T, std::uint64_t seed) {
  Rng rng(seed);
  deberta::DebertaBatch b;
  b.input_ids = Tensor<std::int64_t>({B, T});
  b.attention_mask = Tensor<std::uint8_t>({B, T});
  for (Index n = 0; n < B * T; ++n) {
    b.input_ids.ptr()[n] = static_cast<std::int64_t>(rng.next_u64() % 60);
    b.attention_mask.ptr()[n] = (n % T) < T - (n / T) ? 1 : 0;  // sequence b has b padded positions
  }
  return b;
}

/// The logits and every hidden state of both models, bit for bit.
template <class S>
void require_same_forward(const deberta::DebertaV2ForSequenceClassification<S>& a,
                          const deberta::DebertaV2ForSequenceClassification<S>& b, const deberta::DebertaBatch& batch) {
  const auto x = a.forward(batch, true), y = b.forward(batch, true);
  REQUIRE(x.logits.cwiseAbs().maxCoeff() > 0);
  CHECK(x.logits == y.logits);
  REQUIRE(x.deberta.hidden_states.size() == y.deberta.hidden_states.size());
  for (std::size_t l = 0; l < x.deberta.hidden_states.size(); ++l) {
    INFO("hidden state " << l);
    CHECK(x.deberta.hidden_states[l] == y.deberta.hidden_states[l]);
  }
}

template <class S>
void check_packed_forward(bool share_att_key, bool release) {
  INFO((share_att_key ? "shared keys" : "separate position projections") << (release ? ", float values freed" : ""));
  const auto ref = packing_model<S>(share_att_key, 11);
  auto packed = ref;  // the same weights
  packed.pack_weights(release);
  REQUIRE(packed.weights_packed());
  CHECK(packed.float_weights_released() == release);
  // the projection weights once each (the widths here round up to whole panels of the kernel, at most)
  CHECK(packed.packed_bytes() >= sizeof(S) * std::size_t(2 * (4 * 80 * 80 + 2 * 80 * 528) + 48 * 80 + 80 * 80 + 3 * 80));
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    INFO(threads << " threads");
    require_same_forward(ref, packed, packing_batch(4, 24, 3));  // 96 rows: the packed products
    require_same_forward(ref, packed, packing_batch(1, 10, 4));  // 10 rows: Eigen's products on the float weights
    const ScopedBatchInvariantProducts invariant;                 // every product packed, even one row (the pooler)
    require_same_forward(ref, packed, packing_batch(3, 9, 5));
  }
  set_num_threads(1);
  {  // bf16 products read the float weights (or the unpacked copies): the same bits as the float model's
    const ScopedPrecision bf16(Precision::bf16);
    if (std::is_same<S, float>::value) require_same_forward(ref, packed, packing_batch(4, 24, 6));
  }
}

TEST_CASE("pack_weights: the packed-once forward gives the bits of the forward that packs at every product",
          "[deberta][packed]") {
  for (bool share : {true, false})
    for (bool release : {false, true}) {
      check_packed_forward<float>(share, release);
      check_packed_forward<double>(share, release);
    }
}

TEST_CASE("linear_packed: the bits of ops::linear_forward; a packed weight unpacks to its values", "[deberta][packed]") {
  Rng rng(5);
  for (Index out : {3, 33, 80}) {
    const Index in = 530, rows = 70;
    Param<float> w;
    w.name = "w";
    w.shape = {out, in};
    w.value = Vec<float>(out * in);
    for (Index k = 0; k < w.value.size(); ++k) w.value[k] = static_cast<float>(rng.normal());
    Vec<float> b(out);
    for (Index k = 0; k < out; ++k) b[k] = static_cast<float>(rng.normal());
    Mat<float> x(rows, in);
    for (Index k = 0; k < x.size(); ++k) x.data()[k] = static_cast<float>(rng.normal());
    const deberta::PackedWeight<float> pw(w.value.data(), out, in);
    if (pw.empty()) continue;  // no packed product on this compiler
    CHECK(pw.unpacked() == w.mat());
    Mat<float> want, got;
    ops::linear_forward<float>(x, w.mat(), b.data(), want);
    deberta::linear_packed<float>(x, w, pw, b.data(), got);
    CHECK(got == want);
    Param<float> freed = w;
    freed.value = Vec<float>();
    deberta::linear_packed<float>(x.topRows(5), freed, pw, nullptr, got);  // 5 rows: Eigen on the unpacked weight
    ops::linear_forward<float>(x.topRows(5), w.mat(), nullptr, want);
    CHECK(got == want);
  }
}

TEST_CASE("pack_weights: parameters() drops the packed copies (a changed weight is used), or is refused once the "
          "float values are freed",
          "[deberta][packed]") {
  auto ref = packing_model<float>(false, 12);
  auto packed = ref;
  packed.pack_weights();
  const deberta::DebertaBatch batch = packing_batch(4, 24, 7);
  const Mat<float> before = packed.forward(batch).logits;
  auto change = [](deberta::DebertaV2ForSequenceClassification<float>& m) {
    for (Param<float>* p : m.parameters())
      if (p->name == "deberta.encoder.layer.1.intermediate.dense.weight" ||
          p->name == "deberta.encoder.layer.0.attention.self.pos_key_proj.weight" || p->name == "pooler.dense.weight")
        p->value *= 1.5f;
  };
  change(packed);
  CHECK(!packed.weights_packed());
  change(ref);
  CHECK(packed.forward(batch).logits != before);  // the changed weights are used
  require_same_forward(ref, packed, batch);
  packed.pack_weights();  // packed anew from the changed weights
  CHECK(packed.weights_packed());
  require_same_forward(ref, packed, batch);

  auto freed = ref;
  const std::size_t bytes = freed.weight_bytes();
  freed.pack_weights(true);
  CHECK(freed.float_weights_released());
  // the packed copies replace the float values (each [out, in] weight packed with out rounded up to whole panels)
  const std::size_t released = sizeof(float) * std::size_t(80 * 48 + 2 * (6 * 80 * 80 + 2 * 80 * 528) + 80 * 80 + 3 * 80);
  CHECK(freed.weight_bytes() == bytes - released + freed.packed_bytes());
  CHECK(freed.packed_bytes() >= released);
  CHECK_THROWS_WITH(freed.parameters(), Contains("packed and their float values freed"));
  freed.pack_weights(true);  // nothing to do
  require_same_forward(ref, freed, batch);
}

}  // namespace test_deberta
