// A prepared SQLite statement that finalizes itself, shared by the Store's
// writer side (store.cc) and its reads (store_read.cc). Internal to persist/.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>

namespace straggler::daemon::persist_internal {

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return s_; }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // Unset binds NULL.
  Stmt& Bind(int i, const std::optional<uint32_t>& v) {
    if (v) return Bind(i, static_cast<int64_t>(*v));
    sqlite3_bind_null(s_, i);
    return *this;
  }
  int Step() { return sqlite3_step(s_); }
  int64_t Int(int col) { return sqlite3_column_int64(s_, col); }
  // NULL reads as unset.
  std::optional<uint32_t> OptionalU32(int col) {
    if (sqlite3_column_type(s_, col) == SQLITE_NULL) return std::nullopt;
    return static_cast<uint32_t>(sqlite3_column_int64(s_, col));
  }
  std::string Text(int col) {
    const auto* p = sqlite3_column_text(s_, col);
    return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p));
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_OK;
};

inline int64_t I(uint64_t v) { return static_cast<int64_t>(v); }

}  // namespace straggler::daemon::persist_internal
