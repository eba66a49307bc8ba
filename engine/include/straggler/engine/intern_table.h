// The distinct values of many per-rank fields that share a handful of them
// (node names, peer groups): each value kept once, a rank holding a 4-byte
// index. A million-rank job paid 32 bytes a rank for each std::string field
// (more for a name past the small-string buffer) where a few distinct
// values exist.
//
//   InternTable<std::string> names;        // index 0 is std::string{}
//   std::vector<uint32_t> of(ranks, 0);
//   of[r] = names.Intern(node);
//   names.CompactIfBloated(of);            // after a change of of[]
//   const std::string& name = names[of[r]];
//
// Plain data, not thread-safe (one thread at a time, as its owner).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace straggler::engine {

template <typename Key>
class InternTable {
 public:
  InternTable() : keys_{Key{}} { index_.emplace(Key{}, 0); }

  // The index of `key`, added if new. Ranks set in a row mostly share one
  // value (a hello's), so the last one is checked first.
  uint32_t Intern(const Key& key) {
    if (keys_[last_] == key) return last_;
    auto [it, added] = index_.emplace(key, static_cast<uint32_t>(keys_.size()));
    if (added) keys_.push_back(it->first);
    last_ = it->second;
    return last_;
  }

  // Valid until the next Intern or CompactIfBloated.
  const Key& operator[](uint32_t i) const { return keys_[i]; }
  // Every value, in the order first seen; 0 = Key{}. Values no index names
  // any more stay until CompactIfBloated drops them.
  const std::vector<Key>& keys() const { return keys_; }

  // Past twice as many values as `refs` (clients renaming over and over),
  // keeps only the values `refs` name, renumbering `refs` in place.
  void CompactIfBloated(std::vector<uint32_t>& refs) {
    if (keys_.size() <= 2 * refs.size() + 64) return;
    std::vector<Key> old = std::move(keys_);
    keys_ = {Key{}};
    index_.clear();
    index_.emplace(Key{}, 0);
    last_ = 0;
    for (uint32_t& r : refs) r = Intern(old[r]);
  }

 private:
  std::vector<Key> keys_;
  std::map<Key, uint32_t> index_;
  uint32_t last_ = 0;  // the last value interned
};

}  // namespace straggler::engine
