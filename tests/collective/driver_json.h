// The JSON arrays the collective drivers (collective_driver.cc,
// hybrid_driver.cc) print per step for their Python tests to read.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace straggler::testing {

// [v0,v1,...]; floating-point values with 17 significant digits, so the
// test reads back exactly the value the rank held.
template <class T>
std::string Json(const std::vector<T>& v) {
  std::ostringstream out;
  out.precision(17);
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
  out << "]";
  return out.str();
}

}  // namespace straggler::testing
