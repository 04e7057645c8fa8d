// dea/lm/config.hpp: the configuration of the decoder-only causal language model (DecoderLM, lm/model.hpp).
//
// Field names and defaults follow the reference's ModelConfig (complexity-framework; docs/lm.md), so a
// config written for it reads the same here. Parsing from JSON lives in interop/lm_case.hpp; this header needs
// Eigen only.
//
//   attention_type   "gqa" (default), "mha", "mqa", "tr_mha", "tr_mha_v2", "dea" (causal Dual-Expert attention,
//                    not a type of the reference: see docs/lm.md)
//   mlp_type         "tr_hash_engine" (default, alias "tr_hash_moe": the TR-MoE MLP) or "dense_deterministic"
//                    (alias "dense": the dense SwiGLU gate_proj / up_proj / down_proj)
//   num_key_value_heads  <= 0: the default of the attention type (gqa: max(1, H / 4); mha, tr_mha, tr_mha_v2: H;
//                    mqa: 1). mha / tr_mha / tr_mha_v2 force H and mqa forces 1 whatever is set.
#pragma once

#include "../attention/token_routed.hpp"
#include "../core/error.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace dea {
namespace lm {

enum class AttentionType { mha, gqa, mqa, tr_mha, tr_mha_v2, dea };
enum class MlpType { dense, tr_hash_engine };

inline const char* to_string(AttentionType a) {
  switch (a) {
    case AttentionType::mha: return "mha";
    case AttentionType::gqa: return "gqa";
    case AttentionType::mqa: return "mqa";
    case AttentionType::tr_mha: return "tr_mha";
    case AttentionType::dea: return "dea";
    default: return "tr_mha_v2";
  }
}
inline const char* to_string(MlpType m) { return m == MlpType::dense ? "dense_deterministic" : "tr_hash_engine"; }

/// "mha", "gqa", "mqa", "tr_mha", "tr_mha_v2", "dea"; dea::Error naming the field otherwise.
inline AttentionType parse_attention_type(const std::string& s) {
  if (s == "mha") return AttentionType::mha;
  if (s == "gqa") return AttentionType::gqa;
  if (s == "mqa") return AttentionType::mqa;
  if (s == "tr_mha") return AttentionType::tr_mha;
  if (s == "tr_mha_v2") return AttentionType::tr_mha_v2;
  if (s == "dea") return AttentionType::dea;
  ::dea::detail::raise("DecoderConfig: attention_type: expected one of mha, gqa, mqa, tr_mha, tr_mha_v2, dea, got '" + s +
                       "'");
}

/// "dense_deterministic" / "dense" -> dense; "tr_hash_engine" / "tr_hash_moe" -> tr_hash_engine.
inline MlpType parse_mlp_type(const std::string& s) {
  if (s == "dense_deterministic" || s == "dense") return MlpType::dense;
  if (s == "tr_hash_engine" || s == "tr_hash_moe") return MlpType::tr_hash_engine;
  ::dea::detail::raise("DecoderConfig: mlp_type: expected one of dense_deterministic (dense), tr_hash_engine (tr_hash_moe), "
                "got '" + s + "'");
}

/// The model's configuration, named after ModelConfig's fields, with its defaults.
struct DecoderConfig {
  Index hidden_size = 768;             ///< D
  Index num_hidden_layers = 12;        ///< L
  Index num_attention_heads = 12;      ///< H; D % H == 0 and D / H even (rotate-half RoPE)
  Index num_key_value_heads = -1;      ///< H_kv (<= 0: the attention type's default, see kv_heads())
  std::string attention_type = "gqa";
  Index intermediate_size = 2048;      ///< dense SwiGLU width I (TR-MoE: the total routed width)
  Index vocab_size = 32000;            ///< V
  double rope_theta = 10000.0;         ///< RoPE of every attention type (dea: on its experts' queries and keys)
  bool use_qk_norm = true;
  double norm_eps = 1e-6;              ///< every RMSNorm (blocks, final, qk-norm)
  bool tie_word_embeddings = true;     ///< logits = h Emb^T (no lm_head tensor)
  std::string mlp_type = "tr_hash_engine";
  double initializer_range = 0.02;     ///< sigma of the init (docs/lm.md)

  // TR-MoE MLP fields (mlp_type tr_hash_engine)
  Index num_experts = 1;               ///< E
  Index top_k = 1;                     ///< k
  bool shared_expert = true;
  Index shared_intermediate_size = -1; ///< <= 0: intermediate_size
  std::string routing_strategy = "modulo_cyclic";
  double top_k_primary_weight = -1;    ///< < 0: none (uniform 1 / k)

  // token-routed attention fields (attention_type tr_mha / tr_mha_v2), docs/token_routed.md
  Index tr_mha_num_experts = 4;
  Index tr_mha_adapter_rank = 8;
  Index tr_mha_top_k = 2;
  std::string tr_mha_targets = "qv";
  double tr_mha_adapter_gate_init = 0.1;
  double tr_mha_id_primary_logit = 2.0;
  double tr_mha_id_secondary_logit = 1.0;
  double tr_mha_id_other_logit = -2.0;
  double tr_mha_verifier_gate_init = 0.1;
  double tr_mha_verifier_temperature = 1.0;

  AttentionType attention() const { return parse_attention_type(attention_type); }
  MlpType mlp() const { return parse_mlp_type(mlp_type); }
  Index head_dim() const { return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0; }

  /// The KV head count actually used: mha / tr_mha / tr_mha_v2 -> H, mqa -> 1, gqa -> num_key_value_heads, or
  /// max(1, H / 4) when that is <= 0.
  Index kv_heads() const {
    const Index H = num_attention_heads;
    switch (attention()) {
      case AttentionType::mqa: return 1;
      case AttentionType::gqa: return num_key_value_heads > 0 ? num_key_value_heads : std::max<Index>(1, H / 4);
      default: return H;
    }
  }

  /// Throws dea::Error naming the first bad field.
  void validate() const {
    check(hidden_size > 0, "DecoderConfig: hidden_size must be positive, got ", hidden_size);
    check(num_hidden_layers > 0, "DecoderConfig: num_hidden_layers must be positive, got ", num_hidden_layers);
    check(num_attention_heads > 0, "DecoderConfig: num_attention_heads must be positive, got ", num_attention_heads);
    check(hidden_size % num_attention_heads == 0, "DecoderConfig: hidden_size (", hidden_size,
          ") must be divisible by num_attention_heads (", num_attention_heads, ")");
    check(head_dim() % 2 == 0, "DecoderConfig: head dim hidden_size / num_attention_heads must be even (rotate-half "
          "RoPE), got ", head_dim());
    attention();  // throws on an unknown attention_type
    mlp();        // throws on an unknown mlp_type
    const Index kv = kv_heads();
    check(kv > 0 && num_attention_heads % kv == 0, "DecoderConfig: num_attention_heads (", num_attention_heads,
          ") must be divisible by num_key_value_heads (", kv, ")");
    check(intermediate_size > 0, "DecoderConfig: intermediate_size must be positive, got ", intermediate_size);
    check(vocab_size > 0, "DecoderConfig: vocab_size must be positive, got ", vocab_size);
    check(rope_theta > 0, "DecoderConfig: rope_theta must be positive, got ", rope_theta);
    check(norm_eps > 0, "DecoderConfig: norm_eps must be positive, got ", norm_eps);
    check(initializer_range >= 0 && std::isfinite(initializer_range),
          "DecoderConfig: initializer_range must be finite and >= 0, got ", initializer_range);
    if (attention() == AttentionType::tr_mha || attention() == AttentionType::tr_mha_v2) parse_tr_targets(tr_mha_targets);
  }

  /// The options of the token-routed attention of layer l (attention_type tr_mha / tr_mha_v2).
  TokenRoutedOptions token_routed_options(Index layer) const {
    TokenRoutedOptions o;
    o.variant = attention() == AttentionType::tr_mha ? TrVariant::v1 : TrVariant::v2;
    o.num_experts = tr_mha_num_experts;
    o.adapter_rank = tr_mha_adapter_rank;
    o.top_k = tr_mha_top_k;
    o.targets = parse_tr_targets(tr_mha_targets);
    o.adapter_gate_init = tr_mha_adapter_gate_init;
    o.id_primary_logit = tr_mha_id_primary_logit;
    o.id_secondary_logit = tr_mha_id_secondary_logit;
    o.id_other_logit = tr_mha_id_other_logit;
    o.verifier_gate_init = tr_mha_verifier_gate_init;
    o.verifier_temperature = tr_mha_verifier_temperature;
    o.layer_idx = layer;
    o.num_layers = num_hidden_layers;
    o.initializer_range = initializer_range;
    o.use_qk_norm = use_qk_norm;
    o.qk_norm_eps = norm_eps;
    o.rope_theta = rope_theta;
    o.causal = true;
    o.vocab_size = 0;  // the reference maps ids by (t + l) mod E without a range check
    return o;
  }
};

}  // namespace lm
}  // namespace dea
