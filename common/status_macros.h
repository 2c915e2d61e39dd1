// Status propagation helpers for absl::Status / absl::StatusOr.
//
//   RETURN_IF_ERROR(expr);              // returns the Status if not ok
//   ASSIGN_OR_RETURN(auto x, expr);     // unwraps a StatusOr or returns its Status
#ifndef STRATA_COMMON_STATUS_MACROS_H_
#define STRATA_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    ::absl::Status strata_status_ = (expr);                    \
    if (!strata_status_.ok()) return strata_status_;           \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_statusor_, __LINE__), lhs, expr)

#define STRATA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#endif  // STRATA_COMMON_STATUS_MACROS_H_
