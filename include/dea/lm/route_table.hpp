// dea/lm/route_table.hpp: the per-layer token-id route tables of the TR-MoE MLP (`tr_hash_engine`).
//
// A re-implementation of the route-table construction of the public complexity-framework (commit 17371ce5,
// complexity/tr_hash/routing.py), stated in docs/lm.md (route tables). A table R [V, k] gives, for every token id
// t in [0, V), the k experts e_j = R(t, j) of slot j = 0..k-1. It is built once per layer, on the CPU, from the
// layer index l and the fixed seed 0x71D5A17; it does not depend on any learned value.
//
//   token_id_balanced_hash
//     E = 1: R = 0.
//     order = randperm(V, seed + 104729 l)                  rank q -> token order[q]
//     perm  = randperm(E, (seed ^ 0x5EC0D) + 104729 l)      the layer's expert relabelling
//     odd   = [1, 3, ..., E-1]
//     q = 0..V-1: group = q / E, pos = q mod E, stride = odd[mix32(group + seed + l 0x9E3779B1) mod (E/2)]
//                 R(order[q], j) = perm[(pos + j stride) mod E]
//   modulo_cyclic, alias modulo
//     perm = randperm(E, (seed ^ 0xC0DE) + 104729 l),  R(t, j) = (perm[t mod E] + j) mod E
//
// randperm(n, s) is torch's CPU randperm under a generator seeded with s: MT19937 seeded with s mod 2^32 (the
// standard init_genrand, i.e. std::mt19937) and a forward Fisher-Yates shuffle, z = mt() mod (n - i),
// swap(a[i], a[i + z]) for i = 0..n-2. That loop is torch's for n < 2^32 / 20, far above any vocabulary.
//
// Every complete block of E consecutive ranks of the balanced hash uses each expert once per slot; the odd stride
// makes the k experts of a token distinct (E is a power of two). The framework's buffer `engine.route_table` is
// the transpose, [k, V] (slot-major); route_table_from_buffer and route_table_buffer convert.
#pragma once

#include "../core/error.hpp"
#include "../core/tensor.hpp"

#include <Eigen/Core>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace dea {
namespace lm {

/// Per-token rows: R(t, j) is the expert of slot j for token id t. [V, k].
using RouteTable = Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The route strategies this library builds. The reference also has token_id_multi_hash, token_id_affine_hash and
/// token_id_hierarchical_hash; they are not reproduced here (load such a table from the checkpoint instead).
enum class RoutingStrategy { token_id_balanced_hash, modulo_cyclic };

/// The fixed route seed of the reference (`route_seed`, not settable from its ModelConfig): 0x71D5A17.
constexpr std::uint64_t kRouteSeed = 0x71D5A17u;  // = 119364119

inline const char* to_string(RoutingStrategy s) {
  return s == RoutingStrategy::token_id_balanced_hash ? "token_id_balanced_hash" : "modulo_cyclic";
}

/// "token_id_balanced_hash", "modulo_cyclic" or "modulo" (an alias of modulo_cyclic). Every other value throws
/// dea::Error naming it; the reference's other strategies are named as known but not implemented.
inline RoutingStrategy parse_routing_strategy(const std::string& s) {
  if (s == "token_id_balanced_hash") return RoutingStrategy::token_id_balanced_hash;
  if (s == "modulo_cyclic" || s == "modulo") return RoutingStrategy::modulo_cyclic;
  if (s == "token_id_multi_hash" || s == "token_id_affine_hash" || s == "token_id_hierarchical_hash")
    ::dea::detail::raise("routing_strategy: '" + s + "' is a strategy of the reference that dea does not build (supported: "
                  "token_id_balanced_hash, modulo_cyclic, modulo); a table of it can be loaded from a checkpoint's "
                  "engine.route_table");
  ::dea::detail::raise("routing_strategy: expected one of token_id_balanced_hash, modulo_cyclic, modulo, got '" + s + "'");
}

/// The "lowbias32" hash, all steps modulo 2^32; the argument is first reduced modulo 2^32.
inline std::uint32_t mix32(std::uint64_t v) {
  std::uint32_t x = static_cast<std::uint32_t>(v & 0xFFFFFFFFu);
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

/// torch.randperm(n, generator seeded with `seed`) on the CPU: std::mt19937(seed mod 2^32) and a forward
/// Fisher-Yates shuffle of 0..n-1 (torch's randperm). n >= 0, n < 2^32 / 20 (torch switches algorithm above).
inline std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed) {
  check(n >= 0 && n < std::int64_t(214748364), "torch_randperm: n must be in [0, 214748364), got ", n);
  std::vector<std::int64_t> a(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) a[static_cast<std::size_t>(i)] = i;
  std::mt19937 mt(static_cast<std::uint32_t>(seed & 0xFFFFFFFFu));
  for (std::int64_t i = 0; i + 1 < n; ++i) {
    const std::int64_t z = static_cast<std::int64_t>(static_cast<std::uint32_t>(mt()) % static_cast<std::uint64_t>(n - i));
    std::swap(a[static_cast<std::size_t>(i)], a[static_cast<std::size_t>(i + z)]);
  }
  return a;
}

/// Checks the route-table sizes of the TR-MoE MLP: V >= 1, E in {1, 2, 4, 8, 16}, k in {1, 2, 4}, k <= E,
/// l >= 0. `who` prefixes the message.
inline void check_route_sizes(Index vocab_size, Index num_experts, Index top_k, Index layer_idx, const char* who) {
  check(vocab_size >= 1, who, ": vocab_size must be >= 1, got ", vocab_size);
  check(num_experts == 1 || num_experts == 2 || num_experts == 4 || num_experts == 8 || num_experts == 16, who,
        ": num_experts must be one of 1, 2, 4, 8, 16, got ", num_experts);
  check(top_k == 1 || top_k == 2 || top_k == 4, who, ": top_k must be one of 1, 2, 4, got ", top_k);
  check(top_k <= num_experts, who, ": top_k (", top_k, ") cannot exceed num_experts (", num_experts, ")");
  check(layer_idx >= 0, who, ": layer_idx must be >= 0, got ", layer_idx);
}

/// The route table [V, k] of layer `layer_idx`. Throws dea::Error on sizes outside the reference's
/// constraints (check_route_sizes).
inline RouteTable build_route_table(RoutingStrategy strategy, Index vocab_size, Index num_experts, Index top_k,
                                    Index layer_idx, std::uint64_t seed = kRouteSeed) {
  check_route_sizes(vocab_size, num_experts, top_k, layer_idx, "build_route_table");
  const Index V = vocab_size, E = num_experts, k = top_k;
  const std::uint64_t l = static_cast<std::uint64_t>(layer_idx);
  RouteTable R = RouteTable::Zero(V, k);
  if (strategy == RoutingStrategy::modulo_cyclic) {
    const std::vector<std::int64_t> perm = torch_randperm(E, (seed ^ 0xC0DEu) + 104729u * l);
    for (Index t = 0; t < V; ++t)
      for (Index j = 0; j < k; ++j)
        R(t, j) = static_cast<std::int32_t>((perm[static_cast<std::size_t>(t % E)] + j) % E);  // (perm[t mod E] + j) mod E
    return R;
  }
  if (E == 1) return R;  // balanced hash, step 1: all zeros
  const std::vector<std::int64_t> order = torch_randperm(V, seed + 104729u * l);
  const std::vector<std::int64_t> perm = torch_randperm(E, (seed ^ 0x5EC0Du) + 104729u * l);
  const Index half = E / 2;  // odd = [1, 3, ..., E-1]: odd[i] = 2 i + 1
  for (Index q = 0; q < V; ++q) {
    const std::uint64_t group = static_cast<std::uint64_t>(q / E);
    const Index pos = q % E;
    const Index stride = 2 * static_cast<Index>(mix32(group + seed + l * 0x9E3779B1u) % static_cast<std::uint32_t>(half)) + 1;
    const Index t = order[static_cast<std::size_t>(q)];
    for (Index j = 0; j < k; ++j) R(t, j) = static_cast<std::int32_t>(perm[static_cast<std::size_t>((pos + j * stride) % E)]);
  }
  return R;
}

/// Checks a table against the MLP it is meant for: shape [V, k], 0 <= R(t, j) < E, and no expert twice in a row
/// (the reference asserts both; with E a power of two its constructions never repeat one). `what` names the table.
inline void validate_route_table(const RouteTable& R, Index vocab_size, Index num_experts, Index top_k,
                                 const std::string& what = "route table") {
  check(R.rows() == vocab_size && R.cols() == top_k, what, ": expected [V, k] = [", vocab_size, ", ", top_k,
        "], got [", R.rows(), ", ", R.cols(), "]");
  for (Index t = 0; t < R.rows(); ++t)
    for (Index j = 0; j < R.cols(); ++j) {
      const std::int32_t e = R(t, j);
      check(e >= 0 && e < num_experts, what, ": entry (token ", t, ", slot ", j, ") must be an expert in [0, ",
            num_experts, "), got ", e);
      for (Index i = 0; i < j; ++i)
        check(R(t, i) != e, what, ": token ", t, " is routed to expert ", e, " twice (slots ", i, " and ", j, ")");
    }
}

/// The per-token table [V, k] of a framework buffer `engine.route_table` [k, V] (slot-major, int64), validated
/// as validate_route_table does; `shape` is the buffer's shape.
inline RouteTable route_table_from_buffer(const std::int64_t* data, const Shape& shape, Index vocab_size,
                                          Index num_experts, Index top_k,
                                          const std::string& what = "engine.route_table") {
  check(shape.size() == 2 && shape[0] == top_k && shape[1] == vocab_size, what, ": expected shape [k, V] = [", top_k,
        ", ", vocab_size, "], got ", shape_str(shape));
  check(data != nullptr || vocab_size * top_k == 0, what, ": null data");
  RouteTable R(vocab_size, top_k);
  for (Index j = 0; j < top_k; ++j)
    for (Index t = 0; t < vocab_size; ++t) {
      const std::int64_t e = data[j * vocab_size + t];
      check(e >= 0 && e < num_experts, what, ": entry (slot ", j, ", token ", t, ") must be an expert in [0, ",
            num_experts, "), got ", e);
      R(t, j) = static_cast<std::int32_t>(e);
    }
  validate_route_table(R, vocab_size, num_experts, top_k, what);
  return R;
}

/// The framework's buffer layout of a table: [k, V] slot-major, int64 (what a checkpoint stores).
inline std::vector<std::int64_t> route_table_buffer(const RouteTable& R) {
  const Index V = R.rows(), k = R.cols();
  std::vector<std::int64_t> out(static_cast<std::size_t>(V * k));
  for (Index j = 0; j < k; ++j)
    for (Index t = 0; t < V; ++t) out[static_cast<std::size_t>(j * V + t)] = R(t, j);
  return out;
}

}  // namespace lm
}  // namespace dea
