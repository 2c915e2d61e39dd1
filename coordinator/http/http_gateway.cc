#include "coordinator/http/http_gateway.h"

#include <sys/socket.h>

#include <chrono>
#include <csignal>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/http/connection.h"
#include "coordinator/http/openai_request.h"
#include "coordinator/http/openai_response.h"
#include "httplib.h"
#include "model/chat_format.h"

namespace strata::coordinator::http {
namespace {

using json = nlohmann::json;

constexpr const char* kJson = "application/json";

// Where a generation's responses wait for the handler (or the stream's
// content provider) to take them. Send and Close are called with the
// scheduler's lock held: they only queue.
class HttpSink final : public GenerateSink {
 public:
  void Send(v1::GenerateResponse response) override {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    queue_.push_back(std::move(response));
    cv_.notify_all();
  }
  void Close(const absl::Status& status) override {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    closed_ = true;
    status_ = status;
    cv_.notify_all();
  }

  // Waits up to `ms` for a response or the close; moves the queued
  // responses to *out. True once closed and drained (*status set).
  bool Take(int ms, std::deque<v1::GenerateResponse>* out, absl::Status* status) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::milliseconds(ms), [this] { return closed_ || !queue_.empty(); });
    while (!queue_.empty()) {
      out->push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    if (closed_) *status = status_;
    return closed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::GenerateResponse> queue_;  // guarded by mu_
  bool closed_ = false;                     // guarded by mu_
  absl::Status status_;                     // guarded by mu_
};

// One generation over HTTP, shared by the handler and (streaming) the
// content provider that outlives it.
struct Generation {
  Generation(ResponseContext ctx, ApiAuth::Slot slot) : builder(std::move(ctx)), slot(std::move(slot)) {}
  std::shared_ptr<HttpSink> sink = std::make_shared<HttpSink>();
  ResponseBuilder builder;
  ApiAuth::Slot slot;  // the caller's concurrent-stream slot, held to the end
  int fd = -1;
  bool closed = false, started = false, finished = false;
  absl::Time arrived = absl::Now();  // the handler started: the request was read
  metrics::Histogram* ttft = nullptr;  // strata_http_time_to_first_token_seconds (streams)
  absl::Status status;
  std::deque<v1::GenerateResponse> pending;
};

std::string NewRequestId() {
  std::random_device rd;
  std::string id = "req-";
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(rd(), absl::kZeroPad8));
  return id;
}

void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body) + "\n", kJson);
}

void ReplyError(httplib::Response& res, const absl::Status& s) { Reply(res, HttpStatus(s), ErrorBody(s)); }

// The route a path belongs to, for the metrics' `path` label (bounded: any
// other path is "other").
std::string RouteOf(const std::string& path) {
  static const char* kRoutes[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize",
                                  "/detokenize",     "/health",              "/v1/health", "/metrics"};
  for (const char* r : kRoutes) {
    if (path == r) return r;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Start(HttpGatewayOptions options,
                                                                GenerationService* service,
                                                                std::function<bool()> ready,
                                                                metrics::Registry* registry) {
  std::unique_ptr<HttpGateway> g(new HttpGateway());
  g->options_ = std::move(options);
  g->service_ = service;
  g->ready_ = std::move(ready);
  g->registry_ = registry;
  g->started_ = absl::ToUnixSeconds(absl::Now());
  if (g->options_.served_model_name.empty()) {
    g->options_.served_model_name =
        std::filesystem::path(service->model()->model_dir).lexically_normal().filename().string();
    if (g->options_.served_model_name.empty()) {
      g->options_.served_model_name =
          std::filesystem::path(service->model()->model_dir).lexically_normal().parent_path().filename().string();
    }
  }
  const std::string& listen = g->options_.listen;
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http-listen must be HOST:PORT, got '", listen, "'"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (g->options_.tls_cert.empty() != g->options_.tls_key.empty()) {
    return absl::InvalidArgumentError("the HTTP port needs both the TLS certificate and its key");
  }
  if (g->options_.tls_cert.empty()) {
    g->server_ = std::make_unique<httplib::Server>();
  } else {
    auto ssl = std::make_unique<httplib::SSLServer>(g->options_.tls_cert.c_str(), g->options_.tls_key.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError("the HTTP port cannot use --tls-cert / --tls-key (unreadable or not PEM)");
    }
    g->server_ = std::move(ssl);
  }
  // A write to a client that went away must fail, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  const int threads = std::max(4, g->options_.threads);
  g->server_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  g->server_->set_payload_max_length(g->options_.max_body_bytes);
  g->server_->set_tcp_nodelay(true);
  // SO_REUSEADDR only: the library's default, SO_REUSEPORT, would let a second
  // coordinator bind the same port and take half of the connections.
  g->server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  g->Routes();
  if (port == 0) {
    port = g->server_->bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!g->server_->bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " (--http-listen)"));
  g->port_ = port;
  httplib::Server* s = g->server_.get();
  g->thread_ = std::thread([s] { s->listen_after_bind(); });
  // Stop() before the loop runs would not stop it: wait until it does.
  while (!s->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return g;
}

HttpGateway::~HttpGateway() { Stop(); }

void HttpGateway::Stop() {
  stopping_ = true;
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpGateway::Routes() {
  httplib::Server& s = *server_;
  Scheduler* scheduler = service_->scheduler();

  // Authentication (401) and the caller's request rate (429); the caller's
  // name on success.
  auto authorize = [this](const httplib::Request& req, httplib::Response& res) -> std::optional<std::string> {
    absl::StatusOr<std::string> caller = service_->Authorize(req.get_header_value("Authorization"));
    if (!caller.ok()) {
      ReplyError(res, caller.status());
      if (absl::IsUnauthenticated(caller.status())) res.set_header("WWW-Authenticate", "Bearer");
      return std::nullopt;
    }
    return *caller;
  };

  auto health = [this](const httplib::Request&, httplib::Response& res) {
    if (ready_ && ready_()) {
      Reply(res, 200, json{{"status", "ok"}});
    } else {
      Reply(res, 503, ErrorBody(503, "not ready: the model is loading on the workers, a stage is missing, or the "
                                     "coordinator is draining",
                                "", "not_ready"));
    }
  };
  s.Get("/health", health);
  s.Get("/v1/health", health);

  auto model_json = [this] {
    return json{{"id", options_.served_model_name},
                {"object", "model"},
                {"created", started_},
                {"owned_by", "strata"},
                {"max_model_len", service_->model()->config.max_position_embeddings}};
  };
  s.Get("/v1/models", [=](const httplib::Request& req, httplib::Response& res) {
    if (!authorize(req, res)) return;
    Reply(res, 200, json{{"object", "list"}, {"data", json::array({model_json()})}});
  });
  s.Get(R"(/v1/models/(.+))", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!authorize(req, res)) return;
    if (req.matches[1] != options_.served_model_name) {
      Reply(res, 404, ErrorBody(404, absl::StrCat("the model '", std::string(req.matches[1]), "' does not exist; this "
                                                  "server serves '", options_.served_model_name, "'"),
                                "model", "model_not_found"));
      return;
    }
    Reply(res, 200, model_json());
  });

  s.Get("/metrics", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!authorize(req, res)) return;
    if (registry_ == nullptr) {
      Reply(res, 404, ErrorBody(404, "this server keeps no metrics", "", "not_found"));
      return;
    }
    res.set_content(registry_->Render(), metrics::kContentType);
  });

  s.Post("/tokenize", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!authorize(req, res)) return;
    absl::StatusOr<TokenizeRequest> t = ParseTokenizeRequest(req.body);
    if (!t.ok()) return ReplyError(res, t.status());
    const ModelContext& m = *service_->model();
    if (!m.tokenizer) {
      return ReplyError(res, absl::FailedPreconditionError("the model has no tokenizer.json"));
    }
    std::string text = t->prompt;
    if (t->chat) {
      std::vector<ChatMessage> msgs;
      for (const auto& cm : t->messages) msgs.push_back({cm.role(), cm.content(), ""});
      ChatOptions co;
      co.thinking = t->thinking;
      absl::StatusOr<std::string> f = FormatChat(m.config.model_type, msgs, /*add_generation_prompt=*/true, co);
      if (!f.ok()) return ReplyError(res, f.status());
      text = *f;
    }
    absl::StatusOr<std::vector<int>> ids = m.tokenizer->Encode(text, t->add_special_tokens);
    if (!ids.ok()) return ReplyError(res, ids.status());
    Reply(res, 200, json{{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", m.config.max_position_embeddings}});
  });

  s.Post("/detokenize", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!authorize(req, res)) return;
    absl::StatusOr<std::vector<int>> ids = ParseDetokenizeRequest(req.body);
    if (!ids.ok()) return ReplyError(res, ids.status());
    const ModelContext& m = *service_->model();
    if (!m.tokenizer) return ReplyError(res, absl::FailedPreconditionError("the model has no tokenizer.json"));
    for (size_t i = 0; i < ids->size(); ++i) {
      if (!m.tokenizer->IsKnown((*ids)[i])) {
        return ReplyError(res, InvalidParam("tokens", absl::StrCat("tokens[", i, "] = ", (*ids)[i],
                                                                   " is not a token of this model")));
      }
    }
    Reply(res, 200, json{{"prompt", m.tokenizer->Decode(*ids)}});
  });

  auto generate = [=, this](Endpoint ep, const httplib::Request& req, httplib::Response& res) {
    ApiAuth* auth = service_->auth();
    absl::StatusOr<std::string> caller = auth->Authenticate(req.get_header_value("Authorization"));
    if (!caller.ok()) {
      res.set_header("WWW-Authenticate", "Bearer");
      return ReplyError(res, caller.status());
    }
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(ep, req.body);
    if (!r.ok()) return ReplyError(res, r.status());
    if (!r->model.empty() && r->model != options_.served_model_name) {
      return Reply(res, 404, ErrorBody(404, absl::StrCat("the model '", r->model, "' does not exist; this server "
                                                         "serves '", options_.served_model_name, "' (GET /v1/models)"),
                                       "model", "model_not_found"));
    }
    absl::StatusOr<ApiAuth::Slot> slot = auth->AdmitStream(*caller);
    if (!slot.ok()) return ReplyError(res, slot.status());
    if (r->generate.request_id().empty()) r->generate.set_request_id(NewRequestId());
    ResponseContext ctx;
    ctx.endpoint = ep;
    ctx.id = absl::StrCat(ep == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", r->generate.request_id());
    ctx.created = absl::ToUnixSeconds(absl::Now());
    ctx.model = options_.served_model_name;
    ctx.logprobs = r->logprobs;
    ctx.include_usage = r->include_usage;
    ctx.tokenizer = service_->model()->tokenizer.get();
    auto gen = std::make_shared<Generation>(std::move(ctx), std::move(*slot));
    gen->fd = ConnectionSocket(req);
    if (registry_ != nullptr && r->stream) {
      gen->ttft = registry_->GetHistogram(
          "strata_http_time_to_first_token_seconds",
          "HTTP streams: from the request read to its first token's event written to the connection.",
          metrics::LatencyBuckets(), {{"path", RouteOf(req.path)}});
    }
    service_->Start(*caller, r->generate, gen->sink, std::nullopt);

    const int poll_ms = std::min(200, std::max(10, options_.keepalive_ms));
    // Until the first response (or the end): the status code is still open.
    while (!gen->closed && gen->pending.empty()) {
      gen->closed = gen->sink->Take(poll_ms, &gen->pending, &gen->status);
      if (!gen->closed && gen->pending.empty() && (stopping_ || PeerClosed(gen->fd))) {
        scheduler->Cancel(gen->sink.get());
        res.status = 499;
        return;
      }
    }
    const bool any_chunk = !gen->pending.empty();
    if (gen->closed && !gen->status.ok() && !any_chunk) return ReplyError(res, gen->status);

    if (!r->stream) {
      while (true) {
        for (auto& p : gen->pending) gen->builder.Add(p);
        gen->pending.clear();
        if (gen->closed) break;
        gen->closed = gen->sink->Take(poll_ms, &gen->pending, &gen->status);
        if (!gen->closed && (stopping_ || PeerClosed(gen->fd))) {
          scheduler->Cancel(gen->sink.get());
          res.status = 499;
          return;
        }
      }
      if (!gen->status.ok()) return ReplyError(res, gen->status);
      if (!gen->builder.finished()) {
        return ReplyError(res, absl::InternalError("the generation ended without a final message"));
      }
      return Reply(res, 200, gen->builder.Body());
    }

    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    const int keepalive_ms = std::max(10, options_.keepalive_ms);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, gen, scheduler, poll_ms, keepalive_ms](size_t, httplib::DataSink& sink) -> bool {
          std::string out;
          if (!gen->started) {
            gen->started = true;
            out += gen->builder.StreamStart();
          }
          int waited = 0;
          while (true) {
            for (auto& p : gen->pending) out += gen->builder.StreamEvents(p);
            gen->pending.clear();
            if (gen->closed) {
              if (!gen->status.ok()) out += SseEvent(ErrorBody(gen->status));
              out += kSseDone;
              break;
            }
            if (!out.empty()) break;
            if (stopping_ || PeerClosed(gen->fd)) {
              scheduler->Cancel(gen->sink.get());
              return false;
            }
            if (waited >= keepalive_ms) {
              out = kSseKeepAlive;
              break;
            }
            gen->closed = gen->sink->Take(poll_ms, &gen->pending, &gen->status);
            waited += poll_ms;
          }
          if (!sink.write(out.data(), out.size())) {
            scheduler->Cancel(gen->sink.get());
            return false;
          }
          if (gen->ttft != nullptr && out != kSseKeepAlive) {
            gen->ttft->Observe(absl::ToDoubleSeconds(absl::Now() - gen->arrived));
            gen->ttft = nullptr;  // once
          }
          if (gen->closed) {
            gen->finished = true;
            sink.done();
          }
          return true;
        },
        [gen, scheduler](bool) {
          if (!gen->finished) scheduler->Cancel(gen->sink.get());
        });
  };
  s.Post("/v1/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kCompletions, req, res);
  });
  s.Post("/v1/chat/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kChatCompletions, req, res);
  });

  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.status == 499) return;
    std::string msg;
    switch (res.status) {
      case 404:
        msg = absl::StrCat("no route for ", req.method, " ", req.path,
                           "; the routes are /v1/models, /v1/completions, /v1/chat/completions, /tokenize, "
                           "/detokenize, /health, /v1/health and /metrics");
        break;
      case 413:
        msg = absl::StrCat("the request body is larger than ", options_.max_body_bytes, " bytes");
        break;
      case 405:
        msg = absl::StrCat(req.method, " is not allowed on ", req.path);
        break;
      default:
        msg = absl::StrCat("HTTP ", res.status);
    }
    Reply(res, res.status, ErrorBody(res.status, msg, "", res.status == 413 ? "payload_too_large" : ""));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    Reply(res, 500, ErrorBody(500, absl::StrCat("internal error: ", what), "", "internal_error"));
  });
  if (registry_ != nullptr) {
    s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      registry_
          ->GetCounter("strata_http_requests_total", "HTTP requests answered, by route and status code.",
                       {{"path", RouteOf(req.path)}, {"code", std::to_string(res.status)}})
          ->Inc();
    });
  }
}

}  // namespace strata::coordinator::http
