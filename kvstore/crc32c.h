// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78; the
// checksum of iSCSI, ext4 and leveldb) used by the session manifest's chunk
// checksums and its own trailer (docs/coli-kv.md, "Manifest").
//
// Table-driven (slicing by 8), with the SSE4.2 crc32 instruction used when the
// processor has it; both give the same values. Pure functions, thread-safe.
#ifndef STRATA_KVSTORE_CRC32C_H_
#define STRATA_KVSTORE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata::kv::crc32c {

// Returns the CRC32C of concat(A, data) where crc is the CRC32C of A.
uint32_t Extend(uint32_t crc, const void* data, size_t n);

inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }
inline uint32_t Value(std::string_view s) { return Extend(0, s.data(), s.size()); }

// The portable table-driven implementation (exposed for tests).
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);

// True when Extend uses the crc32 instruction.
bool HardwareAccelerated();

}  // namespace strata::kv::crc32c

#endif  // STRATA_KVSTORE_CRC32C_H_
