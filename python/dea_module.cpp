// dea._core: the attention classes of dea over numpy buffers (docs/python.md).
//
// Arrays crossing into C++ are checked, never converted: an argument must be a numpy.ndarray of the layer's dtype
// (float32 or float64; int64 indices; bool or uint8 masks), C-contiguous, of the documented shape, or the call raises
// TypeError (wrong type or dtype) or ValueError (wrong shape or layout) naming the argument. The library's own
// checks (a NaN in x, an oracle value of +-inf, a target out of range, ...) raise ValueError with its message.
//
// Copies, exactly:
//  - x is copied once, into the layer's cache (backward needs it, and the caller may change its array in between);
//    the layer reads that copy, so the library copies nothing more. dy is copied once into a matrix.
//  - key_mask, alpha_oracle and target_idx are copied once into the forward's inputs (the cache keeps them).
//  - Results (output, dx) are returned without a copy: the numpy array owns the matrix the library computed.
//    alpha_hat and alpha_oracle are copies of the cache's maps (the next forward with that cache reuses them).
//  - parameters() and gradients() are views of the layer's own storage (writing them writes the layer), which
//    keep the layer alive.
// The GIL is released while the library computes (copies included), and each layer serialises its own calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dea/attention/dot_product.hpp>
#include <dea/attention/dual_expert.hpp>
#include <dea/attention/laplacian.hpp>
#include <dea/attention/token_routed.hpp>
#include <dea/core/parallel.hpp>
#include <dea/interop/dea_case.hpp>
#include <dea/interop/model_case.hpp>
#include <dea/interop/tr_mha_case.hpp>
#include <dea/version.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace py = pybind11;
using dea::Index;
using dea::Mat;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Argument checks

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else return "uint8";
}

std::string shape_of(const py::array& a) {
  std::ostringstream os;
  os << "[";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) os << (d ? ", " : "") << a.shape(d);
  return os.str() + "]";
}

std::string type_name(const py::handle& obj) {
  const py::handle t = reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()));
  std::string mod = py::hasattr(t, "__module__") ? py::str(t.attr("__module__")).cast<std::string>() : "";
  std::string name = py::str(t.attr("__qualname__")).cast<std::string>();
  return mod.empty() || mod == "builtins" ? name : mod + "." + name;
}

/// An expected extent: a number, or -1 for "any" (the message prints `sym` there).
struct Dim {
  Index n = -1;
  const char* sym = "";
};

/// `obj` as a C-contiguous numpy array of element type T whose shape is one of `shapes`, or a TypeError /
/// ValueError naming `name`. With T = std::uint8_t, bool arrays are accepted too (both are one byte, 0 or 1).
template <class T>
py::array checked(const py::handle& obj, const char* name, const std::vector<std::vector<Dim>>& shapes) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(std::string(name) + ": expected a numpy.ndarray of " + dtype_name<T>() + ", got " +
                         type_name(obj));
  auto a = py::reinterpret_borrow<py::array>(obj);
  bool dtype_ok = a.dtype().is(py::dtype::of<T>());
  if constexpr (std::is_same_v<T, std::uint8_t>) dtype_ok = dtype_ok || a.dtype().is(py::dtype::of<bool>());
  if (!dtype_ok)
    throw py::type_error(std::string(name) + ": expected dtype " + dtype_name<T>() +
                         (std::is_same_v<T, std::uint8_t> ? " or bool" : "") + ", got " +
                         py::str(a.dtype()).cast<std::string>() + " (arrays are not converted: convert with .astype)");
  bool shape_ok = false;
  std::string expected;
  for (const auto& s : shapes) {
    bool ok = static_cast<std::size_t>(a.ndim()) == s.size();
    std::string e = "[";
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (ok && s[d].n >= 0 && a.shape(static_cast<py::ssize_t>(d)) != s[d].n) ok = false;
      e += (d ? ", " : "") + (s[d].n >= 0 ? std::to_string(s[d].n) : std::string(s[d].sym));
    }
    expected += (expected.empty() ? "" : " or ") + e + "]";
    shape_ok = shape_ok || ok;
  }
  if (!shape_ok)
    throw py::value_error(std::string(name) + ": expected shape " + expected + ", got " + shape_of(a));
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(std::string(name) + ": expected a C-contiguous array, got one of shape " + shape_of(a) +
                          " with other strides (a transposed or sliced view?); arrays are not copied: pass "
                          "numpy.ascontiguousarray(" + name + ")");
  for (py::ssize_t d = 0; d < a.ndim(); ++d)
    if (a.shape(d) == 0) throw py::value_error(std::string(name) + ": expected no empty axis, got " + shape_of(a));
  return a;
}

template <class T>
const T* data_of(const py::array& a) {
  return static_cast<const T*>(a.data());
}

/// A dea::Tensor holding a copy of a checked array.
template <class T>
dea::Tensor<T> tensor_copy(const py::array& a) {
  dea::Shape shape(static_cast<std::size_t>(a.ndim()));
  for (py::ssize_t d = 0; d < a.ndim(); ++d) shape[static_cast<std::size_t>(d)] = a.shape(d);
  dea::Tensor<T> t(shape);
  if (t.numel() > 0) std::memcpy(t.ptr(), a.data(), sizeof(T) * static_cast<std::size_t>(t.numel()));
  return t;
}

/// The oracle's values: finite (a label) or NaN (none); +-inf is an error.
template <class S>
void check_oracle_values(const py::array& a) {
  const S* p = data_of<S>(a);
  for (py::ssize_t k = 0; k < a.size(); ++k)
    if (std::isinf(p[k]))
      throw py::value_error("alpha_oracle: expected finite values (labels) or NaN (unlabelled), got " +
                            std::to_string(p[k]) + " at flat position " + std::to_string(k));
}

/// Target keys: -1 (none) or a key index in [0, T).
inline void check_target_values(const py::array& a, Index T) {
  const std::int64_t* p = data_of<std::int64_t>(a);
  for (py::ssize_t k = 0; k < a.size(); ++k)
    if (p[k] < -1 || p[k] >= T)
      throw py::value_error("target_idx: expected -1 (none) or a key index in [0, " + std::to_string(T) + "), got " +
                            std::to_string(p[k]) + " at flat position " + std::to_string(k));
}

// ---------------------------------------------------------------------------------------------------------------
// Results

/// The matrix as a numpy array of `shape` that owns it (no copy).
template <class S>
py::array owning_array(Mat<S>&& m, std::vector<py::ssize_t> shape) {
  auto* heap = new Mat<S>(std::move(m));
  py::capsule owner(heap, [](void* p) { delete static_cast<Mat<S>*>(p); });
  return py::array_t<S>(shape, heap->data(), owner);
}

template <class S, class Vec>
py::array copy_array(const Vec& v, std::vector<py::ssize_t> shape) {
  py::array_t<S> a(shape);
  std::memcpy(a.mutable_data(), v.data(), sizeof(S) * v.size());
  return a;
}

/// name -> writable view of each parameter's value (grad = false) or gradient (grad = true); `owner` is the
/// Python object of the layer, kept alive by every view.
template <class S>
py::dict param_views(const dea::ParamList<S>& list, const py::object& owner, bool grad) {
  py::dict out;
  for (dea::Param<S>* p : list) {
    std::vector<py::ssize_t> shape(p->shape.begin(), p->shape.end());
    S* ptr = grad ? p->grad.data() : p->value.data();
    out[py::str(p->name)] = py::array_t<S>(shape, ptr, owner);
  }
  return out;
}

template <class S>
py::dict param_groups(const dea::ParamList<S>& list) {
  py::dict out;
  for (dea::Param<S>* p : list) out[py::str(p->name)] = p->group;
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Shared by the layers: the self-attention inputs of one forward

/// The layer's cache, or the one the caller passed (cache=...).
template <class Box>
std::shared_ptr<Box> pick_cache(const std::shared_ptr<Box>& own, const py::object& cache, const char* cls) {
  if (cache.is_none()) return own;
  if (!py::isinstance<Box>(cache))
    throw py::type_error(std::string("cache: expected a cache made by this ") + cls + "'s new_cache(), got " +
                         type_name(cache));
  return cache.cast<std::shared_ptr<Box>>();
}

// ---------------------------------------------------------------------------------------------------------------
// DualExpertAttention

// One Python object per layer: the layer, the random stream it was built from, a lock (calls from several Python
// threads run one at a time per layer) and the cache of the last forward when the caller keeps none.
template <class L>
struct LayerBox {
  using Layer = L;
  using S = typename Layer::Scalar;
  struct CacheBox {
    typename Layer::Cache c;
  };
  template <class Opt>
  LayerBox(Index d_model, Index n_heads, std::uint64_t seed, Opt opt) : rng(seed), own(std::make_shared<CacheBox>()) {
    layer = std::make_unique<Layer>(d_model, n_heads, rng, opt);
  }
  std::unique_ptr<Layer> layer;
  dea::Rng rng;
  std::mutex mu;
  std::shared_ptr<CacheBox> own;
};

template <class S>
using DeaLayer = LayerBox<dea::DualExpertAttention<S>>;

template <class S>
py::dict dea_forward(DeaLayer<S>& w, const py::object& x_obj, const py::object& key_mask,
                     const py::object& alpha_oracle, const py::object& target_idx, double gamma_mix, bool training,
                     bool causal, bool return_alpha_hat, const py::object& cache, const py::object& seed,
                     const py::object& frozen_alpha_hat) {
  const Index D = w.layer->d_model(), H = w.layer->n_heads();
  const py::array x = checked<S>(x_obj, "x", {{{-1, "B"}, {-1, "T"}, {D}}});
  const Index B = x.shape(0), T = x.shape(1);
  auto box = pick_cache(w.own, cache, "DualExpertAttention");
  std::optional<py::array> km, oracle, targets;
  if (!key_mask.is_none()) km = checked<std::uint8_t>(key_mask, "key_mask", {{{B}, {T}}});
  if (!alpha_oracle.is_none())
    oracle = checked<S>(alpha_oracle, "alpha_oracle", {{{B}, {T}, {T}}, {{B}, {H}, {T}, {T}}});
  if (oracle) check_oracle_values<S>(*oracle);
  if (!target_idx.is_none()) {
    if (!oracle) throw py::value_error("target_idx: given without alpha_oracle (the gate loss needs both)");
    targets = checked<std::int64_t>(target_idx, "target_idx", {{{B}, {T}}, {{B}, {H}, {T}}});
    check_target_values(*targets, T);
  }
  std::optional<py::array> frozen;
  if (!frozen_alpha_hat.is_none()) frozen = checked<S>(frozen_alpha_hat, "frozen_alpha_hat", {{{B}, {H}, {T}, {T}}});
  if (!(gamma_mix >= 0 && gamma_mix <= 1))
    throw py::value_error("gamma_mix: expected a value in [0, 1], got " + std::to_string(gamma_mix));
  const std::optional<std::uint64_t> reseed =
      seed.is_none() ? std::nullopt : std::optional<std::uint64_t>(seed.cast<std::uint64_t>());
  Mat<S> y;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(w.mu);
    if (reseed) w.rng.reseed(*reseed);
    dea::AttnInputs<S> in(B, T);
    if (km) in.set_key_mask(tensor_copy<std::uint8_t>(*km));
    if (oracle) in.set_oracle(tensor_copy<S>(*oracle));
    if (targets) in.set_targets(tensor_copy<std::int64_t>(*targets));
    in.set_gamma_mix(S(gamma_mix)).set_training(training, &w.rng).set_causal(causal);
    if (frozen) in.set_frozen_alpha_hat(tensor_copy<S>(*frozen));
    if (return_alpha_hat) in.set_keep_alpha_hat(true);
    auto& c = box->c;
    // x goes straight into the cache's copy (which the layer keeps for backward): forward then copies nothing
    c.q_in = dea::ConstMatMap<S>(data_of<S>(x), B * T, D);
    w.layer->forward(c.q_in, in, c, y);
  }
  const auto& c = box->c;
  py::dict out;
  out["output"] = owning_array(std::move(y), {B, T, D});
  const std::vector<py::ssize_t> cells{B, H, T, T};
  out["alpha_hat"] = return_alpha_hat && !c.alpha_hat.empty() ? copy_array<S>(c.alpha_hat, cells) : py::object(py::none());
  out["alpha_oracle"] = c.has_oracle && !c.oracle_ref.empty() ? copy_array<S>(c.oracle_ref, cells) : py::object(py::none());
  out["loss_gate"] = static_cast<double>(c.loss_gate);
  py::dict stats;
  if (c.has_oracle) {
    stats["loss_reg"] = c.stats.loss_reg;
    stats["loss_spot"] = c.stats.loss_spot;
    stats["loss_decision"] = c.stats.loss_decision;
    stats["decision_side_acc"] = c.stats.decision_side_acc;
    stats["n_decision_pairs"] = c.stats.n_decision_pairs;
  }
  out["stats"] = stats;
  return out;
}

/// dy checked against the cache's forward: [B, T, D] of the layer's dtype.
template <class S, class Box>
py::array checked_dy(const py::object& dy, Index B, Index T, Index D) {
  if (B <= 0) throw py::value_error("backward: the cache holds no forward pass (call forward first)");
  return checked<S>(dy, "dy", {{{B}, {T}, {D}}});
}

// The task backward of the cache's forward (B sequences of T queries): dy checked, dx [B, T, D] returned without a
// copy; the GIL is released and the layer locked while the library runs.
template <class W>
py::array layer_backward(W& w, const py::object& dy_obj, typename W::CacheBox& box, Index B, Index T) {
  using S = typename W::S;
  const Index D = w.layer->d_model();
  const py::array dy = checked_dy<S, typename W::CacheBox>(dy_obj, B, T, D);
  Mat<S> dx;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(w.mu);
    const Mat<S> dym = dea::ConstMatMap<S>(data_of<S>(dy), B * T, D);
    dx = w.layer->backward(dym, box.c);
  }
  return owning_array(std::move(dx), {B, T, D});
}

template <class S>
py::array dea_backward(DeaLayer<S>& w, const py::object& dy_obj, const py::object& cache) {
  auto box = pick_cache(w.own, cache, "DualExpertAttention");
  return layer_backward(w, dy_obj, *box, box->c.B, box->c.Tq);
}

// Backward of a loss that reads alpha_hat: g = dL/d alpha_hat [B, H, Tq, Tk] is chained through the gate,
// alpha_hat = min(0.95, sigmoid(clip(logit, -10, 10))) with logit = Q_i.w_q + K_j.w_k + w_E0 E0~ + w_E1 E1~ + c,
// into W_gate and c_gate only: the gate reads Q, K, E0~ and E1~ as constants, as it does for the gate loss. The
// slope is sigmoid' inside the clip and below the cap and 0 outside (the kinks), as the library's gate backward
// takes it. The reference kernel's cache holds the logit and E~ maps; after a tiled forward, E~ of a row is
// recomputed from the cache's Q, K, R and the row's mean and sigma (not with RoPE, whose experts read rotated
// vectors). One head per task, each summing over b, i, j in a fixed order: the same bits for any thread count.
template <class S>
void dea_backward_alpha_hat(DeaLayer<S>& w, const py::object& g_obj, const py::object& cache) {
  auto box = pick_cache(w.own, cache, "DualExpertAttention");
  auto& c = box->c;
  if (c.B <= 0) throw py::value_error("backward_alpha_hat: the cache holds no forward pass (call forward first)");
  const Index B = c.B, Tq = c.Tq, Tk = c.Tk, H = w.layer->n_heads(), Dh = w.layer->d_head(), G = 2 * Dh + 2;
  const py::array g = checked<S>(g_obj, "g_alpha_hat", {{{B}, {H}, {Tq}, {Tk}}});
  const bool maps = !c.logit.empty() && !c.e0n.empty() && !c.e1n.empty();
  if (!maps && (w.layer->options().rope_theta > 0 || c.mu0.empty()))
    throw std::runtime_error(
        "alpha_hat: backpropagating through it after a tiled-kernel forward with RoPE is not supported (the "
        "experts read rotated vectors); use kernel='reference'");
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(w.mu);
  const S* gp = data_of<S>(g);
  const S amax = S(dea::DeaConstants::alpha_max), clip = S(dea::DeaConstants::logit_clip);
  const S inv_sqrt = S(1) / std::sqrt(S(Dh)), inv_dh = S(1) / S(Dh), eps = S(dea::DeaConstants::norm_eps);
  const bool causal = c.in.causal();
  const S* wg_all = w.layer->W_gate().value.data();
  const S* cg_all = w.layer->c_gate().value.data();
  S* gw = w.layer->W_gate().grad.data();
  S* gc = w.layer->c_gate().grad.data();
  using Block = Eigen::Map<const Mat<S>, 0, Eigen::OuterStride<>>;
  using Row = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  dea::parallel_for(H, [&](Index h) {
    dea::ScopedSerialEigen serial;  // the (b, h) products below on this thread alone
    const S* wg = wg_all + h * G;
    std::vector<S> col(static_cast<std::size_t>(Tk)), lrow(static_cast<std::size_t>(Tk)),
        n0row(static_cast<std::size_t>(Tk)), n1row(static_cast<std::size_t>(Tk));
    Mat<S> QK, RK;                 // tiled: the (b, h) slice's products [Tq, Tk]
    dea::Vec<S> rr, kk, lq, lk;    // |R_i|^2, |K_j|^2, Q_i.w_q, K_j.w_k
    for (Index b = 0; b < B; ++b) {
      const std::uint8_t* km = c.in.has_key_mask() ? c.in.key_mask(b) : nullptr;
      if (!maps) {
        const Block Qh(c.Q.data() + b * Tq * c.Q.cols() + h * Dh, Tq, Dh, Eigen::OuterStride<>(c.Q.cols()));
        const Block Rh(c.R.data() + b * Tq * c.R.cols() + h * Dh, Tq, Dh, Eigen::OuterStride<>(c.R.cols()));
        const Block Kh(c.K.data() + b * Tk * c.K.cols() + h * Dh, Tk, Dh, Eigen::OuterStride<>(c.K.cols()));
        const Eigen::Map<const Row> wq(wg, Dh), wk(wg + Dh, Dh);
        QK.noalias() = Qh * Kh.transpose();
        RK.noalias() = Rh * Kh.transpose();
        rr = Rh.rowwise().squaredNorm();
        kk = Kh.rowwise().squaredNorm();
        lq.noalias() = Qh * wq.transpose();
        lk.noalias() = Kh * wk.transpose();
      }
      std::fill(col.begin(), col.end(), S(0));
      S s0 = 0, s1 = 0, sc = 0;
      for (Index i = 0; i < Tq; ++i) {
        const Index nk = causal ? std::min(Tk, i + 1) : Tk;  // causal: invisible cells are no part of the gate
        const std::size_t row = static_cast<std::size_t>(((b * H + h) * Tq + i) * Tk);
        const S* l = maps ? c.logit.data() + row : lrow.data();
        const S* n0 = maps ? c.e0n.data() + row : n0row.data();
        const S* n1 = maps ? c.e1n.data() + row : n1row.data();
        if (!maps) {  // the row's E~ and logit from the products and the row statistics
          const std::size_t rs = static_cast<std::size_t>((b * H + h) * Tq + i);
          const S inv0 = S(1) / (c.sigma0[rs] + eps), inv1 = S(1) / (c.sigma1[rs] + eps);
          for (Index j = 0; j < nk; ++j) {
            const std::size_t u = static_cast<std::size_t>(j);
            const bool real = km == nullptr || km[j] != 0;
            const S e0 = QK(i, j) * inv_sqrt, v = (S(2) * RK(i, j) - rr[i] - kk[j]) * inv_dh;
            const S e1 = v < S(0) ? v : S(0);
            n0row[u] = real ? (e0 - c.mu0[rs]) * inv0 : S(0);
            n1row[u] = real ? (e1 - c.mu1[rs]) * inv1 : S(0);
            lrow[u] = wg[2 * Dh] * n0row[u] + wg[2 * Dh + 1] * n1row[u] + lq[i] + lk[j] + cg_all[h];
          }
        }
        S rsum = 0;
        for (Index j = 0; j < nk; ++j) {
          const S x = S(1) / (S(1) + std::exp(-l[j]));
          const S slope = (l[j] < -clip || l[j] > clip || x > amax) ? S(0) : x * (S(1) - x);
          const S dl = gp[row + j] * slope;
          rsum += dl;
          col[static_cast<std::size_t>(j)] += dl;
          s0 += dl * n0[j];
          s1 += dl * n1[j];
        }
        sc += rsum;
        for (Index d = 0; d < Dh; ++d) gw[h * G + d] += rsum * c.Q(b * Tq + i, h * Dh + d);  // w_q
      }
      for (Index j = 0; j < Tk; ++j)  // w_k: sum_j (sum_i dl_ij) K_j
        for (Index d = 0; d < Dh; ++d)
          gw[h * G + Dh + d] += col[static_cast<std::size_t>(j)] * c.K(b * Tk + j, h * Dh + d);
      gw[h * G + 2 * Dh] += s0;      // w_E0: sum dl E0~
      gw[h * G + 2 * Dh + 1] += s1;  // w_E1: sum dl E1~
      gc[h] += sc;                   // c_gate: sum dl
    }
  }, double(B) * double(Tq) * double(Tk) * double(Dh) > dea::kParallelMinFlops);
}

template <class S>
void bind_dea(py::module_& m, const char* name) {
  using W = DeaLayer<S>;
  using Layer = typename W::Layer;
  using Box = typename W::CacheBox;
  const std::string cache_name = std::string(name) + "Cache";
  py::class_<Box, std::shared_ptr<Box>>(m, cache_name.c_str(),
                                        "What one forward keeps for its backward (DualExpertAttention.new_cache)");
  py::class_<W>(m, name, "Dual-Expert Attention over numpy arrays (docs/python.md)")
      .def(py::init([](Index d_model, Index n_heads, std::uint64_t seed, double dropout, bool bias, bool out_proj,
                       double lambda_s, double tau_s, double tau_d, double lambda_d, const std::string& kernel,
                       Index block_q, double rope_theta) {
             typename Layer::Options opt;
             opt.dropout = S(dropout);
             opt.bias = bias;
             opt.out_proj = out_proj;
             opt.gate.lambda_s = S(lambda_s);
             opt.gate.tau_s = S(tau_s);
             opt.gate.tau_d = S(tau_d);
             opt.gate.lambda_d = S(lambda_d);
             if (kernel == "reference") opt.kernel = dea::DeaKernel::reference;
             else if (kernel == "tiled") opt.kernel = dea::DeaKernel::tiled;
             else throw py::value_error("kernel: expected 'reference' or 'tiled', got '" + kernel + "'");
             opt.block_q = block_q;
             opt.rope_theta = rope_theta;
             if (!(dropout >= 0 && dropout < 1))
               throw py::value_error("dropout: expected a probability in [0, 1), got " + std::to_string(dropout));
             return std::make_unique<W>(d_model, n_heads, seed, opt);
           }),
           py::arg("d_model"), py::arg("n_heads"), py::kw_only(), py::arg("seed") = 0, py::arg("dropout") = 0.0,
           py::arg("bias") = true, py::arg("out_proj") = true, py::arg("lambda_s") = dea::DeaConstants::lambda_s,
           py::arg("tau_s") = dea::DeaConstants::tau_s, py::arg("tau_d") = dea::DeaConstants::tau_d,
           py::arg("lambda_d") = dea::DeaConstants::lambda_d, py::arg("kernel") = "reference",
           py::arg("block_q") = 0, py::arg("rope_theta") = 0.0)
      .def_property_readonly("d_model", [](W& w) { return w.layer->d_model(); })
      .def_property_readonly("n_heads", [](W& w) { return w.layer->n_heads(); })
      .def_property_readonly("d_head", [](W& w) { return w.layer->d_head(); })
      .def_property_readonly("dtype", [](W&) { return py::dtype::of<S>(); })
      .def("new_cache", [](W&) { return std::make_shared<Box>(); },
           "A cache of its own for one forward (the layer's own is used when forward gets none)")
      .def("forward", &dea_forward<S>, py::arg("x"), py::arg("key_mask") = py::none(),
           py::arg("alpha_oracle") = py::none(), py::arg("target_idx") = py::none(), py::arg("gamma_mix") = 0.0,
           py::kw_only(), py::arg("training") = false, py::arg("causal") = false, py::arg("return_alpha_hat") = true,
           py::arg("cache") = py::none(), py::arg("seed") = py::none(), py::arg("frozen_alpha_hat") = py::none(),
           "x [B, T, D] -> dict(output [B, T, D], alpha_hat [B, H, T, T], alpha_oracle, loss_gate, stats)")
      .def("backward", &dea_backward<S>, py::arg("dy"), py::kw_only(), py::arg("cache") = py::none(),
           "Task backward: adds into every gradient but W_gate / c_gate; returns dx [B, T, D]")
      .def("backward_gate",
           [](W& w, double scale, const py::object& cache) {
             auto box = pick_cache(w.own, cache, "DualExpertAttention");
             if (box->c.B <= 0) throw py::value_error("backward_gate: the cache holds no forward pass");
             py::gil_scoped_release nogil;
             std::lock_guard<std::mutex> lock(w.mu);
             w.layer->backward_gate(box->c, S(scale));
           },
           py::arg("scale") = 1.0, py::kw_only(), py::arg("cache") = py::none(),
           "Gate-loss backward: adds scale * d loss_gate / d(W_gate, c_gate) into their gradients only")
      .def("backward_alpha_hat", &dea_backward_alpha_hat<S>, py::arg("g_alpha_hat"), py::kw_only(),
           py::arg("cache") = py::none(),
           "Backward of a loss reading alpha_hat: adds g_alpha_hat [B, H, T, T] chained through the gate into the "
           "gradients of W_gate / c_gate only")
      .def("zero_grad", [](W& w) { w.layer->zero_grad(); })
      .def("parameters", [](py::object self) { return param_views(self.cast<W&>().layer->parameters(), self, false); },
           "name -> writable view of the parameter (the layer's own storage)")
      .def("gradients", [](py::object self) { return param_views(self.cast<W&>().layer->parameters(), self, true); },
           "name -> writable view of the parameter's gradient")
      .def("parameter_groups", [](W& w) { return param_groups(w.layer->parameters()); },
           "name -> optimiser group ('main' or 'gate')")
      .def("verify_gradient_isolation",
           [](W& w, const py::object& x_obj, const py::object& key_mask, const py::object& alpha_oracle,
              const py::object& target_idx, double gamma_mix) {
             const Index D = w.layer->d_model(), H = w.layer->n_heads();
             const py::array x = checked<S>(x_obj, "x", {{{-1, "B"}, {-1, "T"}, {D}}});
             const Index B = x.shape(0), T = x.shape(1);
             std::optional<py::array> km, oracle, targets;
             if (!key_mask.is_none()) km = checked<std::uint8_t>(key_mask, "key_mask", {{{B}, {T}}});
             oracle = checked<S>(alpha_oracle, "alpha_oracle", {{{B}, {T}, {T}}, {{B}, {H}, {T}, {T}}});
             check_oracle_values<S>(*oracle);
             if (!target_idx.is_none()) {
               targets = checked<std::int64_t>(target_idx, "target_idx", {{{B}, {T}}, {{B}, {H}, {T}}});
               check_target_values(*targets, T);
             }
             typename Layer::IsolationReport r;
             {
               py::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(w.mu);
               dea::AttnInputs<S> in(B, T);
               if (km) in.set_key_mask(tensor_copy<std::uint8_t>(*km));
               in.set_oracle(tensor_copy<S>(*oracle)).set_gamma_mix(S(gamma_mix));
               if (targets) in.set_targets(tensor_copy<std::int64_t>(*targets));
               const Mat<S> xm = dea::ConstMatMap<S>(data_of<S>(x), B * T, D);
               r = w.layer->verify_gradient_isolation(xm, in);
             }
             py::dict d;
             d["task_gate_grad"] = r.task_gate_grad;
             d["task_rel_grad"] = r.task_rel_grad;
             d["gate_main_grad"] = r.gate_main_grad;
             d["gate_gate_grad"] = r.gate_gate_grad;
             d["ok"] = r.ok;
             return d;
           },
           py::arg("x"), py::arg("key_mask") = py::none(), py::arg("alpha_oracle"), py::arg("target_idx") = py::none(),
           py::arg("gamma_mix") = 0.5,
           "The library's isolation check on one batch (clears the gradients before and after)");
}

// ---------------------------------------------------------------------------------------------------------------
// Dot-product and Laplacian attention (the same interface: forward(x, key_mask, causal, training), backward)

template <class Layer>
using PlainLayer = LayerBox<Layer>;

template <class Layer>
void bind_plain(py::module_& m, const char* name, const char* doc) {
  using W = PlainLayer<Layer>;
  using S = typename W::S;
  using Box = typename W::CacheBox;
  const std::string cache_name = std::string(name) + "Cache";
  py::class_<Box, std::shared_ptr<Box>>(m, cache_name.c_str(), "What one forward keeps for its backward");
  py::class_<W> cls(m, name, doc);
  if constexpr (std::is_same_v<Layer, dea::LaplacianAttention<S>>) {
    cls.def(py::init([](Index d_model, Index n_heads, std::uint64_t seed, double dropout, bool bias, double sigma0) {
              typename Layer::Options opt;
              opt.dropout = S(dropout);
              opt.bias = bias;
              opt.sigma0 = S(sigma0);
              return std::make_unique<W>(d_model, n_heads, seed, opt);
            }),
            py::arg("d_model"), py::arg("n_heads"), py::kw_only(), py::arg("seed") = 0, py::arg("dropout") = 0.0,
            py::arg("bias") = true, py::arg("sigma0") = 0.7);
    cls.def("bandwidth", [](W& w, Index h) { return static_cast<double>(w.layer->bandwidth(h)); }, py::arg("h"));
  } else {
    cls.def(py::init([](Index d_model, Index n_heads, std::uint64_t seed, double dropout, bool bias) {
              typename Layer::Options opt;
              opt.dropout = S(dropout);
              opt.bias = bias;
              return std::make_unique<W>(d_model, n_heads, seed, opt);
            }),
            py::arg("d_model"), py::arg("n_heads"), py::kw_only(), py::arg("seed") = 0, py::arg("dropout") = 0.0,
            py::arg("bias") = true);
  }
  cls.def_property_readonly("d_model", [](W& w) { return w.layer->d_model(); })
      .def_property_readonly("n_heads", [](W& w) { return w.layer->n_heads(); })
      .def_property_readonly("dtype", [](W&) { return py::dtype::of<S>(); })
      .def("new_cache", [](W&) { return std::make_shared<Box>(); })
      .def("forward",
           [name](W& w, const py::object& x_obj, const py::object& key_mask, bool causal, bool training,
              const py::object& cache, const py::object& seed) {
             const Index D = w.layer->d_model();
             const py::array x = checked<S>(x_obj, "x", {{{-1, "B"}, {-1, "T"}, {D}}});
             const Index B = x.shape(0), T = x.shape(1);
             auto box = pick_cache(w.own, cache, name);
             std::optional<py::array> km;
             if (!key_mask.is_none()) km = checked<std::uint8_t>(key_mask, "key_mask", {{{B}, {T}}});
             const bool reseed = !seed.is_none();
             const std::uint64_t s = reseed ? seed.cast<std::uint64_t>() : 0;
             Mat<S> y;
             {
               py::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(w.mu);
               if (reseed) w.rng.reseed(s);
               dea::AttnInputs<S> in(B, T);
               if (km) in.set_key_mask(tensor_copy<std::uint8_t>(*km));
               in.set_causal(causal).set_training(training, &w.rng);
               // x straight into the cache's copy, which the layer then uses without copying again
               box->c.x = dea::ConstMatMap<S>(data_of<S>(x), B * T, D);
               w.layer->forward(box->c.x, in, box->c, y);
             }
             return owning_array(std::move(y), {B, T, D});
           },
           py::arg("x"), py::arg("key_mask") = py::none(), py::kw_only(), py::arg("causal") = false,
           py::arg("training") = false, py::arg("cache") = py::none(), py::arg("seed") = py::none(),
           "x [B, T, D] -> output [B, T, D]")
      .def("backward",
           [name](W& w, const py::object& dy_obj, const py::object& cache) {
             auto box = pick_cache(w.own, cache, name);
             return layer_backward(w, dy_obj, *box, box->c.batch, box->c.seq);
           },
           py::arg("dy"), py::kw_only(), py::arg("cache") = py::none(),
           "Adds into every parameter gradient; returns dx [B, T, D]")
      .def("zero_grad", [](W& w) { w.layer->zero_grad(); })
      .def("parameters", [](py::object self) { return param_views(self.cast<W&>().layer->parameters(), self, false); })
      .def("gradients", [](py::object self) { return param_views(self.cast<W&>().layer->parameters(), self, true); });
}

// ---------------------------------------------------------------------------------------------------------------
// Token-routed attention

template <class S>
using TrLayer = LayerBox<dea::TokenRoutedAttention<S>>;

template <class S>
void bind_tr(py::module_& m, const char* name) {
  using W = TrLayer<S>;
  using Box = typename W::CacheBox;
  const std::string cache_name = std::string(name) + "Cache";
  py::class_<Box, std::shared_ptr<Box>>(m, cache_name.c_str(), "What one forward keeps for its backward");
  py::class_<W>(m, name, "Token-routed multi-head attention (tr_mha / tr_mha_v2) over numpy arrays")
      .def(py::init([](Index d_model, Index n_heads, std::uint64_t seed, const std::string& variant, Index num_experts,
                       Index adapter_rank, Index top_k, double adapter_gate_init, double id_primary_logit,
                       double id_secondary_logit, double id_other_logit, double verifier_gate_init,
                       double verifier_temperature, const std::string& targets, Index layer_idx, Index num_layers,
                       double initializer_range, bool use_qk_norm, double qk_norm_eps, double rope_theta, bool causal,
                       std::int64_t vocab_size) {
             dea::TokenRoutedOptions o;
             o.variant = dea::parse_tr_variant(variant);
             o.num_experts = num_experts;
             o.adapter_rank = adapter_rank;
             o.top_k = top_k;
             o.adapter_gate_init = adapter_gate_init;
             o.id_primary_logit = id_primary_logit;
             o.id_secondary_logit = id_secondary_logit;
             o.id_other_logit = id_other_logit;
             o.verifier_gate_init = verifier_gate_init;
             o.verifier_temperature = verifier_temperature;
             o.targets = dea::parse_tr_targets(targets);
             o.layer_idx = layer_idx;
             o.num_layers = num_layers;
             o.initializer_range = initializer_range;
             o.use_qk_norm = use_qk_norm;
             o.qk_norm_eps = qk_norm_eps;
             o.rope_theta = rope_theta;
             o.causal = causal;
             o.vocab_size = vocab_size;
             return std::make_unique<W>(d_model, n_heads, seed, o);
           }),
           py::arg("d_model"), py::arg("n_heads"), py::kw_only(), py::arg("seed") = 0, py::arg("variant") = "v1",
           py::arg("num_experts") = 4, py::arg("adapter_rank") = 8, py::arg("top_k") = 2,
           py::arg("adapter_gate_init") = 0.1, py::arg("id_primary_logit") = 2.0, py::arg("id_secondary_logit") = 1.0,
           py::arg("id_other_logit") = -2.0, py::arg("verifier_gate_init") = 0.1,
           py::arg("verifier_temperature") = 1.0, py::arg("targets") = "qv", py::arg("layer_idx") = 0,
           py::arg("num_layers") = 1, py::arg("initializer_range") = 0.02, py::arg("use_qk_norm") = true,
           py::arg("qk_norm_eps") = 1e-6, py::arg("rope_theta") = 10000.0, py::arg("causal") = true,
           py::arg("vocab_size") = 0)
      .def_property_readonly("d_model", [](W& w) { return w.layer->d_model(); })
      .def_property_readonly("n_heads", [](W& w) { return w.layer->n_heads(); })
      .def_property_readonly("dtype", [](W&) { return py::dtype::of<S>(); })
      .def_property_readonly("attention_type", [](W& w) { return std::string(w.layer->attention_type()); })
      .def("new_cache", [](W&) { return std::make_shared<Box>(); })
      .def("forward",
           [](W& w, const py::object& x_obj, const py::object& token_ids, const py::object& key_mask,
              const py::object& cache) {
             const Index D = w.layer->d_model();
             const py::array x = checked<S>(x_obj, "x", {{{-1, "B"}, {-1, "T"}, {D}}});
             const Index B = x.shape(0), T = x.shape(1);
             auto box = pick_cache(w.own, cache, "TokenRoutedAttention");
             std::optional<py::array> km, ids;
             if (!key_mask.is_none()) km = checked<std::uint8_t>(key_mask, "key_mask", {{{B}, {T}}});
             if (!token_ids.is_none()) ids = checked<std::int64_t>(token_ids, "token_ids", {{{B}, {T}}});
             Mat<S> y;
             {
               py::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(w.mu);
               dea::AttnInputs<S> in(B, T);
               if (km) in.set_key_mask(tensor_copy<std::uint8_t>(*km));
               box->c.x = dea::ConstMatMap<S>(data_of<S>(x), B * T, D);
               y = ids ? w.layer->forward(box->c.x, tensor_copy<std::int64_t>(*ids), in, box->c)
                       : w.layer->forward_plain(box->c.x, in, box->c);
             }
             return owning_array(std::move(y), {B, T, D});
           },
           py::arg("x"), py::arg("token_ids") = py::none(), py::arg("key_mask") = py::none(), py::kw_only(),
           py::arg("cache") = py::none(),
           "x [B, T, D], token_ids [B, T] int64 (routing; None = the plain path) -> output [B, T, D]")
      .def("backward",
           [](W& w, const py::object& dy_obj, const py::object& cache) {
             auto box = pick_cache(w.own, cache, "TokenRoutedAttention");
             return layer_backward(w, dy_obj, *box, box->c.batch, box->c.seq);
           },
           py::arg("dy"), py::kw_only(), py::arg("cache") = py::none())
      .def("telemetry",
           [](W& w) {
             py::dict d;
             for (const auto& kv : w.layer->telemetry().items()) d[py::str(kv.first)] = kv.second;
             return d;
           },
           "The reference's telemetry of the last routed forward")
      .def("zero_grad", [](W& w) { w.layer->zero_grad(); })
      .def("parameters", [](py::object self) { return param_views(self.cast<W&>().layer->parameters(), self, false); })
      .def("gradients", [](py::object self) { return param_views(self.cast<W&>().layer->parameters(), self, true); });
}

// ---------------------------------------------------------------------------------------------------------------
// Golden cases

template <class S>
py::dict run_case(const std::string& path, const std::string& pe_path) {
  const bool single = std::is_same_v<S, float>;
  py::dict out;
  out["path"] = path;
  out["dtype"] = dtype_name<S>();
  py::list tensors;
  std::string kind;
  bool ok = true;
  double worst = 0;
  std::string tolerance;
  {
    struct Row {
      std::string name;
      double error;
      bool ok;
    };
    std::vector<Row> rows;
    {
      py::gil_scoped_release nogil;
      const dea::io::SafeTensors cs = dea::io::SafeTensors::load(path);
      const auto it = cs.metadata().find("kind");
      kind = it == cs.metadata().end() ? "" : it->second;
      if (kind == "tr_mha_layer") {
        const auto r = dea::interop::run_tr_mha_case<S>(path);
        for (const auto& t : r.tensors) rows.push_back({t.name, t.max_abs_error / std::max(t.tolerance, 1e-300), t.ok});
        for (const auto& t : r.telemetry) rows.push_back({"telemetry." + t.name, t.error, t.ok});
        ok = r.ok;
        worst = r.worst_ratio;
        tolerance = "error / tolerance, tolerance 2e-6 x max(1, max|ref|) (route indices exact)";
      } else if (kind == "dea_layer" || kind == "dea_model") {
        if (!pe_path.empty() && kind != "dea_model")
          throw dea::Error("pe: applies to dea_model cases only (" + path + " is '" + kind + "')");
        Mat<double> pe;
        if (!pe_path.empty()) {
          const dea::Tensor<double> t = dea::io::SafeTensors::load(pe_path).get<double>("pe");
          dea::check(t.dim() == 2, pe_path, ": tensor 'pe' must be [max_len, d_model], got ", dea::shape_str(t.shape));
          pe = t.matrix(t.size(1));
        }
        const dea::io::SafeTensors got = kind == "dea_layer"
                                             ? dea::interop::run_dea_layer_case<S>(cs)
                                             : dea::interop::run_dea_model_case<S>(cs, pe_path.empty() ? nullptr : &pe);
        const double tol = single ? 1e-4 : 1e-9;
        for (const auto& c : dea::interop::compare_case(cs, got, tol)) {
          rows.push_back({c.name, c.missing ? INFINITY : c.rel_error, c.ok && !c.missing});
          ok = ok && c.ok && !c.missing;
          if (!c.integer) worst = std::max(worst, c.missing ? INFINITY : c.rel_error);
        }
        tolerance = single ? "relative 1e-4" : "relative 1e-9";
      } else {
        throw dea::Error(path + ": case kind '" + kind + "' is not run by this module (it runs dea_layer, dea_model "
                         "and tr_mha_layer; the dea program's interop command runs every kind)");
      }
    }
    for (const auto& r : rows) {
      py::dict t;
      t["name"] = r.name;
      t["error"] = r.error;
      t["ok"] = r.ok;
      tensors.append(t);
    }
  }
  out["kind"] = kind;
  out["ok"] = ok;
  out["worst"] = worst;
  out["tolerance"] = tolerance;
  out["tensors"] = tensors;
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dea: Dual-Expert Attention and the other attention classes of the C++ library, over numpy arrays";
  m.attr("__version__") = DEA_VERSION_STRING;

  bind_dea<float>(m, "DualExpertAttentionF32");
  bind_dea<double>(m, "DualExpertAttentionF64");
  bind_plain<dea::DotProductAttention<float>>(m, "DotProductAttentionF32", "Multi-head scaled dot-product attention");
  bind_plain<dea::DotProductAttention<double>>(m, "DotProductAttentionF64", "Multi-head scaled dot-product attention");
  bind_plain<dea::LaplacianAttention<float>>(m, "LaplacianAttentionF32", "First-Spike Laplacian attention");
  bind_plain<dea::LaplacianAttention<double>>(m, "LaplacianAttentionF64", "First-Spike Laplacian attention");
  bind_tr<float>(m, "TokenRoutedAttentionF32");
  bind_tr<double>(m, "TokenRoutedAttentionF64");

  m.def("set_num_threads", [](int n) {
    if (n < 1) throw py::value_error("n: expected a thread count >= 1, got " + std::to_string(n));
    dea::set_num_threads(n);
  }, py::arg("n"), "Threads of the library's parallel loops (OpenMP); results are the same bits for any count");
  m.def("num_threads", &dea::num_threads, "Threads the library's parallel loops use");
  m.def("run_golden_case",
        [](const std::string& path, const std::string& dtype, const py::object& pe) {
          const std::string pe_path = pe.is_none() ? "" : py::str(pe).cast<std::string>();
          if (dtype == "float64" || dtype == "double") return run_case<double>(path, pe_path);
          if (dtype == "float32" || dtype == "float") return run_case<float>(path, pe_path);
          throw py::value_error("dtype: expected 'float64' or 'float32', got '" + dtype + "'");
        },
        py::arg("path"), py::arg("dtype") = "float64", py::arg("pe") = py::none(),
        "Runs a reference case file (kind dea_layer, dea_model or tr_mha_layer) as the dea program's interop command "
        "does (pe: a dea_model case's positional table, like its --pe); returns dict(kind, ok, worst, tolerance, "
        "tensors=[dict(name, error, ok)])");
}
