#include "toy_language.hpp"

#include <cmath>
#include <numbers>
#include <set>
#include <stdexcept>

namespace attn::tools {

std::uint64_t ToyRandom::next() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::size_t ToyRandom::below(std::size_t n) {
  return static_cast<std::size_t>(next() % n);
}

double ToyRandom::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

double ToyRandom::normal() {
  const double radius = std::sqrt(-2.0 * std::log(1.0 - uniform()));
  return radius * std::cos(2.0 * std::numbers::pi * uniform());
}

namespace {

// `count` new pseudo-words of 2 or 3 consonant-vowel syllables, none already in `taken`.
std::vector<std::string> new_words(ToyRandom& rng, std::size_t count,
                                   std::set<std::string>& taken) {
  static const std::string consonants = "bcdfglmnprstv", vowels = "aeiou";
  std::vector<std::string> words;
  while (words.size() < count) {
    std::string word;
    for (std::size_t s = 2 + rng.below(2); s > 0; --s) {
      word += consonants[rng.below(consonants.size())];
      word += vowels[rng.below(vowels.size())];
    }
    if (taken.insert(word).second) words.push_back(word);
  }
  return words;
}

}  // namespace

ToyLanguage::ToyLanguage(std::uint64_t seed) {
  ToyRandom rng(seed);
  std::set<std::string> taken = {"le", "la", "un", "une", "the", "a", "is", "tres"};
  const auto pairs = [&](std::size_t n) {
    return std::make_pair(new_words(rng, n, taken), new_words(rng, n, taken));
  };
  const auto [noun_en, noun_fr] = pairs(80);
  for (std::size_t i = 0; i < noun_en.size(); ++i) {
    nouns_.push_back({noun_en[i], noun_fr[i], rng.below(2) == 1});
  }
  const auto [adjective_en, adjective_fr] = pairs(40);
  for (std::size_t i = 0; i < adjective_en.size(); ++i) {
    adjectives_.push_back({adjective_en[i], adjective_fr[i], adjective_fr[i] + "e"});
  }
  const auto [verb_en, verb_fr] = pairs(30);
  for (std::size_t i = 0; i < verb_en.size(); ++i) {
    verbs_.push_back({verb_en[i] + "s", verb_en[i] + "ing", verb_fr[i]});
  }
  const auto [adverb_en, adverb_fr] = pairs(12);
  for (std::size_t i = 0; i < adverb_en.size(); ++i) {  // half of them become two words
    adverbs_.push_back({adverb_en[i] + "ly", i % 2 == 1
                                                 ? std::vector<std::string>{adverb_fr[i]}
                                                 : std::vector<std::string>{"tres", adverb_fr[i]}});
  }
  const auto [preposition_en, preposition_fr] = pairs(6);
  for (std::size_t i = 0; i < preposition_en.size(); ++i) {
    prepositions_.push_back({preposition_en[i], preposition_fr[i]});
  }
}

void ToyLanguage::noun_phrase(ToyRandom& rng, SentencePair& pair) const {
  const Noun& noun = nouns_[rng.below(nouns_.size())];
  const bool definite = rng.below(2) == 1;
  std::vector<std::size_t> chosen;
  for (std::size_t n = rng.below(3); chosen.size() < n;) {  // 0-2 distinct adjectives
    const std::size_t a = rng.below(adjectives_.size());
    if (chosen.empty() || a != chosen.front()) chosen.push_back(a);
  }
  const int first = static_cast<int>(pair.source.size());
  pair.source.push_back(definite ? "the" : "a");
  for (const std::size_t a : chosen) pair.source.push_back(adjectives_[a].english);
  pair.source.push_back(noun.english);
  const int noun_at = first + 1 + static_cast<int>(chosen.size());
  // The article's gender is the noun's, though it translates "the" or "a".
  pair.target.push_back(definite ? (noun.feminine ? "la" : "le") : (noun.feminine ? "une" : "un"));
  pair.translates.push_back({first});
  pair.target.push_back(noun.french);
  pair.translates.push_back({noun_at});
  for (std::size_t i = 0; i < chosen.size(); ++i) {  // after the noun, agreeing with it
    const Adjective& adjective = adjectives_[chosen[i]];
    pair.target.push_back(noun.feminine ? adjective.feminine : adjective.masculine);
    pair.translates.push_back({first + 1 + static_cast<int>(i)});
  }
}

SentencePair ToyLanguage::sentence(ToyRandom& rng) const {
  SentencePair pair;
  noun_phrase(rng, pair);
  const Verb& verb = verbs_[rng.below(verbs_.size())];
  const int verb_at = static_cast<int>(pair.source.size());
  if (rng.below(2) == 1) {  // "is sleeping": two words become one
    pair.source.insert(pair.source.end(), {"is", verb.gerund});
    pair.translates.push_back({verb_at, verb_at + 1});
  } else {
    pair.source.push_back(verb.third_person);
    pair.translates.push_back({verb_at});
  }
  pair.target.push_back(verb.french);
  if (rng.below(2) == 1) {
    const Adverb& adverb = adverbs_[rng.below(adverbs_.size())];
    pair.source.push_back(adverb.english);
    for (const std::string& word : adverb.french) {  // one word may become two
      pair.target.push_back(word);
      pair.translates.push_back({static_cast<int>(pair.source.size()) - 1});
    }
  }
  if (rng.below(2) == 1) {
    const Preposition& preposition = prepositions_[rng.below(prepositions_.size())];
    pair.source.push_back(preposition.english);
    pair.target.push_back(preposition.french);
    pair.translates.push_back({static_cast<int>(pair.source.size()) - 1});
    noun_phrase(rng, pair);
  }
  return pair;
}

Vocabulary::Vocabulary(const std::vector<std::vector<std::string>>& sentences)
    : words_{"<pad>", "<s>", "</s>"} {
  std::set<std::string> sorted;
  for (const auto& sentence : sentences) sorted.insert(sentence.begin(), sentence.end());
  words_.insert(words_.end(), sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < words_.size(); ++i) ids_[words_[i]] = static_cast<int>(i);
}

std::vector<int> Vocabulary::encode(const std::vector<std::string>& words) const {
  std::vector<int> ids;
  for (const std::string& word : words) {
    const auto found = ids_.find(word);
    if (found == ids_.end()) throw std::invalid_argument("not in the vocabulary: " + word);
    ids.push_back(found->second);
  }
  return ids;
}

}  // namespace attn::tools
