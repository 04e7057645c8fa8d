// Tests of dea/lm/route_table.hpp and dea/lm/tr_moe.hpp (the TR-MoE MLP, docs/lm.md): the reference's
// route tables bit for bit, the golden cases in double and float, the formula against a dense evaluation written
// the reference's way, finite-difference gradients, thread-count invariance, accumulation and bad input.
#include <catch2/catch.hpp>
#include <dea/interop/tr_moe_case.hpp>
#include <dea/lm/route_table.hpp>
#include <dea/lm/tr_moe.hpp>
#include <dea/testing/gradcheck.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_tr_moe {

using namespace dea;
using lm::RouteTable;
using lm::RoutingStrategy;
using lm::TrMoeOptions;
using Moe = lm::TrMoeMlp<double>;

namespace {

const char* const kGoldenCases[] = {"mlp_e2_k1_noshared_l1", "mlp_e4_k2_shared_l0", "mlp_e8_k2_pw07_l3",
                                    "mlp_modulo_cyclic_e4_k2_l2"};

std::string golden_path(const std::string& name) {
  return std::string(DEA_TEST_DATA_DIR) + "/golden/lm/" + name + ".safetensors";
}

Mat<double> randn(Index rows, Index cols, Rng& rng, double std = 1.0) {
  Mat<double> m(rows, cols);
  init::normal(m, rng, 0.0, std);
  return m;
}

std::vector<std::int64_t> random_ids(Index n, Rng& rng, std::int64_t vocab) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (auto& t : ids) t = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  return ids;
}

TrMoeOptions options(Index E, Index k, Index I, bool shared, Index Ws, const char* strategy, Index l = 0,
                     Index V = 64) {
  TrMoeOptions o;
  o.num_experts = E;
  o.top_k = k;
  o.intermediate_size = I;
  o.shared_expert = shared;
  o.shared_intermediate_size = Ws;
  o.routing_strategy = strategy;
  o.layer_idx = l;
  o.vocab_size = V;
  return o;
}

/// Test values as the golden cases use them: gate/up N(0, 0.2^2), down N(0, 0.15^2) (the init's 0.02 makes the
/// SwiGLU nearly linear and hides errors in silu').
template <class S>
void randomise(lm::TrMoeMlp<S>& m, Rng& rng) {
  for (Param<S>* p : m.parameters())
    init::normal(p->value, rng, 0.0, p->name.find("down") != std::string::npos ? 0.15 : 0.2);
}

bool bitwise_equal(const Mat<double>& a, const Mat<double>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<std::size_t>(a.size())) == 0;
}

template <class S>
bool bitwise_equal_vec(const Vec<S>& a, const Vec<S>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(S) * static_cast<std::size_t>(a.size())) == 0;
}

/// The reference's evaluation, written independently of the class (the PyTorch reference loops over the
/// experts): for each expert e, tau_e = sum_j a_j [e_j = e] per token, the expert runs densely on every row with
/// x zeroed where tau_e = 0, and tau_e f_e is added; then the shared branch.
Mat<double> dense_reference(Moe& m, const Mat<double>& x, const std::vector<std::int64_t>& ids) {
  const auto& o = m.options();
  const Index N = x.rows(), D = m.d_model(), E = m.num_experts(), k = m.top_k(), w = m.expert_width();
  const RouteTable R = m.route_table();
  const auto ps = m.parameters();
  const Param<double>& G = find_param(ps, "engine.expert_gate");
  const Param<double>& U = find_param(ps, "engine.expert_up");
  const Param<double>& Dn = find_param(ps, "engine.expert_down");
  auto silu = [](double z) { return z / (1.0 + std::exp(-z)); };
  Mat<double> routed = Mat<double>::Zero(N, D);
  for (Index e = 0; e < E; ++e) {
    Mat<double> Ge(D, w), Ue(D, w), De(w, D);
    for (Index i = 0; i < D * w; ++i) {
      Ge.data()[i] = G.value[e * D * w + i];
      Ue.data()[i] = U.value[e * D * w + i];
      De.data()[i] = Dn.value[e * D * w + i];
    }
    Vec<double> tau = Vec<double>::Zero(N);
    Mat<double> xm = x;
    for (Index n = 0; n < N; ++n) {
      const std::int64_t t = std::min<std::int64_t>(std::max<std::int64_t>(ids[static_cast<std::size_t>(n)], 0),
                                                    o.vocab_size - 1);
      for (Index j = 0; j < k; ++j)
        if (R(t, j) == e) tau[n] += m.route_weights()[static_cast<std::size_t>(j)];
      if (tau[n] == 0) xm.row(n).setZero();
    }
    Mat<double> g = xm * Ge, u = xm * Ue, h(N, w);
    for (Index i = 0; i < h.size(); ++i) h.data()[i] = silu(g.data()[i]) * u.data()[i];
    routed += tau.asDiagonal() * (h * De);
  }
  Mat<double> y = o.routed_output_scale * routed;
  if (m.shared_width() > 0) {
    const Mat<double> Wg = find_param(ps, "engine.shared_gate.weight").mat();
    const Mat<double> Wu = find_param(ps, "engine.shared_up.weight").mat();
    const Mat<double> Wd = find_param(ps, "engine.shared_down.weight").mat();
    Mat<double> g = x * Wg.transpose(), u = x * Wu.transpose(), h(N, m.shared_width());
    for (Index i = 0; i < h.size(); ++i) h.data()[i] = silu(g.data()[i]) * u.data()[i];
    y += o.shared_output_scale * (h * Wd.transpose());
  }
  return y;
}

/// Finite-difference check of every parameter and the input x on L = <y, R>.
testing::GradCheckReport gradcheck_mlp(Moe& m, Mat<double>& x, const std::vector<std::int64_t>& ids) {
  const Mat<double> Rp = testing::random_projection(x.rows(), x.cols(), 91);
  Moe::Cache cache;
  Mat<double> dx = Mat<double>::Zero(x.rows(), x.cols());
  testing::GradCheck gc;
  gc.add(m.parameters());
  gc.add("x", x.data(), dx.data(), x.size());
  auto objective = [&] { return m.forward(x, ids.data(), cache).cwiseProduct(Rp).sum(); };
  auto analytic = [&] {
    m.zero_grad();
    m.forward(x, ids.data(), cache);
    const Mat<double> g = m.backward(Rp, cache);
    dx = g;  // a copy into the buffer the checker holds
  };
  return gc.run(objective, analytic);
}

/// Per-slot balance of a balanced-hash table: every complete block of E consecutive ranks (in rank order)
/// holds each expert exactly once per slot; the k experts of each token are distinct.
void require_balanced(const RouteTable& R, Index V, Index E, Index k, Index l) {
  const std::vector<std::int64_t> order = lm::torch_randperm(V, lm::kRouteSeed + 104729u * static_cast<std::uint64_t>(l));
  for (Index q0 = 0; q0 + E <= V; q0 += E)
    for (Index j = 0; j < k; ++j) {
      std::vector<int> seen(static_cast<std::size_t>(E), 0);
      for (Index q = q0; q < q0 + E; ++q) ++seen[static_cast<std::size_t>(R(order[static_cast<std::size_t>(q)], j))];
      REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    }
  // per slot, over the whole vocabulary: floor(V/E) or floor(V/E) + 1 tokens per expert
  for (Index j = 0; j < k; ++j) {
    std::vector<Index> cnt(static_cast<std::size_t>(E), 0);
    for (Index t = 0; t < V; ++t) ++cnt[static_cast<std::size_t>(R(t, j))];
    for (Index c : cnt) REQUIRE((c == V / E || c == V / E + 1));
  }
  for (Index t = 0; t < V; ++t) {
    std::set<std::int32_t> s(R.row(t).data(), R.row(t).data() + k);
    REQUIRE(static_cast<Index>(s.size()) == k);
  }
}

}  // namespace

// =====================================================================================================================
// Route tables
// =====================================================================================================================

TEST_CASE("route tables equal every golden out.route_table exactly", "[tr_moe][route]") {
  for (const char* name : kGoldenCases) {
    INFO(name);
    const auto st = io::SafeTensors::load(golden_path(name));
    const TrMoeOptions o = interop::tr_moe_options_from_config(st.metadata().at("config_json"));
    const Tensor<std::int64_t> ref = st.get<std::int64_t>("out.route_table");  // [V, k]
    REQUIRE(ref.shape == Shape{o.vocab_size, o.top_k});
    const RouteTable R = lm::build_route_table(lm::parse_routing_strategy(o.routing_strategy), o.vocab_size,
                                               o.num_experts, o.top_k, o.layer_idx);
    Index mismatches = 0;
    for (Index i = 0; i < ref.numel(); ++i) mismatches += R.data()[i] != ref[i];
    REQUIRE(mismatches == 0);
    // the MLP builds the same table, and the framework's [k, V] buffer is its transpose
    Rng rng(0);
    Moe m(32, o, rng);
    REQUIRE(m.route_table() == R);
    const std::vector<std::int64_t> buf = m.route_table_buffer();
    for (Index t = 0; t < o.vocab_size; ++t)
      for (Index j = 0; j < o.top_k; ++j) REQUIRE(buf[static_cast<std::size_t>(j * o.vocab_size + t)] == ref[t * o.top_k + j]);
  }
}

TEST_CASE("torch_randperm: a permutation, the seed taken mod 2^32, no draw for n <= 1", "[tr_moe][route]") {
  for (std::int64_t n : {0, 1, 2, 7, 1000}) {
    const auto p = lm::torch_randperm(n, 12345);
    std::vector<std::int64_t> s = p;
    std::sort(s.begin(), s.end());
    for (std::int64_t i = 0; i < n; ++i) REQUIRE(s[static_cast<std::size_t>(i)] == i);
  }
  REQUIRE(lm::torch_randperm(1000, (std::uint64_t(1) << 32) + 5) == lm::torch_randperm(1000, 5));  // seed mod 2^32
  REQUIRE(lm::torch_randperm(1000, 5) != lm::torch_randperm(1000, 6));
  // the first swap draws z = mt() mod n from std::mt19937(seed): element 0 becomes z
  std::mt19937 mt(77);
  const std::uint32_t z = static_cast<std::uint32_t>(mt()) % 1000u;
  REQUIRE(lm::torch_randperm(1000, 77)[0] == static_cast<std::int64_t>(z));
  REQUIRE_THROWS_WITH(lm::torch_randperm(-1, 0), Catch::Contains("got -1"));
}

TEST_CASE("balanced hash: per-slot balance in complete groups, distinct routes (V = 32000, E = 4, k = 2, l = 0..9)",
          "[tr_moe][route]") {
  // the seed's example configuration has balanced-hash tables with V = 32000 for l = 0..9 (E = 4, k = 2 in
  // its MoE variant); no golden numbers are given for them, so their properties are checked.
  std::vector<RouteTable> tables;
  for (Index l = 0; l < 10; ++l) {
    INFO("layer " << l);
    tables.push_back(lm::build_route_table(RoutingStrategy::token_id_balanced_hash, 32000, 4, 2, l));
    require_balanced(tables.back(), 32000, 4, 2, l);
    lm::validate_route_table(tables.back(), 32000, 4, 2);
  }
  for (Index l = 1; l < 10; ++l) REQUIRE(tables[static_cast<std::size_t>(l)] != tables[0]);  // layers differ
  // incomplete last group, more experts and slots
  require_balanced(lm::build_route_table(RoutingStrategy::token_id_balanced_hash, 100, 8, 2, 3), 100, 8, 2, 3);
  require_balanced(lm::build_route_table(RoutingStrategy::token_id_balanced_hash, 257, 16, 4, 5), 257, 16, 4, 5);
  require_balanced(lm::build_route_table(RoutingStrategy::token_id_balanced_hash, 1000, 2, 2, 1), 1000, 2, 2, 1);
  // E = 1: zeros for both strategies
  for (auto s : {RoutingStrategy::token_id_balanced_hash, RoutingStrategy::modulo_cyclic})
    REQUIRE((lm::build_route_table(s, 50, 1, 1, 4).array() == 0).all());
}

TEST_CASE("modulo_cyclic: a permuted residue plus the slot, period E", "[tr_moe][route]") {
  for (Index E : {2, 4, 8, 16})
    for (Index l : {0, 2, 7}) {
      const Index k = std::min<Index>(E, 4);
      const RouteTable R = lm::build_route_table(RoutingStrategy::modulo_cyclic, 100, E, k, l);
      std::set<std::int32_t> first;
      for (Index t = 0; t < E; ++t) first.insert(R(t, 0));
      REQUIRE(static_cast<Index>(first.size()) == E);  // R(0..E-1, 0) is a permutation of the experts
      for (Index t = 0; t < 100; ++t)
        for (Index j = 0; j < k; ++j) REQUIRE(R(t, j) == (R(t % E, 0) + j) % E);
    }
}

TEST_CASE("routing strategies: aliases accepted, the others refused by name", "[tr_moe][route][errors]") {
  REQUIRE(lm::parse_routing_strategy("modulo") == RoutingStrategy::modulo_cyclic);
  REQUIRE(lm::parse_routing_strategy("modulo_cyclic") == RoutingStrategy::modulo_cyclic);
  REQUIRE(lm::parse_routing_strategy("token_id_balanced_hash") == RoutingStrategy::token_id_balanced_hash);
  REQUIRE_THROWS_WITH(lm::parse_routing_strategy("token_id_multi_hash"),
                      Catch::Contains("'token_id_multi_hash'") && Catch::Contains("does not build"));
  REQUIRE_THROWS_WITH(lm::parse_routing_strategy("token_id_hierarchical_hash"),
                      Catch::Contains("'token_id_hierarchical_hash'"));
  REQUIRE_THROWS_WITH(lm::parse_routing_strategy("learned"), Catch::Contains("got 'learned'"));
  Rng rng(1);
  TrMoeOptions o = options(4, 2, 16, true, 0, "token_id_affine_hash");
  REQUIRE_THROWS_WITH(Moe(8, o, rng), Catch::Contains("routing_strategy") && Catch::Contains("'token_id_affine_hash'"));
}

TEST_CASE("route table: load from a [k, V] buffer, set, compare with the generated one, validation",
          "[tr_moe][route]") {
  Rng rng(2);
  Moe m(8, options(4, 2, 16, true, 8, "token_id_balanced_hash", 1, 40), rng);
  randomise(m, rng);
  REQUIRE(m.route_table_is_generated());
  std::vector<std::int64_t> buf = m.route_table_buffer();
  REQUIRE(buf.size() == 80u);
  const Shape shape{2, 40};
  m.load_route_table(buf.data(), shape);
  REQUIRE(m.route_table_is_generated());
  // a different (valid) table: swap the slots of token 5; the forward follows it
  std::swap(buf[5], buf[40 + 5]);
  m.load_route_table(buf.data(), shape);
  REQUIRE_FALSE(m.route_table_is_generated());
  REQUIRE(m.route_table()(5, 0) == m.generated_route_table()(5, 1));
  const Mat<double> x = randn(3, 8, rng);
  const std::vector<std::int64_t> ids = {5, 5, 6};
  Moe::Cache c;
  m.forward(x, ids.data(), c);
  REQUIRE(c.routes(0, 0) == m.route_table()(5, 0));
  REQUIRE(c.routes(0, 1) == m.route_table()(5, 1));
  m.reset_route_table();
  REQUIRE(m.route_table_is_generated());
  // validation
  REQUIRE_THROWS_WITH(m.load_route_table(buf.data(), Shape{40, 2}),
                      Catch::Contains("expected shape [k, V] = [2, 40]") && Catch::Contains("[40, 2]"));
  std::vector<std::int64_t> bad = buf;
  bad[3] = 4;
  REQUIRE_THROWS_WITH(m.load_route_table(bad.data(), shape),
                      Catch::Contains("slot 0, token 3") && Catch::Contains("[0, 4)") && Catch::Contains("got 4"));
  bad = buf;
  bad[40 + 7] = bad[7];
  REQUIRE_THROWS_WITH(m.load_route_table(bad.data(), shape), Catch::Contains("token 7 is routed to expert"));
  RouteTable R = m.route_table();
  R(0, 1) = -1;
  REQUIRE_THROWS_WITH(m.set_route_table(R), Catch::Contains("got -1"));
  REQUIRE_THROWS_WITH(m.set_route_table(RouteTable::Zero(39, 2)), Catch::Contains("[40, 2]"));
  REQUIRE(m.route_table_is_generated());  // a refused table changes nothing
  Tensor<std::int64_t> t({2, 40});
  for (Index i = 0; i < 80; ++i) t[i] = buf[static_cast<std::size_t>(i)];
  m.load_route_table(t);
  REQUIRE_FALSE(m.route_table_is_generated());
}

// =====================================================================================================================
// Golden cases (tests/data/golden/lm/mlp_*, tests/data/golden/README.md)
// =====================================================================================================================

TEST_CASE("golden tr_moe_mlp cases reproduce the reference in double", "[tr_moe][golden]") {
  for (const char* name : kGoldenCases) {
    const auto res = interop::run_tr_moe_case<double>(golden_path(name));
    INFO(res.str());
    REQUIRE(res.ok);
    WARN(name << " (double): worst error / tolerance " << res.worst_ratio << ", worst relative " << res.worst_relative);
    std::size_t n_out = 0, n_grad = 0, n_stat = 0;
    for (const auto& t : res.tensors)
      (t.name.rfind("out.", 0) == 0 ? n_out : t.name.rfind("grad.", 0) == 0 ? n_grad : n_stat) += 1;
    REQUIRE(n_out == 4u);
    REQUIRE(n_grad == (std::string(name) == "mlp_e2_k1_noshared_l1" ? 4u : 7u));
    REQUIRE(n_stat == 1u);
    REQUIRE(res.telemetry.size() == 3u);
    // Sharper: the file records how far a pure-float64 evaluation lies from its numbers (the reference's slot
    // weights are float32). Ours is pure float64: its distance is that same number (to the 4 digits recorded) up
    // to double round-off.
    for (const auto& t : res.tensors) {
      if (t.ref_dev_pure_f64 < 0) continue;
      INFO(t.name << ": ours " << t.max_abs_error << ", pure-f64 reference " << t.ref_dev_pure_f64);
      REQUIRE(std::abs(t.max_abs_error - t.ref_dev_pure_f64) <=
              1e-3 * t.ref_dev_pure_f64 + 1e-14 * std::max(1.0, t.max_abs_ref));
    }
  }
}

TEST_CASE("golden tr_moe_mlp cases in float", "[tr_moe][golden][float]") {
  for (const char* name : kGoldenCases) {
    const auto res = interop::run_tr_moe_case<float>(golden_path(name));
    INFO(res.str());
    REQUIRE(res.ok);
    // float32 rounding of inputs and sums: far inside the 1e-4 rule (measured <= 6e-7 relative)
    REQUIRE(res.worst_relative < 1e-5);
    WARN(name << " (float): worst relative error " << res.worst_relative);
  }
}

TEST_CASE("the golden runner reports a mismatch instead of passing it", "[tr_moe][golden]") {
  // the p = 0.7 case lies 2.5e-8 from a pure-float64 evaluation: a tolerance of 1e-12 must fail
  const auto res = interop::run_tr_moe_case<double>(golden_path("mlp_e8_k2_pw07_l3"), {1e-12, 1e-6});
  REQUIRE_FALSE(res.ok);
  REQUIRE_THROWS_AS(interop::run_tr_moe_case<double>(golden_path("missing")), Error);
  REQUIRE_THROWS_WITH(interop::tr_moe_options_from_config("{\"num_experts\": 4}"), Catch::Contains("'top_k'"));
  REQUIRE_THROWS_WITH(interop::tr_moe_options_from_config("{"), Catch::Contains("not valid JSON"));
}

TEST_CASE("golden e4_k2: the dense reference-style evaluation agrees", "[tr_moe][golden]") {
  const auto st = io::SafeTensors::load(golden_path("mlp_e4_k2_shared_l0"));
  Index D = 0;
  const TrMoeOptions o = interop::tr_moe_options_from_config(st.metadata().at("config_json"), &D);
  Rng rng(0);
  Moe m(D, o, rng);
  for (auto* p : m.parameters()) st.get_into<double>(p->name, p->value.data(), p->numel());
  Mat<double> x(16, D);
  st.get_into<double>("in.x", x.data(), x.size());
  const Tensor<std::int64_t> t = st.get<std::int64_t>("in.token_ids");
  const std::vector<std::int64_t> ids(t.ptr(), t.ptr() + t.numel());
  Moe::Cache c;
  const Mat<double> y = m.forward(x, ids.data(), c);
  REQUIRE((y - dense_reference(m, x, ids)).cwiseAbs().maxCoeff() <= 1e-13);
}

// =====================================================================================================================
// The formula, weights, clamping, telemetry, parameters
// =====================================================================================================================

TEST_CASE("forward equals the reference's dense per-expert evaluation (strategies, E, k, p, scales)", "[tr_moe]") {
  struct Cfg {
    Index E, k, I, Ws;
    bool shared;
    const char* strategy;
    double p, ss, sr;
  };
  const Cfg cfgs[] = {{4, 2, 16, 12, true, "token_id_balanced_hash", -1, 1, 1},
                      {2, 1, 8, 0, false, "token_id_balanced_hash", -1, 1, 1},
                      {1, 1, 12, 0, true, "modulo_cyclic", -1, 1, 1},
                      {8, 4, 32, 6, true, "modulo", 0.4, 0.5, 1.5},
                      {16, 2, 32, 10, true, "token_id_balanced_hash", 0.9, 2.0, 0.25},
                      {4, 2, 16, 12, true, "modulo_cyclic", 1.0, 1, 1}};
  for (const Cfg& cf : cfgs) {
    INFO("E " << cf.E << " k " << cf.k << " " << cf.strategy << " p " << cf.p);
    Rng rng(40 + cf.E);
    TrMoeOptions o = options(cf.E, cf.k, cf.I, cf.shared, cf.Ws, cf.strategy, 3, 50);
    o.top_k_primary_weight = cf.p;
    o.shared_output_scale = cf.ss;
    o.routed_output_scale = cf.sr;
    Moe m(8, o, rng);
    randomise(m, rng);
    const Mat<double> x = randn(40, 8, rng);
    std::vector<std::int64_t> ids = random_ids(40, rng, 50);
    ids[3] = -7;   // clamped to 0
    ids[4] = 999;  // clamped to V - 1
    Moe::Cache c;
    const Mat<double> y = m.forward(x, ids.data(), c);
    REQUIRE((y - dense_reference(m, x, ids)).cwiseAbs().maxCoeff() <= 1e-13 * std::max(1.0, y.cwiseAbs().maxCoeff()));
  }
}

TEST_CASE("slot weights: uniform by default, p clamped to [0, 1], k = 1 is 1", "[tr_moe]") {
  Rng rng(3);
  TrMoeOptions o = options(4, 2, 16, true, 0, "modulo");
  REQUIRE(Moe(8, o, rng).route_weights() == std::vector<double>{0.5, 0.5});
  o.top_k_primary_weight = 0.7;
  REQUIRE(Moe(8, o, rng).route_weights() == std::vector<double>{0.7, 1.0 - 0.7});
  o.top_k_primary_weight = 1.5;
  REQUIRE(Moe(8, o, rng).route_weights() == std::vector<double>{1.0, 0.0});
  o = options(8, 4, 16, false, 0, "modulo");
  REQUIRE(Moe(8, o, rng).route_weights() == std::vector<double>{0.25, 0.25, 0.25, 0.25});
  o.top_k_primary_weight = 0.4;
  Moe m4(8, o, rng);
  REQUIRE(m4.route_weights()[0] == 0.4);
  REQUIRE(m4.route_weights()[3] == Approx(0.2).epsilon(1e-15));
  m4.set_top_k_primary_weight(-1);  // None again
  REQUIRE(m4.route_weights() == std::vector<double>{0.25, 0.25, 0.25, 0.25});
  o = options(2, 1, 16, false, 0, "modulo");
  o.top_k_primary_weight = 0.3;
  REQUIRE(Moe(8, o, rng).route_weights() == std::vector<double>{1.0});
  // float: the weights are the float32 values the reference's buffer holds
  o = options(4, 2, 16, false, 0, "modulo");
  o.top_k_primary_weight = 0.7;
  Rng r2(3);
  lm::TrMoeMlp<float> mf(8, o, r2);
  REQUIRE(static_cast<float>(mf.route_weights()[0]) == 0.7f);
}

TEST_CASE("ids are clamped to [0, V-1]; telemetry counts (token, slot) pairs", "[tr_moe]") {
  Rng rng(4);
  Moe m(8, options(4, 2, 16, true, 8, "token_id_balanced_hash", 2, 30), rng);
  randomise(m, rng);
  const Mat<double> x = randn(4, 8, rng);
  const std::vector<std::int64_t> ids = {-5, 0, 1000000000, 29};
  Moe::Cache c;
  const Mat<double> y = m.forward(x, ids.data(), c);
  const std::vector<std::int64_t> clamped = {0, 0, 29, 29};
  Moe::Cache c2;
  REQUIRE(bitwise_equal(y, m.forward(x, clamped.data(), c2)));
  for (Index n = 0; n < 4; ++n)
    for (Index j = 0; j < 2; ++j) REQUIRE(c.routes(n, j) == m.route_table()(clamped[static_cast<std::size_t>(n)], j));
  const auto& tel = m.telemetry();
  REQUIRE(tel.topk_w == 0.5);
  REQUIRE(tel.active_num_experts == 4);
  REQUIRE(tel.active_expert_width == 4);
  std::vector<Index> cnt(4, 0);
  for (Index n = 0; n < 4; ++n)
    for (Index j = 0; j < 2; ++j) ++cnt[static_cast<std::size_t>(c.routes(n, j))];
  REQUIRE(tel.expert_slot_counts == cnt);
  double sum = 0;
  for (std::size_t e = 0; e < 4; ++e) {
    REQUIRE(tel.expert_share[e] == static_cast<double>(cnt[e]) / 8.0);
    sum += tel.expert_share[e];
  }
  REQUIRE(sum == 1.0);
  REQUIRE(tel.items().size() == 7u);
  REQUIRE(tel.items()[3].first == "expert_share_0");
}

TEST_CASE("parameters: names, shapes, init statistics, the reference's parameter counts", "[tr_moe]") {
  Rng rng(5);
  const Index D = 384;
  TrMoeOptions o = options(4, 2, 256, true, 1536, "token_id_balanced_hash", 0, 32000);
  Moe m(D, o, rng, 0.02, 0.02 / std::sqrt(20.0));
  const auto ps = m.parameters();
  REQUIRE(ps.size() == 6u);
  REQUIRE(find_param(ps, "engine.expert_gate").shape == Shape{4, 384, 64});
  REQUIRE(find_param(ps, "engine.expert_up").shape == Shape{4, 384, 64});
  REQUIRE(find_param(ps, "engine.expert_down").shape == Shape{4, 64, 384});
  REQUIRE(find_param(ps, "engine.shared_gate.weight").shape == Shape{1536, 384});
  REQUIRE(find_param(ps, "engine.shared_up.weight").shape == Shape{1536, 384});
  REQUIRE(find_param(ps, "engine.shared_down.weight").shape == Shape{384, 1536});
  // the seed's example widths: routed 294,912 and shared 1,769,472 per layer, the same for E = 1 and E = 4
  REQUIRE(count_parameters(ps) == 294912 + 1769472);
  o.num_experts = 1;
  o.top_k = 1;
  Moe m1(D, o, rng);
  REQUIRE(count_parameters(m1.parameters()) == 294912 + 1769472);
  REQUIRE((m1.route_table().array() == 0).all());
  auto rms = [](const Param<double>& p) { return std::sqrt(p.value.squaredNorm() / static_cast<double>(p.numel())); };
  REQUIRE(rms(find_param(ps, "engine.expert_gate")) == Approx(0.02).epsilon(0.02));
  REQUIRE(rms(find_param(ps, "engine.shared_up.weight")) == Approx(0.02).epsilon(0.02));
  REQUIRE(rms(find_param(ps, "engine.expert_down")) == Approx(0.02 / std::sqrt(20.0)).epsilon(0.02));
  REQUIRE(rms(find_param(ps, "engine.shared_down.weight")) == Approx(0.02 / std::sqrt(20.0)).epsilon(0.02));
  for (auto* p : ps) REQUIRE(p->group == "main");
  // no shared expert: three tensors; shared_intermediate_size 0 means I
  Moe ns(16, options(2, 1, 8, false, 0, "modulo"), rng);
  REQUIRE(ns.parameters().size() == 3u);
  REQUIRE(ns.shared_width() == 0);
  Moe dflt(16, options(2, 1, 8, true, 0, "modulo"), rng);
  REQUIRE(dflt.shared_width() == 8);
}

// =====================================================================================================================
// Finite-difference gradients (double, L = <y, R>, every parameter and x, relative error <= 1e-6)
// =====================================================================================================================

TEST_CASE("gradcheck: shared + E=4 k=2, no shared E=2 k=1, E=1, p=0.7, both strategies, scales, clamped ids",
          "[tr_moe][grad]") {
  struct Cfg {
    const char* what;
    Index E, k, I, Ws;
    bool shared;
    const char* strategy;
    double p, ss, sr;
  };
  const Cfg cfgs[] = {{"shared E4 k2 balanced", 4, 2, 16, 12, true, "token_id_balanced_hash", -1, 1, 1},
                      {"no shared E2 k1 balanced", 2, 1, 8, 0, false, "token_id_balanced_hash", -1, 1, 1},
                      {"E1 shared modulo", 1, 1, 12, 10, true, "modulo_cyclic", -1, 1, 1},
                      {"p 0.7 E4 k2 modulo", 4, 2, 16, 12, true, "modulo_cyclic", 0.7, 1, 1},
                      {"p 0.4 E8 k4 balanced, scales", 8, 4, 16, 6, true, "token_id_balanced_hash", 0.4, 0.5, 1.5}};
  double worst = 0;
  for (const Cfg& cf : cfgs) {
    Rng rng(200 + cf.E * 7 + cf.k);
    TrMoeOptions o = options(cf.E, cf.k, cf.I, cf.shared, cf.Ws, cf.strategy, 2, 40);
    o.top_k_primary_weight = cf.p;
    o.shared_output_scale = cf.ss;
    o.routed_output_scale = cf.sr;
    Moe m(8, o, rng);
    randomise(m, rng);
    Mat<double> x = randn(12, 8, rng);
    std::vector<std::int64_t> ids = random_ids(12, rng, 40);
    ids[0] = -3;
    ids[11] = 77;
    const auto rep = gradcheck_mlp(m, x, ids);
    INFO(cf.what << "\n" << rep.str());
    REQUIRE(rep.ok);
    for (const auto& t : rep.tensors) {  // every parameter (and x) gets a non-zero gradient
      INFO(t.name);
      REQUIRE(t.max_abs_grad > 0);
    }
    worst = std::max(worst, rep.worst_rel_error);
  }
  WARN("tr_moe gradcheck worst relative error " << worst);
}

TEST_CASE("gradcheck with p = 1: the zero-weight slot contributes nothing and gets no gradient", "[tr_moe][grad]") {
  Rng rng(300);
  TrMoeOptions o = options(4, 2, 16, true, 8, "modulo_cyclic", 1, 40);
  o.top_k_primary_weight = 1.0;
  Moe m(8, o, rng);
  randomise(m, rng);
  // tokens whose slot-0 expert is e0: expert e1 = (e0 + 1) mod 4 is then only ever in slot 1 (weight 0)
  const RouteTable& R = m.route_table();
  const std::int32_t e0 = R(0, 0), e1 = (e0 + 1) % 4;
  std::vector<std::int64_t> ids;
  for (std::int64_t t = 0; t < 40 && ids.size() < 10; ++t)
    if (R(t, 0) == e0) ids.push_back(t);
  REQUIRE(ids.size() == 10u);
  REQUIRE(R(ids[0], 1) == e1);
  Mat<double> x = randn(10, 8, rng);
  const auto rep = gradcheck_mlp(m, x, ids);
  INFO(rep.str());
  REQUIRE(rep.ok);
  // exact zeros for expert e1's slices, non-zero for e0's
  const auto ps = m.parameters();
  const Index D = 8, w = 4;
  for (const char* n : {"engine.expert_gate", "engine.expert_up", "engine.expert_down"}) {
    const Param<double>& p = find_param(ps, n);
    REQUIRE(p.grad.segment(e1 * D * w, D * w).cwiseAbs().maxCoeff() == 0.0);
    REQUIRE(p.grad.segment(e0 * D * w, D * w).cwiseAbs().maxCoeff() > 0.0);
  }
  // and the output does not depend on expert e1 at all
  Moe::Cache c;
  const Mat<double> y0 = m.forward(x, ids.data(), c);
  Param<double>& G = find_param(ps, "engine.expert_gate");
  G.value.segment(e1 * D * w, D * w).setConstant(3.0);
  REQUIRE(bitwise_equal(y0, m.forward(x, ids.data(), c)));
  REQUIRE(m.telemetry().expert_slot_counts[static_cast<std::size_t>(e1)] == 10);  // still routed (telemetry)
}

// =====================================================================================================================
// Contracts: threads, accumulation, float
// =====================================================================================================================

TEST_CASE("1 and 2 threads give identical bits (forward, dx, every gradient)", "[tr_moe][threads]") {
  for (const char* strategy : {"token_id_balanced_hash", "modulo_cyclic"}) {
    Rng rng(400);
    // 600 tokens: several packed-GEMM row blocks per expert and for the shared branch
    TrMoeOptions o = options(4, 2, 128, true, 96, strategy, 1, 1000);
    Moe m(64, o, rng);
    randomise(m, rng);
    const Index N = 600;
    const Mat<double> x = randn(N, 64, rng), dy = randn(N, 64, rng);
    const std::vector<std::int64_t> ids = random_ids(N, rng, 1000);
    auto run = [&](int threads, Mat<double>& y, Mat<double>& dx, std::vector<Vec<double>>& g) {
      set_num_threads(threads);
      Moe::Cache c;
      m.zero_grad();
      y = m.forward(x, ids.data(), c);
      dx = m.backward(dy, c);
      g.clear();
      for (auto* p : m.parameters()) g.push_back(p->grad);
    };
    Mat<double> y1, dx1, y2, dx2;
    std::vector<Vec<double>> g1, g2;
    run(1, y1, dx1, g1);
    run(2, y2, dx2, g2);
#ifdef _OPENMP
    REQUIRE(num_threads() == 2);  // the comparison is between really different thread counts
#endif
    REQUIRE(bitwise_equal(y1, y2));
    REQUIRE(bitwise_equal(dx1, dx2));
    for (std::size_t i = 0; i < g1.size(); ++i) {
      INFO(m.parameters()[i]->name);
      REQUIRE(bitwise_equal_vec(g1[i], g2[i]));
    }
  }
  // float, E = 1 (one expert on every token)
  Rng rng(401);
  lm::TrMoeMlp<float> mf(64, options(1, 1, 128, true, 64, "modulo_cyclic", 0, 500), rng);
  randomise(mf, rng);
  const Mat<float> x = randn(300, 64, rng).cast<float>(), dy = randn(300, 64, rng).cast<float>();
  const std::vector<std::int64_t> ids = random_ids(300, rng, 500);
  std::vector<Mat<float>> outs;
  std::vector<std::vector<Vec<float>>> grads;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    lm::TrMoeMlp<float>::Cache c;
    mf.zero_grad();
    outs.push_back(mf.forward(x, ids.data(), c));
    outs.push_back(mf.backward(dy, c));
    grads.emplace_back();
    for (auto* p : mf.parameters()) grads.back().push_back(p->grad);
  }
  for (int i = 0; i < 2; ++i)
    REQUIRE(std::memcmp(outs[static_cast<std::size_t>(i)].data(), outs[static_cast<std::size_t>(i + 2)].data(),
                        sizeof(float) * static_cast<std::size_t>(outs[0].size())) == 0);
  for (std::size_t i = 0; i < grads[0].size(); ++i) REQUIRE(bitwise_equal_vec(grads[0][i], grads[1][i]));
}

TEST_CASE("gradients accumulate over backward calls; backward leaves the cache reusable", "[tr_moe]") {
  Rng rng(500);
  Moe m(16, options(4, 2, 32, true, 24, "token_id_balanced_hash", 0, 100), rng);
  randomise(m, rng);
  const Mat<double> x = randn(20, 16, rng), dy = randn(20, 16, rng);
  const std::vector<std::int64_t> ids = random_ids(20, rng, 100);
  Moe::Cache c;
  m.forward(x, ids.data(), c);
  m.zero_grad();
  const Mat<double> dx1 = m.backward(dy, c);
  std::vector<Vec<double>> g1;
  for (auto* p : m.parameters()) g1.push_back(p->grad);
  const Mat<double> dx2 = m.backward(dy, c);
  REQUIRE(bitwise_equal(dx1, dx2));
  const auto ps = m.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    INFO(ps[i]->name);
    REQUIRE(ps[i]->grad.isApprox(2.0 * g1[i], 1e-14));
  }
}

TEST_CASE("float agrees with double at a realistic size", "[tr_moe][float]") {
  Rng rng(600);
  const Index D = 128, N = 256;
  TrMoeOptions o = options(4, 2, 256, true, 384, "token_id_balanced_hash", 4, 32000);
  Moe md(D, o, rng);
  randomise(md, rng);
  Rng r2(1);
  lm::TrMoeMlp<float> mf(D, o, r2);
  const auto pd = md.parameters();
  const auto pf = mf.parameters();
  for (std::size_t i = 0; i < pd.size(); ++i) pf[i]->value = pd[i]->value.cast<float>();
  const Mat<double> x = randn(N, D, rng) * 0.2, dy = randn(N, D, rng);
  const std::vector<std::int64_t> ids = random_ids(N, rng, 32000);
  Moe::Cache cd;
  lm::TrMoeMlp<float>::Cache cf;
  const Mat<double> yd = md.forward(x, ids.data(), cd);
  const Mat<float> yf = mf.forward(x.cast<float>(), ids.data(), cf);
  REQUIRE(cd.routes == cf.routes);
  md.zero_grad();
  mf.zero_grad();
  const Mat<double> dxd = md.backward(dy, cd);
  const Mat<float> dxf = mf.backward(dy.cast<float>(), cf);
  auto rel = [](const auto& a, const auto& b) {
    return (a.template cast<double>() - b).cwiseAbs().maxCoeff() / std::max(1e-30, b.cwiseAbs().maxCoeff());
  };
  REQUIRE(rel(yf, yd) < 1e-4);
  REQUIRE(rel(dxf, dxd) < 1e-4);
  for (std::size_t i = 0; i < pd.size(); ++i) {
    INFO(pd[i]->name);
    REQUIRE(rel(pf[i]->grad, pd[i]->grad) < 1e-4);
  }
}

// =====================================================================================================================
// Bad input
// =====================================================================================================================

TEST_CASE("bad options throw dea::Error naming the field", "[tr_moe][errors]") {
  Rng rng(700);
  auto ctor = [&](Index D, TrMoeOptions o) { Moe m(D, o, rng); };
  const TrMoeOptions good = options(4, 2, 16, true, 8, "modulo");
  TrMoeOptions o = good;
  o.num_experts = 3;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("num_experts must be one of 1, 2, 4, 8, 16") && Catch::Contains("got 3"));
  o = good;
  o.top_k = 3;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("top_k must be one of 1, 2, 4") && Catch::Contains("got 3"));
  o = good;
  o.num_experts = 1;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("top_k (2) cannot exceed num_experts (1)"));
  o = good;
  o.intermediate_size = 18;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("intermediate_size (18) must be divisible by num_experts (4)"));
  o.intermediate_size = 0;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("intermediate_size must be positive"));
  o = good;
  o.shared_intermediate_size = -1;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("shared_intermediate_size") && Catch::Contains("got -1"));
  o = good;
  o.top_k_primary_weight = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("top_k_primary_weight"));
  o = good;
  o.shared_output_scale = INFINITY;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("shared_output_scale"));
  o = good;
  o.routed_output_scale = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("routed_output_scale"));
  o = good;
  o.vocab_size = 0;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("vocab_size must be >= 1") && Catch::Contains("got 0"));
  o = good;
  o.layer_idx = -1;
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("layer_idx") && Catch::Contains("got -1"));
  o = good;
  o.routing_strategy = "hash";
  REQUIRE_THROWS_WITH(ctor(8, o), Catch::Contains("routing_strategy") && Catch::Contains("got 'hash'"));
  REQUIRE_THROWS_WITH(ctor(0, good), Catch::Contains("d_model must be positive"));
  REQUIRE_THROWS_WITH(Moe(8, good, rng, -1.0), Catch::Contains("init_std"));
  REQUIRE_THROWS_WITH(Moe(8, good, rng, 0.02, NAN), Catch::Contains("down_std"));
  REQUIRE_THROWS_WITH(lm::build_route_table(RoutingStrategy::modulo_cyclic, 10, 4, 8, 0), Catch::Contains("top_k"));
}

TEST_CASE("bad forward and backward arguments throw naming the argument", "[tr_moe][errors]") {
  Rng rng(701);
  Moe m(8, options(4, 2, 16, true, 8, "modulo", 0, 20), rng);
  const Mat<double> x = randn(5, 8, rng);
  const std::vector<std::int64_t> ids = random_ids(5, rng, 20);
  Moe::Cache c;
  const Mat<double> x7 = randn(5, 7, rng);
  REQUIRE_THROWS_WITH(m.forward(x7, ids.data(), c), Catch::Contains("x expected 8 columns") && Catch::Contains("[5, 7]"));
  REQUIRE_THROWS_WITH(m.forward(Mat<double>(0, 8), ids.data(), c), Catch::Contains("at least one row"));
  REQUIRE_THROWS_WITH(m.forward(x, nullptr, c), Catch::Contains("token_ids must not be null"));
  Mat<double> xn = x;
  xn(2, 3) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(m.forward(xn, ids.data(), c), Catch::Contains("non-finite") && Catch::Contains("row 2, column 3"));
  Moe::Cache empty;
  REQUIRE_THROWS_WITH(m.backward(x, empty), Catch::Contains("run forward first"));
  m.forward(x, ids.data(), c);
  REQUIRE_THROWS_WITH(m.backward(randn(5, 6, rng), c), Catch::Contains("dy") && Catch::Contains("[5, 8]"));
  Mat<double> dyn = x;
  dyn(0, 0) = INFINITY;
  REQUIRE_THROWS_WITH(m.backward(dyn, c), Catch::Contains("non-finite"));
  Moe other(8, options(2, 1, 16, true, 8, "modulo", 0, 20), rng);
  REQUIRE_THROWS_WITH(other.backward(x, c), Catch::Contains("does not belong to this MLP"));
}

}  // namespace test_tr_moe
