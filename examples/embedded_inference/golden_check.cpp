// embedded_golden_check: the public golden cases of one Dual-Expert layer (tests/data/golden/layer_*.safetensors,
// the reference's own numbers) compiled in by `dea export-c --all --type double`, run through
// DualExpertAttention<float> without file system, fmt, JSON, exceptions, RTTI or OpenMP. It checks what
// `dea interop CASE --float --compare` checks: forward on the training graph with dropout 0, the task backward of
// sum(out.output * in.grad_output) and the gate backward; every out.* and grad.* tensor of the case within 1e-4
// of max |reference| (NaN in the same places). It prints a few output values, so that two builds (x86-64 and
// aarch64 in cmake/arm_check.sh) can be compared. Exit status 0 when every case passes.
#include "golden_layer_basic.hpp"
#include "golden_layer_inference.hpp"
#include "golden_layer_masked_block.hpp"

#include <dea/attention/dual_expert.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

using namespace dea;

namespace {

template <class Info>
using FindFn = const Info* (*)(const char*);

template <class Info>
Tensor<float> floats(const Info& t) {
  Shape shape(t.shape, t.shape + t.rank);
  Tensor<float> out(shape);
  const double* v = static_cast<const double*>(t.data);
  for (Index k = 0; k < out.numel(); ++k) out[k] = static_cast<float>(v[k]);
  return out;
}

/// max |got - expected| / max(max |expected|, 1e-12); NaN must be in the same places (else infinity).
template <class Info>
double rel_error(const Info& expected, const float* got, Index n) {
  const double* e = static_cast<const double*>(expected.data);
  double num = 0, mx = 0;
  for (Index k = 0; k < n; ++k) {
    const bool en = std::isnan(e[k]), gn = std::isnan(static_cast<double>(got[k]));
    if (en || gn) {
      if (en != gn) return INFINITY;
      continue;
    }
    num = std::fmax(num, std::fabs(static_cast<double>(got[k]) - e[k]));
    mx = std::fmax(mx, std::fabs(e[k]));
  }
  return num / std::fmax(mx, 1e-12);
}

template <class Info>
int run_case(const char* label, const Info* tensors, int n_tensors, FindFn<Info> find, const char* const (*md)[2],
             int n_md) {
  const Info* x_info = find("in.x");
  const Info* gy_info = find("in.grad_output");
  const Info* cg_info = find("c_gate");
  if (!x_info || !gy_info || !cg_info || x_info->rank != 3) {
    std::printf("%s: not a dea_layer case\n", label);
    return 1;
  }
  const Index B = x_info->shape[0], T = x_info->shape[1], D = x_info->shape[2], H = cg_info->numel;
  double gamma = 0;
  for (int k = 0; k < n_md; ++k)
    if (std::strcmp(md[k][0], "gamma_mix") == 0) gamma = std::atof(md[k][1]);

  Rng rng(0);
  DualExpertAttention<float>::Options opt;
  opt.out_proj = find("W_o.weight") != nullptr;
  opt.bias = find("W_q.bias") != nullptr;
  DualExpertAttention<float> layer(D, H, rng, opt);
  for (Param<float>* p : layer.parameters()) {
    const Info* t = find(p->name.c_str());
    if (!t || t->numel != p->numel()) {
      std::printf("%s: parameter %s missing or of the wrong size\n", label, p->name.c_str());
      return 1;
    }
    p->value = floats(*t).data;
  }
  AttnInputs<float> in(B, T);
  if (const Info* t = find("in.key_mask")) {
    Tensor<std::uint8_t> km(Shape(t->shape, t->shape + t->rank));
    std::memcpy(km.ptr(), t->data, static_cast<std::size_t>(km.numel()));
    in.set_key_mask(km);
  }
  if (const Info* t = find("in.alpha_oracle")) in.set_oracle(floats(*t)).set_gamma_mix(static_cast<float>(gamma));
  if (const Info* t = find("in.target_idx")) {
    Tensor<std::int64_t> target(Shape(t->shape, t->shape + t->rank));
    std::memcpy(target.ptr(), t->data, static_cast<std::size_t>(target.numel()) * sizeof(std::int64_t));
    in.set_targets(std::move(target));
  }

  const Mat<float> xm = floats(*x_info).matrix(D);
  DualExpertAttention<float>::Cache cache;
  layer.zero_grad();
  const Mat<float> y = layer.forward(xm, in, cache);
  const Mat<float> dx = layer.backward(floats(*gy_info).matrix(D), cache);
  layer.backward_gate(cache, 1.0f);

  // what the run produced, under the case's names
  int compared = 0, failed = 0;
  double worst = 0;
  const char* worst_name = "";
  for (int k = 0; k < n_tensors; ++k) {
    const Info& e = tensors[k];
    const bool is_out = std::strncmp(e.name, "out.", 4) == 0, is_grad = std::strncmp(e.name, "grad.", 5) == 0;
    if (!is_out && !is_grad) continue;
    const float* got = nullptr;
    Index n = -1;
    auto cell = [&](const AlignedVec<float>& v) {
      got = v.data();
      n = static_cast<Index>(v.size());
    };
    if (std::strcmp(e.name, "out.output") == 0) got = y.data(), n = y.size();
    else if (std::strcmp(e.name, "out.alpha_hat") == 0) cell(cache.alpha_hat);
    else if (std::strcmp(e.name, "out.E0_norm") == 0) cell(cache.e0n);
    else if (std::strcmp(e.name, "out.E1_norm") == 0) cell(cache.e1n);
    else if (std::strcmp(e.name, "out.attn") == 0) cell(cache.attn);
    else if (std::strcmp(e.name, "out.S_mix") == 0 && cache.has_oracle) cell(cache.scores);
    else if (std::strcmp(e.name, "out.loss_gate") == 0) got = &cache.loss_gate, n = 1;
    else if (std::strcmp(e.name, "grad.in.x") == 0) got = dx.data(), n = dx.size();
    else if (is_grad)
      for (Param<float>* p : layer.parameters())
        if (p->name == e.name + 5) got = p->grad.data(), n = p->numel();
    ++compared;
    if (!got || n != e.numel) {
      std::printf("%s: %s: not produced (or of the wrong size)\n", label, e.name);
      ++failed;
      continue;
    }
    const double r = rel_error(e, got, n);
    if (!(r <= 1e-4)) {
      std::printf("%s: %s: relative error %.3g > 1e-4\n", label, e.name, r);
      ++failed;
    }
    if (!(r <= worst)) {
      worst = r;
      worst_name = e.name;
    }
  }
  std::printf("%s: %d tensors compared, worst relative error %.3g (%s): %s\n", label, compared, worst, worst_name,
              failed == 0 && compared >= 15 ? "OK" : "FAILED");
  std::printf("%s values: %.9g %.9g %.9g %.9g %.9g\n", label, static_cast<double>(y(0, 0)),
              static_cast<double>(y(y.rows() - 1, D - 1)), static_cast<double>(dx(0, 0)),
              static_cast<double>(cache.attn[1]), static_cast<double>(cache.loss_gate));
  return failed == 0 && compared >= 15 ? 0 : 1;
}

#define DEA_GOLDEN_CASE(ns) \
  run_case(#ns, ns::tensors, ns::n_tensors, &ns::find, ns::metadata, ns::n_metadata)

}  // namespace

int main() {
  int bad = 0;
  bad += DEA_GOLDEN_CASE(golden_layer_inference);
  bad += DEA_GOLDEN_CASE(golden_layer_basic);
  bad += DEA_GOLDEN_CASE(golden_layer_masked_block);
  std::printf("embedded golden check: %s\n", bad == 0 ? "all cases pass" : "FAILED");
  return bad == 0 ? 0 : 1;
}
