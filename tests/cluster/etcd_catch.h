// The cluster tests' way to start etcd (etcd_harness.h) inside a Catch2 test:
// a test that cannot start it fails there, with the tail of etcd's log.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "etcd_harness.h"

namespace straggler::cluster::testing {

inline std::unique_ptr<EtcdProcess> RequireEtcd() {
  auto etcd = EtcdProcess::Start();
  INFO((etcd.ok() ? std::string() : std::string(etcd.status().message())));
  REQUIRE(etcd.ok());
  return *std::move(etcd);
}

}  // namespace straggler::cluster::testing
