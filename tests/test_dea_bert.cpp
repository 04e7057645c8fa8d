// Tests of include/dea/bert/dual_expert_bert.hpp (the reference's DualExpertBert): the two public dea_bert golden
// cases in double (1e-9) and float (the golden set's tolerances) with the reference's decision-pair counts, finite
// differences in double of every parameter (task path with alpha-hat held fixed in the scores, with and without an
// oracle, padded rows, dropout on; gate path of every W_gate / c_gate against loss_gate, with and without targets),
// gradient isolation, the accumulation contract, the tiled kernel against the reference one, 1 and 2 threads bit for
// bit for a training step, the conversion from a Hugging Face model directory (q/k/v copied exactly, the rest of BERT
// unchanged, the fresh parameters as the reference initialises them), names, groups and bad input.
#include <catch2/catch.hpp>
#include <dea/bert/dual_expert_bert.hpp>
#include <dea/bert/hf_dir.hpp>
#include <dea/core/parallel.hpp>
#include <dea/interop/dea_bert_case.hpp>
#include <dea/io/safetensors.hpp>
#include <dea/testing/gradcheck.hpp>
#include <dea/train/dual_expert_family.hpp>
#include <dea/train/trainer.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_dea_bert {

using namespace dea;
using Catch::Contains;
using DB = bert::DualExpertBert<double>;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string data(const std::string& rel) { return std::string(DEA_TEST_DATA_DIR) + "/bert/" + rel; }

double dot(const Mat<double>& a, const Mat<double>& b) { return a.cwiseProduct(b).sum(); }

/// 2 layers, 2 heads of 4, no padding row (every lookup has a gradient), dropout `p` everywhere.
bert::BertConfig tiny_config(double p = 0) {
  bert::BertConfig c;
  c.vocab_size = 13;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 12;
  c.max_position_embeddings = 9;
  c.type_vocab_size = 3;
  c.pad_token_id = -1;
  c.hidden_dropout_prob = p;
  c.attention_probs_dropout_prob = p;
  c.initializer_range = 0.5;
  return c;
}

/// A tiny DualExpertBert with 3 classes, every parameter moved off its initial value (biases 0, LayerNorms 1 / 0,
/// c_gate -0.5), so that every gradient is exercised.
DB tiny_model(double p = 0, std::uint64_t seed = 7, DeaKernel kernel = DeaKernel::reference) {
  Rng rng(seed);
  bert::DualExpertBertOptions opt;
  opt.n_classes = 3;
  opt.head_dropout = p;
  opt.kernel = kernel;
  DB m(tiny_config(p), rng, opt);
  Rng pr(seed + 100);
  for (Param<double>* q : m.parameters())
    for (Index k = 0; k < q->numel(); ++k) q->value[k] += 0.3 * pr.normal();
  return m;
}

struct BatchSpec {
  bool oracle = true, targets = false;
  std::uint64_t seed = 3;
};

/// B = 3 sequences of T = 6: all real, the last two padded, only three real. The oracle has NaN holes and values
/// slightly outside [0, 0.95] (clamped); targets point at real keys (-1 for some rows).
DB::Batch tiny_batch(const BatchSpec& s = {}) {
  const Index B = 3, T = 6, V = 13;
  DB::Batch b;
  Rng rng(s.seed);
  b.input_ids = Tensor<std::int64_t>({B, T});
  b.token_type_ids = Tensor<std::int64_t>({B, T});
  b.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  for (Index k = 0; k < B * T; ++k) {
    b.input_ids[k] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(V)));
    b.token_type_ids[k] = (k % T) >= T / 2 ? 1 : 0;
  }
  for (Index t = 4; t < T; ++t) b.attention_mask[1 * T + t] = 0;
  for (Index t = 3; t < T; ++t) b.attention_mask[2 * T + t] = 0;
  b.labels = Tensor<std::int64_t>({B});
  for (Index k = 0; k < B; ++k) b.labels[k] = static_cast<std::int64_t>(k % 3);
  if (s.oracle) {
    b.alpha_oracle = Tensor<double>({B, T, T});
    for (Index k = 0; k < b.alpha_oracle.numel(); ++k)
      b.alpha_oracle[k] = rng.uniform() < 0.35 ? kNaN : rng.uniform(-0.05, 1.0);
    if (s.targets) {
      b.target_idx = Tensor<std::int64_t>({B, T}, -1);
      for (Index bb = 0; bb < B; ++bb)
        for (Index i = 0; i < T; ++i) {
          if (rng.uniform() < 0.3) continue;
          const Index t = static_cast<Index>(rng.below(3));  // a real key of every sequence
          b.target_idx[bb * T + i] = t;
          b.alpha_oracle[(bb * T + i) * T + t] = 0.3 + 0.5 * rng.uniform();
        }
    }
  }
  return b;
}

/// The task path: every parameter against <logits, R1> + <last_hidden_state, R2> (or the mean cross-entropy with
/// `ce`), alpha-hat held at its unperturbed values in the scores (the task path reads it as a constant). Training
/// mode with a fixed dropout stream when the model has dropout.
testing::GradCheckReport check_task(DB& model, const DB::Batch& batch, double gamma, bool ce, bool training) {
  Rng drop(77);
  DB::Cache c0;
  const auto out0 = model.forward(batch, gamma, training, &drop, c0);
  model.freeze_alpha_hat(c0);
  const Mat<double> R1 = testing::random_projection(out0.logits.rows(), out0.logits.cols(), 11);
  const Mat<double> R2 = testing::random_projection(out0.last_hidden_state.rows(), out0.last_hidden_state.cols(), 12);
  auto objective = [&] {
    drop.reseed(77);
    DB::Cache c;
    const auto out = model.forward(batch, gamma, training, &drop, c);
    return ce ? out.task_loss : dot(out.logits, R1) + dot(out.last_hidden_state, R2);
  };
  auto analytic = [&] {
    drop.reseed(77);
    model.zero_grad();
    DB::Cache c;
    model.forward(batch, gamma, training, &drop, c);
    if (ce)
      model.backward_task(c);
    else
      model.backward_outputs(&R1, &R2, c);
  };
  testing::GradCheck gc;
  gc.add(model.parameters());
  auto rep = gc.run(objective, analytic);
  model.clear_frozen_alpha_hat();
  return rep;
}

/// The gate path: W_gate / c_gate of every layer against loss_gate, alpha-hat fixed in the scores (so a layer's
/// gate reaches later layers only through its own gate loss, as in the reference's graph); the gate backward must
/// leave every main parameter exactly zero.
testing::GradCheckReport check_gate(DB& model, const DB::Batch& batch, double gamma) {
  DB::Cache c0;
  model.forward(batch, gamma, false, nullptr, c0);
  model.freeze_alpha_hat(c0);
  bool main_zero = true;
  auto objective = [&] {
    DB::Cache c;
    return model.forward(batch, gamma, false, nullptr, c).loss_gate;
  };
  auto analytic = [&] {
    model.zero_grad();
    DB::Cache c;
    model.forward(batch, gamma, false, nullptr, c);
    model.backward_gate(c);
    for (Param<double>* p : model.parameters("main")) main_zero = main_zero && p->grad.cwiseAbs().maxCoeff() == 0.0;
  };
  testing::GradCheck gc;
  for (Param<double>* p : model.parameters("gate")) gc.add(p->name, p->value.data(), p->grad.data(), p->numel());
  auto rep = gc.run(objective, analytic);
  CHECK(main_zero);
  model.clear_frozen_alpha_hat();
  return rep;
}

bool is_pooler(const std::string& name) { return name.find("pooler") != std::string::npos; }

/// "name (rel e)" of the tensor with the largest relative error of a report.
std::string worst_tensor(const testing::GradCheckReport& r) {
  const testing::TensorError* w = nullptr;
  for (const auto& t : r.tensors)
    if (!w || t.rel_error > w->rel_error) w = &t;
  std::ostringstream os;
  os.precision(3);
  if (w) os << w->name << std::scientific << " (rel " << w->rel_error << ", abs " << w->max_abs_error << ", max|g| "
            << w->max_abs_grad << ")";
  return w ? os.str() : "none";
}

/// Runs the enclosing scope at n threads (the finite-difference checks run thousands of forwards of a tiny model,
/// where waking a second thread costs more than the work; 1 and 2 threads give the same bits, tested below).
struct ThreadScope {
  explicit ThreadScope(int n) : prev(num_threads()) { set_num_threads(n); }
  ~ThreadScope() { set_num_threads(prev); }
  int prev;
};

}  // namespace

// ------------------------------------------------------------------------------------------------ golden

TEST_CASE("dea_bert golden cases: every output and gradient, double and float", "[dea_bert][golden]") {
  for (const char* name : {"dea_bert_gamma05", "dea_bert_gamma1_cells"}) {
    INFO(name);
    const io::SafeTensors cs = io::SafeTensors::load(data(std::string(name) + ".safetensors"));
    std::size_t n_expected = 0;
    for (const std::string& t : cs.names()) n_expected += t.rfind("out.", 0) == 0 || t.rfind("grad.", 0) == 0;
    REQUIRE(n_expected == 8 + 47);  // 8 outputs, 47 parameters
    for (const bool is_float : {false, true}) {
      const io::SafeTensors got =
          is_float ? interop::run_dea_bert_case<float>(cs) : interop::run_dea_bert_case<double>(cs);
      const auto cmp = interop::compare_bert_case(cs, got, is_float);
      CHECK(cmp.size() == n_expected);
      double worst = 0, worst_out = 0;
      std::string worst_name;
      for (const auto& c : cmp) {
        INFO(name << (is_float ? " float: " : " double: ") << c.name << " rel " << c.rel_error << " max|ref| "
                  << c.max_expected);
        CHECK_FALSE(c.missing);
        CHECK(c.ok);
        if (c.name.rfind("out.", 0) == 0) worst_out = std::max(worst_out, c.rel_error);
        if (c.rel_error > worst) {
          worst = c.rel_error;
          worst_name = c.name;
        }
      }
      // the reference's gate statistics: the same decision pairs in every layer
      CHECK(interop::dea_bert_decision_pair_differences(cs, got).empty());
      for (const char* l : {"0", "1"}) {
        const std::string key = std::string("stats.") + l + ".loss_spot";
        CHECK(std::abs(std::stod(got.metadata().at(key)) - std::stod(cs.metadata().at(key))) <
              (is_float ? 1e-4 : 1e-12));
      }
      // the pooler is unused: its gradient is exactly zero
      CHECK(got.get<double>("grad.bert.pooler.dense.weight").data.cwiseAbs().maxCoeff() == 0.0);
      WARN(name << (is_float ? " float" : " double") << ": worst relative error " << worst << " (" << worst_name
                << "), outputs " << worst_out);
    }
  }
}

TEST_CASE("dea_bert golden: the model's forward alone reproduces the losses and alpha-hat of the case",
          "[dea_bert][golden]") {
  // the library API (not the interop runner): parameters by name, forward, the per-layer gate losses
  const io::SafeTensors cs = io::SafeTensors::load(data("dea_bert_gamma05.safetensors"));
  const bert::BertConfig cfg = interop::bert_case_config(cs);
  Rng rng(1);
  bert::DualExpertBertOptions opt;
  opt.head_dropout = 0;
  DB model(cfg, rng, opt);
  io::load_parameters(model.parameters(), cs, true, {"in.", "out.", "grad."});
  DB::Batch b;
  b.input_ids = cs.get<std::int64_t>("in.input_ids");
  b.attention_mask = cs.get<std::uint8_t>("in.attention_mask");
  b.token_type_ids = cs.get<std::int64_t>("in.token_type_ids");
  b.labels = cs.get<std::int64_t>("in.labels");
  b.alpha_oracle = cs.get<double>("in.alpha_oracle");
  DB::Cache c;
  const auto out = model.forward(b, 0.5, false, nullptr, c);
  const double tl = cs.get<double>("out.task_loss")[0], lg = cs.get<double>("out.loss_gate")[0];
  CHECK(std::abs(out.task_loss - tl) < 1e-12 * std::abs(tl));
  CHECK(std::abs(out.loss_gate - lg) < 1e-12 * std::abs(lg));
  CHECK(std::abs(out.loss() - (tl + lg)) < 1e-12 * (tl + lg));
  CHECK(std::abs(out.loss_gate - 0.5 * (out.layer_loss_gate[0] + out.layer_loss_gate[1])) < 1e-15);
  const Tensor<double> ah = cs.get<double>("out.alpha_hat.1");
  CHECK((model.alpha_hat(c, 1).data - ah.data).cwiseAbs().maxCoeff() < 1e-12);
  CHECK(out.layer_stats[1].n_decision_pairs == 187);
  // without the oracle (the inference path): no gate loss, and backward_gate is a no-op
  b.alpha_oracle = Tensor<double>();
  const auto inf = model.forward(b, 0.5, false, nullptr, c);
  CHECK(inf.loss_gate == 0.0);
  CHECK(inf.layer_loss_gate == std::vector<double>{0.0, 0.0});
  CHECK(inf.layer_supervised == std::vector<std::uint8_t>{0, 0});
  model.zero_grad();
  model.backward_gate(c);
  for (Param<double>* p : model.parameters()) CHECK(p->grad.cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("dea_bert cases: a missing or extra tensor and a bad oracle are refused by name before the model is built",
          "[dea_bert][golden][bad_input]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("dea_bert_gamma05.safetensors"));
  // a copy of the case without `drop` and with `extra` (F64, the case's own values)
  auto variant = [&](const std::string& drop, const std::string& extra, const std::string& like) {
    io::SafeTensors v("variant.safetensors");
    v.set_metadata(cs.metadata());
    for (const std::string& n : cs.names()) {
      if (n == drop) continue;
      if (io::dtype_is_floating(cs.dtype(n)))
        v.put(n, cs.get<double>(n), io::DType::F64);
      else
        v.put(n, cs.get<std::int64_t>(n), io::DType::I64);
    }
    if (!extra.empty()) v.put(extra, cs.get<double>(like), io::DType::F64);
    return io::SafeTensors::parse(v.serialize(), "variant.safetensors");
  };
  CHECK_THROWS_WITH(interop::run_dea_bert_case<double>(variant("bert.encoder.layer.1.attention.self.dea.W_rel", "", "")),
                    Contains("missing") && Contains("bert.encoder.layer.1.attention.self.dea.W_rel") &&
                        Contains("[4, 8, 8]"));
  CHECK_THROWS_WITH(interop::run_dea_bert_case<double>(variant("", "bert.encoder.layer.0.attention.self.dea.W_o.weight",
                                                               "bert.pooler.dense.weight")),
                    Contains("dea.W_o.weight") && Contains("no parameter"));
  CHECK_THROWS_WITH(interop::run_dea_bert_case<double>(variant("", "bert.encoder.layer.0.attention.self.query.weight",
                                                               "bert.pooler.dense.weight")),
                    Contains("query.weight") && Contains("no parameter"));
  io::SafeTensors bad = variant("in.alpha_oracle", "in.alpha_oracle", "out.alpha_hat.0");  // [B, A, T, T]
  CHECK_THROWS_WITH(interop::run_dea_bert_case<double>(bad), Contains("in.alpha_oracle") && Contains("[2, 12, 12]"));
  io::SafeTensors other = variant("", "", "");
  other.set_metadata("kind", "bert_model");
  CHECK_THROWS_WITH(interop::run_dea_bert_case<double>(other), Contains("kind = dea_bert"));
}

// ------------------------------------------------------------------------------------------------ gradients

TEST_CASE("DualExpertBert: finite differences of every parameter, task path, with and without an oracle",
          "[dea_bert][gradcheck]") {
  const ThreadScope one(1);
  struct Case {
    const char* what;
    BatchSpec batch;
    double gamma, dropout;
    bool ce;
  };
  for (const Case& k : {Case{"oracle, gamma 0.5, <logits, R1> + <last_hidden_state, R2>", {true, false, 3}, 0.5, 0,
                             false},
                        Case{"no oracle, <logits, R1> + <last_hidden_state, R2>", {false, false, 4}, 0.0, 0, false},
                        Case{"oracle and targets, gamma 0.3, cross-entropy", {true, true, 5}, 0.3, 0, true},
                        Case{"oracle, gamma 1, dropout 0.2 (training)", {true, false, 6}, 1.0, 0.2, false}}) {
    INFO(k.what);
    DB model = tiny_model(k.dropout);
    const auto batch = tiny_batch(k.batch);
    const auto rep = check_task(model, batch, k.gamma, k.ce, k.dropout > 0);
    INFO(rep.str());
    CHECK(rep.ok);
    CHECK(rep.tensors.size() == 47);
    // every parameter the task reaches has a gradient; the gate and the unused pooler have none at all
    for (const auto& t : rep.tensors) {
      const bool none = is_pooler(t.name) || optim::is_gate_param_name(t.name);
      INFO(t.name);
      if (none)
        CHECK(t.max_abs_grad == 0.0);
      else
        CHECK(t.max_abs_grad > 0.0);
    }
    WARN("DualExpertBert task gradcheck (" << k.what << "): worst " << worst_tensor(rep));
  }
}

TEST_CASE("DualExpertBert: finite differences of every W_gate and c_gate against loss_gate", "[dea_bert][gradcheck]") {
  const ThreadScope one(1);
  for (const bool targets : {false, true}) {
    INFO("targets " << targets);
    DB model = tiny_model();
    const auto batch = tiny_batch({true, targets, 8});
    const auto rep = check_gate(model, batch, 0.5);
    INFO(rep.str());
    CHECK(rep.ok);
    CHECK(rep.tensors.size() == 4);
    for (const auto& t : rep.tensors) CHECK(t.max_abs_grad > 0.0);
    WARN("DualExpertBert gate gradcheck (targets " << targets << "): worst " << worst_tensor(rep));
  }
}

TEST_CASE("DualExpertBert: gradient isolation, exact zeros in both directions", "[dea_bert][isolation]") {
  DB model = tiny_model(0.1);
  const auto batch = tiny_batch({true, false, 9});
  const nn::ModelIsolationReport r = model.verify_gradient_isolation(batch, 0.5, 3);
  CHECK(r.ok);
  CHECK(r.task_gate_grad == 0.0);
  CHECK(r.task_rel_grad > 0.0);
  CHECK(r.gate_main_grad == 0.0);
  CHECK(r.gate_rel_grad == 0.0);
  CHECK(r.gate_gate_grad > 0.0);
  for (Param<double>* p : model.parameters()) REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);  // cleared after

  // one backward of task_loss + loss_gate is the sum of the two separate ones, into disjoint parameter sets
  DB::Cache c;
  Rng d1(4);
  model.forward(batch, 0.5, true, &d1, c);
  model.zero_grad();
  model.backward(c);
  std::map<std::string, Vec<double>> both;
  for (Param<double>* p : model.parameters()) both[p->name] = p->grad;
  model.zero_grad();
  model.backward_task(c);
  for (Param<double>* p : model.parameters("gate")) CHECK(p->grad.cwiseAbs().maxCoeff() == 0.0);
  for (Param<double>* p : model.parameters("main")) CHECK(p->grad == both[p->name]);
  model.zero_grad();
  model.backward_gate(c);
  for (Param<double>* p : model.parameters("main")) CHECK(p->grad.cwiseAbs().maxCoeff() == 0.0);
  for (Param<double>* p : model.parameters("gate")) {
    CHECK(p->grad == both[p->name]);
    CHECK(p->grad.cwiseAbs().maxCoeff() > 0.0);
  }
  CHECK_THROWS_WITH(model.verify_gradient_isolation(tiny_batch({false, false, 9})), Contains("alpha_oracle"));
}

TEST_CASE("DualExpertBert: gradients accumulate; the tiled kernel agrees with the reference kernel",
          "[dea_bert][contract]") {
  const auto batch = tiny_batch({true, true, 10});
  DB ref = tiny_model(0.1, 21, DeaKernel::reference), tiled = tiny_model(0.1, 21, DeaKernel::tiled);
  auto run = [&](DB& m, int times) {
    Rng d(5);
    DB::Cache c;
    const auto out = m.forward(batch, 0.4, true, &d, c);
    m.zero_grad();
    for (int k = 0; k < times; ++k) m.backward(c);
    return out;
  };
  const auto o1 = run(ref, 1);
  std::vector<Vec<double>> once;
  for (Param<double>* p : ref.parameters()) once.push_back(p->grad);
  run(ref, 2);
  const auto pr = ref.parameters();
  for (std::size_t i = 0; i < pr.size(); ++i)
    CHECK((pr[i]->grad - 2.0 * once[i]).cwiseAbs().maxCoeff() <= 1e-14 * std::max(1.0, once[i].cwiseAbs().maxCoeff()));

  const auto ot = run(tiled, 1);
  CHECK(std::abs(ot.task_loss - o1.task_loss) <= 1e-12 * std::abs(o1.task_loss));
  CHECK(std::abs(ot.loss_gate - o1.loss_gate) <= 1e-12 * std::abs(o1.loss_gate));
  CHECK((ot.logits - o1.logits).cwiseAbs().maxCoeff() <= 1e-12 * o1.logits.cwiseAbs().maxCoeff());
  const auto pt = tiled.parameters();
  for (std::size_t i = 0; i < pt.size(); ++i) {
    INFO(pt[i]->name);
    CHECK((pt[i]->grad - once[i]).cwiseAbs().maxCoeff() <= 1e-11 * std::max(1e-300, once[i].cwiseAbs().maxCoeff()));
  }
}

// ------------------------------------------------------------------------------------------------ threads

namespace {
/// Everything one AdamW training step produces (dropout on, padding, an oracle with holes): losses, logits, the
/// gradients and the updated parameters of a DualExpertBert in S at `threads` threads, as bytes.
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
  Rng init(1);
  bert::DualExpertBert<S> model(cfg, init);
  const Index B = 6, T = 40;
  typename bert::DualExpertBert<S>::Batch batch;
  batch.input_ids = Tensor<std::int64_t>({B, T});
  batch.token_type_ids = Tensor<std::int64_t>({B, T}, 0);
  batch.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  batch.alpha_oracle = Tensor<S>({B, T, T}, std::numeric_limits<S>::quiet_NaN());
  batch.labels = Tensor<std::int64_t>({B});
  Rng d(2);
  for (Index k = 0; k < B * T; ++k) batch.input_ids[k] = static_cast<std::int64_t>(d.below(50));
  for (Index b = 0; b < B; ++b) {
    batch.labels[b] = b % 2;
    const Index real = T - 6 * b;  // b = 0 unpadded ... b = 5 with 10 real tokens
    for (Index t = 0; t < T; ++t) {
      if (t >= real) batch.attention_mask[b * T + t] = 0;
      if (t >= real / 2) batch.token_type_ids[b * T + t] = 1;
    }
    for (Index i = 1; i < real / 2; ++i)  // the D_alpha block: text A as queries, text B as keys
      for (Index j = real / 2; j < real; ++j)
        if (d.uniform() < 0.8) batch.alpha_oracle[(b * T + i) * T + j] = static_cast<S>(d.uniform(0, 0.95));
  }
  set_num_threads(threads);
  optim::AdamW<S> opt = model.make_optimizer();
  Rng rng(3);
  typename bert::DualExpertBert<S>::Cache c;
  const auto out = model.forward(batch, S(0.5), true, &rng, c);
  opt.zero_grad();
  model.backward(c);
  std::vector<char> v;
  auto add = [&](const S* p, Index n) {
    const char* b = reinterpret_cast<const char*>(p);
    v.insert(v.end(), b, b + n * Index(sizeof(S)));
  };
  for (Param<S>* p : model.parameters()) add(p->grad.data(), p->numel());
  opt.clip_grad_norms();
  opt.step();
  set_num_threads(1);
  add(out.logits.data(), out.logits.size());
  add(&out.task_loss, 1);
  add(&out.loss_gate, 1);
  add(out.last_hidden_state.data(), out.last_hidden_state.size());
  for (Param<S>* p : model.parameters()) add(p->value.data(), p->numel());
  REQUIRE(out.layer_stats[1].n_decision_pairs > 0);
  return v;
}
}  // namespace

TEST_CASE("DualExpertBert: 1 and 2 threads give identical bits for a training step (dropout, padding, oracle)",
          "[dea_bert][threads]") {
  const auto d1 = step_bits<double>(1), d2 = step_bits<double>(2), d1b = step_bits<double>(1);
  CHECK(d1 == d2);
  CHECK(d1 == d1b);
  const auto f1 = step_bits<float>(1), f2 = step_bits<float>(2);
  CHECK(f1 == f2);
}

// ------------------------------------------------------------------------------------------------ construction

TEST_CASE("DualExpertBert from a Hugging Face model directory: q/k/v copied exactly, the rest of BERT unchanged, "
          "fresh W_rel / W_gate / c_gate / cls_head as the reference initialises them", "[dea_bert][hf_dir]") {
  const std::string dir = data("hf_fixtures/f32");
  const io::SafeTensors st = io::SafeTensors::load(dir + "/model.safetensors");
  Rng rng(5);
  bert::HfLoadReport rep;
  DB model = bert::load_dual_expert_bert<double>(dir, rng, {}, &rep);
  CHECK(rep.n_parameters == 39);
  const Index H = 32, A = 4, d = 8, L = 2;
  REQUIRE(model.n_layers() == L);
  REQUIRE(model.config().hidden_size == H);
  std::size_t from_file = 0;
  for (Param<double>* p : model.parameters()) {
    INFO(p->name);
    REQUIRE((p->name.rfind("bert.", 0) == 0 || p->name.rfind("cls_head.1.", 0) == 0));
    std::string hf = p->name.rfind("bert.", 0) == 0 ? p->name.substr(5) : "";
    for (const auto& [w, q] : {std::pair<std::string, std::string>{"dea.W_q.", "query."}, {"dea.W_k.", "key."},
                               {"dea.W_v.", "value."}}) {
      const std::size_t at = hf.find(w);
      if (at != std::string::npos) hf = hf.substr(0, at) + q + hf.substr(at + w.size());
    }
    if (!hf.empty() && st.has(hf)) {  // copied: the stored F32 values, exactly
      const Tensor<float> f = st.get<float>(hf);
      REQUIRE(f.shape == p->shape);
      for (Index k = 0; k < p->numel(); ++k) REQUIRE(p->value[k] == static_cast<double>(f[k]));
      ++from_file;
      continue;
    }
    const std::string& n = p->name;
    if (n.find("W_rel") != std::string::npos) {  // orthogonal per head
      REQUIRE(p->shape == Shape({A, d, d}));
      for (Index h = 0; h < A; ++h) {
        const Eigen::Map<const Mat<double>> w(p->value.data() + h * d * d, d, d);
        CHECK((w * w.transpose() - Mat<double>::Identity(d, d)).cwiseAbs().maxCoeff() < 1e-12);
      }
    } else if (n.find("W_gate") != std::string::npos) {  // Xavier uniform, bound sqrt(6 / (2d + 3))
      REQUIRE(p->shape == Shape({A, 2 * d + 2}));
      const double bound = std::sqrt(6.0 / (2 * d + 3));
      CHECK(p->value.cwiseAbs().maxCoeff() <= bound);
      CHECK(p->value.cwiseAbs().maxCoeff() > 0.5 * bound);
      CHECK(p->group == "gate");
    } else if (n.find("c_gate") != std::string::npos) {
      CHECK(p->value == Vec<double>::Constant(A, -0.5));
      CHECK(p->group == "gate");
    } else if (n.rfind("cls_head.1.", 0) == 0) {  // PyTorch's default Linear: U(+-1/sqrt(H))
      CHECK(p->shape == (n == "cls_head.1.weight" ? Shape({2, H}) : Shape({2})));
      CHECK(p->value.cwiseAbs().maxCoeff() <= 1 / std::sqrt(double(H)));
      CHECK(p->value.cwiseAbs().maxCoeff() > 0.0);
    } else {
      FAIL("a parameter neither copied nor fresh: " << n);
    }
  }
  CHECK(from_file == 39);  // every BERT tensor of the file, query / key / value as W_q / W_k / W_v
  // the same in float: the F32 values themselves
  Rng rng_f(5);
  bert::DualExpertBert<float> mf = bert::load_dual_expert_bert<float>(dir, rng_f);
  const Tensor<float> q0 = st.get<float>("encoder.layer.1.attention.self.query.weight");
  const Param<float>& wq = find_param(mf.parameters(), "bert.encoder.layer.1.attention.self.dea.W_q.weight");
  for (Index k = 0; k < q0.numel(); ++k) REQUIRE(wq.value[k] == q0[k]);
  // the same draws give the same fresh parameters; another seed others
  Rng rng2(5), rng3(6);
  DB again = bert::load_dual_expert_bert<double>(dir, rng2), other = bert::load_dual_expert_bert<double>(dir, rng3);
  const auto pa = model.parameters(), pb = again.parameters(), pc = other.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(pa[i]->value == pb[i]->value);
  CHECK(find_param(pa, "bert.encoder.layer.0.attention.self.dea.W_rel").value !=
        find_param(pc, "bert.encoder.layer.0.attention.self.dea.W_rel").value);
}

TEST_CASE("DualExpertBert: the reference's names, order and groups", "[dea_bert][names]") {
  const io::SafeTensors cs = io::SafeTensors::load(data("dea_bert_gamma05.safetensors"));
  const bert::BertConfig cfg = interop::bert_case_config(cs);
  Rng rng(2);
  DB model(cfg, rng);
  const auto shapes = interop::dea_bert_parameter_shapes(cfg, 2);
  const auto params = model.parameters();
  REQUIRE(params.size() == shapes.size());
  REQUIRE(params.size() == 47);
  std::set<std::string> in_case;
  for (const std::string& n : cs.names())
    if (n.find('.') != std::string::npos && n.rfind("in.", 0) != 0 && n.rfind("out.", 0) != 0 &&
        n.rfind("grad.", 0) != 0)
      in_case.insert(n);
  CHECK(in_case.size() == 47);
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i]->name);
    CHECK(params[i]->name == shapes[i].first);
    CHECK(params[i]->shape == shapes[i].second);
    CHECK(in_case.count(params[i]->name) == 1);
    CHECK(params[i]->group == (optim::is_gate_param_name(params[i]->name) ? "gate" : "main"));
  }
  CHECK(params.front()->name == "bert.embeddings.word_embeddings.weight");
  CHECK(params[5]->name == "bert.encoder.layer.0.attention.self.dea.W_q.weight");
  CHECK(params.back()->name == "cls_head.1.bias");
  const auto gate = model.parameters("gate");
  REQUIRE(gate.size() == 4);
  CHECK(gate[0]->name == "bert.encoder.layer.0.attention.self.dea.W_gate");
  CHECK(gate[1]->name == "bert.encoder.layer.0.attention.self.dea.c_gate");
  CHECK(model.parameters("main").size() == 43);
  for (const auto& p : params) CHECK(p->name.find("query") == std::string::npos);  // the originals are gone
  // the optimiser: the reference's two groups, the fine-tuning learning rates
  optim::AdamW<double> opt = model.make_optimizer();
  CHECK(opt.group_names() == std::vector<std::string>{"main", "gate"});
  CHECK(opt.lr("main") == 2e-5);
  CHECK(opt.lr("gate") == 1e-3);
  CHECK(opt.weight_decay("main") == 0.01);
  CHECK(opt.weight_decay("gate") == 0.0);
  CHECK(opt.params("gate").size() == 4);
  CHECK(model.attention(1).options().out_proj == false);
  CHECK(model.attention(1).options().dropout == cfg.attention_probs_dropout_prob);
  CHECK_THROWS_WITH(model.parameters("other"), Contains("'main' or 'gate'"));
}

TEST_CASE("DualExpertBert: masks never give NaN; dropout comes from the Rng; bad input is refused by name",
          "[dea_bert][bad_input]") {
  DB model = tiny_model(0.2);
  auto batch = tiny_batch({true, false, 12});
  const Index T = batch.seq_len();
  for (Index t = 0; t < T; ++t) batch.attention_mask[2 * T + t] = 0;  // a sequence without a real token
  DB::Cache c;
  Rng a(5), b(5);
  const auto ta = model.forward(batch, 0.5, true, &a, c);
  CHECK(ta.logits.allFinite());
  CHECK(std::isfinite(ta.loss()));
  model.zero_grad();
  model.backward(c);
  for (Param<double>* p : model.parameters()) CHECK(p->grad.allFinite());
  const auto tb = model.forward(batch, 0.5, true, &b, c);
  CHECK(ta.logits == tb.logits);
  const auto ev = model.forward(batch, 0.5, false, nullptr, c);
  CHECK(ev.logits != ta.logits);
  CHECK_THROWS_WITH(model.forward(batch, 0.5, true, nullptr, c), Contains("needs an Rng"));
  CHECK_THROWS_WITH(model.forward(batch, 1.5, false, nullptr, c), Contains("gamma_mix"));
  auto bad = batch;
  bad.labels = Tensor<std::int64_t>({2});
  CHECK_THROWS_WITH(model.forward(bad, 0.5, false, nullptr, c), Contains("labels"));
  bad = batch;
  bad.alpha_oracle = Tensor<double>();
  bad.target_idx = Tensor<std::int64_t>({3, T}, 0);
  CHECK_THROWS_WITH(model.forward(bad, 0.5, false, nullptr, c), Contains("target_idx"));
  bad = batch;
  bad.alpha_oracle = Tensor<double>({3, T, T - 1});
  CHECK_THROWS_WITH(model.forward(bad, 0.5, false, nullptr, c), Contains("alpha"));
  bad = batch;
  bad.input_ids[0] = 13;
  CHECK_THROWS_WITH(model.forward(bad, 0.5, false, nullptr, c), Contains("input_ids"));
  DB::Cache empty;
  CHECK_THROWS_WITH(model.backward(empty), Contains("no forward pass"));
  // a tiled model keeps no alpha-hat of the first layer in a training forward
  DB tiled = tiny_model(0.2, 7, DeaKernel::tiled);
  Rng r(1);
  tiled.forward(batch, 0.5, true, &r, c);
  CHECK(tiled.alpha_hat(c, 1).numel() == 3 * 2 * T * T);
  CHECK_THROWS_WITH(tiled.alpha_hat(c, 0), Contains("kept no alpha-hat"));
  tiled.forward(batch, 0.5, false, nullptr, c);  // evaluation forwards keep every map
  CHECK(tiled.alpha_hat(c, 0).numel() == 3 * 2 * T * T);
}

TEST_CASE("DualExpertBert: the generic trainer runs it as it runs the native model", "[dea_bert][train]") {
  // train::DualExpertFamily<Model> needs forward(batch, gamma, training, rng, cache) -> {task_loss, loss_gate},
  // backward(cache) and parameters(): a step with the reference's two groups, clipped, changes the parameters
  DB model = tiny_model(0.1);
  optim::AdamW<double> opt = model.make_optimizer();
  train::DualExpertFamily<DB> family(model, 10);
  train::Trainer<train::DualExpertFamily<DB>> t(family, opt, 42);
  const auto batch = tiny_batch({true, false, 13});
  std::vector<Vec<double>> before;
  for (Param<double>* p : model.parameters()) before.push_back(p->value);
  const auto s1 = t.step(batch, 1);
  CHECK(family.gamma(1) == 1.0);
  CHECK(std::isfinite(s1.losses.task));
  CHECK(s1.losses.gate > 0);
  CHECK(s1.norms.at("main") > 0);
  CHECK(s1.norms.at("gate") > 0);
  const auto params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i]->name);
    if (!is_pooler(params[i]->name)) CHECK(params[i]->value != before[i]);
  }
  t.step(batch, 2);
  CHECK(family.gamma(2) == Approx(0.9));
  CHECK(family.output().layer_stats.size() == 2);
  // the cache has the shape of the native model's where the training metrics read it: B, T, layers[l].attn
  const DB::Cache& c = family.cache();
  CHECK(c.layers.size() == 2);
  CHECK(static_cast<Index>(c.layers.back().attn.alpha_hat.size()) == c.B * 2 * c.T * c.T);
  CHECK(c.inputs.has_oracle());
}

}  // namespace test_dea_bert
