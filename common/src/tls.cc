#include "straggler/common/tls.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <ctime>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "straggler/common/channel_security.h"
#include "spdlog/spdlog.h"

namespace straggler::common {
namespace {

// OpenSSL's queued errors as one line (and the queue emptied), for a message.
std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

absl::Status Failed(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", OpenSslErrors()));
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Adds every certificate of `pem` to `store` (the client CA bundle).
absl::Status LoadCaBundle(const ServerTls& tls, X509_STORE* store, STACK_OF(X509_NAME)* names) {
  BioPtr bio = MemoryBio(tls.client_ca);
  int count = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    ++count;
    const bool ok = X509_STORE_add_cert(store, cert) == 1;
    if (ok && names != nullptr) {
      sk_X509_NAME_push(names, X509_NAME_dup(X509_get_subject_name(cert)));
    }
    X509_free(cert);
    if (!ok) return Failed(absl::StrCat(tls.section, ".client_ca_file=", tls.config.client_ca_file));
  }
  ERR_clear_error();  // the end of the bundle reads as an error
  if (count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        tls.section, ".client_ca_file=", tls.config.client_ca_file, " holds no PEM certificate"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CertificateValidity> LeafValidity(const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  std::unique_ptr<X509, decltype(&X509_free)> leaf(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  ERR_clear_error();
  if (!leaf) return absl::InvalidArgumentError("no PEM certificate");
  auto to_unix = [](const ASN1_TIME* t) -> std::optional<int64_t> {
    struct tm tm {};
    if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return std::nullopt;
    return static_cast<int64_t>(timegm(&tm));
  };
  const auto before = to_unix(X509_get0_notBefore(leaf.get()));
  const auto after = to_unix(X509_get0_notAfter(leaf.get()));
  if (!before || !after) return absl::InvalidArgumentError("unreadable validity dates");
  return CertificateValidity{*before, *after};
}

std::string ValidityWarning(const CertificateValidity& v, int64_t now_unix,
                            absl::string_view what) {
  auto when = [](int64_t t) {
    const time_t tt = static_cast<time_t>(t);
    struct tm tm {};
    char buf[32] = "?";
    if (gmtime_r(&tt, &tm) != nullptr) strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return std::string(buf);
  };
  if (now_unix > v.not_after) {
    return absl::StrCat(what, " expired at ", when(v.not_after),
                        ": clients that verify it refuse every connection; renew it");
  }
  if (now_unix < v.not_before) {
    return absl::StrCat(what, " is not valid before ", when(v.not_before),
                        ": clients that verify it refuse every connection until then "
                        "(or the clock is wrong)");
  }
  return "";
}

absl::StatusOr<ServerTls> LoadServerTls(const TlsConfig& config, absl::string_view section) {
  ServerTls tls;
  tls.config = config;
  tls.section = std::string(section);
  const struct {
    const std::string& path;
    std::string key;
    std::string* out;
  } files[] = {{config.cert_file, absl::StrCat(section, ".cert_file"), &tls.cert_chain},
               {config.key_file, absl::StrCat(section, ".key_file"), &tls.private_key},
               {config.client_ca_file, absl::StrCat(section, ".client_ca_file"), &tls.client_ca}};
  for (const auto& f : files) {
    if (f.path.empty()) continue;
    std::string error;
    if (!ReadWholeFile(f.path, f.key, f.out, &error)) {
      return absl::FailedPreconditionError(error);
    }
  }
  // The same checks the HTTPS listener's context will make, on a scratch
  // context, so that a bad file stops the start with its own name.
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_server_method()),
                                                        &SSL_CTX_free);
  if (!ctx) return Failed("cannot create an OpenSSL context");
  if (absl::Status s = ConfigureSslContext(tls, ctx.get()); !s.ok()) return s;
  return tls;
}

std::shared_ptr<grpc::ServerCredentials> GrpcServerCredentials(const ServerTls& tls) {
  if (tls.config.reload_seconds > 0) {
    // gRPC's file watcher re-reads the files on its own thread; a renewed
    // certificate serves new connections, and a file that does not parse
    // keeps the last good one (gRPC logs it). Its first read is of the files
    // LoadServerTls has just checked.
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.config.key_file, tls.config.cert_file, tls.config.client_ca_file,
        tls.config.reload_seconds);
    grpc::experimental::TlsServerCredentialsOptions options(provider);
    options.watch_identity_key_cert_pairs();
    if (!tls.client_ca.empty()) {
      options.watch_root_certs();
      options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    }
    return grpc::experimental::TlsServerCredentials(options);
  }
  grpc::SslServerCredentialsOptions options(
      tls.client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls.client_ca;
  options.pem_key_cert_pairs.push_back({tls.private_key, tls.cert_chain});
  return grpc::SslServerCredentials(options);
}

absl::Status ConfigureSslContext(const ServerTls& tls, SSL_CTX* ctx) {
  ERR_clear_error();
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);

  const std::string cert_name = absl::StrCat(tls.section, ".cert_file=", tls.config.cert_file);
  BioPtr bio = MemoryBio(tls.cert_chain);
  X509* leaf = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (leaf == nullptr) return Failed(absl::StrCat(cert_name, " holds no PEM certificate"));
  const bool leaf_ok = SSL_CTX_use_certificate(ctx, leaf) == 1;
  X509_free(leaf);
  if (!leaf_ok) return Failed(cert_name);
  // The rest of the file is the chain up to (not necessarily including) the root.
  SSL_CTX_clear_chain_certs(ctx);
  while (X509* extra = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) {
      X509_free(extra);
      return Failed(cert_name);
    }
  }
  ERR_clear_error();

  BioPtr key_bio = MemoryBio(tls.private_key);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) {
    return Failed(absl::StrCat(tls.section, ".key_file=", tls.config.key_file,
                               " holds no PEM private key (or it is encrypted)"));
  }
  const bool key_ok = SSL_CTX_use_PrivateKey(ctx, key) == 1;
  EVP_PKEY_free(key);
  if (!key_ok || SSL_CTX_check_private_key(ctx) != 1) {
    return Failed(absl::StrCat(tls.section, ".key_file=", tls.config.key_file, " does not match ",
                               cert_name));
  }

  if (!tls.client_ca.empty()) {
    STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
    if (absl::Status s = LoadCaBundle(tls, SSL_CTX_get_cert_store(ctx), names); !s.ok()) {
      sk_X509_NAME_pop_free(names, X509_NAME_free);
      return s;
    }
    SSL_CTX_set_client_CA_list(ctx, names);  // takes ownership
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return absl::OkStatus();
}

SslContextSource::SslContextSource(TlsConfig config, std::string section)
    : config_(std::move(config)), section_(std::move(section)) {}

absl::StatusOr<std::shared_ptr<SslContextSource>> SslContextSource::Create(const ServerTls& tls) {
  std::shared_ptr<SslContextSource> source(new SslContextSource(tls.config, tls.section));
  // Not shared yet: the lock costs nothing and lets the analysis see the writes.
  absl::MutexLock lock(&source->mu_);
  // Stamps before contents: a file renewed between the two looks changed at
  // the first check and is read again, never missed.
  source->stamps_ = source->Stamps();
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx = source->Load();
  if (!ctx.ok()) return ctx.status();
  source->current_ = *std::move(ctx);
  source->next_check_ = Clock::now() + std::chrono::seconds(tls.config.reload_seconds);
  return source;
}

std::vector<SslContextSource::Stamp> SslContextSource::Stamps() const {
  std::vector<Stamp> out;
  for (const std::string* path : {&config_.cert_file, &config_.key_file, &config_.client_ca_file}) {
    Stamp stamp;
    struct stat st {};
    if (!path->empty() && ::stat(path->c_str(), &st) == 0) {
      stamp.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
      stamp.size = static_cast<int64_t>(st.st_size);
      stamp.inode = static_cast<uint64_t>(st.st_ino);
    }
    out.push_back(stamp);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> SslContextSource::Load() const {
  absl::StatusOr<ServerTls> tls = LoadServerTls(config_, section_);
  if (!tls.ok()) return tls.status();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), &SSL_CTX_free);
  if (!ctx) return Failed("cannot create an OpenSSL context");
  if (absl::Status s = ConfigureSslContext(*tls, ctx.get()); !s.ok()) return s;
  return ctx;
}

std::shared_ptr<SSL_CTX> SslContextSource::Current() {
  absl::MutexLock lock(&mu_);
  if (config_.reload_seconds == 0 || Clock::now() < next_check_) return current_;
  next_check_ = Clock::now() + std::chrono::seconds(config_.reload_seconds);
  std::vector<Stamp> stamps = Stamps();
  if (stamps == stamps_) return current_;
  // Noted before reading, as in Create; also what keeps a bad set of files
  // from being retried (and logged) at every check until it changes again.
  stamps_ = std::move(stamps);
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx = Load();
  if (!ctx.ok()) {
    spdlog::warn("HTTPS certificate files changed but do not load ({}); new connections keep "
                 "the last good certificate",
                 std::string(ctx.status().message()));
    return current_;
  }
  current_ = *std::move(ctx);
  spdlog::info("HTTPS: reloaded {}.cert_file={} for new connections", section_,
               config_.cert_file);
  return current_;
}

}  // namespace straggler::common
