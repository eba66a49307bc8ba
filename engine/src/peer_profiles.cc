#include "peer_profiles.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace straggler::engine::internal {

// A chunk's profiles: counts per rank and kind, then per kind cap columns
// of kChunk values (column j: the chunk's ranks' j-th values). Mapped
// anonymous memory starts zeroed (every count 0) and is only backed where
// written.
struct PeerProfiles::Block {
  size_t bytes;
  uint32_t cap;
  uint32_t live;  // ranks of the chunk holding a value of either kind
  uint32_t count[kChunk][2];

  double& At(size_t i, Kind kind, size_t j) {
    return reinterpret_cast<double*>(this + 1)[(kind * size_t{cap} + j) * kChunk + i];
  }
};

void PeerProfiles::Unmap::operator()(Block* b) const {
  munmap(b, b->bytes);
}

PeerProfiles::BlockPtr PeerProfiles::Map(size_t cap) {
  const size_t bytes = sizeof(Block) + kChunk * 2 * cap * sizeof(double);
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
  if (b->count[i][kind] == b->cap) {
    // Outgrown (the policy's profile length went up meanwhile): twice the room.
    BlockPtr grown = Map(size_t{b->cap} * 2);
    grown->live = b->live;
    std::memcpy(grown->count, b->count, sizeof(b->count));
    for (size_t r = 0; r < kChunk; ++r)
      for (Kind k : {kOwn, kGen})
        for (size_t j = 0; j < b->count[r][k]; ++j) grown->At(r, k, j) = b->At(r, k, j);
    b = std::move(grown);
  }
  uint32_t(&n)[2] = b->count[i];
  if (n[kOwn] == 0 && n[kGen] == 0) ++b->live;
  b->At(i, kind, n[kind]++) = v;
}

void PeerProfiles::CopyTo(Kind kind, uint32_t rank, std::vector<double>& out) const {
  out.clear();
  Block* b = blocks_[rank >> kShift].get();
  if (b == nullptr) return;
  const size_t i = rank & (kChunk - 1);
  for (size_t j = 0; j < b->count[i][kind]; ++j) out.push_back(b->At(i, kind, j));
}

size_t PeerProfiles::Count(Kind kind, uint32_t rank) const {
  const Block* b = blocks_[rank >> kShift].get();
  return b == nullptr ? 0 : b->count[rank & (kChunk - 1)][kind];
}

void PeerProfiles::Clear(Kind kind, uint32_t rank) {
  BlockPtr& b = blocks_[rank >> kShift];
  if (!b) return;
  uint32_t(&n)[2] = b->count[rank & (kChunk - 1)];
  if (n[kind] == 0) return;
  n[kind] = 0;
  if (n[kOwn] == 0 && n[kGen] == 0 && --b->live == 0) b.reset();
}

size_t PeerProfiles::MappedBytes() const {
  size_t sum = 0;
  for (const BlockPtr& b : blocks_)
    if (b) sum += b->bytes;
  return sum;
}

}  // namespace straggler::engine::internal
