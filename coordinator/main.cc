// strata-coordinator: the public API of a Strata cluster (docs/service.md;
// ports, TLS and tokens in docs/deploy.md).
//
//   strata-coordinator --model DIR [--listen 127.0.0.1:50051] [--internal-listen 127.0.0.1:50052]
//                      [--workers N] [--kvstore HOST:PORT] [--placement 0-1:w0,2-3:w1]
//                      (--tls-cert F --tls-key F | --insecure-public)
//                      (--api-tokens F | --allow-unauthenticated)
//                      (--cluster-ca F --cluster-cert F --cluster-key F | --insecure-cluster)
//                      [--http-listen 127.0.0.1:8000] [--metrics-listen 0.0.0.0:9400]
//
// Prints "internal ADDRESS" (where workers register), "http ADDRESS" (with
// --http-listen: the OpenAI-compatible API, docs/http.md), "metrics ADDRESS"
// (with --metrics-listen, docs/metrics.md) and then "listening ADDRESS" (the
// public gRPC API) once serving, and logs events on stderr, one line each
// (docs/logging.md; --log-prompts adds prompt and completion text); readiness is published on
// grpc.health.v1 under "strata.v1.Generation". SIGINT / SIGTERM drain: readiness
// goes false, no new requests, running ones finish up to --drain-timeout-s; a
// second signal exits at once.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cluster_security.h"
#include "common/flags.h"
#include "common/health_port.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_port.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "coordinator/api_auth.h"
#include "coordinator/cluster.h"
#include "coordinator/generation_service.h"
#include "coordinator/http/http_gateway.h"
#include "coordinator/request.h"
#include "coordinator/kv_client.h"
#include "coordinator/scheduler.h"
#include "coordinator/serving_metrics.h"
#include "coordinator/session_manager.h"
#include "coordinator/sessions.h"
#include "model/fingerprint.h"
#include "model/v4/config.h"
#include "model/v4/kv_state.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

namespace {

constexpr const char* kUsage = "usage: strata-coordinator --model DIR [flags]\n";

// Largest request messages: a Generate request carries a prompt (text or
// token ids); Register/Heartbeat are small.
constexpr int kMaxPublicMessageBytes = 16 << 20;
constexpr int kMaxInternalMessageBytes = 1 << 20;

int Usage(const std::string& msg, const strata::FlagSet& flags) {
  std::fprintf(stderr, "strata-coordinator: %s\n\n%s%s", msg.c_str(), kUsage, flags.Help().c_str());
  return 2;
}

// The coordinator's transport security and its callers (docs/deploy.md).
struct Security {
  strata::ClusterCredentials cluster = strata::ClusterCredentials::Insecure();
  std::shared_ptr<grpc::ServerCredentials> public_credentials;
  std::unique_ptr<strata::coordinator::ApiAuth> auth;
};

absl::StatusOr<Security> SecurityFromFlags(const strata::FlagSet& flags) {
  Security s;
  ASSIGN_OR_RETURN(s.cluster, strata::ClusterCredentialsFromFlags(flags, "strata-coordinator"));
  const bool tls = flags.Has("tls-cert") || flags.Has("tls-key");
  if (tls == flags.Has("insecure-public")) {
    return absl::InvalidArgumentError(
        "the public API needs TLS (--tls-cert and --tls-key) or an explicit --insecure-public, not both");
  }
  if (tls) {
    ASSIGN_OR_RETURN(s.public_credentials, strata::PublicServerCredentials(flags.Get("tls-cert"), flags.Get("tls-key")));
  } else {
    s.public_credentials = grpc::InsecureServerCredentials();
    strata::log::Warn("insecure_public", {{"reason", "--insecure-public: the public API is plaintext"}});
  }
  strata::coordinator::ApiAuthOptions ao;
  auto concurrent = flags.GetInt("max-concurrent-per-token", ao.max_concurrent);
  auto rps = flags.GetDouble("max-rps-per-token", ao.max_rps);
  if (!concurrent.ok() || *concurrent < 0 || *concurrent > 1000000) {
    return absl::InvalidArgumentError("--max-concurrent-per-token must be in [0, 1000000]");
  }
  if (!rps.ok() || !(*rps >= 0) || *rps > 1e6) {
    return absl::InvalidArgumentError("--max-rps-per-token must be in [0, 1000000]");
  }
  ao.max_concurrent = static_cast<int>(*concurrent);
  ao.max_rps = *rps;
  if (flags.Has("api-tokens") == flags.Has("allow-unauthenticated")) {
    return absl::InvalidArgumentError(
        "the public API needs tokens (--api-tokens FILE) or an explicit --allow-unauthenticated, not both");
  }
  if (flags.Has("api-tokens")) {
    ASSIGN_OR_RETURN(const std::string text, strata::ReadSecretFile(flags.Get("api-tokens"), "--api-tokens"));
    ASSIGN_OR_RETURN(s.auth, strata::coordinator::ApiAuth::FromTokens(text, ao));
  } else {
    s.auth = strata::coordinator::ApiAuth::Anonymous(ao);
    strata::log::Warn("unauthenticated", {{"reason", "--allow-unauthenticated: anyone who reaches the public port "
                                                     "may generate"}});
  }
  return s;
}

// The gauges read at scrape time (docs/metrics.md §2): the scheduler's queue
// and each stage's state, asked of its worker.
void RegisterClusterGauges(strata::metrics::Registry* reg, strata::coordinator::Scheduler* scheduler,
                           strata::coordinator::Cluster* cluster) {
  reg->OnScrape([reg, scheduler, cluster] {
    const strata::coordinator::SchedulerStats st = scheduler->Stats();
    reg->GetGauge("strata_requests_running", "Requests generating now.")->Set(static_cast<double>(st.running));
    reg->GetGauge("strata_requests_waiting", "Requests waiting for a running slot.")->Set(static_cast<double>(st.queued));
    reg->GetGauge("strata_resident_sessions", "Sessions whose KV rows are on the stages.")
        ->Set(static_cast<double>(st.resident_sessions));
    reg->GetGauge("strata_batches_in_flight", "Micro-batches in the pipeline.")
        ->Set(static_cast<double>(st.batches_in_flight));
    reg->GetGauge("strata_cluster_ready", "1 when every stage has its layers and requests are served.")
        ->Set(cluster->ready() ? 1 : 0);
    for (const strata::v1::StageStats& s : cluster->StageStats()) {
      const strata::metrics::Labels l = {{"stage", std::to_string(s.stage())}, {"worker", s.worker()}};
      reg->GetGauge("strata_stage_up", "1 when the stage's worker answered the scrape.", l)->Set(s.up() ? 1 : 0);
      reg->GetGauge("strata_stage_kv_pages_used", "64-token KV pages the stage holds, over its layers.", l)
          ->Set(static_cast<double>(s.kv_pages()));
      reg->GetGauge("strata_stage_kv_bytes_used", "Bytes of KV rows the stage holds.", l)
          ->Set(static_cast<double>(s.kv_bytes()));
      reg->GetGauge("strata_stage_sequences", "Sequences whose KV rows the stage holds.", l)
          ->Set(static_cast<double>(s.sequences()));
      reg->GetGauge("strata_stage_queue_depth", "Batches waiting at the stage.", l)
          ->Set(static_cast<double>(s.queue_depth()));
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata::coordinator;
  namespace metrics = strata::metrics;
  strata::FlagSet flags;
  flags.Declare("model", "model directory (config.json, safetensors, tokenizer.json), readable by every worker");
  flags.Declare("listen", "public API address: strata.v1.Generation (default 127.0.0.1:50051; port 0: any free port)");
  flags.Declare("internal-listen", "address for the workers: strata.v1.Coordinator, mutual TLS (default 127.0.0.1:50052)");
  flags.Declare("health-listen", "plaintext address serving only grpc.health.v1, for probes (default: none)");
  flags.Declare("tls-cert", "PEM certificate of the public API port");
  flags.Declare("tls-key", "PEM key of --tls-cert");
  flags.Declare("insecure-public", "serve the public API in plaintext (development only)", true);
  flags.Declare("api-tokens", "file of NAME:TOKEN lines; callers send `authorization: Bearer TOKEN`");
  flags.Declare("allow-unauthenticated", "serve the public API without tokens (development only)", true);
  flags.Declare("max-concurrent-per-token", "Generate streams one token may have open (default 64; 0: no limit)");
  flags.Declare("max-rps-per-token", "requests per second one token may start (default 0: no limit)");
  flags.Declare("http-listen", "OpenAI-compatible HTTP API address, with the public port's TLS and tokens "
                                "(docs/http.md; default: none)");
  flags.Declare("http-threads", "HTTP connections served at once; each stream holds one (default 128)");
  flags.Declare("served-model-name", "the model's name in the HTTP API (default: the model directory's name)");
  flags.Declare("metrics-listen", "plaintext address serving only GET /metrics, for Prometheus (default: none)");
  flags.Declare("log-prompts", "log the prompt and completion text of every request (default: counts and ids only; "
                               "docs/logging.md)", true);
  flags.Declare("drain-timeout-s", "on SIGTERM, running requests get this long to finish (default 30)");
  strata::DeclareClusterSecurityFlags(flags);
  flags.Declare("workers", "workers to place the model over (default 1)");
  flags.Declare("min-workers", "place over fewer workers when only this many are alive (default: --workers)");
  flags.Declare("placement", "manual placement, e.g. 0-30:w0,31-60:w1 (default: balanced by memory)");
  flags.Declare("kvstore", "address of strata-kvstore for session persistence (default: none)");
  flags.Declare("kv-dtype", "KV cache dtype on the workers: fp8 (default) or f32");
  flags.Declare("max-running", "sequences generating at once (default 64)");
  flags.Declare("max-queued", "requests waiting beyond --max-running before RESOURCE_EXHAUSTED (default 256)");
  flags.Declare("max-context", "tokens per sequence in the KV budget for placement (default: the model's context)");
  flags.Declare("prefill-chunk", "most prompt tokens of one sequence per step (default 256)");
  flags.Declare("worker-threads", "engine threads per worker (default 0: the worker's own setting)");
  flags.Declare("down-after-ms", "a worker silent this long is down (default 3000)");
  flags.Declare("synthetic-weights", "generate the weights on the GPU workers from this seed instead of reading "
                                     "them (only config.json is read; benchmarks at real dimensions)");
  flags.Declare("model-digest", "hash every byte of the checkpoint at startup and record the digest in new "
                                "sessions, for strata kv verify --full (reads the whole checkpoint once)", true);
  flags.Declare("help", "show this help", true);
  if (auto st = flags.Parse(argc, argv, 1); !st.ok()) return Usage(std::string(st.message()), flags);
  if (flags.Has("help")) {
    std::printf("%s%s", kUsage, flags.Help().c_str());
    return 0;
  }
  if (!flags.Has("model")) return Usage("--model is required", flags);
  strata::log::Configure({"strata-coordinator", nullptr});
  auto workers = flags.GetInt("workers", 1), min_workers = flags.GetInt("min-workers", 0),
       max_running = flags.GetInt("max-running", 64), max_queued = flags.GetInt("max-queued", 256),
       max_context = flags.GetInt("max-context", 0), chunk = flags.GetInt("prefill-chunk", 256),
       wthreads = flags.GetInt("worker-threads", 0), down_ms = flags.GetInt("down-after-ms", 3000);
  for (const auto* v : {&workers, &min_workers, &max_running, &max_queued, &max_context, &chunk, &wthreads, &down_ms}) {
    if (!v->ok()) return Usage(std::string(v->status().message()), flags);
  }
  if (*workers < 1 || *workers > 256) return Usage("--workers must be in [1, 256]", flags);
  if (*wthreads < 0 || *wthreads > strata::kMaxThreads) {
    return Usage(absl::StrCat("--worker-threads must be in [0, ", strata::kMaxThreads, "] (0: the worker's own)"),
                 flags);
  }
  if (*max_running < 1 || *max_queued < 0 || *chunk < 1 || *down_ms < 100) {
    return Usage("--max-running, --prefill-chunk must be positive, --max-queued >= 0, --down-after-ms >= 100", flags);
  }
  const std::string kv = flags.Get("kv-dtype", "fp8");
  if (kv != "fp8" && kv != "f32") return Usage("--kv-dtype must be fp8 or f32", flags);
  std::optional<uint64_t> synthetic_seed;
  if (flags.Has("synthetic-weights")) {
    auto seed = flags.GetInt("synthetic-weights", 0);
    if (!seed.ok() || *seed < 0) return Usage("--synthetic-weights must be a non-negative integer seed", flags);
    synthetic_seed = static_cast<uint64_t>(*seed);
  }

  auto http_threads = flags.GetInt("http-threads", 128);
  if (!http_threads.ok() || *http_threads < 4 || *http_threads > 4096) {
    return Usage("--http-threads must be in [4, 4096]", flags);
  }
  auto drain = flags.GetInt("drain-timeout-s", 30);
  if (!drain.ok() || *drain < 0 || *drain > 86400) return Usage("--drain-timeout-s must be in [0, 86400]", flags);
  absl::StatusOr<Security> security = SecurityFromFlags(flags);
  if (!security.ok()) return Usage(std::string(security.status().message()), flags);

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  auto model = LoadModelContext(flags.Get("model"));
  if (!model.ok()) {
    strata::log::Error("start_failed", {{"error", model.status().message()}});
    return 1;
  }
  ClusterOptions co;
  co.model_dir = flags.Get("model");
  co.workers = static_cast<int>(*workers);
  co.min_workers = static_cast<int>(*min_workers);
  co.placement_override = flags.Get("placement");
  co.kv_dtype = kv == "f32" ? strata::KvDtype::kF32 : strata::KvDtype::kFp8;
  if ((*model)->config.family == strata::ModelFamily::kDeepseekV4) {
    // docs/service.md, "DeepSeek-V4": f32 state only, sessions in memory.
    if (flags.Has("kv-dtype") && kv != "f32") {
      return Usage("deepseek_v4 keeps its state in float32 only (no fp8 V4 cache yet): use --kv-dtype f32", flags);
    }
    co.kv_dtype = strata::KvDtype::kF32;
    std::fprintf(stderr, "strata-coordinator: deepseek_v4: float32 state on the workers\n");
  }
  co.kvstore_address = flags.Get("kvstore");
  co.synthetic_seed = synthetic_seed;
  std::unique_ptr<KvSessionClient> store;
  if (!co.kvstore_address.empty()) {
    auto ids = strata::FingerprintModel(co.model_dir, synthetic_seed);
    if (!ids.ok()) {
      strata::log::Error("start_failed", {{"error", ids.status().message()}});
      return 1;
    }
    co.model_fingerprint = ids->fingerprint;
    co.model_legacy_fingerprint = ids->legacy_fingerprint;
    KvSessionShape shape = ShapeOf((*model)->config, ids->fingerprint, ids->legacy_fingerprint);
    if ((*model)->config.family == strata::ModelFamily::kDeepseekV4) {
      // Its sessions are v3 files (docs/coli-kv.md, "V4 sessions in the KV store").
      auto v4c = strata::v4::LoadV4Config(co.model_dir);
      if (!v4c.ok()) {
        std::fprintf(stderr, "strata-coordinator: %s\n", std::string(v4c.status().message()).c_str());
        return 1;
      }
      const strata::kv::V3Header h = strata::v4::V4KvHeader(*v4c, strata::kv::V3RowFormat::kF32);
      strata::v1::V4Layout& l = shape.v4.emplace();
      l.set_head_dim(h.head_dim);
      l.set_rope_dim(h.rope_dim);
      l.set_index_hd(h.index_hd);
      l.set_window(h.window);
      l.set_vocab(h.vocab);
      l.set_row_format(static_cast<int32_t>(h.row_format));
      for (const strata::kv::V3Layer& x : h.layers) {
        l.add_layer_kinds(static_cast<int32_t>(x.kind));
        l.add_layer_rates(x.rate);
      }
    }
    if (flags.Has("model-digest") && !synthetic_seed) {
      strata::FingerprintStats stats;
      auto digest = strata::ModelDigest(co.model_dir, &stats);
      if (!digest.ok()) {
        strata::log::Error("start_failed", {{"error", digest.status().message()}});
        return 1;
      }
      shape.model_digest = *digest;
      strata::log::Info("model_digest", {{"digest", absl::StrCat(absl::Hex(*digest, absl::kZeroPad16))},
                                         {"mb_read", static_cast<double>(stats.bytes_read) / 1e6}});
    }
    store = std::make_unique<KvSessionClient>(co.kvstore_address, std::move(shape), security->cluster.channel());
    strata::log::Info("kvstore", {{"address", co.kvstore_address},
                                  {"fingerprint", absl::StrCat(absl::Hex(ids->fingerprint, absl::kZeroPad16))},
                                  {"fingerprint_of", ids->what}});
  }
  co.placement.max_sessions = *max_running;
  co.placement.max_context = *max_context > 0 ? *max_context : (*model)->config.max_position_embeddings;
  co.worker_threads = static_cast<int>(*wthreads);
  co.down_after = absl::Milliseconds(*down_ms);
  co.credentials = security->cluster.channel();
  auto cluster = Cluster::Create(co);
  if (!cluster.ok()) {
    strata::log::Error("start_failed", {{"error", cluster.status().message()}});
    return 1;
  }
  SessionTable sessions;
  SchedulerOptions so;
  so.max_running = static_cast<int>(*max_running);
  so.max_queued = static_cast<int>(*max_queued);
  so.prefill_chunk = static_cast<int>(*chunk);
  metrics::Registry registry;
  ServingMetrics serving_metrics(&registry);
  so.metrics = &serving_metrics;
  so.log_prompts = flags.Has("log-prompts");
  auto scheduler = std::make_unique<Scheduler>(so, model->get(), cluster->get(), &sessions);
  SessionManager manager(SessionManagerOptions{}, &sessions, scheduler.get(), cluster->get(), std::move(store));
  scheduler->SetTurnListener([&manager](const TurnEnd& t) { manager.OnTurnEnd(t); });

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto generation = std::make_unique<GenerationService>(model->get(), scheduler.get(), cluster->get(), &manager,
                                                        security->auth.get());
  CoordinatorService membership(cluster->get());
  // Two ports: the public API, and the cluster's internal one where workers
  // register (never answered on the public port).
  int port = 0, internal_port = 0;
  const std::string listen = flags.Get("listen", "127.0.0.1:50051");
  const std::string internal_listen = flags.Get("internal-listen", "127.0.0.1:50052");
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, security->public_credentials, &port);
  builder.RegisterService(generation.get());
  builder.SetMaxReceiveMessageSize(kMaxPublicMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    strata::log::Error("listen_failed", {{"address", listen}});
    return 1;
  }
  grpc::ServerBuilder internal_builder;
  internal_builder.AddListeningPort(internal_listen, security->cluster.server(), &internal_port);
  internal_builder.RegisterService(&membership);
  internal_builder.SetMaxReceiveMessageSize(kMaxInternalMessageBytes);
  std::unique_ptr<grpc::Server> internal = internal_builder.BuildAndStart();
  if (!internal || internal_port == 0) {
    strata::log::Error("listen_failed", {{"address", internal_listen}, {"flag", "--internal-listen"}});
    return 1;
  }
  auto health = strata::HealthPort::Start(flags.Get("health-listen"),
                                          {server->GetHealthCheckService(), internal->GetHealthCheckService()});
  if (!health.ok()) {
    strata::log::Error("start_failed", {{"error", health.status().message()}});
    return 1;
  }
  (*health)->Set("strata.v1.Generation", false);
  (*health)->Set("", true);  // the process is up; "strata.v1.Generation" says whether it serves
  std::atomic<bool> draining{false};
  strata::HealthPort* h = health->get();
  (*cluster)->Start(scheduler.get(), [h, &draining](bool ready) { h->Set("strata.v1.Generation", ready && !draining); });
  Cluster* cl = cluster->get();
  Scheduler* sch = scheduler.get();
  RegisterClusterGauges(&registry, sch, cl);
  auto metrics_port = strata::MetricsPort::Start(flags.Get("metrics-listen"), &registry);
  if (!metrics_port.ok()) {
    strata::log::Error("start_failed", {{"error", metrics_port.status().message()}});
    return 1;
  }
  std::unique_ptr<http::HttpGateway> gateway;
  if (flags.Has("http-listen")) {
    http::HttpGatewayOptions ho;
    ho.listen = flags.Get("http-listen");
    ho.tls_cert = flags.Get("tls-cert");
    ho.tls_key = flags.Get("tls-key");
    ho.served_model_name = flags.Get("served-model-name");
    ho.threads = static_cast<int>(*http_threads);
    auto g = http::HttpGateway::Start(
        ho, generation.get(), [cl, &draining] { return cl->ready() && !draining; }, &registry);
    if (!g.ok()) {
      strata::log::Error("start_failed", {{"error", g.status().message()}});
      return 1;
    }
    gateway = std::move(*g);
  }
  std::printf("internal %s:%d\n", internal_listen.substr(0, internal_listen.rfind(':')).c_str(), internal_port);
  if (gateway) {
    const std::string hl = flags.Get("http-listen");
    std::printf("http %s:%d\n", hl.substr(0, hl.rfind(':')).c_str(), gateway->port());
  }
  if ((*metrics_port)->port() != 0) {
    const std::string ml = flags.Get("metrics-listen");
    std::printf("metrics %s:%d\n", ml.substr(0, ml.rfind(':')).c_str(), (*metrics_port)->port());
  }
  std::printf("listening %s:%d\n", listen.substr(0, listen.rfind(':')).c_str(), port);
  std::fflush(stdout);
  strata::log::Info("listening", {{"port", port}, {"internal_port", internal_port},
                                  {"http_port", gateway ? gateway->port() : 0},
                                  {"metrics_port", (*metrics_port)->port()}, {"log_prompts", so.log_prompts}});

  int sig = 0;
  sigwait(&set, &sig);
  // Drain: readiness false, no new admissions, the running requests finish
  // (their sessions commit as turns end) until the deadline; a second
  // signal exits at once.
  draining = true;
  h->Set("strata.v1.Generation", false);
  scheduler->StopAdmitting();
  strata::log::Info("drain", {{"signal", sig}, {"timeout_s", *drain}});
  std::thread([set] {
    int again = 0;
    sigwait(&set, &again);
    strata::log::Warn("exit_now", {{"signal", again}});
    std::_Exit(1);
  }).detach();
  const absl::Time deadline = absl::Now() + absl::Seconds(*drain);
  while (absl::Now() < deadline) {
    const SchedulerStats st = scheduler->Stats();
    if (st.running == 0 && st.queued == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  strata::log::Info("stopping", {{"running", scheduler->Stats().running}, {"queued", scheduler->Stats().queued}});
  h->SetAll(false);
  if (gateway) gateway->Stop();  // its handlers abort what still runs
  metrics_port->reset();          // its scrapes read the scheduler and the cluster
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  internal->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  generation->Drain();  // helper threads use the scheduler and the cluster
  (*cluster)->Stop();   // its stream reader reports to the scheduler
  scheduler.reset();
  server->Wait();
  internal->Wait();
  generation.reset();
  cluster->reset();
  return 0;
}
