// The bad-input table, one test per row (the README's "Bad input" table names the rows B1 ... B18): for each
// kind of bad input, what the library does (a dea::Error whose message names the problem, or a defined result).
// A row's test feeds that kind of input through the public API a user calls and checks the outcome, never by
// catching "anything": the exact exception type and the words of the message are checked.
#include <dea/attention/dot_product.hpp>
#include <dea/attention/dual_expert.hpp>
#include <dea/attention/inputs.hpp>
#include <dea/attention/laplacian.hpp>
#include <dea/attention/token_routed.hpp>
#include <dea/data/loaders.hpp>
#include <dea/text/simple_tokenizer.hpp>
#include <dea/io/jsonl.hpp>
#include <dea/train.hpp>
#include <dea/train/lm.hpp>
#include <dea/io/safetensors.hpp>
#include <dea/nn/transformer.hpp>
#include <dea/ops/cross_entropy.hpp>
#if defined(DEA_HAVE_SENTENCEPIECE)
#include <dea/text/spm_tokenizer.hpp>
#endif

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_bad_input {

using namespace dea;
namespace fs = std::filesystem;
using Catch::Contains;
using Catch::EndsWith;
using Catch::StartsWith;
// The model and attention rows run in float, the type the training pipeline uses (so this file instantiates the
// model once: it is built under the sanitizers in CI, where compile time counts).
using S = float;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("dea_test_bad_input_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string write(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  REQUIRE(out.good());
  return path;
}

/// A safetensors image with header text `header` and `data_bytes` zero bytes of data.
std::vector<std::uint8_t> raw_safetensors(const std::string& header, std::size_t data_bytes) {
  std::vector<std::uint8_t> out;
  out.reserve(8 + header.size() + data_bytes);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
  for (const char c : header) out.push_back(static_cast<std::uint8_t>(c));
  out.resize(out.size() + data_bytes, 0);
  return out;
}

nn::ModelConfig tiny_model_config() {
  nn::ModelConfig m;
  m.vocab_size = 12;
  m.d_model = 8;
  m.n_heads = 2;
  m.n_layers = 1;
  m.d_ff = 16;
  m.max_len = 6;
  m.dropout = 0;
  m.n_classes = 2;
  m.pad_id = 0;
  return m;
}

nn::ModelBatch<S> tiny_batch(Index B = 2, Index T = 5) {
  nn::ModelBatch<S> b;
  b.input_ids = Tensor<std::int64_t>({B, T});
  for (Index k = 0; k < b.input_ids.numel(); ++k) b.input_ids[k] = 1 + k % 11;
  b.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  b.labels = Tensor<std::int64_t>({B}, 1);
  return b;
}

train::TrainConfig tiny_train(const std::string& dir) {
  train::TrainConfig c;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 1;
  c.d_ff = 32;
  c.batch_size = 8;
  c.max_len = 32;
  c.n_per_source = 20;
  c.steps = 2;
  c.gamma_steps = 2;
  c.log_every = 1;
  c.eval_every = 2;
  c.eval_batches = 1;
  c.seed = 5;
  c.threads = 1;
  c.out_dir = dir;
  return c;
}

train::encoder::TrainOptions<float> quiet() {
  train::encoder::TrainOptions<float> o;
  o.verbose = false;
  return o;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Tensors and shapes
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("bad input B1 wrong shapes: a dea::Error naming the argument, expected and actual shape", "[bad_input]") {
  Rng rng(1);
  DualExpertAttention<S> layer(8, 2, rng);
  DualExpertAttention<S>::Cache c;
  const AttnInputs<S> in(2, 5);
  const Mat<S> x = Mat<S>::Zero(10, 8);
  CHECK_THROWS_WITH(layer.forward(Mat<S>::Zero(10, 6), in, c), Contains("8 columns") && Contains("got 6"));
  CHECK_THROWS_WITH(layer.forward(x, AttnInputs<S>(3, 5), c), Contains("expected 15 rows") && Contains("got 10"));
  Tensor<std::uint8_t> km({2, 4}, 1);
  AttnInputs<S> masked(2, 5);
  CHECK_THROWS_WITH(masked.set_key_mask(km), Contains("key_mask") && Contains("[2, 5]") && Contains("[2, 4]"));

  nn::TransformerModel<S> model(tiny_model_config(), rng);
  nn::TransformerModel<S>::Cache mc;
  nn::ModelBatch<S> b = tiny_batch();
  b.attention_mask = Tensor<std::uint8_t>({2, 4}, 1);
  CHECK_THROWS_WITH(model.forward(b, 0.0, false, nullptr, mc), Contains("attention_mask") && Contains("[2, 4]"));
  b = tiny_batch();
  b.labels = Tensor<std::int64_t>({3}, 0);
  CHECK_THROWS_WITH(model.forward(b, 0.0, false, nullptr, mc), Contains("labels") && Contains("[3]"));
  b = tiny_batch();
  b.input_ids = Tensor<std::int64_t>({10}, 1);
  CHECK_THROWS_WITH(model.forward(b, 0.0, false, nullptr, mc), Contains("input_ids") && Contains("[B, T]"));
  // a stored tensor read into a buffer of the wrong size
  io::SafeTensors st;
  st.put("w", Tensor<double>({2, 3}, 1.0));
  std::vector<double> small(5);
  CHECK_THROWS_WITH(st.get_into("w", small.data(), 5), Contains("'w'") && Contains("6 elements"));
}

TEST_CASE("bad input B2 bad sizes: zero, negative or inconsistent sizes are a dea::Error", "[bad_input]") {
  Rng rng(1);
  CHECK_THROWS_WITH(DualExpertAttention<S>(30, 4, rng), Contains("d_model (30)") && Contains("n_heads (4)"));
  CHECK_THROWS_WITH(DualExpertAttention<S>(0, 1, rng), Contains("d_model must be positive"));
  nn::ModelConfig m = tiny_model_config();
  m.n_heads = 3;
  CHECK_THROWS_WITH(nn::TransformerModel<S>(m, rng), Contains("multiple of n_heads"));
  // a sequence longer than the model's positional table, and an empty batch
  nn::TransformerModel<S> model(tiny_model_config(), rng);
  nn::TransformerModel<S>::Cache mc;
  CHECK_THROWS_WITH(model.forward(tiny_batch(2, 7), 0.0, false, nullptr, mc), Contains("exceeds max_len 6"));
  nn::ModelBatch<S> empty = tiny_batch();
  empty.input_ids = Tensor<std::int64_t>({0, 5});
  empty.attention_mask = Tensor<std::uint8_t>();
  empty.labels = Tensor<std::int64_t>();
  CHECK_THROWS_WITH(model.forward(empty, 0.0, false, nullptr, mc), Contains("non-empty"));
  // the training configuration: flags and config.json share the ranges
  train::TrainConfig c = tiny_train("unused");
  c.n_heads = 0;
  CHECK_THROWS_WITH(train::validate(c), Contains("--n_heads") && Contains("outside"));
  c = tiny_train("unused");
  c.d_model = 10;
  c.n_heads = 4;
  CHECK_THROWS_WITH(train::validate(c), Contains("--d_model (10)") && Contains("--n_heads (4)"));
  c = tiny_train("unused");
  c.d_model = Index(1) << 40;  // would need terabytes
  CHECK_THROWS_WITH(train::validate(c), Contains("--d_model") && Contains("outside"));
  CHECK_THROWS_WITH(train::parse_args({"--steps", "0"}), Contains("--steps"));
  // (found by fuzz_config) supervised layers named for a model without layers
  c = tiny_train("unused");
  c.n_layers = 0;
  c.supervise_layers = std::vector<Index>{0};
  CHECK_THROWS_WITH(train::validate(c), Contains("--supervise_layers") && Contains("without layers"));
}

// ---------------------------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("bad input B3 NaN or Inf in inputs: attention inputs and oracle are checked, losses propagate",
          "[bad_input]") {
  Rng rng(2);
  DualExpertAttention<S> layer(8, 2, rng);
  DualExpertAttention<S>::Cache c;
  AttnInputs<S> in(2, 5);
  Mat<S> x = Mat<S>::Zero(10, 8);
  x(7, 3) = kNaN;
  CHECK_THROWS_WITH(layer.forward(x, in, c), Contains("x: non-finite") && Contains("row 7"));
  x(7, 3) = kInf;
  CHECK_THROWS_WITH(layer.forward(x, in, c), Contains("x: non-finite") && Contains("row 7"));
  x(7, 3) = 0;
  // oracle alpha: NaN means "unlabelled" (a defined value); +-Inf is refused when the inputs are built
  Tensor<S> oracle({2, 5, 5}, kNaN);
  oracle[3] = 0.5;
  in.set_oracle(oracle).set_gamma_mix(0.5);
  Mat<S> y = layer.forward(x, in, c);
  CHECK(y.allFinite());
  oracle[4] = kInf;
  CHECK_THROWS_WITH(AttnInputs<S>(2, 5).set_oracle(oracle), Contains("alpha") && Contains("inf") &&
                                                               Contains("flat position 4"));
  // cross-entropy of non-finite logits: the loss is NaN (not an exception); training stops on it (B5)
  Mat<S> logits(1, 2);
  logits << kNaN, 0.0;
  const std::int64_t label = 0;
  CHECK(std::isnan(ops::cross_entropy<S>(logits, &label, 1).loss));
  // the oracle alpha cache and config files refuse non-finite numbers (JSON has no NaN; 1e999 overflows)
  const std::string dir = temp_dir("b3");
  write(dir + "/cache.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 1e999}\n");
  CHECK_THROWS_AS(io::read_alpha_cache(dir + "/cache.jsonl"), Error);
  write(dir + "/config.json", "{\"lr_main\": 1e999}");
  CHECK_THROWS_AS(train::read_config(dir + "/config.json"), Error);
}

TEST_CASE("bad input B4 NaN or Inf in parameters: refused when loaded, detected when met", "[bad_input]") {
  // a checkpoint holding a NaN parameter is refused and the model is left untouched
  const std::string dir = temp_dir("b4");
  train::TrainConfig cfg = tiny_train(dir);
  const train::encoder::TrainResult r = train::encoder::run_training(cfg, quiet());
  REQUIRE(r.last_step == cfg.steps);
  io::SafeTensors st = io::SafeTensors::load(train::checkpoint_path(dir));
  Tensor<float> w = st.get<float>("cls_head.3.weight");
  w[1] = std::numeric_limits<float>::quiet_NaN();
  st.put("cls_head.3.weight", w, io::DType::F32);
  st.save(train::checkpoint_path(dir));
  const data::SimpleTokenizer tok = data::SimpleTokenizer::load(train::tokenizer_path(dir));
  Rng rng(cfg.seed);
  nn::TransformerModel<float> model(train::encoder::model_config(cfg, tok.vocab_size(), nn::Task::cls), rng);
  std::vector<Vec<float>> before;
  for (auto* p : model.parameters()) before.push_back(p->value);
  CHECK_THROWS_WITH(train::load_checkpoint(dir, model, nullptr),
                    Contains("cls_head.3.weight") && Contains("non-finite") && Contains("flat index 1"));
  for (std::size_t i = 0; i < before.size(); ++i) CHECK((model.parameters()[i]->value.array() == before[i].array()).all());
  // a NaN parameter met in a forward pass: the next attention layer reports its non-finite input
  Rng r2(3);
  nn::TransformerModel<S> m(tiny_model_config(), r2);
  m.parameters()[0]->value[20] = kNaN;  // the token embedding table
  nn::TransformerModel<S>::Cache mc;
  nn::ModelBatch<S> b = tiny_batch();
  for (Index k = 0; k < b.input_ids.numel(); ++k) b.input_ids[k] = 2;  // the row holding the NaN
  CHECK_THROWS_WITH(m.forward(b, 0.0, false, nullptr, mc), Contains("non-finite"));
}

TEST_CASE("bad input B5 a non-finite loss in training: the run stops, the last good checkpoint stays", "[bad_input]") {
  const std::string dir = temp_dir("b5");
  train::TrainConfig cfg = tiny_train(dir);
  cfg.steps = 5;
  cfg.eval_every = 2;
  train::encoder::TrainOptions<float> o = quiet();
  // after step 3 a parameter of the classifier head is NaN (as a diverged update would leave it)
  o.on_step = [](std::int64_t step, double, double, nn::TransformerModel<float>& m) {
    if (step == 3)
      for (auto* p : m.parameters())
        if (p->name == "cls_head.3.weight") p->value[0] = std::numeric_limits<float>::quiet_NaN();
  };
  CHECK_THROWS_WITH(train::encoder::run_training(cfg, o), Contains("non-finite loss at step 4") && Contains("kept"));
  const io::SafeTensors st = io::SafeTensors::load(train::checkpoint_path(dir));
  CHECK(st.get<std::int64_t>("train.step")[0] == 2);
  CHECK(st.get<float>("cls_head.3.weight").data.allFinite());
}

TEST_CASE("bad input B5 the fault-injection variable: STEP:MICRO parsed, anything else refused naming it", "[bad_input]") {
  const train::InjectedFault unset = train::parse_injected_fault("DEA_INJECT_NONFINITE_LOSS", nullptr);
  CHECK(unset.step == -1);
  CHECK(unset.micro == -1);
  const train::InjectedFault f = train::parse_injected_fault("DEA_INJECT_NONFINITE_LOSS", "12:3");
  CHECK(f.step == 12);
  CHECK(f.micro == 3);
  for (const char* bad : {"", "12", "12:", ":3", "a:3", "12:3x", "-1:0", "1:2:3", "99999999999999999999:0"})
    CHECK_THROWS_WITH(train::parse_injected_fault("DEA_INJECT_NONFINITE_LOSS", bad),
                      Contains("DEA_INJECT_NONFINITE_LOSS='" + std::string(bad) + "'") && Contains("STEP:MICRO_BATCH"));
}

TEST_CASE("bad input B5 a loss fault the caller installs: the run stops at its micro-batch, the checkpoint before it "
          "stays", "[bad_input]") {
  using Calls = std::vector<std::pair<std::int64_t, std::int64_t>>;
  auto nan_at = [](Calls& calls, std::int64_t step, std::int64_t micro) {
    return [&calls, step, micro](double loss, std::int64_t s, std::int64_t k) {
      calls.emplace_back(s, k);
      return s == step && k == micro ? std::nan("") : loss;
    };
  };
  auto checkpoint_step = [](const std::string& dir) {
    return io::SafeTensors::load(train::checkpoint_path(dir)).get<std::int64_t>("train.step")[0];
  };
  SECTION("the encoder, one batch a step") {
    const std::string dir = temp_dir("b5_fault");
    train::TrainConfig cfg = tiny_train(dir);
    cfg.steps = 5;
    train::encoder::TrainOptions<float> o = quiet();
    Calls calls;
    o.fault = nan_at(calls, 3, 0);
    CHECK_THROWS_WITH(train::encoder::run_training(cfg, o),
                      StartsWith("dea: non-finite loss at step 3 (task_loss nan, loss_gate ") &&
                          EndsWith("); stopping. The last good checkpoint in " + dir + " is kept."));
    CHECK(calls == Calls{{1, 0}, {2, 0}, {3, 0}});
    CHECK(checkpoint_step(dir) == 2);
  }
  SECTION("the encoder, micro-batches: the fault sees each of them, last to first, and the message names it") {
    const std::string dir = temp_dir("b5_fault_micro");
    train::TrainConfig cfg = tiny_train(dir);
    cfg.steps = 5;
    cfg.micro_batches = 2;
    train::encoder::TrainOptions<float> o = quiet();
    Calls calls;
    o.fault = nan_at(calls, 3, 1);
    CHECK_THROWS_WITH(train::encoder::run_training(cfg, o),
                      StartsWith("dea: non-finite loss at step 3, micro-batch 1 of 2 (task_loss nan, loss_gate ") &&
                          Contains("The last good checkpoint in " + dir + " is kept."));
    CHECK(calls == Calls{{1, 1}, {1, 0}, {2, 1}, {2, 0}, {3, 1}});
    CHECK(checkpoint_step(dir) == 2);
  }
  SECTION("the decoder LM") {
    const std::string dir = temp_dir("b5_fault_lm");
    train::TrainConfig cfg = tiny_train(dir);
    cfg.model = "lm";
    cfg.data_source = "text";
    cfg.text = std::string(DEA_TEST_DATA_DIR) + "/lm/tiny_corpus.txt";
    cfg.max_len = 16;
    cfg.steps = 5;
    train::lm_run::TrainOptions o;
    o.verbose = false;
    Calls calls;
    o.fault = nan_at(calls, 4, 0);
    CHECK_THROWS_WITH(train::lm_run::run_training<float>(cfg, o),
                      "dea: non-finite loss at step 4 (nan); stopping. The last good checkpoint in " + dir +
                          " is kept.");
    CHECK(calls == Calls{{1, 0}, {2, 0}, {3, 0}, {4, 0}});
    CHECK(checkpoint_step(dir) == 2);
  }
}

TEST_CASE("bad input B6 out-of-range ids: a dea::Error naming the position and the range", "[bad_input]") {
  Rng rng(4);
  nn::TransformerModel<S> model(tiny_model_config(), rng);
  nn::TransformerModel<S>::Cache mc;
  nn::ModelBatch<S> b = tiny_batch();
  b.input_ids[3] = 12;
  CHECK_THROWS_WITH(model.forward(b, 0.0, false, nullptr, mc), Contains("[3]") && Contains("[0, 12)") && Contains("got 12"));
  b.input_ids[3] = -1;
  CHECK_THROWS_WITH(model.forward(b, 0.0, false, nullptr, mc), Contains("got -1"));
  b = tiny_batch();
  b.token_type_ids = Tensor<std::int64_t>({2, 5}, 0);
  b.token_type_ids[4] = 2;
  CHECK_THROWS_WITH(model.forward(b, 0.0, false, nullptr, mc), Contains("[0, 2)") && Contains("got 2"));
  // a tokenizer maps an unknown id to [UNK] (a defined result) and an unknown token to id 1
  const data::SimpleTokenizer tok;
  CHECK(tok.id_to_token(99) == "[UNK]");
  CHECK(tok.id_to_token(-5) == "[UNK]");
  CHECK(tok.token_to_id("never-seen") == data::SimpleTokenizer::unk_id);
}

TEST_CASE("bad input B7 out-of-range targets: labels and target keys are checked", "[bad_input]") {
  Mat<S> logits = Mat<S>::Zero(2, 3);
  std::int64_t labels[2] = {0, 3};
  CHECK_THROWS_WITH(ops::cross_entropy<S>(logits, labels, 2), Contains("labels[1]") && Contains("[0, 3)") &&
                                                                        Contains("got 3"));
  labels[1] = -100;  // the ignore index is a defined value: the row is not counted
  CHECK(ops::cross_entropy<S>(logits, labels, 2).count == 1);
  Rng rng(5);
  nn::TransformerModel<S> model(tiny_model_config(), rng);
  nn::TransformerModel<S>::Cache mc;
  nn::ModelBatch<S> b = tiny_batch();
  b.labels[1] = 2;
  CHECK_THROWS_WITH(model.forward(b, 0.0, false, nullptr, mc), Contains("labels[1]") && Contains("got 2"));
  DualExpertAttention<S> layer(8, 2, rng);
  DualExpertAttention<S>::Cache c;
  AttnInputs<S> in(2, 5);
  Tensor<std::int64_t> target({2, 5}, 0);
  target[3] = 5;
  in.set_oracle(Tensor<S>({2, 5, 5}, 0.5));
  CHECK_THROWS_WITH(in.set_targets(target), Contains("target") && Contains("[0, 5)") && Contains("got 5"));
  // a record label other than 0 / 1 in a records file
  const std::string dir = temp_dir("b7");
  write(dir + "/r.jsonl", "{\"q_text\": \"a\", \"k_text\": \"b\", \"label\": 2}\n");
  CHECK_THROWS_WITH(io::read_records(dir + "/r.jsonl"), Contains(":1:") && Contains("label must be 0 or 1"));
}

TEST_CASE("bad input B8 fully masked rows: zeros, never NaN, in attention and in the model", "[bad_input]") {
  Rng rng(6);
  DualExpertAttention<S> layer(8, 2, rng);
  DualExpertAttention<S>::Cache c;
  Mat<S> x(10, 8);
  init::normal(x, rng, 0, 1);
  Tensor<std::uint8_t> km({2, 5}, 1);
  for (Index j = 0; j < 5; ++j) km[5 + j] = 0;  // batch item 1: every key masked
  AttnInputs<S> in(2, 5);
  in.set_key_mask(km).set_oracle(Tensor<S>({2, 5, 5}, 0.4)).set_gamma_mix(0.5);
  CHECK(in.n_real(0) == 5);
  CHECK(in.n_real(1) == 0);
  const Mat<S> y = layer.forward(x, in, c);
  REQUIRE(y.allFinite());
  // with every key masked the attention context is zero, so the output is the output projection's bias
  for (Index r = 5; r < 10; ++r) CHECK((y.row(r) - y.row(5)).cwiseAbs().maxCoeff() == 0.0);
  const Mat<S> dx = layer.backward(Mat<S>::Ones(10, 8), c);
  CHECK(dx.allFinite());
  CHECK(std::isfinite(c.loss_gate));
  nn::TransformerModel<S> model(tiny_model_config(), rng);
  nn::TransformerModel<S>::Cache mc;
  nn::ModelBatch<S> b = tiny_batch();
  for (Index j = 0; j < 5; ++j) b.attention_mask[j] = 0;
  const auto out = model.forward(b, 0.0, false, nullptr, mc);
  CHECK(out.logits.allFinite());
  CHECK(std::isfinite(out.task_loss));
}

// ---------------------------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("bad input B9 empty data: a defined empty result or a dea::Error saying what is missing", "[bad_input]") {
  const std::string dir = temp_dir("b9");
  const std::string empty = write(dir + "/empty", "");
  CHECK(io::read_alpha_cache(empty).empty());           // an empty cache is a valid cache
  CHECK(data::load_babi(empty).empty());                 // no stories, no records
  CHECK(data::load_conceptnet_assertions(empty).empty());
  CHECK_THROWS_WITH(data::load_capitals(empty), Contains("no capital,country lines"));
  CHECK_THROWS_WITH(data::load_clutrr_csv(empty), Contains("empty CSV file"));
  CHECK_THROWS_WITH(data::SimpleTokenizer::load(empty), Contains("expected at least the 5 special tokens"));
  CHECK_THROWS_WITH(train::read_config(empty), Contains("invalid JSON"));
  CHECK_THROWS_WITH(io::SafeTensors::load(empty), Contains("shorter than the 8-byte"));
  // a data source whose file gives no record is an error (or, when asked, falls back to synthetic data)
  data::DalphaFiles files;
  files.babi = {empty};
  files.log = nullptr;
  CHECK_THROWS_WITH(data::build_dalpha(files), Contains("no babi records"));
  files.fallback_to_synthetic = true;
  CHECK_FALSE(data::build_dalpha(files).empty());
  // an empty token sequence: [CLS] [SEP]
  const data::SimpleTokenizer tok;
  CHECK(tok.encode("", 8).size() == 2);
  CHECK(tok.tokenize(" \t\n").empty());
  // no training data at all
  train::TrainConfig cfg = tiny_train(dir + "/run");
  cfg.data_source = "text";
  cfg.text = write(dir + "/corpus.txt", "");
  CHECK_THROWS_AS(train::encoder::run_training(cfg, quiet()), Error);
}

TEST_CASE("bad input B10 truncated files: a dea::Error naming the file and what is missing", "[bad_input]") {
  io::SafeTensors st;
  st.put("w", Tensor<double>({4, 4}, 2.0));
  const std::vector<std::uint8_t> full = st.serialize();
  // cut inside the data part, inside the header, inside the 8-byte prefix
  for (std::size_t keep : {full.size() - 1, std::size_t(40), std::size_t(5)}) {
    const std::vector<std::uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(keep));
    CHECK_THROWS_WITH(io::SafeTensors::parse(cut, "cut.safetensors"),
                      Contains("cut.safetensors") && (Contains("truncated") || Contains("outside the data part")));
  }
  const std::string dir = temp_dir("b10");
  write(dir + "/cache.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 0.5}\n{\"premise\": \"c\", \"hyp");
  CHECK_THROWS_WITH(io::read_alpha_cache(dir + "/cache.jsonl"), Contains("cache.jsonl:2") && Contains("invalid JSON"));
  write(dir + "/vocab.txt", "[PAD]\n[UNK]\n[CLS]\n");
  CHECK_THROWS_WITH(data::SimpleTokenizer::load(dir + "/vocab.txt"), Contains("vocab.txt") && Contains("3 lines"));
  write(dir + "/c.csv", "story,query,target\n\"Anna went");
  CHECK_THROWS_WITH(data::load_clutrr_csv(dir + "/c.csv"), Contains("unterminated quoted field"));
  write(dir + "/config.json", "{\"d_model\": 16, \"n_he");
  CHECK_THROWS_WITH(train::read_config(dir + "/config.json"), Contains("config.json") && Contains("invalid JSON"));
  write(dir + "/qa16.txt", "1 Lily is a frog.\n3 Lily is white.\n");  // a line lost in the middle
  CHECK_THROWS_WITH(data::load_babi(dir + "/qa16.txt"), Contains("qa16.txt:2") && Contains("does not follow 1"));
}

TEST_CASE("bad input B11 oversized files and sizes: refused from the declared sizes, before allocating",
          "[bad_input]") {
  // a header length beyond the sane maximum (the file does not need to be that long to be refused)
  std::vector<std::uint8_t> img(16, 0);
  const std::uint64_t n = io::SafeTensors::max_header_bytes + 1;
  for (int i = 0; i < 8; ++i) img[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  CHECK_THROWS_WITH(io::SafeTensors::parse(img), Contains("exceeds the sane maximum"));
  // a tensor whose declared shape needs more bytes than the file has, or overflows 64 bits
  CHECK_THROWS_WITH(io::SafeTensors::parse(raw_safetensors(
                        R"({"w":{"dtype":"F64","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})", 8)),
                    Contains("overflow"));
  CHECK_THROWS_WITH(io::SafeTensors::parse(raw_safetensors(
                        R"({"w":{"dtype":"F64","shape":[1000000],"data_offsets":[0,8000000]}})", 8)),
                    Contains("outside the data part"));
  // JSON nested deeper than the limit (the parser would otherwise allocate one node per level)
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THROWS_WITH(io::SafeTensors::parse(raw_safetensors(deep, 0)), Contains("deeper than 64"));
  const std::string dir = temp_dir("b11");
  write(dir + "/config.json", deep);
  CHECK_THROWS_WITH(train::read_config(dir + "/config.json"), Contains("deeper than 64"));
  write(dir + "/cache.jsonl", "{\"a\":" + deep + "}\n");
  CHECK_THROWS_WITH(io::read_alpha_cache(dir + "/cache.jsonl"), Contains("cache.jsonl:1") && Contains("deeper than 64"));
  // a config.json larger than any real one
  write(dir + "/big.json", "{\"text\": \"" + std::string(train::kMaxConfigBytes, 'x') + "\"}");
  CHECK_THROWS_WITH(train::read_config(dir + "/big.json"), Contains("more than the maximum"));
  // a bAbI story longer than any real one (each question would copy it)
  std::string story = "1 start.\n";
  for (int i = 2; i < 2000; ++i) story += std::to_string(i) + " " + std::string(40, 'w') + ".\n";
  write(dir + "/qa16_long.txt", story);
  CHECK_THROWS_WITH(data::load_babi(dir + "/qa16_long.txt"), Contains("story longer than"));
  // a line longer than any real one in a line-streamed file
  write(dir + "/assertions.csv", std::string(data::kMaxLineBytes + 10, 'a') + "\n");
  CHECK_THROWS_WITH(data::load_conceptnet_assertions(dir + "/assertions.csv"),
                    Contains("assertions.csv:1") && Contains("line longer than"));
  // sizes in a config.json beyond the sane maxima
  write(dir + "/huge.json", "{\"d_model\": 4294967296, \"n_heads\": 1}");
  CHECK_THROWS_WITH(train::read_config(dir + "/huge.json"), Contains("d_model") && Contains("outside"));
}

TEST_CASE("bad input B12 wrong dtypes: unsupported or lossy dtypes are a dea::Error naming the tensor",
          "[bad_input]") {
  CHECK_THROWS_WITH(io::SafeTensors::parse(raw_safetensors(
                        R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2)),
                    Contains("tensor 'w'") && Contains("unsupported dtype \"F8_E4M3\""));
  io::SafeTensors st;
  st.put("f", Tensor<double>({2}, 1.5));
  st.put("big", Tensor<std::int64_t>({1}, std::int64_t(1) << 40));
  CHECK_THROWS_WITH(st.get<std::int32_t>("f"), Contains("'f'") && Contains("drop the fraction"));
  CHECK_THROWS_WITH(st.get<std::int32_t>("big"), Contains("'big'") && Contains("cannot be represented"));
  CHECK(st.get<double>("big")[0] == std::ldexp(1.0, 40));  // exactly representable: a defined conversion
  std::vector<double> frac = {0.5};
  CHECK_THROWS_WITH(st.put("g", Shape{1}, frac.data(), io::DType::I32), Contains("drop the fraction"));
  // a JSON value of the wrong type in config.json or the alpha cache
  const std::string dir = temp_dir("b12");
  write(dir + "/config.json", "{\"steps\": 2.5}");
  CHECK_THROWS_WITH(train::read_config(dir + "/config.json"), Contains("'steps'") && Contains("an integer"));
  write(dir + "/config.json", "{\"d_model\": \"big\"}");
  CHECK_THROWS_WITH(train::read_config(dir + "/config.json"), Contains("'d_model'"));
  write(dir + "/cache.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": \"high\"}\n");
  CHECK_THROWS_WITH(io::read_alpha_cache(dir + "/cache.jsonl"), Contains("\"alpha\" must be a number"));
}

TEST_CASE("bad input B13 unknown tensor names: a strict load lists them; missing ones are listed too",
          "[bad_input]") {
  Rng rng(7);
  nn::TransformerModel<S> model(tiny_model_config(), rng);
  io::SafeTensors st;
  io::put_parameters(st, model.parameters());
  st.put("layers.9.attn.W_rel", Tensor<double>({2, 2}, 0.0));
  CHECK_THROWS_WITH(io::load_parameters(model.parameters(), st),
                    Contains("match no parameter") && Contains("'layers.9.attn.W_rel'"));
  CHECK_NOTHROW(io::load_parameters(model.parameters(), st, /*strict=*/false));
  st.erase("layers.9.attn.W_rel");
  st.erase("cls_head.3.weight");
  CHECK_THROWS_WITH(io::load_parameters(model.parameters(), st), Contains("missing") && Contains("'cls_head.3.weight'"));
  CHECK_THROWS_WITH(st.get<double>("nope"), Contains("no tensor named 'nope'"));
}

TEST_CASE("bad input B14 a checkpoint of another configuration: a dea::Error naming the difference", "[bad_input]") {
  const std::string dir = temp_dir("b14");
  train::TrainConfig cfg = tiny_train(dir);
  REQUIRE(train::encoder::run_training(cfg, quiet()).last_step == cfg.steps);
  const data::SimpleTokenizer tok = data::SimpleTokenizer::load(train::tokenizer_path(dir));
  // another width: the first parameter whose shape differs is named with both shapes
  train::TrainConfig wide = cfg;
  wide.d_model = 24;
  Rng r1(1);
  nn::TransformerModel<float> m1(train::encoder::model_config(wide, tok.vocab_size(), nn::Task::cls), r1);
  CHECK_THROWS_WITH(train::load_checkpoint(dir, m1, nullptr), Contains("expected shape") && Contains("16"));
  // another depth: the extra layer's parameters are missing
  train::TrainConfig deep = cfg;
  deep.n_layers = 2;
  Rng r2(1);
  nn::TransformerModel<float> m2(train::encoder::model_config(deep, tok.vocab_size(), nn::Task::cls), r2);
  CHECK_THROWS_WITH(train::load_checkpoint(dir, m2, nullptr), Contains("missing") && Contains("layers.1."));
  // the same shapes but another run (seed): resuming is refused
  Rng r3(1);
  nn::TransformerModel<float> m3(train::encoder::model_config(cfg, tok.vocab_size(), nn::Task::cls), r3);
  optim::AdamW<float> opt = train::encoder::make_optimizer(m3, cfg);
  CHECK_THROWS_WITH(train::load_checkpoint(dir, m3, &opt, cfg.seed + 1), Contains("does not match seed"));
  CHECK(train::load_checkpoint(dir, m3, &opt, cfg.seed) == cfg.steps);
}

TEST_CASE("bad input B15 invalid UTF-8 and odd text: defined results", "[bad_input]") {
  const data::SimpleTokenizer tok;
  const std::vector<std::string> t = tok.tokenize("ab\xff" "cd \xe2\x82");
  // each invalid byte is U+FFFD, a punctuation token of its own
  REQUIRE(t.size() == 5);
  CHECK(t[0] == "ab");
  CHECK(t[1] == "\xef\xbf\xbd");
  CHECK(t[2] == "cd");
  CHECK(t[3] == "\xef\xbf\xbd");
  CHECK(t[4] == "\xef\xbf\xbd");
  // a safetensors tensor name must be valid UTF-8 (as JSON requires)
  CHECK_THROWS_WITH(io::SafeTensors::parse(raw_safetensors(
                        "{\"w\xff\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4)),
                    Contains("not valid JSON"));
  io::SafeTensors st;
  std::vector<float> one = {1};
  CHECK_THROWS_WITH(st.put("w\xff", Shape{}, one.data(), io::DType::F32), Contains("not valid UTF-8"));
}

TEST_CASE("bad input B16 malformed records: a dea::Error naming the file and the line", "[bad_input]") {
  const std::string dir = temp_dir("b16");
  write(dir + "/c.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 0.5}\n[1, 2]\n");
  CHECK_THROWS_WITH(io::read_alpha_cache(dir + "/c.jsonl"), Contains("c.jsonl:2") && Contains("expected a JSON object"));
  write(dir + "/c.jsonl", "{\"premise\": \"a\", \"alpha\": 0.5}\n");
  CHECK_THROWS_WITH(io::read_alpha_cache(dir + "/c.jsonl"), Contains("c.jsonl:1") && Contains("\"hypothesis\""));
  write(dir + "/c.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 0.99}\n");
  CHECK_THROWS_WITH(io::read_alpha_cache(dir + "/c.jsonl"), Contains("outside [0, 0.95]"));
  write(dir + "/qa16.txt", "1 Lily is a frog.\n2 What is Lily?\n");
  CHECK(data::load_babi(dir + "/qa16.txt").empty());  // no tab: a statement, not a question
  write(dir + "/qa16.txt", "1 Lily is a frog.\n2 What is Lily?\t\t1\n");
  CHECK_THROWS_WITH(data::load_babi(dir + "/qa16.txt"), Contains("qa16.txt:2") && Contains("without an answer"));
  write(dir + "/qa16.txt", "x Lily is a frog.\n");
  CHECK_THROWS_WITH(data::load_babi(dir + "/qa16.txt"), Contains("qa16.txt:1") && Contains("line number"));
  write(dir + "/cn.csv", "/a/1\t/r/IsA\n");
  CHECK_THROWS_WITH(data::load_conceptnet_assertions(dir + "/cn.csv"), Contains("cn.csv:1") && Contains("got 2 fields"));
  write(dir + "/caps.txt", "Paris,France,Europe\n");
  CHECK_THROWS_WITH(data::load_capitals(dir + "/caps.txt"), Contains("caps.txt:1"));
  write(dir + "/cl.csv", "story,query,target\nA met B.,A and B,father\n");
  CHECK_THROWS_WITH(data::load_clutrr_csv(dir + "/cl.csv"), Contains("cl.csv:2") && Contains("malformed query"));
  write(dir + "/vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ndog\ndog\n");
  CHECK_THROWS_WITH(data::SimpleTokenizer::load(dir + "/vocab.txt"), Contains("vocab.txt:7") && Contains("duplicate"));
}

TEST_CASE("bad input B17 a path that is not a readable file: a dea::Error naming it", "[bad_input]") {
  const std::string dir = temp_dir("b17");
  CHECK_THROWS_WITH(io::SafeTensors::load(dir), Contains("is a directory"));
  CHECK_THROWS_WITH(data::SimpleTokenizer::load(dir), Contains("is a directory"));
  CHECK_THROWS_WITH(train::read_config(dir + "/missing.json"), Contains("cannot open") && Contains("missing.json"));
  CHECK_THROWS_WITH(io::read_alpha_cache(dir + "/missing.jsonl"), Contains("missing.jsonl"));
  CHECK_THROWS_WITH(data::load_babi(dir + "/missing.txt"), Contains("missing.txt"));
  train::TrainConfig cfg = tiny_train(dir + "/nothing_here");
  cfg.resume = true;
  CHECK_THROWS_WITH(train::encoder::run_training(cfg, quiet()), Contains("--resume: no checkpoint"));
}

TEST_CASE("bad input B18 interrupted writes: the target holds the old or the new file, never a mix", "[bad_input]") {
  // (test_crash_safety kills the train program while it writes a checkpoint; here: a failed write.)
  const std::string dir = temp_dir("b18");
  const std::string path = dir + "/vocab.txt";
  dea::write_file_atomic(path, "old\n");
  // a temporary that cannot be created (the target's directory is missing) leaves nothing behind
  CHECK_THROWS_WITH(dea::write_file_atomic(dir + "/no/such/dir/f", "x"), Contains("cannot create"));
  io::SafeTensors st;
  st.put("w", Tensor<double>({1}, 1.0));
  CHECK_THROWS_AS(st.save(dir + "/no/such/dir/w.safetensors"), Error);
  dea::write_file_atomic(path, "new\n");
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(s == "new\n");
  // nothing but the target is left in the directory
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
}

// ---------------------------------------------------------------------------------------------------------------
// Attention inputs
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("bad input B21 attention inputs: each argument is validated once, naming it", "[bad_input][inputs]") {
  CHECK_THROWS_WITH(AttnInputs<S>(0, 5), Contains("batch must be positive") && Contains("got 0"));
  CHECK_THROWS_WITH(AttnInputs<S>(2, 0), Contains("q_len must be positive"));
  CHECK_THROWS_WITH(AttnInputs<S>(2, 3, -1), Contains("k_len must be positive"));
  AttnInputs<S> empty;
  CHECK_THROWS_WITH(empty.set_key_mask(Tensor<std::uint8_t>({2, 5}, 1)), Contains("set_key_mask") && Contains("empty"));
  AttnInputs<S> in(2, 5);
  // shapes
  CHECK_THROWS_WITH(in.set_key_mask(Tensor<std::uint8_t>({5, 2}, 1)),
                    Contains("key_mask") && Contains("[2, 5]") && Contains("got [5, 2]"));
  CHECK_THROWS_WITH(in.set_oracle(Tensor<S>({2, 5, 4}, 0.5)),
                    Contains("set_oracle: alpha") && Contains("[2, 5, 5]") && Contains("got [2, 5, 4]"));
  CHECK_THROWS_WITH(in.set_frozen_alpha_hat(Tensor<S>({2, 5, 5}, 0.5)),
                    Contains("alpha_hat") && Contains("[2, H, 5, 5]") && Contains("got [2, 5, 5]"));
  // +-inf in the oracle (NaN is "unlabelled", a defined value)
  Tensor<S> oracle({2, 5, 5}, kNaN);
  oracle[7] = -kInf;
  CHECK_THROWS_WITH(in.set_oracle(oracle), Contains("alpha") && Contains("-inf") && Contains("flat position 7"));
  // targets without an oracle, of the wrong shape, out of range
  CHECK_THROWS_WITH(in.set_targets(Tensor<std::int64_t>({2, 5}, 0)),
                    Contains("set_targets") && Contains("without an oracle"));
  oracle[7] = 0.5;
  in.set_oracle(oracle);
  CHECK(in.has_oracle());
  CHECK_THROWS_WITH(in.set_targets(Tensor<std::int64_t>({2, 4}, 0)),
                    Contains("target") && Contains("[2, 5]") && Contains("got [2, 4]"));
  Tensor<std::int64_t> target({2, 5}, -1);
  target[9] = -2;
  CHECK_THROWS_WITH(in.set_targets(target), Contains("target") && Contains("got -2") && Contains("flat position 9"));
  target[9] = 5;
  CHECK_THROWS_WITH(in.set_targets(target), Contains("target") && Contains("[0, 5)") && Contains("got 5"));
  target[9] = 4;
  in.set_targets(target);
  CHECK(in.has_targets());
  // gamma_mix in [0, 1]
  CHECK_THROWS_WITH(in.set_gamma_mix(S(1.5)), Contains("gamma_mix") && Contains("[0, 1]") && Contains("1.5"));
  CHECK_THROWS_WITH(in.set_gamma_mix(S(-0.1)), Contains("gamma_mix"));
  CHECK_THROWS_WITH(in.set_gamma_mix(S(kNaN)), Contains("gamma_mix"));
  // causal masking needs Tq == Tk
  CHECK_THROWS_WITH(AttnInputs<S>(2, 3, 4).set_causal(true), Contains("causal") && Contains("Tq == Tk"));
  // without_oracle() drops oracle and targets and shares the rest
  in.set_key_mask(Tensor<std::uint8_t>({2, 5}, 1));
  const AttnInputs<S> u = in.without_oracle();
  CHECK_FALSE(u.has_oracle());
  CHECK_FALSE(u.has_targets());
  CHECK(u.key_mask(1) == in.key_mask(1));
  // inputs built for other sizes than the call
  Rng rng(7);
  DotProductAttention<S> dp(8, 2, rng);
  DotProductAttention<S>::Cache dc;
  CHECK_THROWS_WITH(dp.forward(Mat<S>::Zero(12, 8), AttnInputs<S>(2, 5), dc),
                    Contains("DotProductAttention") && Contains("expected B*T = 10 rows") && Contains("got 12"));
  AttnInputs<S> per_head(2, 5);
  per_head.set_oracle(Tensor<S>({2, 3, 5, 5}, 0.5));  // 3 heads
  DualExpertAttention<S> dea(8, 2, rng);
  DualExpertAttention<S>::Cache ec;
  CHECK_THROWS_WITH(dea.forward(Mat<S>::Zero(10, 8), per_head, ec),
                    Contains("DualExpertAttention") && Contains("alpha_oracle") && Contains("[2, 2, 5, 5]") &&
                        Contains("got [2, 3, 5, 5]"));
}

TEST_CASE("bad input B22 attention inputs a class does not support: refused, naming the class and the input",
          "[bad_input][inputs]") {
  const Index B = 2, T = 5, D = 8, H = 2;
  Rng rng(8);
  Mat<S> x(B * T, D);
  init::normal(x, rng, 0, 1);
  const Tensor<S> oracle({B, T, T}, 0.5);
  AttnInputs<S> causal(B, T);
  causal.set_causal(true);
  AttnInputs<S> with_oracle(B, T);
  with_oracle.set_oracle(oracle);
  AttnInputs<S> with_targets = with_oracle;
  with_targets.set_targets(Tensor<std::int64_t>({B, T}, 0));
  AttnInputs<S> frozen(B, T);
  frozen.set_frozen_alpha_hat(Tensor<S>({B, H, T, T}, 0.5));
  auto refused = [](auto&& call, const char* cls, const char* input) {
    CHECK_THROWS_WITH(call(), Contains(cls) && Contains(input) && Contains("not supported"));
  };
  // Dual-Expert attention: the oracle, targets and frozen alpha-hat are its own inputs; it supports causal masking
  static_assert(DualExpertAttention<S>::kSupport.oracle && DualExpertAttention<S>::kSupport.causal, "");
  DualExpertAttention<S> dea(D, H, rng);
  DualExpertAttention<S>::Cache ec;
  CHECK(dea.forward(x, causal, ec).allFinite());
  CHECK(dea.forward(x, with_targets, ec).allFinite());
  CHECK(dea.forward(x, frozen, ec).allFinite());
  // dot-product, Laplacian and token-routed attention: causal masking yes, the Dual-Expert inputs no
  DotProductAttention<S> dp(D, H, rng);
  DotProductAttention<S>::Cache dc;
  refused([&] { return dp.forward(x, with_oracle, dc); }, "DotProductAttention", "oracle");
  refused([&] { return dp.forward(x, frozen, dc); }, "DotProductAttention", "frozen_alpha_hat");
  CHECK(dp.forward(x, causal, dc).allFinite());
  LaplacianAttention<S> lp(D, H, rng);
  LaplacianAttention<S>::Cache lc;
  refused([&] { return lp.forward(x, with_oracle, lc); }, "LaplacianAttention", "oracle");
  refused([&] { return lp.forward(x, frozen, lc); }, "LaplacianAttention", "frozen_alpha_hat");
  CHECK(lp.forward(x, causal, lc).allFinite());
  TokenRoutedOptions to;
  to.num_experts = 4;
  to.vocab_size = 12;
  TokenRoutedAttention<S> tr(D, H, rng, to);
  TokenRoutedAttention<S>::Cache tc;
  const Tensor<std::int64_t> ids({B, T}, 3);
  refused([&] { return tr.forward(x, ids, with_oracle, tc); }, "TokenRoutedAttention", "oracle");
  refused([&] { return tr.forward(x, ids, frozen, tc); }, "TokenRoutedAttention", "frozen_alpha_hat");
  CHECK(tr.forward(x, ids, causal, tc).allFinite());
  // a model whose attention takes no oracle refuses a batch that carries one
  nn::TransformerModel<S, DotProductAttention<S>> model(tiny_model_config(), rng);
  nn::TransformerModel<S, DotProductAttention<S>>::Cache mc;
  nn::ModelBatch<S> b = tiny_batch();
  b.alpha_oracle = oracle;
  CHECK_THROWS_WITH(model.forward(b, 0.5, false, nullptr, mc),
                    Contains("DotProductAttention") && Contains("oracle") && Contains("not supported"));
}

#if defined(DEA_HAVE_SENTENCEPIECE)
// B44-B46: the SentencePiece tokenizer of DeBERTa model directories (also tests/test_spm.cpp, and dea tokenize --spm
// in tests/cli_tests.cmake)
namespace {
const std::string kSpmModel = std::string(DEA_TEST_DATA_DIR) + "/deberta/spm/spm_nfkc.model";
}  // namespace

TEST_CASE("bad input B44 a DeBERTa directory without spm.model or with settings not covered: refused naming the file",
          "[bad_input]") {
  const std::string d = temp_dir("spm_dir");
  CHECK_THROWS_WITH(text::SpmTokenizer(d), Contains(d) && Contains("has no spm.model"));
  CHECK_THROWS_WITH(text::SpmTokenizer(d + "/none.model"), Contains("none.model") && Contains("does not exist"));
  fs::copy_file(kSpmModel, d + "/spm.model");
  write(d + "/tokenizer_config.json", "{\"do_lower_case\": true}");
  CHECK_THROWS_WITH(text::SpmTokenizer(d), Contains("tokenizer_config.json") && Contains("do_lower_case is true"));
  write(d + "/tokenizer_config.json", "{\"split_by_punct\": 1}");
  CHECK_THROWS_WITH(text::SpmTokenizer(d), Contains("split_by_punct: expected true or false, got 1"));
  write(d + "/tokenizer_config.json", "{\"tokenizer_class\": \"BertTokenizer\"}");
  CHECK_THROWS_WITH(text::SpmTokenizer(d), Contains("tokenizer_class \"BertTokenizer\""));
  write(d + "/tokenizer_config.json", "{\"do_lower_case\": false}");
  write(d + "/added_tokens.json", "{\"[MASK]\": -1}");
  CHECK_THROWS_WITH(text::SpmTokenizer(d), Contains("added_tokens.json") && Contains("'[MASK]' has id -1"));
  write(d + "/added_tokens.json", "{\"[MASK]\": 520");
  CHECK_THROWS_WITH(text::SpmTokenizer(d), Contains("added_tokens.json"));
  fs::remove(d + "/added_tokens.json");
  CHECK(text::SpmTokenizer(d).mask_id() == 520);  // the default: the number of pieces
  fs::remove_all(d);
}

TEST_CASE("bad input B45 a corrupt spm.model: truncated or corrupt protobuf, no pieces, missing special pieces",
          "[bad_input]") {
  const std::string d = temp_dir("spm_model");
  const std::string good = read_file(kSpmModel);
  const std::string m = d + "/spm.model";
  auto refused = [&](const std::string& bytes, const std::string& words) {
    write(m, bytes);
    CHECK_THROWS_WITH(text::SpmTokenizer(d), Contains("spm.model '" + m + "'") && Contains(words));
  };
  refused("", "empty file");
  refused(good.substr(0, good.size() - 100), "truncated protobuf");
  refused(good.substr(0, 3), "truncated protobuf");
  refused(std::string("\x0b\x01", 2), "corrupt protobuf (wire type 3)");
  refused(std::string("\x12\x00", 2), "no pieces (an empty vocabulary");
  refused(std::string("\x0a\x03\x0a\x01" "a" "\x12\x02\x18\x02", 9), "model type BPE");
  std::string no_sep = good;
  no_sep[no_sep.find("[SEP]") + 1] = 'Z';
  refused(no_sep, "no piece '[SEP]'");
  fs::remove_all(d);
}

TEST_CASE("bad input B46 invalid UTF-8 for the SentencePiece tokenizer: refused naming the byte and its offset",
          "[bad_input]") {
  for (const text::SpmMode mode : {text::SpmMode::fast, text::SpmMode::slow}) {
    const text::SpmTokenizer tok(kSpmModel, mode);
    CHECK_THROWS_WITH(tok.ids("ok\xc0\xaf"), Contains("not valid UTF-8 (byte 0xC0 at byte offset 2)"));
    CHECK_THROWS_WITH(tok.encode_pair("premise", "\xed\xa0\x80"),
                      Contains("not valid UTF-8 (byte 0xED at byte offset 0)"));
    CHECK_THROWS_WITH(tok.encode("\xff", 8), Contains("not valid UTF-8"));
  }
}
#endif

}  // namespace test_bad_input
