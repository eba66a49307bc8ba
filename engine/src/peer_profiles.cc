#include "peer_profiles.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace straggler::engine::internal {

// A chunk's profiles: counts per kind and rank, then per kind cap columns
// of kChunk values (column j: the chunk's ranks' j-th values). Mapped
// anonymous memory starts zeroed (every count 0) and is only backed where
// written: a kind no rank of the chunk uses (kOwn in a job of large groups)
// touches no page, its counts included.
struct PeerProfiles::Block {
  size_t bytes;
  uint32_t cap;
  uint32_t live;  // ranks of the chunk holding a value of either kind
  uint32_t count[2][kChunk];

  float& At(size_t i, Kind kind, size_t j) {
    return reinterpret_cast<float*>(this + 1)[(kind * size_t{cap} + j) * kChunk + i];
  }
};

void PeerProfiles::Unmap::operator()(Block* b) const {
  munmap(b, b->bytes);
}

PeerProfiles::BlockPtr PeerProfiles::Map(size_t cap) {
  const size_t bytes = sizeof(Block) + kChunk * 2 * cap * sizeof(float);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  // A trivial type on fresh zeroed pages: only the header's own fields are
  // written, the counts stay untouched zero pages.
  Block* b = static_cast<Block*>(p);
  b->bytes = bytes;
  b->cap = static_cast<uint32_t>(cap);
  b->live = 0;
  return BlockPtr(b);
}

PeerProfiles::PeerProfiles() = default;
PeerProfiles::~PeerProfiles() = default;

void PeerProfiles::Resize(size_t n) {
  blocks_.resize((n + kChunk - 1) >> kShift);
  // Ranks past n in the last chunk: no profile when grown again.
  for (size_t r = n; r < (blocks_.size() << kShift); ++r) {
    Clear(kOwn, static_cast<uint32_t>(r));
    Clear(kGen, static_cast<uint32_t>(r));
  }
}

void PeerProfiles::Push(Kind kind, uint32_t rank, double v, size_t cap) {
  BlockPtr& b = blocks_[rank >> kShift];
  if (!b) b = Map(std::max<size_t>(cap, 1));
  const size_t i = rank & (kChunk - 1);
  if (b->count[kind][i] == b->cap) {
    // Outgrown (the policy's profile length went up meanwhile): twice the room.
    BlockPtr grown = Map(size_t{b->cap} * 2);
    grown->live = b->live;
    std::memcpy(grown->count, b->count, sizeof(b->count));
    for (size_t r = 0; r < kChunk; ++r)
      for (Kind k : {kOwn, kGen})
        for (size_t j = 0; j < b->count[k][r]; ++j) grown->At(r, k, j) = b->At(r, k, j);
    b = std::move(grown);
  }
  if (b->count[kOwn][i] == 0 && b->count[kGen][i] == 0) ++b->live;
  b->At(i, kind, b->count[kind][i]++) = static_cast<float>(v);
}

void PeerProfiles::CopyTo(Kind kind, uint32_t rank, std::vector<double>& out) const {
  out.clear();
  Block* b = blocks_[rank >> kShift].get();
  if (b == nullptr) return;
  const size_t i = rank & (kChunk - 1);
  for (size_t j = 0; j < b->count[kind][i]; ++j) out.push_back(b->At(i, kind, j));
}

size_t PeerProfiles::Count(Kind kind, uint32_t rank) const {
  const Block* b = blocks_[rank >> kShift].get();
  return b == nullptr ? 0 : b->count[kind][rank & (kChunk - 1)];
}

void PeerProfiles::Clear(Kind kind, uint32_t rank) {
  BlockPtr& b = blocks_[rank >> kShift];
  if (!b) return;
  const size_t i = rank & (kChunk - 1);
  if (b->count[kind][i] == 0) return;
  b->count[kind][i] = 0;
  if (b->count[kOwn][i] == 0 && b->count[kGen][i] == 0 && --b->live == 0) b.reset();
}

size_t PeerProfiles::MappedBytes() const {
  size_t sum = 0;
  for (const BlockPtr& b : blocks_)
    if (b) sum += b->bytes;
  return sum;
}

}  // namespace straggler::engine::internal
