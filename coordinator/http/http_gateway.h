// HttpGateway: the coordinator's OpenAI-compatible HTTP front end
// (docs/http.md). It serves /v1/models, /v1/completions,
// /v1/chat/completions (JSON or server-sent events), /tokenize, /detokenize,
// /health, /v1/health and /metrics on its own port, with the public gRPC
// port's TLS certificate and API tokens (ApiAuth), and starts every
// generation through GenerationService::Start — the gRPC path — so the same
// request and seed give the same text on both.
//
// Built on cpp-httplib (Debian's libcpp-httplib-dev): one thread per open
// connection from a pool of `threads`. A handler waiting for tokens polls its
// connection and aborts the request when the client goes away
// (coordinator/http/connection.h), which frees its KV rows on every stage.
//
// Thread-safety: Start and Stop are called by one thread; the handlers run
// on the server's threads and share only thread-safe objects.
#ifndef STRATA_COORDINATOR_HTTP_HTTP_GATEWAY_H_
#define STRATA_COORDINATOR_HTTP_HTTP_GATEWAY_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "coordinator/generation_service.h"

namespace httplib {
class Server;
}

namespace strata::coordinator::http {

struct HttpGatewayOptions {
  // HOST:PORT to listen on; port 0 picks a free one (see port()).
  std::string listen;
  // PEM files of the certificate and key (the public gRPC port's). Both
  // empty: plaintext (--insecure-public).
  std::string tls_cert, tls_key;
  // The model's name in /v1/models and in answers; a request naming another
  // model gets 404. Empty: the model directory's last component.
  std::string served_model_name;
  // Largest request body; beyond it 413.
  size_t max_body_bytes = 16 << 20;
  // Server threads: connections served at once (each stream holds one).
  int threads = 128;
  // A stream silent this long gets an SSE comment (and a request waiting for
  // its first token checks its connection this often).
  int keepalive_ms = 1000;
};

class HttpGateway {
 public:
  // Binds and starts serving. `ready` says whether generations can be
  // served now (the cluster is placed and not draining): /health answers
  // 200 or 503 from it. `registry` is rendered at /metrics (null: 404), and
  // strata_http_requests_total is recorded in it.
  // REQUIRES: service and registry outlive the gateway.
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Start(HttpGatewayOptions options, GenerationService* service,
                                                            std::function<bool()> ready,
                                                            metrics::Registry* registry);
  ~HttpGateway();

  int port() const { return port_; }
  // Stops accepting, ends the open connections and joins the server thread.
  void Stop();

 private:
  HttpGateway() = default;
  void Routes();

  HttpGatewayOptions options_;
  GenerationService* service_ = nullptr;
  std::function<bool()> ready_;
  metrics::Registry* registry_ = nullptr;
  int64_t started_ = 0;  // unix seconds, the model's "created"
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  // Set by Stop: waiting handlers abort their requests and return.
  std::atomic<bool> stopping_{false};
};

}  // namespace strata::coordinator::http

#endif  // STRATA_COORDINATOR_HTTP_HTTP_GATEWAY_H_
