// embedded_profile_check: the embedded profile's configuration, checked. Built with -fno-exceptions -fno-rtti and
// without OpenMP (and without fmt, JSON or the file system), it includes every header of core/, ops/, attention/,
// nn/ and optim/, and checks that
//   1. errors reach the error handler: a custom handler receives the message dea::Error would carry (this one
//      longjmps back); the default handler prints it to stderr and aborts (checked in a child process);
//   2. compile-time sizes give the dynamic-size results, single-threaded: DualExpertAttention<float, 4, 16>
//      against DualExpertAttention<float>, and a 2-layer InferenceModel<float, 2, 8, 2> against TransformerModel
//      and InferenceModel with dynamic sizes (the latter bit for bit: this program is built with
//      -ffp-contract=off, so the compiler cannot fuse a*b + c differently in the two code paths);
//   3. every attention class trains in this configuration: a TransformerModel forward / backward with each, and
//      an AdamW step (profile_train.cpp).
// Prints one line per check; exit status 0 when all pass.
#include <dea/attention/inputs.hpp>
#include <dea/attention/dot_product.hpp>
#include <dea/attention/dual_expert.hpp>
#include <dea/attention/gate_loss.hpp>
#include <dea/attention/laplacian.hpp>
#include <dea/attention/token_routed.hpp>
#include <dea/core/config.hpp>
#include <dea/core/error.hpp>
#include <dea/core/parallel.hpp>
#include <dea/core/param.hpp>
#include <dea/core/rng.hpp>
#include <dea/core/tensor.hpp>
#include <dea/core/workspace.hpp>
#include <dea/nn/inference.hpp>
#include <dea/nn/transformer.hpp>
#include <dea/ops/activations.hpp>
#include <dea/ops/cross_entropy.hpp>
#include <dea/ops/dropout.hpp>
#include <dea/ops/gelu.hpp>
#include <dea/ops/gemm.hpp>
#include <dea/ops/l1_distance.hpp>
#include <dea/ops/layer_norm.hpp>
#include <dea/ops/linear.hpp>
#include <dea/ops/mse.hpp>
#include <dea/ops/rms_norm.hpp>
#include <dea/ops/rope.hpp>
#include <dea/ops/softmax.hpp>
#include <dea/optim/adamw.hpp>
#include <dea/optim/schedule.hpp>

#ifndef DEA_NO_EXCEPTIONS
#error "built without exceptions, dea/core/error.hpp must define DEA_NO_EXCEPTIONS"
#endif
#ifdef _OPENMP
#error "the embedded profile check is built without OpenMP"
#endif

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <cstring>

using namespace dea;

bool train_every_attention_class();  // profile_train.cpp (its own translation unit: the two compile in parallel)

namespace {

int g_failed = 0;

void report(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  if (!ok) ++g_failed;
}

// ---- 1. the error handler -----------------------------------------------------------------------------------

std::jmp_buf g_jump;
char g_message[1024];

void capture_and_jump(const char* message) {
  std::snprintf(g_message, sizeof g_message, "%s", message);
  std::longjmp(g_jump, 1);
}

/// Runs f with the capturing handler; true when it reported an error whose message contains `want`.
template <class F>
bool reports_error(F&& f, const char* want) {
  g_message[0] = '\0';
  const ErrorHandler previous = set_error_handler(&capture_and_jump);
  if (setjmp(g_jump) == 0) {
    f();
    set_error_handler(previous);
    std::printf("  (no error reported; expected '%s')\n", want);
    return false;
  }
  set_error_handler(previous);
  std::printf("  handler received: %s\n", g_message);
  return std::strstr(g_message, want) != nullptr;
}

void check_error_handler() {
  Rng rng(1);
  DualExpertAttention<float> layer(64, 4, rng);
  DualExpertAttention<float>::Cache cache;
  Mat<float> x = Mat<float>::Zero(6, 63);
  report(reports_error([&] { layer.forward(x, AttnInputs<float>(2, 3), cache); },
                       "dea: DualExpertAttention::forward: x: expected 64 columns (d_model), got 63"),
         "custom error handler gets the message of a bad argument");
  Mat<float> x2 = Mat<float>::Zero(6, 64);
  Tensor<std::uint8_t> km({3, 2}, 1);
  report(reports_error([&] { AttnInputs<float>(2, 3).set_key_mask(km); }, "key_mask: expected shape [2, 3], got [3, 2]"),
         "custom error handler: a bad key mask shape");
  report(g_message[0] != '\0' && std::strncmp(g_message, "dea: ", 5) == 0, "the message starts with 'dea: '");

  // the default handler, in a child process: message on stderr, then abort
  int fds[2];
  if (pipe(fds) != 0) {
    report(false, "pipe for the default-handler check");
    return;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // the abort is expected: no core file
    close(fds[0]);
    dup2(fds[1], 2);
    set_error_handler(nullptr);
    check(false, "profile check: bad argument ", 42);
    _exit(0);  // not reached when the handler aborts
  }
  close(fds[1]);
  char buf[512] = {0};
  std::size_t got = 0;
  for (ssize_t r; got + 1 < sizeof buf && (r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0;)
    got += static_cast<std::size_t>(r);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const bool aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  std::printf("  default handler wrote: %s", buf);
  report(aborted && std::strstr(buf, "dea: profile check: bad argument 42\n") != nullptr,
         "default error handler prints the message and aborts");
}

// ---- 2. compile-time sizes against dynamic sizes ---------------------------------------------------------------

template <class A, class B>
double rel_diff(const A& a, const B& b) {
  const double den = std::max(1.0, static_cast<double>(b.cwiseAbs().maxCoeff()));
  return static_cast<double>((a - b).cwiseAbs().maxCoeff()) / den;
}

void check_fixed_sizes() {
  Rng rng(2);
  DualExpertAttention<float> dyn(64, 4, rng);
  DualExpertAttention<float, 4, 16> fixed(64, 4, rng);
  const ParamList<float> pd = dyn.parameters(), pf = fixed.parameters();
  for (std::size_t i = 0; i < pd.size(); ++i) {
    init::uniform(pd[i]->value, rng, -0.3, 0.3);
    pf[i]->value = pd[i]->value;
  }
  const Index B = 2, T = 9;
  Mat<float> x(B * T, 64);
  init::normal(x, rng, 0, 1);
  Tensor<std::uint8_t> km({B, T}, 1);
  km[T - 1] = 0;
  AttnInputs<float> in(B, T);
  in.set_key_mask(km);
  DualExpertAttention<float>::Cache cd;
  DualExpertAttention<float, 4, 16>::Cache cf;
  const Mat<float> yd = dyn.forward(x, in, cd), yf = fixed.forward(x, in, cf);
  Mat<float> gy(B * T, 64);
  init::normal(gy, rng, 0, 1);
  const Mat<float> dxd = dyn.backward(gy, cd), dxf = fixed.backward(gy, cf);
  const double ry = rel_diff(yf, yd), rdx = rel_diff(dxf, dxd);
  std::printf("  DualExpertAttention<float, 4, 16> vs <float>: output %.3g, input gradient %.3g\n", ry, rdx);
  report(ry <= 1e-5 && rdx <= 1e-5, "DualExpertAttention with compile-time sizes gives the dynamic-size results");

  nn::ModelConfig mc;
  mc.vocab_size = 40;
  mc.d_model = 16;
  mc.n_heads = 2;
  mc.n_layers = 2;
  mc.d_ff = 32;
  mc.max_len = 16;
  mc.n_classes = 3;
  nn::TransformerModel<float> model(mc, rng);
  for (Param<float>* p : model.parameters())
    for (Index k = 0; k < p->numel(); ++k) p->value[k] += static_cast<float>(rng.uniform(-0.2, 0.2));
  nn::InferenceModel<float, 2, 8, 2> inf_fixed(nn::InferenceConfig::from(mc));
  nn::InferenceModel<float> inf_dyn(nn::InferenceConfig::from(mc));
  inf_fixed.bind_parameters(model);
  inf_dyn.bind_parameters(model);
  inf_fixed.reserve(2, 12);
  inf_dyn.reserve(2, 12);
  nn::ModelBatch<float> batch;
  batch.input_ids = Tensor<std::int64_t>({2, 12});
  batch.attention_mask = Tensor<std::uint8_t>({2, 12}, 1);
  for (Index k = 0; k < 24; ++k) batch.input_ids[k] = 1 + (5 * k) % 39;
  batch.attention_mask[23] = batch.attention_mask[22] = 0;
  nn::TransformerModel<float>::Cache mcache;
  const Mat<float> want = model.forward(batch, 0.0f, false, nullptr, mcache).logits;
  const Mat<float> got_fixed = inf_fixed.forward(batch.input_ids.ptr(), 2, 12, batch.attention_mask.ptr());
  const Mat<float> got_dyn = inf_dyn.forward(batch.input_ids.ptr(), 2, 12, batch.attention_mask.ptr());
  const double rf = rel_diff(got_fixed, want);
  std::printf("  InferenceModel<float, 2, 8, 2> vs TransformerModel<float>: %.3g; dynamic InferenceModel %s\n", rf,
              got_dyn == want ? "bitwise identical" : "differs");
  report(rf <= 1e-5, "a 2-layer model with compile-time sizes gives the dynamic-size logits");
  report(got_dyn == want, "InferenceModel with dynamic sizes gives TransformerModel's logits bit for bit");
}

}  // namespace

int main() {
  std::printf("embedded profile check (no exceptions, no RTTI, no OpenMP, %d thread)\n", num_threads());
  check_error_handler();
  check_fixed_sizes();
  report(train_every_attention_class(),
         "every attention class runs forward and backward (and AdamW steps) in this configuration");
  std::printf("embedded profile check: %s\n", g_failed == 0 ? "all checks pass" : "FAILED");
  return g_failed == 0 ? 0 : 1;
}
