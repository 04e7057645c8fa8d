// Tests of mixed-precision training (train --precision bf16): for the encoder, DualExpertBert and the decoder LM with
// TR-MoE, a few bf16 steps give the same bits on 1 and 2 threads, a resumed bf16 run gives the uninterrupted run's
// bits, gradient isolation stays exact, the bf16 run differs from the fp32 run (the policy is applied) but stays
// close; the precision is recorded in config.json and in the checkpoint, and a run cannot change it.
#include <dea/train.hpp>
#include <dea/train/dea_bert.hpp>
#include <dea/train/lm.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <string>

// (the file in a namespace of its own, like the other test files)
namespace test_precision {

using namespace dea;
using namespace dea::train;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("dea_test_precision_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

/// Every tensor of two checkpoints, compared bit for bit (names, shapes and dtypes too).
bool same_tensors(const std::string& a, const std::string& b) {
  const io::SafeTensors x = io::SafeTensors::load(checkpoint_path(a)), y = io::SafeTensors::load(checkpoint_path(b));
  if (x.names() != y.names()) return false;
  for (const std::string& n : x.names()) {
    if (x.shape(n) != y.shape(n) || x.dtype(n) != y.dtype(n)) return false;
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

/// The library's thread count for a scope (a run's cfg.threads sets it for the process).
struct ThreadScope {
  int prev;
  ThreadScope() : prev(num_threads()) {}
  ~ThreadScope() { set_num_threads(prev); }
};

std::string config_precision(const std::string& dir) {
  return nlohmann::json::parse(read_file(config_path(dir))).at("precision").get<std::string>();
}
std::string checkpoint_metadata_precision(const std::string& dir) {
  return io::SafeTensors::load(checkpoint_path(dir)).metadata().at("precision");
}

/// The last training loss of a run of `c` (whatever its family), its checkpoint in c.out_dir.
using RunFn = std::function<double(const TrainConfig& c)>;

/// The checks every family shares, on runs of `base` (bf16, `steps` steps, its own out_dir names derived from
/// `name`): 1 and 2 threads, resume after `k` steps, fp32 against bf16, the precision in config.json and the
/// checkpoint.
void check_family(const std::string& name, TrainConfig base, std::int64_t k, const RunFn& run) {
  const ThreadScope restore;
  base.precision = "bf16";
  TrainConfig one = base, two = base, part = base, full32 = base;
  one.threads = 1;
  one.out_dir = temp_dir(name + "_bf16_t1");
  two.threads = 2;
  two.out_dir = temp_dir(name + "_bf16_t2");
  const double loss1 = run(one), loss2 = run(two);
  // 1 and 2 threads: the same losses, parameters and AdamW state, bit for bit
  CHECK(loss1 == loss2);
  CHECK(same_tensors(one.out_dir, two.out_dir));
  // the precision is recorded
  CHECK(config_precision(one.out_dir) == "bf16");
  CHECK(checkpoint_metadata_precision(one.out_dir) == "bf16");
  // resumed after k steps (on 2 threads): the uninterrupted run's bits
  part.threads = 2;
  part.out_dir = temp_dir(name + "_bf16_part");
  part.steps = k;
  run(part);
  CHECK_FALSE(same_tensors(one.out_dir, part.out_dir));  // (the comparison can fail)
  part.steps = base.steps;
  part.resume = true;
  const double loss_resumed = run(part);
  CHECK(loss_resumed == loss1);
  CHECK(same_tensors(one.out_dir, part.out_dir));
  // fp32: other bits (the policy is applied), a loss within a few percent
  full32.precision = "fp32";
  full32.threads = 1;
  full32.out_dir = temp_dir(name + "_fp32");
  const double loss32 = run(full32);
  CHECK(config_precision(full32.out_dir) == "fp32");
  CHECK(checkpoint_metadata_precision(full32.out_dir) == "fp32");
  CHECK_FALSE(same_tensors(one.out_dir, full32.out_dir));
  CHECK(loss1 != loss32);
  CHECK(std::abs(loss1 - loss32) <= 0.01 * std::abs(loss32));
  // a resumed run keeps its precision: the other one is refused, naming the flag, before anything is loaded
  TrainConfig other = part;
  other.precision = "fp32";
  CHECK_THROWS_WITH(resume_config(part, other, {"precision", "resume", "out_dir"}),
                    Catch::Contains("--precision: \"fp32\" differs from the checkpoint's \"bf16\""));
}

/// A Dual-Expert run's last task loss, after checking that the first batch's isolation check (run under the run's
/// precision) found exact zeros.
double checked_isolation(const encoder::TrainResult& r, const TrainConfig& c) {
  if (!c.resume) {
    CHECK(r.isolation_skipped.empty());
    CHECK(r.isolation.ok);
    CHECK(r.isolation.task_gate_grad == 0);
    CHECK(r.isolation.gate_main_grad == 0);
  }
  return r.last_task_loss;
}

TrainConfig tiny_encoder() {
  TrainConfig c;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 2;
  c.d_ff = 32;
  c.batch_size = 16;
  c.max_len = 32;
  c.n_per_source = 20;
  c.steps = 4;
  c.gamma_steps = 3;
  c.log_every = 2;
  c.eval_every = 4;
  c.eval_batches = 1;
  c.seed = 11;
  return c;
}

}  // namespace

TEST_CASE("bf16 training, encoder: thread invariance, bit-exact resume, isolation, close to fp32", "[precision]") {
  check_family("encoder", tiny_encoder(), 2, [](const TrainConfig& c) {
    encoder::TrainOptions<float> o;
    o.verbose = false;
    const encoder::TrainResult r = encoder::run_training<float>(c, o);
    return checked_isolation(r, c);
  });
}

TEST_CASE("bf16 training, DualExpertBert: thread invariance, bit-exact resume, isolation, close to fp32",
          "[precision]") {
  TrainConfig c;
  c.model = "dea_bert";
  c.hf_model = std::string(DEA_TEST_DATA_DIR) + "/bert/oracle/oracle_sim";
  c.batch_size = 8;
  c.max_len = 32;
  c.n_per_source = 20;
  c.steps = 4;
  c.gamma_steps = 3;
  c.eval_every = 4;
  c.eval_batches = 1;
  c.lr_main = 1e-3;
  c.seed = 5;
  c = dea_bert::fresh_config(c, {"model", "hf_model", "batch_size", "max_len", "lr_main"});
  check_family("dea_bert", c, 2, [](const TrainConfig& c) {
    dea_bert::TrainOptions<float> o;
    o.verbose = false;
    const encoder::TrainResult r = dea_bert::run_training<float>(c, o);
    return checked_isolation(r, c);
  });
}

TEST_CASE("bf16 training, decoder LM with TR-MoE: thread invariance, bit-exact resume, close to fp32",
          "[precision]") {
  TrainConfig c;
  c.model = "lm";
  c.data_source = "text";
  c.text = std::string(DEA_TEST_DATA_DIR) + "/lm/tiny_corpus.txt";
  c.d_model = 32;
  c.n_heads = 4;
  c.n_layers = 2;
  c.d_ff = 64;
  c.mlp = "tr_moe";
  c.experts = 4;
  c.top_k = 2;
  c.shared_expert = true;
  c.max_len = 32;
  c.batch_size = 8;
  c.lr_main = 3e-3;
  c.steps = 4;
  c.log_every = 2;
  c.eval_every = 4;
  c.eval_batches = 1;
  c.seed = 3;
  check_family("lm", c, 2, [](const TrainConfig& c) {
    lm_run::TrainOptions o;
    o.verbose = false;
    const lm_run::TrainResult r = lm_run::run_training<float>(c, o);
    REQUIRE(r.last_eval);
    return r.last_loss;
  });
}

TEST_CASE("bf16 accuracy: the decoder LM smoke runs reach a validation NLL within 2% of fp32's after 40 steps",
          "[precision]") {
  // the runs of tests/lm_train.cmake (grouped-query attention with TR-MoE, token-routed v2 with SwiGLU, causal
  // Dual-Expert with SwiGLU)
  const ThreadScope restore;
  for (const char* arch : {"gqa_trmoe", "trmha2_swiglu", "dea_swiglu"}) {
    TrainConfig c;
    c.model = "lm";
    c.data_source = "text";
    c.text = std::string(DEA_TEST_DATA_DIR) + "/lm/tiny_corpus.txt";
    c.d_model = 32;
    c.n_heads = 4;
    c.n_layers = 2;
    c.d_ff = 64;
    c.max_len = 32;
    c.batch_size = 8;
    c.lr_main = 3e-3;
    c.steps = 40;
    c.log_every = 40;
    c.eval_every = 40;
    c.seed = 7;
    c.threads = 1;
    if (std::string(arch) == "gqa_trmoe") {
      c.attention = "gqa";
      c.kv_heads = 2;
      c.mlp = "tr_moe";
      c.experts = 4;
      c.top_k = 2;
      c.shared_expert = true;
      c.shared_d_ff = 48;
      c.routing = "balanced_hash";
      c.label_smoothing = 0.1;
      c.warmup_steps = 5;
    } else {
      c.attention = std::string(arch) == "dea_swiglu" ? "dea" : "tr_mha_v2";
    }
    double nll[2];
    for (int k = 0; k < 2; ++k) {
      c.precision = k ? "bf16" : "fp32";
      c.out_dir = temp_dir(std::string("lm_accuracy_") + arch + "_" + c.precision);
      lm_run::TrainOptions o;
      o.verbose = false;
      const lm_run::TrainResult r = lm_run::run_training<float>(c, o);
      REQUIRE(r.last_eval);
      nll[k] = r.last_eval->nll;
    }
    INFO(arch << ": validation NLL fp32 " << nll[0] << ", bf16 " << nll[1]);
    CHECK(nll[1] != nll[0]);
    CHECK(std::abs(nll[1] - nll[0]) <= 0.02 * nll[0]);
  }
}

TEST_CASE("bf16: gradient isolation is exact under bf16 products, which do change the task gradients",
          "[precision]") {
  const ThreadScope restore;
  set_num_threads(1);
  TrainConfig c = tiny_encoder();
  c.out_dir = temp_dir("isolation");
  const encoder::RunData d = encoder::build_data(c);
  auto report = [&](Precision p) {
    const ScopedPrecision products(p);
    auto model = encoder::encoder_family<float>(c).build(d);
    encoder::BatchOrder order(d.size(encoder::Split::train), static_cast<std::size_t>(c.batch_size), c.seed);
    Rng mask(1);
    const auto b = encoder::make_batch<float>(d, encoder::Split::train, order.at(1), c.max_len, &mask);
    return model->verify_gradient_isolation(b, 0.5f, c.seed);
  };
  const nn::ModelIsolationReport r32 = report(Precision::fp32), r16 = report(Precision::bf16);
  CHECK(r16.ok);
  CHECK(r16.task_gate_grad == 0);  // the task loss writes no gate gradient
  CHECK(r16.gate_main_grad == 0);  // the gate loss writes only the gate's
  CHECK(r16.gate_rel_grad == 0);
  CHECK(r16.gate_gate_grad > 0);
  CHECK(r16.task_rel_grad != r32.task_rel_grad);  // the products did run in bf16
}

TEST_CASE("bf16: a Dual-Expert layer's gate, its Q and K inputs included, is the fp32 gate to the bit",
          "[precision]") {
  // Q and K are the gate's inputs and its experts' (fp32) products read them: under bf16 they must be fp32
  // products, so alpha-hat, the gate loss and the gate's gradients are fp32's bits, while V, the output projection
  // and the backward products are bf16 (the output and the task gradients differ).
  const ThreadScope restore;
  set_num_threads(2);
  const Index B = 2, T = 24, D = 64, H = 4;
  Rng rng(11);
  DualExpertAttention<float> layer(D, H, rng);
  Mat<float> x(B * T, D), dy(B * T, D);
  init::normal(x, rng, 0, 1);
  init::normal(dy, rng, 0, 1);
  Tensor<float> oracle({B, T, T}, std::numeric_limits<float>::quiet_NaN());
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < T; ++i)
      for (Index j = 0; j < T; j += 3) oracle[(b * T + i) * T + j] = float(rng.uniform(0, 0.95));
  AttnInputs<float> in(B, T);
  in.set_oracle(oracle).set_gamma_mix(0.5f).set_keep_alpha_hat(true);
  struct Run {
    Mat<float> Q, K, V, y, dx;
    std::vector<float> alpha_hat, gate_grads, task_grads;
    float loss_gate = 0;
  };
  auto run = [&](Precision p) {
    const ScopedPrecision products(p);
    DualExpertAttention<float>::Cache c;
    Run r;
    layer.zero_grad();
    r.y = layer.forward(x, in, c);
    r.Q = c.Q;
    r.K = c.K;
    r.V = c.V;
    r.alpha_hat.assign(c.alpha_hat.begin(), c.alpha_hat.end());
    r.loss_gate = c.loss_gate;
    r.dx = layer.backward(dy, c);
    for (Param<float>* q : layer.parameters())
      if (q->group != "gate") r.task_grads.insert(r.task_grads.end(), q->grad.data(), q->grad.data() + q->numel());
    layer.zero_grad();
    layer.backward_gate(c);
    for (Param<float>* q : layer.parameters())
      r.gate_grads.insert(r.gate_grads.end(), q->grad.data(), q->grad.data() + q->numel());
    return r;
  };
  const Run f = run(Precision::fp32), h = run(Precision::bf16);
  CHECK(h.Q == f.Q);
  CHECK(h.K == f.K);
  REQUIRE(!f.alpha_hat.empty());
  CHECK(h.alpha_hat == f.alpha_hat);
  CHECK(h.loss_gate == f.loss_gate);
  CHECK(h.gate_grads == f.gate_grads);
  CHECK(h.V != f.V);  // the rest did run in bf16
  CHECK(h.y != f.y);
  CHECK(h.dx != f.dx);
  CHECK(h.task_grads != f.task_grads);

  // incremental decoding: the cached keys are fp32 products under either precision, the values bf16 ones
  auto decode = [&](Precision p) {
    const ScopedPrecision products(p);
    DualExpertAttention<float>::DecodeCache dc(B);
    Mat<float> xb(B, D);
    for (Index t = 0; t < 3; ++t) {
      for (Index b = 0; b < B; ++b) xb.row(b) = x.row(b * T + t);
      layer.forward_decode(xb, dc);
    }
    return dc;
  };
  const auto df = decode(Precision::fp32), dh = decode(Precision::bf16);
  REQUIRE(dh.cap == df.cap);
  for (Index b = 0; b < B; ++b) {
    CHECK(dh.K.middleRows(b * dh.cap, 3) == df.K.middleRows(b * df.cap, 3));
    CHECK(dh.V.middleRows(b * dh.cap, 3) != df.V.middleRows(b * df.cap, 3));
  }
}

TEST_CASE("bf16: the checkpoint's precision must be the configuration's; an old checkpoint without it is fp32",
          "[precision]") {
  const ThreadScope restore;
  TrainConfig c = tiny_encoder();
  c.threads = 1;
  c.steps = 2;
  c.eval_every = 2;
  c.precision = "bf16";
  c.out_dir = temp_dir("metadata");
  encoder::TrainOptions<float> o;
  o.verbose = false;
  encoder::run_training<float>(c, o);
  // a configuration edited to fp32 (config.json) no longer loads the bf16 checkpoint
  TrainConfig edited = c;
  edited.precision = "fp32";
  edited.steps = 3;
  edited.resume = true;
  CHECK_THROWS_WITH(encoder::run_training<float>(edited, o),
                    Catch::Contains("checkpoint was trained with --precision bf16") &&
                        Catch::Contains("says --precision fp32"));
  // a checkpoint without the field (written before mixed precision) reads as fp32
  const std::string path = checkpoint_path(c.out_dir);
  {
    io::SafeTensors st = io::SafeTensors::load(path);
    CHECK(checkpoint_precision(st, path) == Precision::bf16);
    st.set_metadata(std::map<std::string, std::string>{{"format", "dea-train-checkpoint"}, {"step", "2"}});
    st.save(path);
    CHECK(checkpoint_precision(io::SafeTensors::load(path), path) == Precision::fp32);
  }
  CHECK_NOTHROW(encoder::run_training<float>(edited, o));
  TrainConfig back = edited;
  back.precision = "bf16";
  back.steps = 4;
  CHECK_THROWS_WITH(encoder::run_training<float>(back, o), Catch::Contains("checkpoint was trained with --precision fp32"));
  // a config.json without the key (an older run, or the reference's) reads as fp32
  nlohmann::json j = to_json(c);
  j.erase("precision");
  CHECK(config_from_json(j)->precision == "fp32");
  j["precision"] = "fp16";
  CHECK_THROWS_WITH(config_from_json(j), Catch::Contains("--precision") && Catch::Contains("'fp32' or 'bf16'"));
}

}  // namespace test_precision
