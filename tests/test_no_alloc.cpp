// No allocation in the inference path: this executable replaces the global operator new / delete with counting
// versions and turns Eigen's own heap allocations (which use malloc, not new) into counted events through
// EIGEN_RUNTIME_NO_MALLOC and a counting eigen_assert. After the set-up, forward of a Dual-Expert layer (same
// shapes, AttnInputs built beforehand, no oracle) and of an InferenceModel (any batch and length up to the
// workspace's maximum) must count zero of either.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>

namespace {
std::atomic<long> g_new_calls{0};      // every operator new / new[] of the process
std::atomic<long> g_eigen_events{0};   // Eigen heap allocations while forbidden (and any other failed eigen_assert)
}  // namespace

void note_eigen_assert(const char* what, const char* file, int line) {
  ++g_eigen_events;
  std::fprintf(stderr, "counted a failed eigen_assert (a heap allocation while forbidden, or a bug): %s (%s:%d)\n",
               what, file, line);
}

#define EIGEN_RUNTIME_NO_MALLOC
#define eigen_assert(x)                                     \
  do {                                                      \
    if (!(x)) ::note_eigen_assert(#x, __FILE__, __LINE__);  \
  } while (false)

#include <catch2/catch.hpp>
#include <dea/attention/dual_expert.hpp>
#include "instances/dual_expert_shapes.hpp"
#include <dea/nn/inference.hpp>
#include <dea/nn/transformer.hpp>

#include <vector>

// ---- counting replacements of the global allocation functions ----
// (they allocate with malloc and free with free; GCC, inlining them, cannot tell and warns about a mismatch)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
void* counted_alloc(std::size_t n, std::size_t align = 0) {
  ++g_new_calls;
  void* p = nullptr;
  if (align > alignof(std::max_align_t)) {
    if (posix_memalign(&p, align, n ? n : 1) != 0) p = nullptr;
  } else {
    p = std::malloc(n ? n : 1);
  }
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++g_new_calls;
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  ++g_new_calls;
  return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using namespace dea;

namespace {

/// Counts allocations between construction and stop(): operator new calls and Eigen heap allocations.
class AllocWindow {
public:
  AllocWindow() {
    new0_ = g_new_calls.load();
    eig0_ = g_eigen_events.load();
    Eigen::internal::set_is_malloc_allowed(false);
  }
  ~AllocWindow() { Eigen::internal::set_is_malloc_allowed(true); }
  void stop() {
    Eigen::internal::set_is_malloc_allowed(true);
    news = g_new_calls.load() - new0_;
    eigen = g_eigen_events.load() - eig0_;
  }
  long news = -1, eigen = -1;

private:
  long new0_ = 0, eig0_ = 0;
};

template <class A>
void layer_forward_allocates_nothing(Index D, Index H, Index B, Index T, DeaKernel kernel = DeaKernel::reference,
                                     Index block_q = 0) {
  using S = typename A::Scalar;
  Rng rng(7);
  typename A::Options opt;
  opt.kernel = kernel;
  opt.block_q = block_q;
  A layer(D, H, rng, opt);
  Mat<S> x(B * T, D), x2(B * T, D);
  init::normal(x, rng, 0, 1);
  init::normal(x2, rng, 0, 1);
  Tensor<std::uint8_t> km({B, T}, 1);
  km[T - 1] = 0;  // one padded key in the first sequence
  AttnInputs<S> in(B, T);
  in.set_key_mask(km);
  km[T - 2] = 0;  // the inputs of another batch: another mask
  AttnInputs<S> in2(B, T);
  in2.set_key_mask(km);
  typename A::Cache cache;
  Mat<S> y;
  layer.forward(x, in, cache, y);  // set-up: sizes the cache and y
  const Mat<S> y_first = y;

  AllocWindow w;
  for (int rep = 0; rep < 3; ++rep) {
    layer.forward(x2, rep % 2 ? in : in2, cache, y);  // the mask may change from call to call
    layer.forward(x, in2, cache, y);
  }
  w.stop();
  INFO("D " << D << " H " << H << " B " << B << " T " << T);
  CHECK(w.news == 0);
  CHECK(w.eigen == 0);
  // the same call gives the same result as before (the scratch holds no stale state)
  layer.forward(x, in, cache, y);
  CHECK(y == y_first);
}

}  // namespace

TEST_CASE("the counters see allocations (so a zero below means something)", "[alloc]") {
  AllocWindow w;
  std::vector<int>* v = new std::vector<int>(100);
  Eigen::MatrixXf m(16, 16);  // an Eigen heap allocation while forbidden: counted, not fatal
  w.stop();
  CHECK(w.news >= 2);
  CHECK(w.eigen >= 1);
  delete v;
  CHECK(m.size() == 256);
}

TEST_CASE("DualExpertAttention::forward allocates nothing after the set-up call", "[alloc][dea]") {
  layer_forward_allocates_nothing<DualExpertAttention<float>>(64, 4, 2, 9);
  layer_forward_allocates_nothing<DualExpertAttention<double>>(32, 4, 3, 7);
  layer_forward_allocates_nothing<DualExpertAttention<float, 2, 8>>(16, 2, 1, 16);
}

TEST_CASE("DualExpertAttention::forward with the tiled kernel allocates nothing after the set-up call",
          "[alloc][dea][tiled]") {
  layer_forward_allocates_nothing<DualExpertAttention<float>>(64, 4, 2, 9, DeaKernel::tiled, 4);
  layer_forward_allocates_nothing<DualExpertAttention<double>>(32, 4, 3, 7, DeaKernel::tiled, 0);
  layer_forward_allocates_nothing<DualExpertAttention<float, 2, 8>>(16, 2, 1, 16, DeaKernel::tiled, 5);
}

namespace {

template <class S, class Attention, class Inference>
void model_forward_allocates_nothing(nn::Task task, Index D, Index H, Index L) {
  nn::ModelConfig mc;
  mc.vocab_size = 29;
  mc.d_model = D;
  mc.n_heads = H;
  mc.n_layers = L;
  mc.d_ff = 2 * D;
  mc.max_len = 16;
  mc.n_classes = 3;
  mc.task = task;
  Rng rng(3);
  nn::TransformerModel<S, Attention> model(mc, rng);
  Inference inf(nn::InferenceConfig::from(mc));
  inf.bind_parameters(model);
  const Index maxB = 3, maxT = 12;
  inf.reserve(maxB, maxT);  // set-up: the one allocation

  std::vector<std::int64_t> ids(static_cast<std::size_t>(maxB * maxT));
  std::vector<std::uint8_t> mask(ids.size(), 1);
  std::vector<std::int64_t> types(ids.size(), 0);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    ids[k] = 1 + static_cast<std::int64_t>(rng.below(28));
    types[k] = static_cast<std::int64_t>(k % 2);
  }
  mask[5] = 0;
  struct Shape2 {
    Index B, T;
  };
  const Shape2 shapes[] = {{3, 12}, {1, 5}, {2, 12}, {3, 1}, {1, 12}, {3, 12}};
  double sum = 0;
  AllocWindow w;
  for (const Shape2& s : shapes) {
    const ConstMatMap<S> a = inf.forward(ids.data(), s.B, s.T);
    const ConstMatMap<S> b = inf.forward(ids.data(), s.B, s.T, mask.data(), types.data());
    sum += static_cast<double>(a(0, 0)) + static_cast<double>(b(0, 0));
  }
  w.stop();
  INFO("task " << nn::to_string(task) << " D " << D << " H " << H << " L " << L);
  CHECK(w.news == 0);
  CHECK(w.eigen == 0);
  CHECK(std::isfinite(sum));
}

}  // namespace

TEST_CASE("InferenceModel::forward allocates nothing for any batch and length within its workspace",
          "[alloc][inference]") {
  using nn::Task;
  model_forward_allocates_nothing<float, DualExpertAttention<float>, nn::InferenceModel<float>>(Task::cls, 32, 4, 2);
  model_forward_allocates_nothing<float, DualExpertAttention<float>, nn::InferenceModel<float>>(Task::mlm, 32, 4, 2);
  model_forward_allocates_nothing<double, DualExpertAttention<double>, nn::InferenceModel<double>>(Task::cls, 16, 2, 1);
  model_forward_allocates_nothing<float, DualExpertAttention<float, 2, 8>, nn::InferenceModel<float, 2, 8, 2>>(
      Task::cls, 16, 2, 2);
}

TEST_CASE("InferenceModel on a caller's static buffer: no heap at all after construction", "[alloc][inference]") {
  constexpr nn::InferenceConfig cfg{/*vocab*/ 29, /*D*/ 16, /*H*/ 2, /*L*/ 2, /*d_ff*/ 32, /*max_len*/ 16,
                                    /*classes*/ 3, nn::Task::cls};
  using Model = nn::InferenceModel<float, 2, 8, 2>;
  alignas(kWorkspaceAlign) static float ws[Model::workspace_size(cfg, 2, 16)];
  // parameters from a TransformerModel kept alive beside it (they would be a generated header's arrays)
  nn::ModelConfig mc;
  mc.vocab_size = cfg.vocab_size;
  mc.d_model = cfg.d_model;
  mc.n_heads = cfg.n_heads;
  mc.n_layers = cfg.n_layers;
  mc.d_ff = cfg.d_ff;
  mc.max_len = cfg.max_len;
  mc.n_classes = cfg.n_classes;
  Rng rng(5);
  nn::TransformerModel<float> src(mc, rng);

  const ParamList<float> params = src.parameters();

  AllocWindow w;
  Model m(cfg);
  for (Param<float>* p : params) m.bind(p->name.c_str(), p->value.data(), p->numel());
  m.check_bound();
  m.set_workspace(ws, static_cast<Index>(sizeof(ws) / sizeof(float)), 2, 16);
  const std::int64_t ids[2 * 16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 1, 2, 3, 4};
  const ConstMatMap<float> logits = m.forward(ids, 2, 16);
  const float l00 = logits(0, 0);
  w.stop();
  CHECK(w.news == 0);
  CHECK(w.eigen == 0);
  CHECK(std::isfinite(l00));
}
