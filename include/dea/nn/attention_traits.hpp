// dea/nn/attention_traits.hpp: what the encoder asks of an attention class, detected at compile time.
//
// Every attention class of the library has the same core shape:
//   Attention(Index d_model, Index n_heads, Rng& rng, Options opt);   typename Attention::Options / ::Cache / ::Scalar
//   Mat<S> forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache);   x, y [B*T, D], B = in.batch()
//   Mat<S> backward(const Mat<S>& dy, Cache& cache);                          adds parameter grads
//   ParamList<S> parameters();   void zero_grad();
//   static constexpr AttnSupport kSupport;   the optional inputs it accepts (any other is an error at forward)
// Optional parts, used when present:
//   - a gate loss: void backward_gate(Cache&, S scale) and Cache::loss_gate (Dual-Expert Attention);
//   - gate statistics: Cache::stats of type GateStats;
//   - token-routed forward: forward(x, const Tensor<int64_t>& token_ids, in, cache) (instead of the plain one);
//   - options: Options::dropout (set to the model's dropout), Options::layer_idx / num_layers (set per layer).
#pragma once

#include "../attention/gate_stats.hpp"
#include "../attention/inputs.hpp"
#include "../core/tensor.hpp"

#include <cstdint>
#include <type_traits>
#include <utility>

namespace dea {
namespace nn {
namespace traits {

template <class A, class = void>
struct has_gate_loss : std::false_type {};
template <class A>
struct has_gate_loss<A, std::void_t<decltype(std::declval<A&>().backward_gate(std::declval<typename A::Cache&>(),
                                                                                std::declval<typename A::Scalar>())),
                                    decltype(std::declval<typename A::Cache&>().loss_gate)>> : std::true_type {};

template <class A, class = void>
struct has_gate_stats : std::false_type {};
template <class A>
struct has_gate_stats<A, std::enable_if_t<std::is_same<std::decay_t<decltype(std::declval<typename A::Cache&>().stats)>,
                                                       GateStats>::value>> : std::true_type {};

template <class A, class = void>
struct takes_token_ids : std::false_type {};
template <class A>
struct takes_token_ids<
    A, std::void_t<decltype(std::declval<A&>().forward(
           std::declval<const Mat<typename A::Scalar>&>(), std::declval<const Tensor<std::int64_t>&>(),
           std::declval<const AttnInputs<typename A::Scalar>&>(), std::declval<typename A::Cache&>()))>>
    : std::true_type {};

template <class A, class = void>
struct has_support : std::false_type {};
template <class A>
struct has_support<A, std::enable_if_t<std::is_same<std::decay_t<decltype(A::kSupport)>, AttnSupport>::value>>
    : std::true_type {};

/// The optional attention inputs class A accepts: A::kSupport, or none of them for a class that declares nothing.
template <class A>
constexpr AttnSupport support() {
  if constexpr (has_support<A>::value)
    return A::kSupport;
  else
    return AttnSupport{};
}

template <class O, class = void>
struct has_dropout_option : std::false_type {};
template <class O>
struct has_dropout_option<O, std::void_t<decltype(std::declval<O&>().dropout)>> : std::true_type {};

template <class O, class = void>
struct has_layer_options : std::false_type {};
template <class O>
struct has_layer_options<O, std::void_t<decltype(std::declval<O&>().layer_idx), decltype(std::declval<O&>().num_layers)>>
    : std::true_type {};

}  // namespace traits

/// The options a model gives the attention of layer `layer` (of `n_layers`) by default: the class's defaults,
/// with its dropout set to the model's dropout and its layer index / count set where it has them.
template <class Attention>
typename Attention::Options default_attention_options(double dropout, Index layer, Index n_layers) {
  using O = typename Attention::Options;
  O o{};
  if constexpr (traits::has_dropout_option<O>::value) o.dropout = static_cast<std::decay_t<decltype(o.dropout)>>(dropout);
  if constexpr (traits::has_layer_options<O>::value) {
    o.layer_idx = layer;
    o.num_layers = n_layers;
  }
  return o;
}

}  // namespace nn
}  // namespace dea
