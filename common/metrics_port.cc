#include "common/metrics_port.h"

#include <sys/socket.h>

#include <chrono>
#include <csignal>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace strata {

absl::StatusOr<std::unique_ptr<MetricsPort>> MetricsPort::Start(const std::string& address,
                                                                metrics::Registry* registry) {
  std::unique_ptr<MetricsPort> p(new MetricsPort());
  if (address.empty()) return p;
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen must be HOST:PORT, got '", address, "'"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::signal(SIGPIPE, SIG_IGN);  // a scraper that hangs up must not kill the daemon
  p->server_ = std::make_unique<httplib::Server>();
  p->server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  // SO_REUSEADDR only: the library's default, SO_REUSEPORT, would let a second
  // daemon bind the same port and take half of the scrapes.
  p->server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  p->server_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), metrics::kContentType);
  });
  if (port == 0) {
    port = p->server_->bind_to_any_port(host);
  } else if (!p->server_->bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", address, " (--metrics-listen)"));
  p->port_ = port;
  httplib::Server* s = p->server_.get();
  p->thread_ = std::thread([s] { s->listen_after_bind(); });
  // Stop() before the loop runs would not stop it: wait until it does.
  while (!s->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return p;
}

MetricsPort::~MetricsPort() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace strata
