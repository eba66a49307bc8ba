// A throwaway TLS certificate for tests, made by the openssl command (as an
// operator would) in a fresh temporary directory that goes with the object.
//
//   straggler::testing::TestCertificate cert;   // REQUIREs openssl to succeed
//   config.tls.cert_file = cert.cert;
//   config.tls.key_file = cert.key;
//
// Self-signed, for 127.0.0.1 (subject and IP SAN): it is its own CA, so a
// client that trusts cert.Pem() can verify the daemon. Not thread-safe.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace straggler::testing {

struct TestCertificate {
  TestCertificate() {
    char pattern[] = "/tmp/straggler-test-tls-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    dir = pattern;
    cert = dir + "/cert.pem";
    key = dir + "/key.pem";
    const std::string cmd =
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
        "-addext subjectAltName=IP:127.0.0.1 -keyout " + key + " -out " + cert + " 2>" + dir +
        "/openssl.log";
    INFO(cmd);
    REQUIRE(std::system(cmd.c_str()) == 0);
  }
  ~TestCertificate() { std::filesystem::remove_all(dir); }
  TestCertificate(const TestCertificate&) = delete;
  TestCertificate& operator=(const TestCertificate&) = delete;

  std::string Pem() const { return Read(cert); }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::string dir, cert, key;
};

}  // namespace straggler::testing
