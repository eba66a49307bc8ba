// The coalescing write slot that stragglerd's and straggler-agent's
// streaming reactors share (absl -> grpc status: grpc_status.h).
//
// A streaming reactor keeps ONE write in flight and ONE pending message; a
// newer message is merged into the pending one, so a slow reader costs one
// message of memory, never a queue:
//
//   absl::MutexLock lock(&mu_);
//   CarryOut(slot_.Offer(std::move(msg), &Merge), slot_, *this);  // StartWrite or Finish
//
// WriteSlot is not thread-safe (the reactor's mutex guards it).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

namespace straggler::common {

enum class WriteAction { kNone, kWrite, kFinish };

template <class Msg>
class WriteSlot {
 public:
  using MergeFn = void (*)(Msg& pending, Msg&& newer);

  // A message to send. kWrite: the caller must StartWrite(&current()).
  WriteAction Offer(Msg msg, MergeFn merge, bool* coalesced = nullptr) {
    if (finishing_) return WriteAction::kNone;
    if (!writing_) {
      current_ = std::move(msg);  // protobuf swaps: msg holds the last write
      Recycle(std::move(msg));
      writing_ = true;
      return WriteAction::kWrite;
    }
    if (pending_) {
      merge(*pending_, std::move(msg));
      if (coalesced) *coalesced = true;
    } else {
      pending_ = std::move(msg);
    }
    return WriteAction::kNone;
  }

  // The write in flight completed. kWrite: start the pending one; kFinish:
  // call Finish(finish_status()).
  WriteAction WriteDone(bool ok) {
    writing_ = false;
    if (!ok) {
      // The peer is gone; nothing more can be delivered.
      pending_.reset();
      if (!finishing_) {
        finishing_ = true;
        status_ = grpc::Status(grpc::StatusCode::CANCELLED, "write failed: peer gone");
      }
    }
    if (pending_) {
      current_ = std::move(*pending_);
      Recycle(std::move(*pending_));
      pending_.reset();
      writing_ = true;
      return WriteAction::kWrite;
    }
    return TakeFinish();
  }

  // End the RPC with `status` once what is queued has been written (`flush`)
  // or after the write in flight (`!flush`). Only the first request counts.
  WriteAction RequestFinish(grpc::Status status, bool flush) {
    if (finishing_) return WriteAction::kNone;
    finishing_ = true;
    status_ = std::move(status);
    if (!flush) pending_.reset();
    return writing_ ? WriteAction::kNone : TakeFinish();
  }

  // A cleared message that held an earlier write, to build the next Offer
  // in: its repeated fields keep their elements, so filling it allocates
  // nothing (a directive's 4 096 RankProgress entries were a malloc and a
  // free each: 13% of a daemon ingesting a million-rank job). A default
  // message when there is none.
  Msg TakeSpare() {
    Msg m = std::move(spare_);
    spare_.Clear();
    return m;
  }

  const Msg& current() const { return current_; }
  bool finishing() const { return finishing_; }
  const grpc::Status& finish_status() const { return status_; }

 private:
  // Keeps a written message as the spare, unless it was large (a stream's
  // first directive, with every rank's progress): memory is not kept for it.
  void Recycle(Msg&& written) {
    static constexpr int kMaxSpareBytes = 256 << 10;
    if (written.GetCachedSize() > kMaxSpareBytes) return;
    spare_ = std::move(written);
    spare_.Clear();
  }

  WriteAction TakeFinish() {
    if (!finishing_ || finished_) return WriteAction::kNone;
    finished_ = true;
    return WriteAction::kFinish;
  }

  Msg current_;
  Msg spare_;
  std::optional<Msg> pending_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

// Does what `slot` asked for with `action` on `reactor`: a
// grpc::ServerBidiReactor or ServerWriteReactor (pass it as its gRPC base
// when the reactor hides Finish(grpc::Status) behind an overload of its own).
// The caller holds the mutex that guards `slot`; gRPC runs the completions
// of StartWrite and Finish on its own threads, never inline, so holding it
// across them is safe.
template <class Msg, class Reactor>
void CarryOut(WriteAction action, const WriteSlot<Msg>& slot, Reactor& reactor) {
  switch (action) {
    case WriteAction::kWrite: reactor.StartWrite(&slot.current()); break;
    case WriteAction::kFinish: reactor.Finish(slot.finish_status()); break;
    case WriteAction::kNone: break;
  }
}

}  // namespace straggler::common
