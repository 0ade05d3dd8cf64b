// How much memory the system can give this process now (Linux's MemAvailable: free memory plus
// what the kernel can reclaim without swapping), for sizing caches at start-up.
#pragma once

#include <cstdint>

namespace moestream::storage {

// MemAvailable from /proc/meminfo, in bytes; where it cannot be read, the free physical pages
// (sysconf), which undercounts the reclaimable page cache.
uint64_t available_memory_bytes();

}  // namespace moestream::storage
