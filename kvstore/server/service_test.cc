// In-process tests of the strata.v1.KVStore service over a real gRPC
// channel, on the in-memory fault-injection file system.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/metrics_text.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "kvstore/fault_injection_env.h"
#include "kvstore/server/server.h"
#include "kvstore/test_util.h"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::kv {
namespace {

namespace pb = strata::v1;

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dims_ = testing::RandomDims(rng_);
    dims_.n_layers = 3 + static_cast<int32_t>(rng_() % 4);
    dims_.index_hd = 1 + static_cast<int32_t>(rng_() % 4);
    dims_.nic = 2;
    indexer_layers_ = {0, dims_.n_layers - 2};
    model_ = std::make_unique<testing::RecordModel>(rng_, dims_, indexer_layers_);
    ServerOptions o;
    o.store.dir = "/kv";
    o.store.commit_threads = 2;
    o.store.chunk_records = 8;
    o.metrics_listen = "127.0.0.1:0";
    server_ = *KvStoreServer::Start(&env_, o);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = pb::KVStore::NewStub(channel_);
  }

  pb::CreateSessionRequest CreateRequest(const std::string& id) {
    pb::CreateSessionRequest r;
    r.set_session_id(id);
    pb::KvDims* d = r.mutable_dims();
    d->set_n_layers(dims_.n_layers);
    d->set_kv_lora(dims_.kv_lora);
    d->set_qk_rope(dims_.qk_rope);
    d->set_index_hd(dims_.index_hd);
    d->set_nic(dims_.nic);
    d->set_vocab(dims_.vocab);
    for (int32_t l : indexer_layers_) r.add_indexer_layers(l);
    r.set_fingerprint(fingerprint_);
    (*r.mutable_metadata())["user"] = "ada";
    return r;
  }

  grpc::Status Create(const std::string& id) {
    grpc::ClientContext ctx;
    pb::SessionInfo info;
    return stub_->CreateSession(&ctx, CreateRequest(id), &info);
  }

  // A synchronous append stream of one layer range.
  struct Stream {
    std::unique_ptr<grpc::ClientContext> ctx = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<grpc::ClientReaderWriter<pb::AppendRequest, pb::AppendResponse>> rw;
    pb::AppendOpened opened;
  };

  // Opens a stream; returns the final status when the server refused it.
  std::unique_ptr<Stream> Open(const std::string& id, int b, int e, grpc::Status* refused) {
    auto s = std::make_unique<Stream>();
    s->rw = stub_->Append(s->ctx.get());
    pb::AppendRequest req;
    req.mutable_open()->set_session_id(id);
    req.mutable_open()->set_layer_begin(b);
    req.mutable_open()->set_layer_end(e);
    req.mutable_open()->set_fingerprint(fingerprint_);
    EXPECT_TRUE(s->rw->Write(req));
    pb::AppendResponse resp;
    if (!s->rw->Read(&resp)) {
      *refused = s->rw->Finish();
      return nullptr;
    }
    EXPECT_TRUE(resp.has_opened());
    s->opened = resp.opened();
    return s;
  }

  pb::AppendRequest Rows(int64_t from, int64_t to, int b, int e) {
    pb::AppendRequest req;
    req.mutable_rows()->set_position(from);
    for (int64_t p = from; p < to; ++p) {
      req.mutable_rows()->add_token_ids(model_->Token(p));
      req.mutable_rows()->mutable_rows()->append(model_->Slice(p, b, e));
    }
    return req;
  }

  // Half-closes and reads until the server finishes; returns the last
  // Committed nrec seen.
  int64_t Drain(Stream& s, grpc::Status* status) {
    s.rw->WritesDone();
    pb::AppendResponse resp;
    int64_t last = -1;
    while (s.rw->Read(&resp)) {
      if (resp.has_committed()) {
        EXPECT_GE(resp.committed().nrec(), last);  // never shrinks
        last = resp.committed().nrec();
      }
    }
    *status = s.rw->Finish();
    return last;
  }

  // Loads layers [b, e) of tokens [from, to) and compares with the model.
  grpc::Status ExpectLoad(const std::string& id, int b, int e, int64_t from, int64_t to,
                          int64_t chunk_bytes = 0) {
    grpc::ClientContext ctx;
    pb::LoadRequest req;
    req.set_session_id(id);
    req.set_layer_begin(b);
    req.set_layer_end(e);
    req.set_position_begin(from);
    req.set_position_end(to);
    req.set_max_chunk_bytes(chunk_bytes);
    auto reader = stub_->Load(&ctx, req);
    pb::LoadChunk chunk;
    int64_t next = from;
    std::string rows, want;
    while (reader->Read(&chunk)) {
      EXPECT_EQ(chunk.position(), next);
      for (int32_t t : chunk.token_ids()) EXPECT_EQ(t, model_->Token(next++));
      rows += chunk.rows();
    }
    grpc::Status st = reader->Finish();
    if (!st.ok()) return st;
    EXPECT_EQ(next, to);
    for (int64_t p = from; p < to; ++p) want += model_->Slice(p, b, e);
    EXPECT_TRUE(rows == want) << "loaded rows of layers [" << b << ", " << e << ") differ";
    return st;
  }

  FaultInjectionEnv env_;
  std::mt19937_64 rng_ = testing::FreshRng();
  Dims dims_;
  std::vector<int32_t> indexer_layers_;
  std::unique_ptr<testing::RecordModel> model_;
  const uint64_t fingerprint_ = rng_();
  std::unique_ptr<KvStoreServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KVStore::Stub> stub_;
};

TEST_F(ServiceTest, HealthIsServing) {
  grpc::GenericStub generic(channel_);
  for (const std::string& service : {std::string(), std::string("strata.v1.KVStore")}) {
    // grpc.health.v1.HealthCheckRequest{service}: field 1, length-delimited.
    std::string request;
    if (!service.empty()) request = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
    grpc::Slice slice(request);
    grpc::ByteBuffer in(&slice, 1), out;
    grpc::ClientContext ctx;
    grpc::Status st;
    bool done = false;
    std::mutex mu;
    std::condition_variable cv;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                      [&](grpc::Status s) {
                        std::lock_guard<std::mutex> l(mu);
                        st = s;
                        done = true;
                        cv.notify_one();
                      });
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });
    ASSERT_TRUE(st.ok()) << st.error_message();
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(out.Dump(&slices).ok());
    std::string bytes;
    for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "status SERVING";  // HealthCheckResponse{SERVING}
  }
}

TEST_F(ServiceTest, TwoStagesAppendAndThreeStagesLoad) {
  ASSERT_TRUE(Create("chat").ok());
  const int split = 1 + static_cast<int>(rng_() % (dims_.n_layers - 1));
  grpc::Status refused;
  auto a = Open("chat", 0, split, &refused);
  auto b = Open("chat", split, dims_.n_layers, &refused);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->opened.next_position(), 0);
  EXPECT_EQ(a->opened.slice_bytes(), static_cast<int64_t>(model_->Slice(0, 0, split).size()));
  const int64_t total = 40;
  for (int64_t p = 0; p < total;) {
    const int64_t k = std::min<int64_t>(total - p, 1 + static_cast<int64_t>(rng_() % 7));
    ASSERT_TRUE(a->rw->Write(Rows(p, p + k, 0, split)));
    ASSERT_TRUE(b->rw->Write(Rows(p, p + k, split, dims_.n_layers)));
    p += k;
  }
  grpc::Status sa, sb;
  Drain(*a, &sa);
  const int64_t last = Drain(*b, &sb);
  ASSERT_TRUE(sa.ok()) << sa.error_message();
  ASSERT_TRUE(sb.ok()) << sb.error_message();
  EXPECT_EQ(last, total);
  // Resume on three stages with another split, and a token sub-range.
  const int c1 = static_cast<int>(rng_() % (dims_.n_layers - 2)) + 1;
  EXPECT_TRUE(ExpectLoad("chat", 0, c1, 0, total).ok());
  EXPECT_TRUE(ExpectLoad("chat", c1, dims_.n_layers - 1, 0, total, 100).ok());  // tiny chunks
  EXPECT_TRUE(ExpectLoad("chat", dims_.n_layers - 1, dims_.n_layers, 0, total).ok());
  EXPECT_TRUE(ExpectLoad("chat", 0, dims_.n_layers, 7, 19).ok());

  grpc::ClientContext ctx;
  pb::StatRequest sr;
  sr.set_session_id("chat");
  pb::SessionInfo info;
  ASSERT_TRUE(stub_->Stat(&ctx, sr, &info).ok());
  EXPECT_EQ(info.nrec(), total);
  EXPECT_EQ(info.fingerprint(), fingerprint_);
  EXPECT_EQ(info.format_version(), 2);
  EXPECT_EQ(info.metadata().at("user"), "ada");
  EXPECT_EQ(info.writers_size(), 0);
  EXPECT_EQ(info.file_bytes(), static_cast<uint64_t>(40 + total * testing::SpecV2RecordBytes(dims_)));
}

TEST_F(ServiceTest, ErrorCodesAndTheServerKeepsServing) {
  ASSERT_TRUE(Create("s").ok());
  EXPECT_EQ(Create("s").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Create("../../etc/passwd").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Create(std::string(200, 'x')).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  {
    pb::CreateSessionRequest bad = CreateRequest("bad");
    bad.mutable_dims()->set_kv_lora(-4);
    grpc::ClientContext ctx;
    pb::SessionInfo info;
    EXPECT_EQ(stub_->CreateSession(&ctx, bad, &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  grpc::Status refused;
  EXPECT_EQ(Open("nope", 0, 1, &refused), nullptr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::NOT_FOUND);
  auto a = Open("s", 0, 2, &refused);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(Open("s", 1, 3, &refused), nullptr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);  // overlapping writer
  EXPECT_EQ(Open("s", 2, dims_.n_layers + 1, &refused), nullptr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // Each of these ends its own stream with a precise code.
  auto expect_stream_error = [&](pb::AppendRequest bad, grpc::StatusCode code, bool open_first) {
    auto s = std::make_unique<Stream>();
    s->rw = stub_->Append(s->ctx.get());
    if (open_first) {
      pb::AppendRequest o;
      o.mutable_open()->set_session_id("s");
      o.mutable_open()->set_layer_begin(2);
      o.mutable_open()->set_layer_end(dims_.n_layers);
      ASSERT_TRUE(s->rw->Write(o));
    }
    s->rw->Write(bad);
    s->rw->WritesDone();
    pb::AppendResponse resp;
    while (s->rw->Read(&resp)) {
    }
    EXPECT_EQ(s->rw->Finish().error_code(), code);
  };
  const int L = dims_.n_layers;
  expect_stream_error(Rows(0, 1, 2, L), grpc::StatusCode::INVALID_ARGUMENT, false);  // no open
  expect_stream_error(Rows(1, 2, 2, L), grpc::StatusCode::OUT_OF_RANGE, true);       // position 1 first
  pb::AppendRequest wrong = Rows(0, 2, 2, L);
  wrong.mutable_rows()->mutable_rows()->pop_back();
  expect_stream_error(wrong, grpc::StatusCode::INVALID_ARGUMENT, true);  // a byte short
  pb::AppendRequest tok = Rows(0, 1, 2, L);
  tok.mutable_rows()->set_token_ids(0, dims_.vocab + 5);
  expect_stream_error(tok, grpc::StatusCode::INVALID_ARGUMENT, true);
  pb::AppendRequest again;
  again.mutable_open()->set_session_id("s");
  expect_stream_error(again, grpc::StatusCode::INVALID_ARGUMENT, true);  // a second open

  // Unary errors.
  grpc::ClientContext c1, c2, c3, c4, c5;
  pb::TruncateRequest tr;
  tr.set_session_id("s");
  tr.set_nrec(0);
  pb::TruncateResponse tresp;
  EXPECT_EQ(stub_->Truncate(&c1, tr, &tresp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  pb::DeleteRequest dr;
  dr.set_session_id("s");
  pb::DeleteResponse dresp;
  EXPECT_EQ(stub_->Delete(&c2, dr, &dresp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  pb::StatRequest sr;
  sr.set_session_id("nope");
  pb::SessionInfo info;
  EXPECT_EQ(stub_->Stat(&c3, sr, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  pb::UpdateSessionRequest ur;
  ur.set_session_id("s");
  ur.set_turn_watermark(5);
  EXPECT_EQ(stub_->UpdateSession(&c4, ur, &info).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(ExpectLoad("s", 0, L, 0, 3).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(ExpectLoad("s", L, L + 1, 0, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  {
    grpc::ClientContext ctx;
    pb::LoadRequest lr;
    lr.set_session_id("s");
    lr.set_fingerprint(fingerprint_ + 1);
    auto reader = stub_->Load(&ctx, lr);
    pb::LoadChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }

  // And the healthy stream still works.
  ASSERT_TRUE(a->rw->Write(Rows(0, 3, 0, 2)));
  auto b = Open("s", 2, L, &refused);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->rw->Write(Rows(0, 3, 2, L)));
  grpc::Status sa, sb;
  Drain(*a, &sa);
  Drain(*b, &sb);
  EXPECT_TRUE(sa.ok() && sb.ok());
  EXPECT_TRUE(ExpectLoad("s", 0, L, 0, 3).ok());
  EXPECT_TRUE(stub_->Truncate(&c5, tr, &tresp).ok());
  EXPECT_EQ(tresp.nrec(), 0);
}

TEST_F(ServiceTest, FullDiskIsResourceExhaustedForThatSessionOnly) {
  ASSERT_TRUE(Create("full").ok());
  ASSERT_TRUE(Create("fine").ok());
  grpc::Status refused;
  auto s = Open("full", 0, dims_.n_layers, &refused);
  ASSERT_NE(s, nullptr);
  FaultInjectionEnv::Fault f;
  f.op = FaultInjectionEnv::OpKind::kWrite;
  f.path_contains = "full.coli_kv";
  f.times = -1;
  env_.AddFault(f);
  s->rw->Write(Rows(0, 2, 0, dims_.n_layers));
  grpc::Status st;
  Drain(*s, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto ok = Open("fine", 0, dims_.n_layers, &refused);
  ASSERT_NE(ok, nullptr);
  ok->rw->Write(Rows(0, 2, 0, dims_.n_layers));
  EXPECT_EQ(Drain(*ok, &st), 2);
  EXPECT_TRUE(st.ok());
}

TEST_F(ServiceTest, ListUpdateDelete) {
  for (const char* id : {"a1", "a2", "b1"}) ASSERT_TRUE(Create(id).ok());
  grpc::ClientContext c1;
  pb::ListRequest lr;
  lr.set_prefix("a");
  lr.set_page_size(1);
  pb::ListResponse resp;
  ASSERT_TRUE(stub_->List(&c1, lr, &resp).ok());
  ASSERT_EQ(resp.sessions_size(), 1);
  EXPECT_EQ(resp.sessions(0).session_id(), "a1");
  EXPECT_EQ(resp.next_page_token(), "a1");
  grpc::ClientContext c2;
  lr.set_page_token(resp.next_page_token());
  ASSERT_TRUE(stub_->List(&c2, lr, &resp).ok());
  ASSERT_EQ(resp.sessions_size(), 1);
  EXPECT_EQ(resp.sessions(0).session_id(), "a2");
  EXPECT_TRUE(resp.next_page_token().empty());

  grpc::ClientContext c3;
  pb::UpdateSessionRequest ur;
  ur.set_session_id("a1");
  ur.set_turn_watermark(0);
  (*ur.mutable_set_metadata())["title"] = "hello";
  ur.add_remove_metadata("user");
  pb::SessionInfo info;
  ASSERT_TRUE(stub_->UpdateSession(&c3, ur, &info).ok());
  EXPECT_EQ(info.metadata().at("title"), "hello");
  EXPECT_EQ(info.metadata().count("user"), 0u);

  grpc::ClientContext c4, c5, c6;
  pb::DeleteRequest dr;
  dr.set_session_id("a1");
  pb::DeleteResponse dresp;
  ASSERT_TRUE(stub_->Delete(&c4, dr, &dresp).ok());
  EXPECT_EQ(stub_->Delete(&c5, dr, &dresp).error_code(), grpc::StatusCode::NOT_FOUND);
  pb::StatRequest sr;
  sr.set_session_id("a1");
  EXPECT_EQ(stub_->Stat(&c6, sr, &info).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServiceTest, GarbageOnTheWire) {
  // Bytes that are no AppendRequest, sent to the Append method.
  {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    grpc::CompletionQueue cq;
    auto call = generic.PrepareCall(&ctx, "/strata.v1.KVStore/Append", &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    cq.Next(&tag, &ok);
    const std::string junk = "\xff\xff\xff\xff\x0f garbage";
    grpc::Slice slice(junk);
    grpc::ByteBuffer bb(&slice, 1);
    call->Write(bb, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    grpc::ByteBuffer reply;
    do {  // read until the server ends the stream
      call->Read(&reply, reinterpret_cast<void*>(5));
      cq.Next(&tag, &ok);
    } while (ok);
    grpc::Status st;
    call->Finish(&st, reinterpret_cast<void*>(4));
    while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
    }
    // Unparsable before `open`: refused (the callback API reports it as a failed read).
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }

  // The server still serves.
  EXPECT_TRUE(Create("after").ok());
}

// The metrics of docs/metrics.md §4, read from the metrics port: every
// series moves with the RPCs that should move it, and only those.
TEST_F(ServiceTest, MetricsFollowAppendsLoadsSyncsAndRpcs) {
  ASSERT_GT(server_->metrics_port(), 0);
  httplib::Client scraper("127.0.0.1", server_->metrics_port());
  auto scrape = [&] {
    auto res = scraper.Get("/metrics");
    EXPECT_TRUE(res && res->status == 200);
    return res ? res->body : std::string();
  };
  auto value = [](const std::string& body, const std::string& series) {
    return strata::testing::MetricValue(body, series).value_or(-1);
  };
  std::string body = scrape();
  EXPECT_EQ(value(body, "strata_kvstore_sessions_stored"), 0);
  EXPECT_EQ(value(body, "strata_kvstore_appended_bytes_total"), 0);
  EXPECT_EQ(value(body, "strata_kvstore_append_seconds_count"), 0);
  EXPECT_EQ(body.find("strata_kvstore_rpcs_total{"), std::string::npos) << "no RPC yet";
  const double syncs_at_open = value(body, "strata_kvstore_fsync_seconds_count");

  ASSERT_TRUE(Create("m1").ok());
  ASSERT_TRUE(Create("m2").ok());
  EXPECT_EQ(Create("m1").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  body = scrape();
  EXPECT_EQ(value(body, R"(strata_kvstore_rpcs_total{method="CreateSession",code="OK"})"), 2);
  EXPECT_EQ(value(body, R"(strata_kvstore_rpcs_total{method="CreateSession",code="ALREADY_EXISTS"})"), 1);
  EXPECT_EQ(value(body, "strata_kvstore_sessions_stored"), 2);
  EXPECT_GE(value(body, "strata_kvstore_sessions_open"), 1);
  EXPECT_GT(value(body, "strata_kvstore_fsync_seconds_count"), syncs_at_open) << "a create syncs its files";

  grpc::Status refused;
  auto s = Open("m1", 0, dims_.n_layers, &refused);
  ASSERT_NE(s, nullptr);
  const double syncs_before = value(scrape(), "strata_kvstore_fsync_seconds_count");
  uint64_t bytes = 0;
  for (int64_t p = 0; p < 12; p += 4) {
    pb::AppendRequest rows = Rows(p, p + 4, 0, dims_.n_layers);
    bytes += rows.rows().rows().size();
    ASSERT_TRUE(s->rw->Write(rows));
  }
  grpc::Status st;
  EXPECT_EQ(Drain(*s, &st), 12);
  ASSERT_TRUE(st.ok()) << st.error_message();
  body = scrape();
  EXPECT_EQ(value(body, "strata_kvstore_appended_bytes_total"), static_cast<double>(bytes));
  EXPECT_EQ(value(body, "strata_kvstore_append_seconds_count"), 3);
  EXPECT_GT(value(body, "strata_kvstore_append_seconds_sum"), 0);
  EXPECT_GE(value(body, "strata_kvstore_fsync_seconds_count"), syncs_before + 2) << "a commit round syncs twice";
  EXPECT_EQ(value(body, R"(strata_kvstore_rpcs_total{method="Append",code="OK"})"), 1);
  EXPECT_EQ(value(body, "strata_kvstore_read_bytes_total"), 0);

  ASSERT_TRUE(ExpectLoad("m1", 0, dims_.n_layers, 0, 12).ok());
  EXPECT_EQ(ExpectLoad("m1", 0, dims_.n_layers, 0, 13).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(ExpectLoad("nope", 0, dims_.n_layers, 0, 1).error_code(), grpc::StatusCode::NOT_FOUND);
  body = scrape();
  EXPECT_EQ(value(body, "strata_kvstore_read_bytes_total"), static_cast<double>(bytes));
  EXPECT_EQ(value(body, R"(strata_kvstore_rpcs_total{method="Load",code="OK"})"), 1);
  EXPECT_EQ(value(body, R"(strata_kvstore_rpcs_total{method="Load",code="OUT_OF_RANGE"})"), 1);
  EXPECT_EQ(value(body, R"(strata_kvstore_rpcs_total{method="Load",code="NOT_FOUND"})"), 1);

  // A failing sync fails the append stream and is counted.
  FaultInjectionEnv::Fault f;
  f.op = FaultInjectionEnv::OpKind::kSync;
  f.path_contains = "m2.coli_kv";
  f.times = -1;
  f.error = absl::InternalError("injected: I/O error");
  env_.AddFault(f);
  auto bad = Open("m2", 0, dims_.n_layers, &refused);
  ASSERT_NE(bad, nullptr);
  pb::AppendRequest bad_rows = Rows(0, 2, 0, dims_.n_layers);
  bytes += bad_rows.rows().rows().size();  // written in place; the sync after it fails
  bad->rw->Write(bad_rows);
  Drain(*bad, &st);
  EXPECT_FALSE(st.ok());
  body = scrape();
  EXPECT_GE(value(body, "strata_kvstore_fsync_errors_total"), 1);
  EXPECT_EQ(value(body, absl::StrCat(R"(strata_kvstore_rpcs_total{method="Append",code=")",
                                     absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())),
                                     R"("})")), 1);
  env_.ClearFaults();

  grpc::ClientContext ctx;
  pb::DeleteRequest del;
  del.set_session_id("m1");
  pb::DeleteResponse dresp;
  ASSERT_TRUE(stub_->Delete(&ctx, del, &dresp).ok());
  body = scrape();
  EXPECT_EQ(value(body, "strata_kvstore_sessions_stored"), 1);
  EXPECT_EQ(value(body, R"(strata_kvstore_rpcs_total{method="Delete",code="OK"})"), 1);
  EXPECT_EQ(strata::testing::MetricValue(server_->metrics()->Render(), "strata_kvstore_appended_bytes_total"),
            static_cast<double>(bytes))
      << "the port serves the server's registry";
}

}  // namespace
}  // namespace strata::kv
