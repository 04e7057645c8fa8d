// embedded_inference: a Dual-Expert transformer with compile-time sizes whose weights are compiled in: a header
// written by `dea export-c` (DEA_WEIGHTS_HEADER, generated at build time from a checkpoint `dea train` makes).
// No file system, no fmt, no JSON; built with -fno-exceptions -fno-rtti, without OpenMP. The workspace is a
// static array sized at compile time, so after set-up nothing is allocated. Prints the logits of a fixed input,
// the memory the model uses and the latency of one forward pass.
#include DEA_WEIGHTS_HEADER

#include <dea/nn/inference.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>

namespace {

long g_operator_new = 0;  // calls of the global operator new (replaced below), to show the run does not allocate

namespace w = dea_weights;
using dea::Index;

constexpr Index kBatch = 1;
constexpr Index kLen = w::config.max_len < 16 ? w::config.max_len : 16;  // tokens of the fixed input
using Model = dea::nn::InferenceModel<float, static_cast<int>(w::config.n_heads),
                                      static_cast<int>(w::config.d_model / w::config.n_heads),
                                      static_cast<int>(w::config.n_layers)>;

constexpr Index kWorkspace = Model::workspace_size(w::config, kBatch, kLen);
alignas(dea::kWorkspaceAlign) float g_workspace[kWorkspace];

constexpr int kMaxRuns = 2000;
double g_times[kMaxRuns];

}  // namespace

void* operator new(std::size_t n) {
  ++g_operator_new;
  void* p = std::malloc(n ? n : 1);
  if (!p) std::abort();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

int main() {
  const dea::nn::InferenceConfig& c = w::config;
  Model model(c);
  w::bind(model);  // Maps over the compiled-in arrays: nothing copied
  model.set_workspace(g_workspace, kWorkspace, kBatch, kLen);
  const long new_after_setup = g_operator_new;

  // the fixed input: kLen token ids spread over the vocabulary (id 0 is padding)
  std::int64_t ids[kBatch * kLen];
  for (Index t = 0; t < kBatch * kLen; ++t) ids[t] = 1 + (7 * t + 3) % (c.vocab_size - 1);

  std::printf("embedded_inference: V=%ld D=%ld H=%ld L=%ld d_ff=%ld (%s head), input %ld x %ld tokens\n",
              static_cast<long>(c.vocab_size), static_cast<long>(c.d_model), static_cast<long>(c.n_heads),
              static_cast<long>(c.n_layers), static_cast<long>(c.d_ff), dea::nn::to_string(c.task),
              static_cast<long>(kBatch), static_cast<long>(kLen));
  const dea::ConstMatMap<float> out = model.forward(ids, kBatch, kLen);
  if (c.task == dea::nn::Task::cls) {
    std::printf("logits:");
    Index best = 0;
    for (Index k = 0; k < out.cols(); ++k) {
      std::printf(" %.9g", static_cast<double>(out(0, k)));
      if (out(0, k) > out(0, best)) best = k;
    }
    std::printf("\nprediction: class %ld\n", static_cast<long>(best));
  } else {
    std::printf("logits (first 4 of each position):");
    for (Index r = 0; r < out.rows(); ++r)
      for (Index k = 0; k < 4 && k < out.cols(); ++k) std::printf(" %.9g", static_cast<double>(out(r, k)));
    std::printf("\n");
  }

  // latency: repeated forward passes of the same input, median
  int runs = 0;
  double elapsed = 0;
  while (runs < kMaxRuns && (runs < 5 || elapsed < 0.3)) {
    const auto t0 = std::chrono::steady_clock::now();
    const dea::ConstMatMap<float> again = model.forward(ids, kBatch, kLen);
    const auto t1 = std::chrono::steady_clock::now();
    if (again(0, 0) != out(0, 0)) {
      std::printf("error: forward is not deterministic\n");
      return 1;
    }
    g_times[runs] = std::chrono::duration<double>(t1 - t0).count();
    elapsed += g_times[runs];
    ++runs;
  }
  std::sort(g_times, g_times + runs);
  const double median_us = 1e6 * g_times[runs / 2];

  const long params = static_cast<long>(model.parameter_count());
  const long param_bytes = params * static_cast<long>(sizeof(float));
  const long ws_bytes = static_cast<long>(model.workspace_bytes());
  std::printf("parameters: %ld values, %ld bytes (read-only arrays, compiled in)\n", params, param_bytes);
  std::printf("workspace: %ld bytes (static array for batch %ld x %ld tokens)\n", ws_bytes, static_cast<long>(kBatch),
              static_cast<long>(kLen));
  std::printf("memory (parameters + workspace): %ld bytes\n", param_bytes + ws_bytes);
  std::printf("latency: %.1f us per forward (median of %d runs)\n", median_us, runs);
  std::printf("operator new calls after set-up: %ld\n", g_operator_new - new_after_setup);
  return g_operator_new == new_after_setup ? 0 : 1;
}
