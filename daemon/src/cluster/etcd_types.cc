#include "cluster/etcd_types.h"

#include <utility>

namespace straggler::cluster {

Compare Compare::Absent(std::string key) { return CreateRevisionIs(std::move(key), 0); }

Compare Compare::CreateRevisionIs(std::string key, int64_t revision) {
  return Compare{std::move(key), Target::kCreateRevision, Op::kEqual, revision, {}};
}

Compare Compare::ModRevisionIs(std::string key, int64_t revision) {
  return Compare{std::move(key), Target::kModRevision, Op::kEqual, revision, {}};
}

Compare Compare::ValueIs(std::string key, std::string value) {
  return Compare{std::move(key), Target::kValue, Op::kEqual, 0, std::move(value)};
}

Compare Compare::LeaseIs(std::string key, int64_t lease) {
  return Compare{std::move(key), Target::kLease, Op::kEqual, lease, {}};
}

TxnOp TxnOp::Get(std::string key) { return TxnOp{Kind::kGet, std::move(key), {}, 0}; }

TxnOp TxnOp::Put(std::string key, std::string value, int64_t lease) {
  return TxnOp{Kind::kPut, std::move(key), std::move(value), lease};
}

TxnOp TxnOp::Delete(std::string key) { return TxnOp{Kind::kDelete, std::move(key), {}, 0}; }

std::string PrefixRangeEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace straggler::cluster
