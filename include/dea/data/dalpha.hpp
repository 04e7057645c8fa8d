// dea/data/dalpha.hpp: the D_alpha relation-pair data set (docs/training.md, data): synthetic bAbI-like, CLUTRR-like
// and ConceptNet-like positives, 1:1 random negatives, the 10/1/1 split, the mock oracle by strength band and
// mock_alpha with the 45/25/30 density.
//
// A record is one (query text, key text) pair with a 0/1 label. The classifier reads [CLS] q [SEP] k [SEP];
// the oracle alpha of the pair labels the block rows = q tokens x columns = k tokens (see collate.hpp).
//
// Sizes with the defaults (n_per_source = 2000): 2000 bAbI-like + 2000 CLUTRR-like + 122 ConceptNet-like
// positives, each with one negative: 8,244 records, split 6,870 / 687 / 687. All draws come from one dea::Rng
// seeded with `seed`, in a fixed order (bAbI positives, bAbI negatives, CLUTRR positives, CLUTRR negatives,
// ConceptNet shuffle, ConceptNet negatives, final shuffle), so a seed gives the same records everywhere.
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "knowledge.hpp"
#include "random.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dea::data {

/// One D_alpha pair. `alpha` is NaN until an oracle is attached.
struct Record {
  std::string q_text;
  std::string k_text;
  int label = 0;             ///< 1 = related pair, 0 = random negative
  std::string relation;      ///< qa16, qa18, arith, father-brother, capital, partof, isa, ..., random_negative
  std::string strength;      ///< "strong", "weak" or "none"
  std::string source;        ///< "babi", "clutrr" or "conceptnet"
  double alpha = std::numeric_limits<double>::quiet_NaN();
};

inline Record make_record(std::string q, std::string k, int label, std::string source, std::string relation,
                          std::string strength) {
  Record r;
  r.q_text = std::move(q);
  r.k_text = std::move(k);
  r.label = label;
  r.source = std::move(source);
  r.relation = std::move(relation);
  r.strength = std::move(strength);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// Synthetic generators
// ---------------------------------------------------------------------------------------------------------

/// n bAbI-like positives ("strong"). Each picks one of three kinds uniformly:
///  qa16 induction: "A is a AN. A is COL. C is a OTHER. C is OCOL. B is a AN. what color is B?" -> COL
///  qa18 size: "the x is bigger than the y. the y is bigger than the z. is the x bigger than the z?" -> "yes",
///             or with the reversed question "is the z bigger than the x?" -> "no" (50/50)
///  arith: "a+b" -> "a+b's value", a, b uniform integers in [0, 50].
inline std::vector<Record> generate_babi_like(std::size_t n, Rng& rng) {
  namespace kw = knowledge;
  std::vector<Record> out;
  out.reserve(n);
  while (out.size() < n) {
    const std::size_t kind = random_index(rng, 3);
    if (kind == 0) {
      const auto who = sample(rng, kw::names, 3);
      const auto an = sample(rng, kw::animals, 2);
      const auto col = sample(rng, kw::colours, 2);
      const std::string a = who[0], b = who[1], c = who[2];
      std::string story = a + " is a " + an[0] + ". " + a + " is " + col[0] + ". " + c + " is a " + an[1] + ". " +
                          c + " is " + col[1] + ". " + b + " is a " + an[0] + ". what color is " + b + "?";
      out.push_back(make_record(std::move(story), col[0], 1, "babi", "qa16", "strong"));
    } else if (kind == 1) {
      const auto s = sample(rng, kw::containers, 3);
      const std::string x = s[0], y = s[1], z = s[2];
      const std::string facts = "the " + x + " is bigger than the " + y + ". the " + y + " is bigger than the " + z + ". ";
      if (rng.uniform() < 0.5)
        out.push_back(make_record(facts + "is the " + x + " bigger than the " + z + "?", "yes", 1, "babi", "qa18",
                                  "strong"));
      else
        out.push_back(make_record(facts + "is the " + z + " bigger than the " + x + "?", "no", 1, "babi", "qa18",
                                  "strong"));
    } else {
      const int a = static_cast<int>(rng.below(51)), b = static_cast<int>(rng.below(51));
      out.push_back(make_record(std::to_string(a) + "+" + std::to_string(b), std::to_string(a + b), 1, "babi",
                                "arith", "strong"));
    }
  }
  return out;
}

/// n CLUTRR-like positives ("strong"): a rule (r1, r2) -> kin from the 12-entry table and three distinct
/// names A, B, C; q = "B is the r1 of A. C is the r2 of B.", k = "C is the kin of A.", relation "r1-r2".
inline std::vector<Record> generate_clutrr_like(std::size_t n, Rng& rng) {
  std::vector<Record> out;
  out.reserve(n);
  while (out.size() < n) {
    const KinRule& rule = choice(rng, knowledge::kinship);
    const auto who = sample(rng, knowledge::names, 3);
    const std::string a = who[0], b = who[1], c = who[2];
    out.push_back(make_record(b + " is the " + rule.r1 + " of " + a + ". " + c + " is the " + rule.r2 + " of " + b + ".",
                              c + " is the " + rule.result + " of " + a + ".", 1, "clutrr",
                              std::string(rule.r1) + "-" + rule.r2, "strong"));
  }
  return out;
}

/// The fixed ConceptNet-like list, shuffled: 122 positives. Relations and strengths: capital (47), partof (25),
/// isa (20), analogy (8) "strong"; weak (12) "weak"; similar (10) "none". Whole->part pairs read q = whole.
inline std::vector<Record> generate_conceptnet_like(Rng& rng) {
  std::vector<Record> out;
  auto add = [&](const auto& list, const char* relation, const char* strength) {
    for (const WordPair& p : list) out.push_back(make_record(p.q, p.k, 1, "conceptnet", relation, strength));
  };
  add(knowledge::capitals, "capital", "strong");
  add(knowledge::whole_part, "partof", "strong");
  add(knowledge::is_a, "isa", "strong");
  add(knowledge::analogy, "analogy", "strong");
  add(knowledge::weak, "weak", "weak");
  add(knowledge::similar, "similar", "none");
  shuffle(out, rng);
  return out;
}

/// Returns `positives` followed by one negative per positive, in the same order: the same q_text with the
/// k_text of a uniformly chosen positive of the list (redrawn while it equals the positive's own k_text,
/// unless every k_text of the list is the same). label 0, relation "random_negative", strength "none",
/// source unchanged. Call it once per source so negatives stay within their source.
inline std::vector<Record> add_negatives(std::vector<Record> positives, Rng& rng) {
  const std::size_t n = positives.size();
  if (n == 0) return positives;
  std::set<std::string> distinct;
  for (const auto& r : positives) distinct.insert(r.k_text);
  const bool can_differ = distinct.size() > 1;
  positives.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t j = random_index(rng, n);
    // Terminates with probability 1: at least one other k_text exists when can_differ.
    while (can_differ && positives[j].k_text == positives[i].k_text) j = random_index(rng, n);
    Record neg = make_record(positives[i].q_text, positives[j].k_text, 0, positives[i].source, "random_negative",
                             "none");
    positives.push_back(std::move(neg));
  }
  return positives;
}

/// Options of the synthetic D_alpha build.
struct DalphaOptions {
  std::size_t n_per_source = 2000;  ///< positives of the bAbI-like and CLUTRR-like sources
  std::uint64_t seed = 42;
};

/// The synthetic D_alpha: per source positives + negatives, all concatenated and shuffled.
inline std::vector<Record> build_dalpha_synthetic(const DalphaOptions& opt = {}) {
  Rng rng(opt.seed);
  std::vector<Record> all;
  auto append = [&](std::vector<Record> part) {
    for (auto& r : part) all.push_back(std::move(r));
  };
  append(add_negatives(generate_babi_like(opt.n_per_source, rng), rng));
  append(add_negatives(generate_clutrr_like(opt.n_per_source, rng), rng));
  append(add_negatives(generate_conceptnet_like(rng), rng));
  shuffle(all, rng);
  return all;
}

/// train / val / test parts of a record list.
struct Splits {
  std::vector<Record> train, val, test;
};

/// Splits by integer division in the ratio r0 : r1 : r2 (default 10 : 1 : 1): train = the first
/// floor(n*r0/R) records, val = the next floor(n*r1/R), test = the rest (R = r0 + r1 + r2).
inline Splits split_records(const std::vector<Record>& recs, std::size_t r0 = 10, std::size_t r1 = 1,
                            std::size_t r2 = 1) {
  const std::size_t tot = r0 + r1 + r2;
  check(tot > 0, "split_records: the ratios sum to zero");
  const std::size_t n = recs.size();
  const std::size_t a = n * r0 / tot;
  const std::size_t b = a + n * r1 / tot;
  Splits s;
  s.train.assign(recs.begin(), recs.begin() + static_cast<std::ptrdiff_t>(a));
  s.val.assign(recs.begin() + static_cast<std::ptrdiff_t>(a), recs.begin() + static_cast<std::ptrdiff_t>(b));
  s.test.assign(recs.begin() + static_cast<std::ptrdiff_t>(b), recs.end());
  return s;
}

// ---------------------------------------------------------------------------------------------------------
// Fingerprints
// ---------------------------------------------------------------------------------------------------------

/// A 64-bit FNV-1a hash of a sequence of fields, each length-prefixed (so ("ab", "c") and ("a", "bc") differ); the
/// fingerprint a run records of its data, the same on every platform.
class Fingerprint {
public:
  Fingerprint& add(std::string_view s) {
    add_u64(s.size());
    for (char c : s) byte(static_cast<unsigned char>(c));
    return *this;
  }
  /// Bytes of a field whose length was added first (add_u64): add(s) is add_u64(s.size()) then add_bytes of s, in
  /// as many calls as wanted, so a long field can be added as it is read.
  Fingerprint& add_bytes(const char* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) byte(static_cast<unsigned char>(p[i]));
    return *this;
  }
  Fingerprint& add_u64(std::uint64_t v) {
    for (int k = 0; k < 8; ++k) byte(static_cast<unsigned char>(v >> (8 * k)));
    return *this;
  }
  /// The bits of a double (NaN as one canonical value).
  Fingerprint& add_double(double x) {
    std::uint64_t bits = 0x7ff8000000000000ULL;
    if (!std::isnan(x)) std::memcpy(&bits, &x, sizeof bits);
    return add_u64(bits);
  }
  std::uint64_t value() const { return h_; }
  /// 16 lower-case hex digits.
  std::string hex() const {
    static const char* d = "0123456789abcdef";
    std::string s(16, '0');
    for (int k = 0; k < 16; ++k) s[static_cast<std::size_t>(15 - k)] = d[(h_ >> (4 * k)) & 15];
    return s;
  }

private:
  void byte(unsigned char b) {
    h_ ^= b;
    h_ *= 0x100000001b3ULL;
  }
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

/// Adds every field of the records, in order (texts, label, source, relation, strength and alpha).
inline Fingerprint& add_records(Fingerprint& f, const std::vector<Record>& recs) {
  f.add_u64(recs.size());
  for (const Record& r : recs) {
    f.add(r.q_text).add(r.k_text).add_u64(static_cast<std::uint64_t>(r.label)).add(r.source).add(r.relation);
    f.add(r.strength).add_double(r.alpha);
  }
  return f;
}

// ---------------------------------------------------------------------------------------------------------
// Mock oracle
// ---------------------------------------------------------------------------------------------------------

/// The alpha band of a strength: none (0, 0.05), weak (0.15, 0.30), strong (0.75, 0.95). An unknown strength
/// reads as "none" (as the reference's dictionary lookup with a default does).
struct Band {
  double lo, hi;
};
inline Band strength_band(const std::string& strength) {
  if (strength == "strong") return {0.75, 0.95};
  if (strength == "weak") return {0.15, 0.30};
  return {0.0, 0.05};
}

/// alpha ~ U(band of the strength).
inline double mock_alpha_for_strength(const std::string& strength, Rng& rng) {
  const Band b = strength_band(strength);
  return rng.uniform(b.lo, b.hi);
}

/// Sets every record's alpha from the mock oracle, drawing in record order from Rng(seed + 1).
inline void attach_mock_oracle(std::vector<Record>& records, std::uint64_t seed = 42) {
  Rng rng(seed + 1);
  for (auto& r : records) r.alpha = mock_alpha_for_strength(r.strength, rng);
}

/// The paper's graded density, elementwise: with r, x ~ U[0, 1): r < 0.45 -> 0.05 x; r < 0.70 -> 0.15 + 0.15 x;
/// else 0.75 + 0.20 x. Masses 45 / 25 / 30 %, values in [0, 0.95), mean 0.3225. Two draws per element (r then x).
template <class S>
Tensor<S> mock_alpha(const Shape& shape, Rng& rng) {
  Tensor<S> t(shape);
  for (Index i = 0; i < t.numel(); ++i) {
    const double r = rng.uniform();
    const double x = rng.uniform();
    const double a = r < 0.45 ? 0.05 * x : (r < 0.70 ? 0.15 + 0.15 * x : 0.75 + 0.20 * x);
    t[i] = static_cast<S>(a);
  }
  return t;
}

}  // namespace dea::data
