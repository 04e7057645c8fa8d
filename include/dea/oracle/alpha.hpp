// dea/oracle/alpha.hpp: the real oracle alpha (docs/training.md, the oracle), computed offline from scores that
// frozen NLI / sentence-embedding models produced elsewhere.
//
//  * oracle_alpha: alpha = clamp(sigmoid(Phi - 0.3 Sim), 0, 0.95), Phi = entailment logit of
//    (premise = q_text, hypothesis = k_text), Sim = cosine similarity of the two sentence embeddings.
//  * the isotonic calibration of alpha on human labels is eval::IsotonicRegression (oracle/isotonic.hpp), and the
//    oracle itself, computed from two model directories, is bert::NliOracle (oracle/nli_oracle.hpp).
//  * AlphaCache: alpha per (premise, hypothesis), the content of an oracle JSONL cache (io/jsonl.hpp reads
//    and writes the files), and attach() that sets the alpha of D_alpha records from it.
#pragma once

#include "../core/error.hpp"
#include "../data/dalpha.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dea::data {

constexpr double kAlphaMax = 0.95;
constexpr double kGammaNli = 0.3;

/// alpha_raw = sigmoid(phi - gamma_nli * sim), before the clamp (and before any calibration).
inline double oracle_alpha_raw(double phi, double sim, double gamma_nli = kGammaNli) {
  check(std::isfinite(phi) && std::isfinite(sim), "oracle_alpha: non-finite score (phi=", phi, ", sim=", sim, ")");
  const double z = phi - gamma_nli * sim;
  return z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z));
}

/// alpha = clamp(sigmoid(phi - gamma_nli * sim), 0, 0.95).
inline double oracle_alpha(double phi, double sim, double gamma_nli = kGammaNli) {
  return std::min(std::max(oracle_alpha_raw(phi, sim, gamma_nli), 0.0), kAlphaMax);
}

/// One cached oracle value.
struct OracleEntry {
  std::string premise;     ///< q_text
  std::string hypothesis;  ///< k_text
  double alpha = 0;        ///< in [0, 0.95]
  std::optional<double> phi;
  std::optional<double> sim;
};

/// alpha per (premise, hypothesis). Adding a pair that is already present replaces its entry.
class AlphaCache {
public:
  void add(OracleEntry e) {
    check(std::isfinite(e.alpha) && e.alpha >= 0 && e.alpha <= kAlphaMax, "AlphaCache::add: alpha ", e.alpha,
          " for ('", e.premise, "', '", e.hypothesis, "') outside [0, 0.95]");
    auto key = std::make_pair(e.premise, e.hypothesis);
    auto it = index_.find(key);
    if (it != index_.end()) {
      entries_[it->second] = std::move(e);
    } else {
      index_.emplace(std::move(key), entries_.size());
      entries_.push_back(std::move(e));
    }
  }

  /// The entry of a pair, or nullptr.
  const OracleEntry* find(const std::string& premise, const std::string& hypothesis) const {
    auto it = index_.find(std::make_pair(premise, hypothesis));
    return it == index_.end() ? nullptr : &entries_[it->second];
  }

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  /// Entries in insertion order.
  const std::vector<OracleEntry>& entries() const { return entries_; }

  /// Sets each record's alpha from the cache (premise = q_text, hypothesis = k_text). With require_all, a
  /// record without a cached value is a dea::Error naming the pair and how many are missing; otherwise such
  /// records keep their alpha. Returns how many records were set.
  std::size_t attach(std::vector<Record>& records, bool require_all = true) const {
    std::size_t set = 0, missing = 0;
    const Record* first_missing = nullptr;
    for (auto& r : records) {
      if (const OracleEntry* e = find(r.q_text, r.k_text)) {
        r.alpha = e->alpha;
        ++set;
      } else if (!first_missing) {
        first_missing = &r;
        ++missing;
      } else {
        ++missing;
      }
    }
    check(!require_all || missing == 0, "AlphaCache::attach: ", missing, " record(s) have no cached alpha, e.g. ('",
          first_missing ? first_missing->q_text : "", "', '", first_missing ? first_missing->k_text : "", "')");
    return set;
  }

private:
  std::vector<OracleEntry> entries_;
  std::map<std::pair<std::string, std::string>, std::size_t> index_;
};

}  // namespace dea::data
