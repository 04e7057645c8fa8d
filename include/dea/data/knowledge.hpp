// dea/data/knowledge.hpp: the built-in word lists behind the synthetic D_alpha generators and the mock
// corpus the word-level tokenizer always learns from.
//
// The lists are this library's own (the reference ships its own lists of the same sizes): the sizes are
// the reference's data set (47 capitals, 25 whole->part, 20 IsA, 8 analogy, 12 weak, 10 "none" pairs;
// 20 names, 6 colours, 6 animals, 8 containers; a 12-entry kinship composition table), the words are not.
// Every capital is the real capital of its country.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace dea::data {

/// A (query word, key word) pair of the ConceptNet-like list: capital->country, whole->part, x->kind of x, ...
struct WordPair {
  const char* q;
  const char* k;
};

/// One row of the kinship composition table: "B is the r1 of A. C is the r2 of B." => "C is the result of A."
struct KinRule {
  const char* r1;
  const char* r2;
  const char* result;
};

namespace knowledge {

inline constexpr std::array<WordPair, 47> capitals{{
    {"paris", "france"},        {"berlin", "germany"},    {"rome", "italy"},          {"madrid", "spain"},
    {"lisbon", "portugal"},     {"vienna", "austria"},    {"athens", "greece"},       {"warsaw", "poland"},
    {"prague", "czechia"},      {"budapest", "hungary"},  {"bucharest", "romania"},   {"sofia", "bulgaria"},
    {"belgrade", "serbia"},     {"zagreb", "croatia"},    {"ljubljana", "slovenia"},  {"bratislava", "slovakia"},
    {"copenhagen", "denmark"},  {"stockholm", "sweden"},  {"oslo", "norway"},         {"helsinki", "finland"},
    {"reykjavik", "iceland"},   {"dublin", "ireland"},    {"brussels", "belgium"},    {"amsterdam", "netherlands"},
    {"bern", "switzerland"},    {"kyiv", "ukraine"},      {"vilnius", "lithuania"},   {"riga", "latvia"},
    {"tallinn", "estonia"},     {"cairo", "egypt"},       {"nairobi", "kenya"},       {"accra", "ghana"},
    {"dakar", "senegal"},       {"abuja", "nigeria"},     {"tokyo", "japan"},         {"beijing", "china"},
    {"hanoi", "vietnam"},       {"bangkok", "thailand"},  {"manila", "philippines"},  {"jakarta", "indonesia"},
    {"canberra", "australia"},  {"wellington", "new zealand"}, {"ottawa", "canada"},  {"lima", "peru"},
    {"quito", "ecuador"},       {"montevideo", "uruguay"}, {"caracas", "venezuela"},
}};

inline constexpr std::array<WordPair, 25> whole_part{{
    {"car", "wheel"},      {"bicycle", "chain"},   {"house", "roof"},      {"house", "kitchen"},
    {"hand", "thumb"},     {"foot", "heel"},       {"face", "eye"},        {"bird", "feather"},
    {"fish", "gill"},      {"tree", "bark"},       {"flower", "stem"},     {"book", "chapter"},
    {"computer", "screen"}, {"phone", "battery"},  {"boat", "sail"},       {"airplane", "cockpit"},
    {"train", "carriage"}, {"guitar", "fret"},     {"shoe", "sole"},       {"knife", "handle"},
    {"window", "pane"},    {"camera", "lens"},     {"castle", "tower"},    {"week", "day"},
    {"orange", "peel"},
}};

inline constexpr std::array<WordPair, 20> is_a{{
    {"sparrow", "bird"},  {"salmon", "fish"},     {"oak", "tree"},        {"tulip", "flower"},
    {"dog", "animal"},    {"apple", "fruit"},     {"potato", "vegetable"}, {"copper", "metal"},
    {"hammer", "tool"},   {"cello", "instrument"}, {"cobra", "snake"},    {"jupiter", "planet"},
    {"soccer", "sport"},  {"poker", "game"},      {"french", "language"}, {"sofa", "furniture"},
    {"jacket", "clothing"}, {"nile", "river"},    {"everest", "mountain"}, {"ruby", "gem"},
}};

inline constexpr std::array<WordPair, 8> analogy{{
    {"king", "queen"},    {"actor", "actress"},   {"prince", "princess"}, {"nephew", "niece"},
    {"husband", "wife"},  {"son", "daughter"},    {"bull", "cow"},        {"waiter", "waitress"},
}};

inline constexpr std::array<WordPair, 12> weak{{
    {"car", "road"},      {"rain", "cloud"},      {"pilot", "airport"},   {"chef", "kitchen"},
    {"beach", "sand"},    {"coffee", "cup"},      {"winter", "snow"},     {"farmer", "field"},
    {"moon", "night"},    {"lock", "key"},        {"bee", "honey"},       {"student", "exam"},
}};

inline constexpr std::array<WordPair, 10> similar{{
    {"dog", "dogs"},      {"cat", "cats"},        {"house", "houses"},    {"child", "children"},
    {"box", "boxes"},     {"jump", "jumping"},    {"go", "going"},        {"tall", "taller"},
    {"quick", "quickly"}, {"write", "wrote"},
}};

inline constexpr std::array<const char*, 20> names{{
    "anna", "bob",  "carla", "david", "elena", "frank",  "grace", "henry", "irene", "jack",
    "karen", "liam", "maria", "nolan", "olivia", "peter", "quinn", "rosa",  "samuel", "tina",
}};

inline constexpr std::array<const char*, 6> colours{{"red", "blue", "green", "yellow", "white", "brown"}};

inline constexpr std::array<const char*, 6> animals{{"lion", "frog", "swan", "rabbit", "horse", "sheep"}};

inline constexpr std::array<const char*, 8> containers{{"box", "chest", "suitcase", "basket", "jar", "bag",
                                                          "crate", "trunk"}};

/// Kinship composition: B is the r1 of A, C is the r2 of B, so C is the `result` of A.
inline constexpr std::array<KinRule, 12> kinship{{
    {"father", "father", "grandfather"}, {"father", "mother", "grandmother"},
    {"mother", "father", "grandfather"}, {"mother", "mother", "grandmother"},
    {"father", "brother", "uncle"},      {"mother", "brother", "uncle"},
    {"father", "sister", "aunt"},        {"mother", "sister", "aunt"},
    {"brother", "son", "nephew"},        {"sister", "daughter", "niece"},
    {"son", "son", "grandson"},          {"son", "daughter", "granddaughter"},
}};

namespace detail {
template <class A>
constexpr bool all_set(const A& a) {
  for (const auto& p : a)
    if (p.q == nullptr || p.k == nullptr) return false;
  return true;
}
template <class A>
constexpr bool all_words_set(const A& a) {
  for (const char* w : a)
    if (w == nullptr) return false;
  return true;
}
constexpr bool all_rules_set() {
  for (const auto& r : kinship)
    if (r.r1 == nullptr || r.r2 == nullptr || r.result == nullptr) return false;
  return true;
}
}  // namespace detail

// An array initialised with fewer entries than its size would be padded with null pointers: catch it here.
static_assert(detail::all_set(capitals) && detail::all_set(whole_part) && detail::all_set(is_a) &&
                  detail::all_set(analogy) && detail::all_set(weak) && detail::all_set(similar),
              "a ConceptNet-like list has fewer entries than its declared size");
static_assert(detail::all_words_set(names) && detail::all_words_set(colours) && detail::all_words_set(animals) &&
                  detail::all_words_set(containers) && detail::all_rules_set(),
              "a word list has fewer entries than its declared size");

}  // namespace knowledge

/// The built-in mock corpus: one sentence per knowledge pair, arithmetic facts, and the demo sentences
/// (Paris -> France, car -> wheel, king -> queen, 5+3 = 8, dog -> dogs). The word-level tokenizer always adds
/// it to its training texts, so the demo words are in every vocabulary. Fixed order (it fixes token ids).
inline std::vector<std::string> mock_corpus() {
  std::vector<std::string> s;
  s.reserve(400);
  s.push_back("paris is the capital of france.");
  s.push_back("paris is capital of france");
  s.push_back("the car has a wheel, and the wheel turns when the car moves.");
  s.push_back("the king and the queen live in the palace.");
  s.push_back("5+3 = 8");
  s.push_back("5+3=8");
  s.push_back("one dog barks; two dogs bark.");
  s.push_back("car→wheel");
  s.push_back("king→queen");
  s.push_back("dog→dogs");
  s.push_back("paris→france");
  for (const auto& p : knowledge::capitals) s.push_back(std::string(p.q) + " is the capital of " + p.k + ".");
  for (const auto& p : knowledge::whole_part) s.push_back(std::string("the ") + p.k + " is part of the " + p.q + ".");
  for (const auto& p : knowledge::is_a) s.push_back(std::string("a ") + p.q + " is a kind of " + p.k + ".");
  for (const auto& p : knowledge::analogy)
    s.push_back(std::string(p.q) + " is to " + p.k + " as man is to woman.");
  for (const auto& p : knowledge::weak) s.push_back(std::string("a ") + p.q + " often goes with a " + p.k + ".");
  for (const auto& p : knowledge::similar)
    s.push_back(std::string(p.q) + " and " + p.k + " are two forms of one word.");
  for (const auto& r : knowledge::kinship)
    s.push_back(std::string("the ") + r.r2 + " of my " + r.r1 + " is my " + r.result + ".");
  for (int a = 0; a < 10; ++a)
    for (int b = 0; b < 10; ++b) s.push_back(std::to_string(a) + "+" + std::to_string(b) + " = " + std::to_string(a + b));
  for (int a = 1; a < 6; ++a)
    for (int b = 1; b < 6; ++b) s.push_back(std::to_string(a) + "*" + std::to_string(b) + " = " + std::to_string(a * b));
  return s;
}

}  // namespace dea::data
