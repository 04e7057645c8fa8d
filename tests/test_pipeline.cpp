// Tests of dea/train/ (config, flags, run directory, trainer) and the encoder's run (train/encoder.hpp): flags and
// config JSON, training, checkpoints, bit-exact resume, corrupt files, the evaluation loop and the Paris probe of
// `dea train` / `dea eval`, on a tiny configuration.
#include <dea/train.hpp>
#include <dea/train/lm.hpp>

#include "../examples/dea/paris_probe.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_pipeline {

using namespace dea;
using namespace dea::train;
using namespace dea::train::encoder;
using dea_cli::paris_probe;
using dea_cli::ParisProbe;
namespace fs = std::filesystem;

namespace {

using Scalar = float;
using Model = nn::TransformerModel<Scalar>;
using Batch = nn::ModelBatch<Scalar>;
using TrainOpts = train::encoder::TrainOptions<Scalar>;

/// `dea eval`'s work: the evaluation of the run in `dir`, and the Paris probe on its model when asked.
EvalResult eval_with_probe(const std::string& dir, Split split, ParisProbe* probe = nullptr) {
  return evaluate_checkpoint<Scalar>(dir, split, [&](Model& m, const LoadedRun<Scalar>& run) {
    if (probe) *probe = paris_probe(m, run.tok);
  });
}

TrainConfig tiny(const std::string& dir) {
  TrainConfig c;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 1;
  c.d_ff = 32;
  c.batch_size = 8;
  c.max_len = 32;
  c.n_per_source = 20;
  c.steps = 12;
  c.gamma_steps = 8;
  c.log_every = 4;
  c.eval_every = 5;
  c.eval_batches = 2;
  c.seed = 7;
  c.threads = 1;  // tiny sizes: one thread is fastest (and results do not depend on it)
  c.out_dir = dir;
  return c;
}

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("dea_test_pipeline_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

TrainOpts quiet() {
  TrainOpts o;
  o.verbose = false;
  return o;
}

/// Every tensor of two safetensors files, compared byte for byte (names and shapes too).
bool same_tensors(const std::string& a, const std::string& b) {
  const io::SafeTensors x = io::SafeTensors::load(a), y = io::SafeTensors::load(b);
  if (x.names() != y.names()) return false;
  for (const std::string& n : x.names()) {
    if (x.shape(n) != y.shape(n)) return false;
    if (x.dtype(n) != y.dtype(n)) return false;
    if (x.dtype(n) == io::DType::I64) {
      if (!(x.get<std::int64_t>(n).data == y.get<std::int64_t>(n).data)) return false;
      continue;
    }
    const Tensor<double> u = x.get<double>(n), v = y.get<double>(n);
    for (Index i = 0; i < u.numel(); ++i)
      if (!(u[i] == v[i])) return false;
  }
  return true;
}

std::vector<std::string> argv_of(std::initializer_list<const char*> a) { return {a.begin(), a.end()}; }

}  // namespace

TEST_CASE("pipeline: flags, --quick preset and explicit overrides", "[pipeline]") {
  const ParsedArgs d = parse_args({});
  CHECK(d.config.d_model == 512);
  CHECK(d.config.steps == 12000);
  CHECK(d.config.max_len == 64);
  CHECK(d.config.out_dir == "runs/dea");

  const ParsedArgs q = parse_args(argv_of({"--quick"}));
  CHECK(q.config.d_model == 128);
  CHECK(q.config.n_heads == 4);
  CHECK(q.config.n_layers == 2);
  CHECK(q.config.d_ff == 256);
  CHECK(q.config.batch_size == 32);
  CHECK(q.config.steps == 300);
  CHECK(q.config.gamma_steps == 200);
  CHECK(q.config.eval_every == 150);
  CHECK(q.config.log_every == 25);
  CHECK(q.config.n_per_source == 500);

  // explicit flags win over the preset, whatever their position
  const ParsedArgs o = parse_args(argv_of({"--steps", "40", "--quick", "--gamma_steps=10", "--eval_every", "20",
                                           "--log_every", "5", "--supervise_layers", "-1,0"}));
  CHECK(o.config.steps == 40);
  CHECK(o.config.gamma_steps == 10);
  CHECK(o.config.eval_every == 20);
  CHECK(o.config.log_every == 5);
  CHECK(o.config.d_model == 128);
  REQUIRE(o.config.supervise_layers);
  CHECK(*o.config.supervise_layers == std::vector<Index>{-1, 0});

  // bad values name the flag and the value
  try {
    parse_args(argv_of({"--lr_main", "fast"}));
    FAIL("no throw");
  } catch (const dea::Error& e) {
    const std::string m = e.what();
    CHECK(m.find("--lr_main") != std::string::npos);
    CHECK(m.find("fast") != std::string::npos);
  }
  CHECK_THROWS_AS(parse_args(argv_of({"--steps", "-3"})), dea::Error);
  CHECK_THROWS_AS(parse_args(argv_of({"--dropout", "1.5"})), dea::Error);
  CHECK_THROWS_AS(parse_args(argv_of({"--data_source", "wiki"})), dea::Error);
  CHECK_THROWS_AS(parse_args(argv_of({"--bogus", "1"})), dea::Error);
  CHECK_THROWS_AS(parse_args(argv_of({"--steps"})), dea::Error);
  CHECK_THROWS_AS(parse_args(argv_of({"--supervise_layers", "1,x"})), dea::Error);
  CHECK_THROWS_AS(validate(parse_args(argv_of({"--d_model", "10", "--n_heads", "4"})).config), dea::Error);

  // an unknown flag is named as unknown, also at the end of the line; a flag is never taken as another's value
  CHECK_THROWS_WITH(parse_args(argv_of({"--steps", "3", "--bogus"})), Catch::Contains("unknown flag --bogus"));
  CHECK_THROWS_WITH(parse_args(argv_of({"--steps", "--out_dir", "x"})),
                    Catch::Contains("--steps: missing value") && Catch::Contains("'--out_dir'"));
  // --threads is range-checked before it is narrowed (2^32 + 1 would otherwise become 1)
  CHECK_THROWS_WITH(parse_args(argv_of({"--threads", "4294967297"})), Catch::Contains("--threads"));
  CHECK_THROWS_WITH(parse_args(argv_of({"--supervise_layers", "99999999999999999999"})),
                    Catch::Contains("--supervise_layers"));
  std::string many = "0";
  for (int k = 0; k < 1100; ++k) many += ",0";  // more entries than config.json may hold: the run could not be read
  CHECK_THROWS_WITH(parse_args(argv_of({"--supervise_layers", many.c_str()})), Catch::Contains("at most 1024"));
  CHECK(parse_args(argv_of({"--supervise_layers", "0,-1"})).config.supervise_layers->size() == 2);
  CHECK_THROWS_WITH(parse_args(argv_of({"--threads", "99999999999"})), Catch::Contains("99999999999"));
  CHECK(parse_args(argv_of({"--threads", "4096"})).config.threads == 4096);
  // --text without --data_source text would be ignored: refused
  CHECK_THROWS_WITH(validate(parse_args(argv_of({"--text", "corpus.txt"})).config),
                    Catch::Contains("--text 'corpus.txt'") && Catch::Contains("--data_source"));
  // a model whose parameters and optimiser state alone exceed the machine's memory is refused before allocating
  CHECK_THROWS_WITH(validate(parse_args(argv_of({"--d_model", "65536", "--n_heads", "1", "--d_ff", "1048576",
                                                 "--n_layers", "4"})).config),
                    Catch::Contains("GB") && Catch::Contains("--d_model 65536"));
  CHECK_THROWS_WITH(validate(parse_args(argv_of({"--n_per_source", "1073741824"})).config),
                    Catch::Contains("--n_per_source"));
}

TEST_CASE("pipeline: config JSON round trip", "[pipeline]") {
  TrainConfig c = tiny("/some/dir");
  c.quick = true;
  c.dropout = 0.25;
  c.lr_main = 1.5e-4;
  c.seed = 123456789012345ULL;
  c.oracle = "cache.jsonl";
  c.supervise_layers = std::vector<Index>{-1};
  c.threads = 2;
  const std::string dir = temp_dir("config");
  const std::string path = dir + "/config.json";
  write_config(path, c);
  const TrainConfig r = read_config(path);
  CHECK(to_json(r) == to_json(c));
  CHECK(r.seed == c.seed);
  CHECK(r.dropout == c.dropout);
  REQUIRE(r.supervise_layers);
  CHECK(*r.supervise_layers == std::vector<Index>{-1});
  TrainConfig all = c;
  all.supervise_layers.reset();
  write_config(path, all);
  CHECK_FALSE(read_config(path)->supervise_layers);
  // a key of the wrong type is an error naming the key
  dea::write_file_atomic(path, "{\"d_model\": \"big\"}");
  CHECK_THROWS_WITH(read_config(path), Catch::Contains("d_model"));
  dea::write_file_atomic(path, "{not json");
  CHECK_THROWS_AS(read_config(path), dea::Error);
}

TEST_CASE("pipeline: training decreases the loss on a fixed batch", "[pipeline]") {
  TrainConfig c = tiny("unused");
  c.dropout = 0.0;
  c.lr_main = 1e-3;
  set_num_threads(1);
  const RunData d = build_data(c);
  Rng rng(c.seed);
  Model model(model_config(c, d.tok.vocab_size(), d.task), rng);
  auto opt = make_optimizer(model, c);
  std::vector<std::size_t> idx = {0, 1, 2, 3, 4, 5, 6, 7};
  const Batch b = make_batch<Scalar>(d, Split::train, idx, c.max_len, nullptr);
  REQUIRE(b.alpha_oracle.dim() == 3);
  Model::Cache cache;
  const auto before = model.forward(b, 0.0f, false, nullptr, cache);
  double last = 0;
  for (int s = 0; s < 60; ++s) {
    const auto out = model.forward(b, 0.0f, true, nullptr, cache);
    opt.zero_grad();
    model.backward(cache);
    opt.clip_grad_norms();
    opt.step();
    last = static_cast<double>(out.loss());
  }
  const auto after = model.forward(b, 0.0f, false, nullptr, cache);
  INFO("task loss " << before.task_loss << " -> " << after.task_loss << ", gate loss " << before.loss_gate << " -> "
                    << after.loss_gate);
  CHECK(std::isfinite(last));
  CHECK(after.task_loss < 0.5f * before.task_loss);  // a fixed batch of 8 is memorised
  CHECK(after.loss() < before.loss());
}

TEST_CASE("pipeline: checkpoint round trip is exact; corrupt checkpoints are rejected", "[pipeline]") {
  const std::string dir = temp_dir("ckpt");
  TrainConfig c = tiny(dir);
  c.steps = 3;
  run_training(c, quiet());
  REQUIRE(fs::exists(checkpoint_path(dir)));
  REQUIRE(fs::exists(config_path(dir)));
  REQUIRE(fs::exists(tokenizer_path(dir)));
  TrainConfig recorded = c;  // config.json: the run's flags and the fingerprint of its data
  recorded.data_hash = build_data(c).hash;
  CHECK(to_json(read_config(config_path(dir))) == to_json(recorded));

  // load into a fresh model + optimiser, save again: the same tensors, bit for bit
  const data::RunTokenizer tok = data::SimpleTokenizer::load(tokenizer_path(dir));
  const RunData d = build_data(c, &tok);
  Rng rng(999);  // different initial weights: every value must come from the file
  Model model(model_config(c, tok.vocab_size(), d.task), rng);
  auto opt = make_optimizer(model, c);
  CHECK(load_checkpoint(dir, model, &opt, c.seed) == 3);
  CHECK(opt.step_count("main") == 3);
  const std::string dir2 = temp_dir("ckpt2");
  save_run(dir2, c, tok, model, &opt, 3);
  CHECK(same_tensors(checkpoint_path(dir), checkpoint_path(dir2)));
  // a different seed does not match the stored Rng state
  CHECK_THROWS_AS(load_checkpoint(dir, model, &opt, c.seed + 1), dea::Error);

  // truncated file
  const std::string bad = temp_dir("ckpt_bad");
  fs::copy_file(config_path(dir), config_path(bad));
  fs::copy_file(tokenizer_path(dir), tokenizer_path(bad));
  const auto size = fs::file_size(checkpoint_path(dir));
  fs::copy_file(checkpoint_path(dir), checkpoint_path(bad));
  fs::resize_file(checkpoint_path(bad), size - 100);
  CHECK_THROWS_AS(load_checkpoint(bad, model, &opt), dea::Error);
  // garbage header
  {
    std::fstream f(checkpoint_path(bad), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.write("\x01\x02garbage", 9);
  }
  CHECK_THROWS_AS(load_checkpoint(bad, model, &opt), dea::Error);
  // a checkpoint of another architecture
  TrainConfig big = c;
  big.d_model = 32;
  Model other(model_config(big, tok.vocab_size(), d.task), rng);
  CHECK_THROWS_AS(load_checkpoint(dir, other, nullptr), dea::Error);
  // a missing file
  CHECK_THROWS_AS(load_checkpoint(temp_dir("empty"), model, nullptr), dea::Error);
  // the model was left intact by the failed loads: it still evaluates to the saved values
  save_run(dir2, c, tok, model, &opt, 3);
  CHECK(same_tensors(checkpoint_path(dir), checkpoint_path(dir2)));
}

TEST_CASE("pipeline: resume after k steps equals an uninterrupted run bit for bit", "[pipeline]") {
  const std::string full = temp_dir("full"), part = temp_dir("part");
  TrainConfig c = tiny(full);
  c.steps = 14;  // crosses an epoch boundary (270 training records / 32 = 9 batches) and the end of the gamma ramp
  c.batch_size = 32;
  const TrainResult rf = run_training(c, quiet());
  CHECK(rf.last_step == 14);

  TrainConfig p = c;
  p.out_dir = part;
  p.steps = 6;
  run_training(p, quiet());
  p.steps = 14;
  p.resume = true;
  const TrainResult rp = run_training(p, quiet());
  CHECK(rp.start_step == 6);
  CHECK(rp.last_step == 14);
  CHECK(rp.last_task_loss == rf.last_task_loss);
  CHECK(same_tensors(checkpoint_path(full), checkpoint_path(part)));

  // without restoring, a run of 8 steps from scratch is not the same (the test can fail)
  TrainConfig q = c;
  q.out_dir = temp_dir("short");
  q.steps = 8;
  run_training(q, quiet());
  CHECK_FALSE(same_tensors(checkpoint_path(full), checkpoint_path(q.out_dir)));

  // the log has one line per logged step and per evaluation
  std::ifstream log(fs::path(full) / "train_log.jsonl");
  std::string line;
  int steps = 0, evals = 0;
  while (std::getline(log, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("event")) ++evals;
    else {
      ++steps;
      CHECK(j.contains("grad_norm_gate"));
      CHECK(j.contains("alpha_mae"));
    }
  }
  CHECK(steps == 5);  // steps 1, 4, 8, 12, 14
  CHECK(evals == 3);  // steps 5, 10, 14

  // the resumed run's log: the first run's lines (its last step, 6, ends that run) and then the steps an
  // uninterrupted run logs, not the first step after the resume
  auto logged = [](const std::string& dir) {
    std::vector<std::string> out;
    std::ifstream in(fs::path(dir) / "train_log.jsonl");
    std::string l;
    while (std::getline(in, l)) {
      const auto j = nlohmann::json::parse(l);
      out.push_back(std::to_string(j["step"].get<long long>()) + (j.contains("event") ? "e" : ""));
    }
    return out;
  };
  CHECK(logged(full) == std::vector<std::string>{"1", "4", "5e", "8", "10e", "12", "14", "14e"});
  CHECK(logged(part) == std::vector<std::string>{"1", "4", "5e", "6", "6e", "8", "10e", "12", "14", "14e"});
}

TEST_CASE("pipeline: evaluation of a checkpoint and the Paris probe", "[pipeline]") {
  const std::string dir = temp_dir("eval");
  TrainConfig c = tiny(dir);
  c.steps = 4;
  run_training(c, quiet());
  ParisProbe probe;
  const EvalResult r = eval_with_probe(dir, Split::test, &probe);
  CHECK(r.split == "test");
  CHECK(r.n_examples > 0);
  CHECK(r.accuracy >= 0);
  CHECK(r.accuracy <= 1);
  CHECK(std::isfinite(r.task_loss));
  CHECK(r.alpha.n_points > 0);
  CHECK(r.alpha.mae >= 0);
  CHECK(r.n_decision_pairs > 0);
  const nlohmann::json j = to_json(r);
  for (const char* k : {"accuracy", "task_loss", "alpha_mae", "alpha_pearson", "alpha_spearman", "band_agreement",
                        "alpha_hat_mean", "alpha_oracle_mean", "decision_side_acc", "n_decision_pairs"})
    CHECK(j.contains(k));
  // evaluation is deterministic (eval mode, gamma 0)
  const EvalResult r2 = eval_with_probe(dir, Split::test);
  CHECK(r2.accuracy == r.accuracy);
  CHECK(r2.task_loss == r.task_loss);
  // a config.json whose seed is not the run's would evaluate other splits: refused
  {
    TrainConfig other = read_config(config_path(dir));
    other.seed += 1;
    write_config(config_path(dir), other);
    // the seed gives other records: their fingerprint is not the run's
    CHECK_THROWS_WITH(eval_with_probe(dir, Split::test), Catch::Contains("is not the run's (data_hash"));
    // without the fingerprint (a run imported from the reference), the checkpoint's Rng state tells
    const std::string hash = other.data_hash;
    other.data_hash.clear();
    write_config(config_path(dir), other);
    CHECK_THROWS_WITH(eval_with_probe(dir, Split::test), Catch::Contains("does not match seed"));
    other.seed -= 1;
    other.data_hash = hash;
    write_config(config_path(dir), other);
  }

  REQUIRE(probe.ok);
  CHECK(probe.qi == 1);
  CHECK(probe.ki == 5);
  REQUIRE(probe.per_layer.size() == 1);
  CHECK(probe.per_layer[0] > 0);
  CHECK(probe.per_layer[0] < 1);
  // deterministic: the probe runs in eval mode
  const data::RunTokenizer tok = data::SimpleTokenizer::load(tokenizer_path(dir));
  const RunData d = build_data(c, &tok);
  Rng rng(1);
  Model model(model_config(c, tok.vocab_size(), d.task), rng);
  load_checkpoint(dir, model, nullptr);
  const ParisProbe p2 = paris_probe(model, tok);
  CHECK(p2.per_layer == probe.per_layer);
  // a tokenizer without "france" skips the probe with a message
  const ParisProbe p3 = paris_probe(model, data::SimpleTokenizer());
  CHECK_FALSE(p3.ok);
  CHECK_FALSE(p3.error.empty());
  // a model whose max_len is shorter than the probe sentence (7 tokens) skips it with a message, no error
  TrainConfig shortc = c;
  shortc.max_len = 5;
  Rng rng5(1);
  Model short_model(model_config(shortc, tok.vocab_size(), d.task), rng5);
  const ParisProbe p4 = paris_probe(short_model, tok);
  CHECK_FALSE(p4.ok);
  CHECK_THAT(p4.error, Catch::Contains("max_len 5"));
}

TEST_CASE("pipeline: a fresh run refuses a directory holding another run unless overwrite", "[pipeline]") {
  const std::string dir = temp_dir("fresh");
  TrainConfig c = tiny(dir);
  c.steps = 2;
  c.eval_every = 2;
  run_training(c, quiet());
  const std::string before = io::SafeTensors::load(checkpoint_path(dir)).names().front();
  const auto log_size = fs::file_size(fs::path(dir) / "train_log.jsonl");
  // refused: nothing in the directory is touched (the log is not truncated, the checkpoint stays)
  TrainConfig again = c;
  again.lr_main = 1e-2;
  CHECK_THROWS_WITH(run_training(again, quiet()), Catch::Contains("already holds a run") &&
                                                      Catch::Contains("--overwrite") && Catch::Contains(dir));
  CHECK(fs::file_size(fs::path(dir) / "train_log.jsonl") == log_size);
  CHECK(read_config(config_path(dir))->lr_main == c.lr_main);
  // with overwrite, a new run whose data cannot be read fails before anything of the old run is deleted
  TrainOpts o = quiet();
  o.overwrite = true;
  TrainConfig no_data = again;
  no_data.oracle = dir + "/missing_cache.jsonl";
  CHECK_THROWS_WITH(run_training(no_data, o), Catch::Contains("missing_cache.jsonl"));
  CHECK(fs::exists(checkpoint_path(dir)));
  CHECK(fs::file_size(fs::path(dir) / "train_log.jsonl") == log_size);
  // then the old files go before the new run starts: a run that fails before its first checkpoint leaves none
  o.on_step = [](std::int64_t, double, double, Model&) { ::dea::detail::raise("stopped by the test"); };
  CHECK_THROWS_WITH(run_training(again, o), Catch::Contains("stopped by the test"));
  CHECK_FALSE(fs::exists(checkpoint_path(dir)));
  o.on_step = nullptr;
  run_training(again, o);
  CHECK(read_config(config_path(dir))->lr_main == again.lr_main);
  CHECK(io::SafeTensors::load(checkpoint_path(dir)).names().front() == before);
}

TEST_CASE("pipeline: a non-finite loss stops the run and keeps the last good checkpoint", "[pipeline]") {
  const std::string dir = temp_dir("nan");
  TrainConfig c = tiny(dir);
  c.steps = 12;
  TrainOpts o = quiet();
  o.on_step = [](std::int64_t step, double, double, Model& m) {
    if (step == 7) m.ln_f().weight.value[0] = std::numeric_limits<float>::quiet_NaN();  // poison after step 7
  };
  try {
    run_training(c, o);
    FAIL("no throw");
  } catch (const dea::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("non-finite") != std::string::npos);
    CHECK(msg.find("step 8") != std::string::npos);
  }
  // the checkpoint of the evaluation at step 5 is intact and finite
  const data::RunTokenizer tok = data::SimpleTokenizer::load(tokenizer_path(dir));
  const RunData d = build_data(c, &tok);
  Rng rng(1);
  Model model(model_config(c, tok.vocab_size(), d.task), rng);
  auto opt = make_optimizer(model, c);
  CHECK(load_checkpoint(dir, model, &opt, c.seed) == 5);
  for (auto* p : model.parameters()) CHECK(p->value.allFinite());
}

TEST_CASE("pipeline: a state_dict exported from the reference loads, reproduces its logits and evaluates",
          "[pipeline]") {
  // What a user of the reference does: save its model's state_dict as safetensors (float32, the tied
  // mlm_head.weight and the positional buffer included) next to the run's cfg and vocabulary. The weights here
  // are the reference's own, from the public model_cls case, so the loaded model must give the case's logits.
  const io::SafeTensors cs = io::SafeTensors::load(std::string(DEA_TEST_DATA_DIR) + "/golden/model_cls.safetensors");
  const io::SafeTensors pe =
      io::SafeTensors::load(std::string(DEA_TEST_DATA_DIR) + "/reference/model_cls_pe.safetensors");
  const std::string dir = temp_dir("reference_export");
  io::SafeTensors sd;
  for (const std::string& n : cs.names()) {
    if (n.rfind("in.", 0) == 0 || n.rfind("out.", 0) == 0 || n.rfind("grad.", 0) == 0) continue;
    sd.put(n, cs.get<double>(n), io::DType::F32);
  }
  sd.put("mlm_head.weight", cs.get<double>("tok_emb.weight"), io::DType::F32);
  Tensor<double> table = pe.get<double>("pe");
  table.shape = {1, table.shape[0], table.shape[1]};
  sd.put("pos_enc.pe", table, io::DType::F32);
  sd.save(checkpoint_path(dir));

  // the reference's cfg: its flag names (unknown keys such as 'tokenizer' are ignored)
  const nlohmann::json cfg = {{"d_model", 32}, {"n_heads", 4}, {"n_layers", 2}, {"d_ff", 64}, {"dropout", 0.1},
                              {"max_len", 64}, {"batch_size", 16}, {"seed", 42}, {"data_source", "dalpha"},
                              {"oracle", "mock"}, {"n_per_source", 20}, {"tokenizer", "simple"},
                              {"supervise_layers", nullptr}, {"quick", false}};
  dea::write_file_atomic(config_path(dir), cfg.dump(2));
  {
    // a 50-token vocabulary (the case's vocab_size): the specials and the most frequent words of the data
    TrainConfig c = config_from_json(cfg);
    const RunData d = build_data(c, nullptr);
    std::ofstream f(tokenizer_path(dir));
    for (std::size_t i = 0; i < 50; ++i) f << d.tok.vocab()[i] << "\n";
  }

  const TrainConfig c = read_config(config_path(dir));
  const data::RunTokenizer tok = data::SimpleTokenizer::load(tokenizer_path(dir));
  REQUIRE(tok.vocab_size() == 50);
  Rng rng(3);
  Model model(model_config(c, tok.vocab_size(), nn::Task::cls), rng);
  CHECK(load_checkpoint(dir, model, nullptr) == 0);  // no train.step: a fresh start for --resume
  CHECK(model.positional().table()(63, 31) == static_cast<float>(pe.get<double>("pe")[63 * 32 + 31]));

  nn::ModelBatch<Scalar> batch;
  batch.input_ids = cs.get<std::int64_t>("in.input_ids");
  batch.attention_mask = cs.get<std::uint8_t>("in.attention_mask");
  batch.token_type_ids = cs.get<std::int64_t>("in.token_type_ids");
  batch.alpha_oracle = cs.get<Scalar>("in.alpha_oracle");
  batch.labels = cs.get<std::int64_t>("in.labels");
  Model::Cache cache;
  const nn::ModelOutput<Scalar> out = model.forward(batch, Scalar(0.7), false, nullptr, cache);
  const Tensor<double> want = cs.get<double>("out.logits");
  double worst = 0, scale = 0;
  for (Index k = 0; k < want.numel(); ++k) {
    worst = std::max(worst, std::abs(static_cast<double>(out.logits.data()[k]) - want[k]));
    scale = std::max(scale, std::abs(want[k]));
  }
  CHECK(worst / scale < 1e-5);  // float32 weights and arithmetic against the reference's float64 run
  CHECK(std::abs(out.task_loss - cs.get<double>("out.task_loss")[0]) < 1e-5);

  // the eval program's path: data rebuilt from the cfg, tokenised with the exported vocabulary
  ParisProbe probe;
  const EvalResult r = eval_with_probe(dir, Split::test, &probe);
  CHECK(r.n_examples > 0);
  CHECK(std::isfinite(r.task_loss));
  CHECK(r.alpha.n_points > 0);

  // a state_dict from another configuration is rejected with the parameter named
  nlohmann::json other = cfg;
  other["d_ff"] = 128;
  dea::write_file_atomic(config_path(dir), other.dump());
  CHECK_THROWS_WITH(eval_with_probe(dir, Split::test), Catch::Contains("layers.0.ff.0.weight"));
  // a positional table of the wrong width is rejected before anything changes
  sd.put("pos_enc.pe", Tensor<double>({1, 64, 16}, 0.0), io::DType::F32);
  sd.save(checkpoint_path(dir));
  Model m2(model_config(c, 50, nn::Task::cls), rng);
  CHECK_THROWS_WITH(load_checkpoint(dir, m2, nullptr), Catch::Contains("pos_enc.pe"));
}

TEST_CASE("train: a resumed run may change only the resumable flags", "[pipeline]") {
  const TrainConfig saved = tiny("resume_rule");
  TrainConfig given = saved;
  given.steps = 40;
  given.threads = 2;
  given.out_dir = "elsewhere";
  const TrainConfig r = resume_config(saved, given, {"steps", "threads", "out_dir", "resume"});
  CHECK(r.steps == 40);
  CHECK(r.threads == 2);
  CHECK(r.resume);
  CHECK(r.out_dir == "elsewhere");
  CHECK(r.d_model == saved.d_model);
  TrainConfig other = saved;
  other.d_model = 32;
  CHECK_THROWS_WITH(resume_config(saved, other, {"d_model"}),
                    Catch::Contains("--d_model") && Catch::Contains("differs from the checkpoint's"));
  CHECK_NOTHROW(resume_config(saved, saved, {"d_model", "seed", "lr_main"}));  // repeating a saved value is allowed
  CHECK(resumable_flags().count("steps") == 1);
  CHECK(resumable_flags().count("lr_main") == 0);
}

TEST_CASE("flags: a FlagSet parses, refuses and documents every flag", "[pipeline]") {
  std::int64_t n = 3;
  double x = 0.5;
  bool sw = false;
  std::string name = "a";
  cli::FlagSet fs("prog [flags]", "A test program.");
  fs.integer("n", n, cli::IntRange::closed(1, 10), "a count")
      .real("x", x, cli::Range::closed_open(0, 1), "a fraction")
      .toggle("sw", sw, "a switch");
  fs.choice("name", name, {"a", "b"}, "a choice");
  const auto p = fs.parse(std::vector<std::string>{"--n=7", "--x", "0.25", "--sw", "--name", "b"});
  CHECK(n == 7);
  CHECK(x == 0.25);
  CHECK(sw);
  CHECK(name == "b");
  CHECK(p.flags.count("n") == 1);
  CHECK_THROWS_WITH(fs.parse(std::vector<std::string>{"--n", "11"}), Catch::Contains("--n: expected an integer in [1, 10], got '11'"));
  CHECK_THROWS_WITH(fs.parse(std::vector<std::string>{"--x", "1"}), Catch::Contains("[0, 1)"));
  CHECK_THROWS_WITH(fs.parse(std::vector<std::string>{"--name", "c"}), Catch::Contains("'a' or 'b'"));
  CHECK_THROWS_WITH(fs.parse(std::vector<std::string>{"--n", "2", "--bogus"}), Catch::Contains("unknown flag --bogus"));
  CHECK_THROWS_WITH(fs.parse(std::vector<std::string>{"file"}), Catch::Contains("unexpected argument 'file'"));
  const std::string h = fs.help();
  CHECK_THAT(h, Catch::Contains("--n N") && Catch::Contains("default 3, range [1, 10]") &&
                    Catch::Contains("range [0, 1)") && Catch::Contains("--sw"));
}

TEST_CASE("lm run: the learning-rate schedule and the decoder configuration of the flags", "[train][lm]") {
  TrainConfig c;
  c.model = "lm";
  c.lr_main = 1e-3;
  c.steps = 100;
  c.warmup_steps = 10;
  // constant: linear warmup to lr_main, then lr_main
  CHECK(lm_run::lr_at(c, 1) == Approx(1e-4));
  CHECK(lm_run::lr_at(c, 5) == Approx(5e-4));
  CHECK(lm_run::lr_at(c, 10) == Approx(1e-3));
  CHECK(lm_run::lr_at(c, 60) == 1e-3);
  CHECK(lm_run::lr_at(c, 100) == 1e-3);
  // cosine: from lr_main after the warmup down to 0.1 lr_main at the last step, halfway at 0.55 lr_main
  c.lr_schedule = "cosine";
  CHECK(lm_run::lr_at(c, 10) == Approx(1e-3));
  CHECK(lm_run::lr_at(c, 55) == Approx(0.55e-3));
  CHECK(lm_run::lr_at(c, 100) == Approx(1e-4));
  double prev = lm_run::lr_at(c, 10);
  for (std::int64_t s = 11; s <= 100; ++s) {
    const double lr = lm_run::lr_at(c, s);
    CHECK(lr <= prev);
    prev = lr;
  }
  c.warmup_steps = 0;
  CHECK(lm_run::lr_at(c, 1) < 1e-3);
  CHECK(lm_run::lr_at(c, 1) > 0.999e-3);

  // the TR-MoE flags reach the decoder's configuration
  c.mlp = "tr_moe";
  c.shared_expert = true;
  c.shared_d_ff = 48;
  c.d_ff = 32;
  c.routing = "balanced_hash";
  lm::DecoderConfig m = lm_run::decoder_config(c);
  CHECK(m.mlp_type == "tr_hash_engine");
  CHECK(m.shared_intermediate_size == 48);
  CHECK(m.intermediate_size == 32);
  CHECK(m.routing_strategy == "token_id_balanced_hash");
  c.shared_d_ff = 0;
  c.routing = "modulo_cyclic";
  m = lm_run::decoder_config(c);
  CHECK(m.shared_intermediate_size <= 0);
  CHECK(m.routing_strategy == "modulo_cyclic");
}

}  // namespace test_pipeline
