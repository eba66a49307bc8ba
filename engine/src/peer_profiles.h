// What the peer reference's ranks keep only while they profile
// (docs/detection.md, "peer", "Profiles"): per rank, the steps of its own
// baseline (kOwn) and its log ratios in its group's profile (kGen, the
// generation check). Every rank of a job profiles in the same few rows, so
// they live in one block per chunk of 4 096 ranks, mapped from the system
// when a rank of the chunk first profiles and unmapped when none does:
// no allocation per rank, nothing left in the heap when a million profiles
// end in the same row (the per-rank vectors they replace took three heap
// allocations a rank, about 100 bytes more while profiling - engine_memory
// at a million ranks: 787 against 684 - and a malloc_trim of the whole
// heap to give back). A block
// holds a column per step of the profile: a row's steps of neighbouring
// ranks lie side by side, and the job's first row touches the pages of the
// first column only, not the whole profile's. The values are floats, as in
// PeerSteps' rings: half the bytes of a profiling million-rank job's
// largest part (the scenarios and the seed sweep give byte-identical
// reports).
// Plain data, one thread at a time (the engine's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace straggler::engine::internal {

class PeerProfiles {
 public:
  enum Kind : uint8_t { kOwn = 0, kGen = 1 };
  static constexpr size_t kShift = 12;
  static constexpr size_t kChunk = size_t{1} << kShift;

  PeerProfiles();
  ~PeerProfiles();
  PeerProfiles(const PeerProfiles&) = delete;
  PeerProfiles& operator=(const PeerProfiles&) = delete;

  // Ranks past `n` lose their profiles.
  void Resize(size_t n);

  // Appends v (as a float) to the rank's profile of `kind`; a new block holds `cap`
  // values of each kind per rank (the policy's profile length), and grows
  // if a profile outgrows it.
  void Push(Kind kind, uint32_t rank, double v, size_t cap);

  // The rank's values of `kind`, in the order pushed, into `out` (replaced).
  void CopyTo(Kind kind, uint32_t rank, std::vector<double>& out) const;
  size_t Count(Kind kind, uint32_t rank) const;

  // Empties the rank's profile of `kind`; its chunk's block goes back to the
  // system once no rank of the chunk holds a value.
  void Clear(Kind kind, uint32_t rank);

  // Bytes mapped now (for tests and the memory benchmark).
  size_t MappedBytes() const;

 private:
  struct Block;
  struct Unmap {
    void operator()(Block* b) const;
  };
  using BlockPtr = std::unique_ptr<Block, Unmap>;
  static BlockPtr Map(size_t cap);

  std::vector<BlockPtr> blocks_;
};

}  // namespace straggler::engine::internal
