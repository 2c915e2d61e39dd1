#include "coordinator/health_client.h"

#include <future>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"

namespace strata::coordinator {

absl::StatusOr<bool> CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                                 absl::Duration timeout) {
  if (service.size() > 127) return absl::InvalidArgumentError("service name too long");
  std::string req;
  if (!service.empty()) {
    req.push_back(0x0A);
    req.push_back(static_cast<char>(service.size()));
    req += service;
  }
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status st = done.get_future().get();
  if (!st.ok()) return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // Field 1, varint: 0x08 then the status (SERVING = 1).
  return bytes.size() >= 2 && bytes[0] == 0x08 && bytes[1] == 0x01;
}

}  // namespace strata::coordinator
