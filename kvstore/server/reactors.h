// The streaming RPCs of the KV store service, one reactor per stream
// (gRPC callback API; semantics in docs/coli-kv.md, "The KV store service"):
//   - Append: the first message opens a writer of one layer range of one
//     session (Session::OpenWriter) and is answered with AppendOpened; each
//     rows message is written in place (Session::Write); after every group
//     commit that concerns the stream the reactor sends Committed{nrec}. One
//     write in flight; later commits coalesce into the next Committed. When
//     the client half-closes, the stream finishes with OK once all its rows
//     are durable. Any error finishes it with that status.
//   - Load: streams LoadChunk messages of committed, sanitised rows.
// Each RPC is finished exactly once; a failed read or write finishes it as
// cancelled.
//
// Thread-safety: owned by gRPC; commit notifications arrive on the store's
// commit threads and are synchronised inside the reactor.
#ifndef STRATA_KVSTORE_SERVER_REACTORS_H_
#define STRATA_KVSTORE_SERVER_REACTORS_H_

#include <cstdint>

#include "grpcpp/grpcpp.h"
#include "kvstore/server/kv_metrics.h"
#include "kvstore/store.h"
#include "strata/v1/kvstore.grpc.pb.h"

namespace strata::kv {

// Both count the RPC when it finishes, Append the time and bytes of each
// rows message, Load the bytes it sends (kv_metrics.h).
// REQUIRES: store and metrics outlive the reactor. The reactor deletes itself
// in OnDone.
grpc::ServerBidiReactor<strata::v1::AppendRequest, strata::v1::AppendResponse>* NewAppendReactor(
    Store* store, KvStoreMetrics* metrics);

grpc::ServerWriteReactor<strata::v1::LoadChunk>* NewLoadReactor(Store* store, KvStoreMetrics* metrics,
                                                               const strata::v1::LoadRequest& req,
                                                               int64_t default_chunk_bytes);

}  // namespace strata::kv

#endif  // STRATA_KVSTORE_SERVER_REACTORS_H_
