// The translation demo's corpus, made in the program (no download): a toy English and a
// French-like language of a few hundred pseudo-words, with the rules that make translation
// more than a word-for-word lookup (examples/translate.py makes the same kind of corpus).
// Adjectives follow their noun, articles and adjectives agree with the noun's gender, "is
// sleeping" becomes one verb and some adverbs become two words. Each target word knows the
// source words it translates, so a learned alignment can be checked.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attn::tools {

// A seeded generator whose numbers are the same with every compiler and standard library
// (splitmix64), unlike the distributions of <random>.
class ToyRandom {
 public:
  explicit ToyRandom(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  // Uniform in [0, n), n > 0.
  std::size_t below(std::size_t n);
  // Uniform in [0, 1).
  double uniform();
  // Standard normal (Box-Muller).
  double normal();

 private:
  std::uint64_t state_;
};

struct SentencePair {
  std::vector<std::string> source;  // English, 3-12 words
  std::vector<std::string> target;  // French-like
  // Per target word, the source words it translates: one, or "is" and the gerund for the
  // verb that "is sleeping" becomes.
  std::vector<std::vector<int>> translates;
};

class ToyLanguage {
 public:
  explicit ToyLanguage(std::uint64_t seed);
  SentencePair sentence(ToyRandom& rng) const;

 private:
  struct Noun {
    std::string english, french;
    bool feminine;
  };
  struct Adjective {
    std::string english, masculine, feminine;
  };
  struct Verb {
    std::string third_person, gerund, french;
  };
  struct Adverb {
    std::string english;
    std::vector<std::string> french;  // one word or two
  };
  struct Preposition {
    std::string english, french;
  };
  void noun_phrase(ToyRandom& rng, SentencePair& pair) const;

  std::vector<Noun> nouns_;
  std::vector<Adjective> adjectives_;
  std::vector<Verb> verbs_;
  std::vector<Adverb> adverbs_;
  std::vector<Preposition> prepositions_;
};

// The specials <pad> 0, <s> 1 and </s> 2, then the sentences' words sorted.
class Vocabulary {
 public:
  static constexpr int kPad = 0, kBegin = 1, kEnd = 2;
  explicit Vocabulary(const std::vector<std::vector<std::string>>& sentences);
  std::vector<int> encode(const std::vector<std::string>& words) const;
  const std::string& word(int id) const { return words_[static_cast<std::size_t>(id)]; }
  int size() const { return static_cast<int>(words_.size()); }

 private:
  std::vector<std::string> words_;
  std::map<std::string, int> ids_;
};

}  // namespace attn::tools
