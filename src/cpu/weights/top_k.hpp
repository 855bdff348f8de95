// A row's k best keys by score, kept while the weights pass sweeps the row's keys in
// increasing order: a bounded min-heap of (score, key) whose root is the entry to drop
// next. exp(s - lse) ranks keys as s does, so scores are enough to choose.
#pragma once

#include <algorithm>
#include <limits>

#include "attn/tensor.hpp"

namespace attn::cpu {

// One entry; key is relative to the row's segment.
struct Candidate {
  float score = 0.0f;
  Index key = 0;
};

// a ranks before b: the larger score, then the lower key index.
inline bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.score > b.score || (a.score == b.score && a.key < b.key);
}

class TopK {
 public:
  TopK() = default;
  // heap: the caller's storage for `capacity` entries.
  TopK(Candidate* heap, Index capacity) : heap_(heap), capacity_(capacity) {}

  // The score a new key must beat to enter: -inf until the heap is full.
  float threshold() const {
    return size_ < capacity_ ? -std::numeric_limits<float>::infinity() : heap_[0].score;
  }

  // Keys come in increasing order, so a key that ties the worst entry has the higher
  // index and loses: ties go to the lower index.
  void offer(float score, Index key) {
    if (!(score > threshold())) return;
    if (size_ < capacity_) {
      heap_[size_++] = {score, key};
      std::push_heap(heap_, heap_ + size_, ranks_before);
    } else {
      std::pop_heap(heap_, heap_ + size_, ranks_before);
      heap_[size_ - 1] = {score, key};
      std::push_heap(heap_, heap_ + size_, ranks_before);
    }
  }

  // The entries, best first; the heap is spent.
  const Candidate* sorted() {
    std::sort(heap_, heap_ + size_, ranks_before);
    return heap_;
  }
  Index size() const { return size_; }

 private:
  Candidate* heap_ = nullptr;
  Index capacity_ = 0, size_ = 0;
};

}  // namespace attn::cpu
