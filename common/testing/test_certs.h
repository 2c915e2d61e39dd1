// Throwaway certificates for tests of TLS and mutual TLS, made with the
// openssl command (a Debian package scripts/install-deps.sh installs): a CA,
// a certificate it signs for 127.0.0.1 / localhost usable by servers and
// clients alike, and a second, unrelated CA with its own such certificate.
//
//   absl::StatusOr<strata::testing::TestCerts> certs = strata::testing::MakeTestCerts(dir);
//
// Thread-safety: call from one thread; the files are written under `dir`.
#ifndef STRATA_COMMON_TESTING_TEST_CERTS_H_
#define STRATA_COMMON_TESTING_TEST_CERTS_H_

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace strata::testing {

struct TestCerts {
  std::string ca, cert, key;                    // the cluster CA and a leaf it signed
  std::string other_ca, other_cert, other_key;  // an unrelated CA and its leaf
};

inline absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir) {
  const std::string ext = dir + "/leaf.ext";
  {
    std::ofstream f(ext);
    f << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
         "extendedKeyUsage=serverAuth,clientAuth\n"
         "basicConstraints=CA:FALSE\n";
  }
  auto run = [&](const std::string& cmd) -> absl::Status {
    const std::string full = absl::StrCat("cd '", dir, "' && (", cmd, ") > openssl.log 2>&1");
    if (std::system(full.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("openssl failed (see ", dir, "/openssl.log): ", cmd));
    }
    return absl::OkStatus();
  };
  for (const char* name : {"ca", "other_ca"}) {
    if (absl::Status s = run(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=", name,
                                          " -keyout ", name, ".key -out ", name, ".pem"));
        !s.ok()) {
      return s;
    }
  }
  for (const auto& [leaf, ca] : {std::pair<const char*, const char*>{"leaf", "ca"}, {"other_leaf", "other_ca"}}) {
    if (absl::Status s = run(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=", leaf, " -keyout ",
                                          leaf, ".key -out ", leaf, ".csr && openssl x509 -req -in ", leaf,
                                          ".csr -CA ", ca, ".pem -CAkey ", ca, ".key -CAcreateserial -days 2 "
                                          "-extfile leaf.ext -out ", leaf, ".pem"));
        !s.ok()) {
      return s;
    }
  }
  TestCerts c;
  c.ca = dir + "/ca.pem";
  c.cert = dir + "/leaf.pem";
  c.key = dir + "/leaf.key";
  c.other_ca = dir + "/other_ca.pem";
  c.other_cert = dir + "/other_leaf.pem";
  c.other_key = dir + "/other_leaf.key";
  return c;
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_TEST_CERTS_H_
