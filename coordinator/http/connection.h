// The socket a request arrived on, so that a handler waiting for tokens
// notices a client that went away (docs/http.md §6).
//
// cpp-httplib 0.11 does not hand a handler its connection. Over TLS the
// request carries its SSL object, whose descriptor is the socket; in
// plaintext the socket is the one descriptor of this process whose local and
// peer addresses are the request's (a TCP connection is named by that pair),
// found once per request in /proc/self/fd. The descriptor stays open while the
// handler runs (the library closes it after the handler returns), so it
// cannot be reused for another connection meanwhile.
//
// Thread-safety: pure functions.
#ifndef STRATA_COORDINATOR_HTTP_CONNECTION_H_
#define STRATA_COORDINATOR_HTTP_CONNECTION_H_

#include "httplib.h"

namespace strata::coordinator::http {

// The request's socket, or -1 when it cannot be found.
int ConnectionSocket(const httplib::Request& req);

// True when the peer closed or reset the connection (POLLRDHUP, POLLHUP or
// POLLERR); false while it is open, and for fd < 0.
bool PeerClosed(int fd);

}  // namespace strata::coordinator::http

#endif  // STRATA_COORDINATOR_HTTP_CONNECTION_H_
